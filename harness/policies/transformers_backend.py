"""`TransformersBackend`: batched, KV-cached sampling from any Hugging Face causal LM.

This is the CPU default and the backend the tests use. It runs its own short decode loop rather
than `model.generate`, for three reasons measured or required here:

- per-token log-probs of the sampled token *under the sampling distribution* (after temperature,
  top-k and top-p) come out of the loop directly, with no second pass over `scores`;
- sampling is seeded per prefix: prefix `i` of a call draws its uniforms from row `i` of one
  matrix generated from `SamplingParams.seed`, so a seeded call is reproducible, identical
  prefixes in one call still get different samples, and a prefix's sample does not depend on how
  the call was split into batches (a shared `torch.Generator` per batch would make it depend);
- finished rows are dropped from the batch and its KV cache as they stop, so one long
  continuation does not keep a whole batch of short ones decoding. On the tiny policy this loop
  is faster than `generate` with stop strings (see `benchmarks/perf/transformers_decode.py`).

Stop strings that the tokenizer holds as one token (the tiny policy's tags) are matched by id;
any other stop string is matched on the decoded tail of the continuation, so any tokenizer works.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch

from harness.policies.base import Completion, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TransformersBackend"]

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "eos"]


@dataclass(frozen=True, slots=True)
class _StopMatcher:
    """Finds the end of an action: stop strings held as single tokens, and all the others."""

    token_ids: frozenset[int]
    """Ids that decode to exactly one of the stop strings."""
    strings: tuple[str, ...]
    """Every stop string (for the text cut and for the tail check)."""
    tail_strings: tuple[str, ...]
    """Stop strings that span several tokens: checked on the decoded tail."""

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str]) -> _StopMatcher:
        token_ids, tail = set(), []
        for stop in stops:
            ids = tokenizer.encode(stop, add_special_tokens=False)
            if len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=False) == stop:
                token_ids.add(ids[0])
            else:
                tail.append(stop)
        return cls(frozenset(token_ids), tuple(stops), tuple(tail))

    def hit(self, tokenizer: PreTrainedTokenizerBase, generated: list[int]) -> bool:
        """Whether a stop string ends in the newest token of `generated`."""
        if generated[-1] in self.token_ids:
            return True
        for stop in self.tail_strings:
            # An ASCII stop of m characters spans at most m tokens, so the last m tokens hold it.
            tail = tokenizer.decode(generated[-len(stop) :], skip_special_tokens=False)
            if stop in tail:
                return True
        return False

    def cut(self, text: str) -> str:
        """`text` up to and including the earliest stop string in it."""
        ends = [text.find(stop) + len(stop) for stop in self.strings if stop in text]
        return text[: min(ends)] if ends else text


class TransformersBackend:
    """A `PolicyBackend` over a Hugging Face causal LM, for CPU (or one GPU).

    Args:
        model: A model directory (config + weights, as `save_pretrained` writes it) or a loaded
            `PreTrainedModel`. A loaded model is used as is (not copied), so a trainer can share
            its live policy with the backend.
        tokenizer: The tokenizer, or a directory to load it from. Defaults to `model`'s directory.
        device: Where to run ("cpu", "cuda", ...).
        batch_size: Most prefixes decoded together; longer lists are split, longest first.
        dtype: Weights' dtype when loading from a directory (e.g. "float32", "bfloat16").
        seed: Seeds the backend's own generator, used by calls whose `SamplingParams.seed` is None.

    Raises:
        ValueError: for a batch size below 1, or a tokenizer that cannot be found.

    Example:
        >>> backend = TransformersBackend("runs/demo/policy")  # doctest: +SKIP
        >>> backend.generate([[1, 5, 9]], SamplingParams(temperature=0))[0].text  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = 64,
        dtype: str | torch.dtype = "float32",
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        if isinstance(model, str | Path):
            model_dir = Path(model)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
            tokenizer = model_dir if tokenizer is None else tokenizer
        if tokenizer is None:
            raise ValueError("pass a tokenizer (or its directory) along with a loaded model")
        if isinstance(tokenizer, str | Path):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.model = model.to(device).eval()
        # (a str or Path was loaded just above)
        self.tokenizer = cast("PreTrainedTokenizerBase", tokenizer)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self._rng = torch.Generator().manual_seed(seed)
        self._eos_ids = _eos_ids(model, self.tokenizer)
        self._pad_id = _first_not_none(self.tokenizer.pad_token_id, *sorted(self._eos_ids), 0)
        self._keeps_last_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._matchers: dict[tuple[str, ...], _StopMatcher] = {}

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding (ids a prefix may contain)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once.

        Args:
            prefixes: Token ids of each prefix (non-empty, within the vocabulary).
            sampling: Temperature (0 = greedy), top-p, top-k, stop strings, length cap, seed.

        Returns:
            One `Completion` per prefix, in order. `logprobs` holds each sampled token's
            log-probability under the distribution it was sampled from (after temperature,
            top-k and top-p); under greedy decoding, under the model's own distribution.

        Raises:
            ValueError: for an empty prefix or an id outside the vocabulary.
        """
        rows = [list(map(int, p)) for p in prefixes]
        vocab = self.vocab_size
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"prefix {i} is empty: a prefix needs at least one token")
            bad = [t for t in row if not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"prefix {i} has ids outside the vocabulary [0, {vocab}): {bad[:5]}"
                )
        if not rows:
            return []
        generator = self._rng
        if sampling.seed is not None:
            generator = torch.Generator().manual_seed(sampling.seed)
        # Row i always uses uniforms[i]: its sample is independent of the batch it lands in.
        uniforms = torch.rand((len(rows), sampling.max_new_tokens), generator=generator)
        matcher = self._matcher(sampling.stop)
        out: list[Completion | None] = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # little padding per batch
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            done = self._decode([rows[i] for i in idx], uniforms[idx], sampling, matcher)
            for i, completion in zip(idx, done, strict=True):
                out[i] = completion
        return [c for c in out if c is not None]

    def _matcher(self, stops: tuple[str, ...]) -> _StopMatcher:
        if stops not in self._matchers:
            self._matchers[stops] = _StopMatcher.build(self.tokenizer, stops)
        return self._matchers[stops]

    @torch.inference_mode()
    def _decode(
        self,
        rows: list[list[int]],
        uniforms: torch.Tensor,
        sampling: SamplingParams,
        matcher: _StopMatcher,
    ) -> list[Completion]:
        from transformers import DynamicCache

        n, width = len(rows), max(len(r) for r in rows)
        input_ids = torch.full((n, width), self._pad_id, dtype=torch.long)  # (n, L) left-padded
        mask = torch.zeros((n, width), dtype=torch.long)  # (n, L)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (n, L)
        input_ids, mask, positions = (t.to(self.device) for t in (input_ids, mask, positions))
        cache = DynamicCache()
        live = list(range(n))  # batch row -> index in `rows`, for the rows still decoding
        tokens: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        finish: list[FinishReason] = ["length"] * n
        for step in range(sampling.max_new_tokens):
            extra = {"logits_to_keep": 1} if self._keeps_last_logits else {}
            logits = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **extra,
            ).logits[:, -1, :]  # (b, V)
            token, logprob = _sample(logits.float(), uniforms[live, step], sampling)  # (b,), (b,)
            keep = []
            for b, (i, t, lp) in enumerate(
                zip(live, token.tolist(), logprob.tolist(), strict=True)
            ):
                tokens[i].append(t)
                logprobs[i].append(lp)
                if t in self._eos_ids:
                    finish[i] = "eos"
                elif matcher.hit(self.tokenizer, tokens[i]):
                    finish[i] = "stop"
                else:
                    keep.append(b)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(live):  # drop finished rows from the batch and the cache
                sel = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(sel)
                token, mask, positions = token[sel], mask[sel], positions[sel]
                live = [live[b] for b in keep]
            input_ids = token[:, None]  # (b, 1)
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)  # (b, L + step + 1)
            positions = positions[:, -1:] + 1  # (b, 1)
        return [
            self._completion(tokens[i], logprobs[i], finish[i], sampling, matcher) for i in range(n)
        ]

    def _completion(
        self,
        tokens: list[int],
        logprobs: list[float],
        finish: FinishReason,
        sampling: SamplingParams,
        matcher: _StopMatcher,
    ) -> Completion:
        shown = tokens[:-1] if finish == "eos" else tokens  # the end token is kept, not shown
        text = self.tokenizer.decode(
            shown, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if finish == "stop":
            # A multi-token stop may end inside a token: the ids keep it, the text ends at the stop.
            text = matcher.cut(text)
        return Completion(
            token_ids=tuple(tokens),
            text=text,
            logprobs=tuple(logprobs) if sampling.logprobs else (),
            finish_reason=finish,
        )


def _sample(
    logits: torch.Tensor, uniforms: torch.Tensor, sampling: SamplingParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row by inverse-CDF sampling with the given uniforms.

    Args:
        logits: Next-token logits, (b, V) float32.
        uniforms: One uniform in [0, 1) per row, (b,).
        sampling: Temperature (0 = greedy), top-k, top-p.

    Returns:
        The tokens (b,) and their log-probabilities (b,) under the sampling distribution.
    """
    if sampling.temperature == 0:
        token = logits.argmax(-1)  # (b,)
        return token, logits.log_softmax(-1).gather(-1, token[:, None])[:, 0]
    scores = logits / sampling.temperature  # (b, V)
    if 0 < sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, dim=-1).values[:, -1:]  # (b, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1:
        sorted_scores, sorted_idx = scores.sort(dim=-1, descending=True)  # (b, V)
        probs = sorted_scores.softmax(-1)
        # Drop a token once the mass strictly before it already reaches top_p (keeps >= 1).
        drop = (probs.cumsum(-1) - probs) >= sampling.top_p
        scores = scores.scatter(-1, sorted_idx, sorted_scores.masked_fill(drop, float("-inf")))
    logp = scores.log_softmax(-1)  # (b, V)
    cdf = logp.exp().cumsum(-1)  # (b, V)
    # side="right": a zero-probability token never matches, even for a uniform of exactly 0.
    target = (uniforms.to(cdf.device) * cdf[:, -1])[:, None]  # (b, 1)
    token = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)
    return token, logp.gather(-1, token[:, None])[:, 0]


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None) or model.config
    for source in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return frozenset(ids)


def _first_not_none(*values: int | None) -> int:
    return next(v for v in values if v is not None)
