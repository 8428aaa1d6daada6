"""TransformersBackend's own decode loop against Hugging Face `generate`, same model, same run.

Question: for the tiny policy, is a hand-written KV-cached decode loop faster than `generate`
with `stop_strings` and `output_scores` (what a backend needs: stops and per-token log-probs)?

Both decode the same left-padded batch of prefixes of mixed lengths, at T=1 and greedy, up to
`--max-new-tokens`, stopping at `</search>` / `</answer>`. The model is the tiny policy of
`--model-dir` (e.g. `runs/demo/tiny_policy/policy`, so actions really stop at the tags), or a
randomly initialised one of the same shape when none is given (its outputs rarely stop).
Throughput counts generated tokens up to each row's own stop, divided by wall time; each
figure is the median of `--repeats` timed runs after one warm-up run.

Run: `python -m benchmarks.perf.transformers_decode --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import tyro

from harness.policies import STOP_STRINGS, SamplingParams, TransformersBackend


@dataclass
class Args:
    """Command-line options."""

    model_dir: Path | None = None
    """A policy directory; None builds a random tiny policy (hidden 192, 3 layers)."""
    n_prefixes: int = 64
    """Prefixes per batch."""
    max_new_tokens: int = 48
    repeats: int = 3
    threads: int | None = None
    """torch threads (None: torch's default)."""
    seed: int = 0
    quick: bool = False
    """Shrink everything for a smoke test."""
    json: bool = False
    """Print one JSON object as the last line of stdout."""


def _model(args: Args) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    from harness.tiny_policy import ModelConfig, build_model, load_tokenizer, train_tokenizer

    if args.model_dir is not None:
        return AutoModelForCausalLM.from_pretrained(args.model_dir).eval(), load_tokenizer(
            args.model_dir
        )
    from envs import World

    world = World.generate(0)
    texts = [d.title + " " + d.text for d in world.documents]
    texts += [t.question for t in world.tasks]
    tokenizer = train_tokenizer(texts, vocab_size=2048)
    return build_model(ModelConfig(), tokenizer).eval(), tokenizer


def _prefixes(tokenizer: Any, n: int, seed: int) -> list[list[int]]:
    from envs import World

    world = World.generate(seed)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        task = world.tasks[i % len(world.tasks)]
        doc = world.documents[int(torch.randint(len(world.documents), (1,), generator=g))]
        text = f"Question: {task.question}\n" + f"<information>Doc 1(Title: {doc.title}) {doc.text}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        cut = int(torch.randint(max(1, len(ids) // 3), len(ids) + 1, (1,), generator=g))
        out.append([tokenizer.bos_token_id, *ids[:cut]])
    return out


def _hf_generate(
    model: Any, tokenizer: Any, prefixes: list[list[int]], sampling: SamplingParams
) -> int:
    """`generate` with stop strings and scores; returns tokens up to each row's stop."""
    width = max(len(p) for p in prefixes)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prefixes])  # (n, L)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes])  # (n, L)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=sampling.temperature > 0,
            temperature=sampling.temperature or None,
            top_k=None,
            top_p=None,
            max_new_tokens=sampling.max_new_tokens,
            stop_strings=list(sampling.stop),
            tokenizer=tokenizer,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
        )
        # Per-token log-probs of the sampled tokens, as a backend must return them.
        model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    new = out.sequences[:, width:]  # (n, T)
    total = 0
    for row in new.tolist():
        text_ids = []
        for t in row:
            text_ids.append(t)
            if t == pad or any(s in tokenizer.decode(text_ids[-3:]) for s in sampling.stop):
                break
        total += len(text_ids) - (text_ids[-1] == pad)
    return total


def main(args: Args) -> dict[str, Any]:
    """Time both decoders on the same batch, greedy and at T=1."""
    if args.quick:
        args.n_prefixes, args.max_new_tokens, args.repeats = 8, 8, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = _model(args)
    prefixes = _prefixes(tokenizer, args.n_prefixes, args.seed)
    backend = TransformersBackend(model, tokenizer, batch_size=args.n_prefixes)
    results: dict[str, Any] = {}
    for name, temperature in (("sampled", 1.0), ("greedy", 0.0)):
        sampling = SamplingParams(
            temperature=temperature, max_new_tokens=args.max_new_tokens, stop=STOP_STRINGS, seed=1
        )

        def ours(s: SamplingParams = sampling) -> int:
            return sum(c.n_tokens for c in backend.generate(prefixes, s))

        def theirs(s: SamplingParams = sampling) -> int:
            return _hf_generate(model, tokenizer, prefixes, s)

        row = {}
        for label, fn in (("own_loop", ours), ("hf_generate", theirs)):
            fn()  # warm-up
            rates = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                n = fn()
                rates.append(n / (time.perf_counter() - start))
            row[f"{label}_tokens_per_s"] = round(statistics.median(rates), 1)
        row["own_over_hf"] = round(
            row["own_loop_tokens_per_s"] / row["hf_generate_tokens_per_s"], 2
        )
        results[name] = row
    results["meta"] = _meta(args)
    return results


def _meta(args: Args) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model_dir": str(args.model_dir) if args.model_dir else "random tiny policy",
        "n_prefixes": args.n_prefixes,
        "max_new_tokens": args.max_new_tokens,
        "argv": sys.argv[1:],
    }


if __name__ == "__main__":
    cli_args = tyro.cli(Args)
    result = main(cli_args)
    for mode in ("sampled", "greedy"):
        r = result[mode]
        print(
            f"{mode:8s} own loop {r['own_loop_tokens_per_s']:8.0f} tok/s   "
            f"HF generate {r['hf_generate_tokens_per_s']:8.0f} tok/s   "
            f"ratio {r['own_over_hf']:.2f}x",
            file=sys.stderr,
        )
    if cli_args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
