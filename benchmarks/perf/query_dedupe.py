"""How often do GRPO's samples of one prompt search for the same thing?

GRPO samples G episodes per prompt and, in lockstep, sends each turn's searches together:
Search-R1's client posts all of them in one `/retrieve` request, duplicates included. The
retrieval server's micro-batcher searches each distinct (query, k) of a batch once
(`retrieval.batching`), so the share of duplicates in a turn's batch is the share of encoder and
index work it saves.

This plays the shipped tiny policy (`harness.tiny_policy.SHIPPED_DIR`) on its synthetic world:
`--samples` episodes per training prompt at temperature 1, all turns batched across episodes as
the trainer batches them, and counts the searches of each turn after the env's own
normalisation (what a server receives), per turn and within each prompt's group.

Run: `python -m benchmarks.perf.query_dedupe --json` (`--quick`: 6 prompts).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import tyro

from benchmarks.meta import run_meta

__all__ = ["Args", "main"]


@dataclass
class Args:
    """Options of the duplicate-query measurement."""

    n_prompts: int = 48
    """training prompts of the tiny policy's world"""
    samples: int = 8
    """episodes per prompt (GRPO's group size)"""
    temperature: float = 1.0
    seed: int = 0
    quick: bool = False
    """a smoke test: 6 prompts"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.n_prompts = 6


def main(args: Args) -> dict[str, Any]:
    """Play the episodes and count duplicate searches per turn."""
    from envs.protocol import parse_action
    from harness.policies import SamplingParams, TransformersBackend
    from harness.rollout import EpisodeCodec, advance, start_episodes
    from harness.tiny_policy import ARTIFACTS_FILE, SHIPPED_DIR, PolicyArtifacts

    record = json.loads((SHIPPED_DIR / ARTIFACTS_FILE).read_text())
    artifacts = PolicyArtifacts.from_json(record, SHIPPED_DIR)
    env = artifacts.make_env()
    prompts = list(artifacts.split["train"])[: args.n_prompts]
    task_ids = [p for p in prompts for _ in range(args.samples)]
    backend = TransformersBackend(artifacts.policy_dir, seed=args.seed)
    codec = EpisodeCodec(tokenizer=artifacts.load_tokenizer())
    episodes = start_episodes(env, task_ids, codec)
    sampling = SamplingParams(temperature=args.temperature, logprobs=False)
    turn = 0
    while not all(e.done for e in episodes):
        advance(
            backend, episodes, codec, dataclasses.replace(sampling, seed=args.seed * 1_000 + turn)
        )
        turn += 1

    by_turn: dict[int, list[tuple[str, str]]] = defaultdict(list)  # turn -> (prompt, query)
    for episode in episodes:
        for t, played in enumerate(episode.turns):
            parsed = parse_action(played.completion.text)
            if parsed.kind == "search":
                by_turn[t].append((episode.task_id, parsed.content))
    turns = []
    for t in sorted(by_turn):
        pairs = by_turn[t]
        groups: dict[str, list[str]] = defaultdict(list)
        for prompt, query in pairs:
            groups[prompt].append(query)
        distinct_in_group = [len(set(qs)) / len(qs) for qs in groups.values()]
        turns.append(
            {
                "turn": t + 1,
                "searches": len(pairs),
                "distinct": len({q for _, q in pairs}),
                "duplicate_share": 1 - len({q for _, q in pairs}) / len(pairs),
                "mean_distinct_share_within_prompt": float(np.mean(distinct_in_group)),
                "prompts_all_same_query": sum(len(set(qs)) == 1 for qs in groups.values()),
                "prompts": len(groups),
            }
        )
    total = sum(t["searches"] for t in turns)
    distinct = sum(t["distinct"] for t in turns)
    return {
        "n_prompts": len(prompts),
        "samples": args.samples,
        "turns": turns,
        "first_turn_duplicate_share": turns[0]["duplicate_share"] if turns else None,
        "all_turns_duplicate_share": 1 - distinct / total if total else None,
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """Per turn: searches, distinct, duplicate share."""
    print(f"{'turn':>4} {'searches':>8} {'distinct':>8} {'dup share':>9} {'same in group':>13}")
    for t in result["turns"]:
        print(
            f"{t['turn']:>4} {t['searches']:>8} {t['distinct']:>8} {t['duplicate_share']:>9.3f} "
            f"{t['prompts_all_same_query']:>6} / {t['prompts']:<5}"
        )


if __name__ == "__main__":
    parsed = tyro.cli(Args)
    out = main(parsed)
    print_table(out)
    if parsed.json:
        print(json.dumps(out, sort_keys=True), flush=True)
    sys.exit(0)
