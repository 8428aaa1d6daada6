"""Interop: each peer's search client against `tracerl serve-retriever`, and scoring vs FlashRAG.

Part 1, the peers' clients. A synthetic world's BM25 index is served by
`tracerl serve-retriever --index DIR --port 0` in a subprocess, with no flag for any peer, and
one scripted episode per client runs against it: the expert's query for each hop in a
`<search>` action, then the final answer in an `<answer>` action.

- Search-R1 ships no package, so its client is `search_r1_request` / `search_r1_documents` /
  `passages_text` in `retrieval.peers`, written from its `generation.py` (`_batch_search` posts JSON
  `{"queries", "topk", "return_scores": true}` and reads `result`; `_passages2string` formats the
  observation), and the answer is scored with EM.
- SkyRL-gym: the real `skyrl_gym.envs.search.env.SearchEnv` (skyrl-gym 0.4.0) with its
  `search_url`, scored by SkyRL's own reward.
- GEM: the real `gem.tools.search_tool.SearchTool` (gem-llm 0.1.0) inside GEM's
  `ToolEnvWrapper(QaEnv)`, scored by GEM's own reward.

Reported per client: the reward, the searches made, and how many hops' answers appeared in the
observations (every hop's, when the documents reached the client intact). A peer package that is
not installed is reported as skipped, with the reason.

Part 2, scoring. `envs.rewards.score_answer` is compared with the installed FlashRAG metrics
(flashrag-dev 0.1.2: `ExactMatch`, `Sub_ExactMatch`, `F1_Score`) on prediction/gold pairs made
from the world's and the shared datasets' gold answers (exact, re-cased, with articles and
punctuation, inside a sentence, truncated, another task's answer, empty, yes/no, string golds).
Reported: the pairs, the disagreements per score, how many of the sub-EM disagreements the
documented empty-gold rule explains (all of them, or the run fails), and pairs with sub-EM < EM.

Install the peers without their heavy dependencies:
`pip install --no-deps skyrl-gym==0.4.0 gem-llm==0.1.0 flashrag-dev==0.1.2` (and the modules
their imports ask for; see docs/retrieval.md). Run: `python -m benchmarks.perf.interop --json`.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import tyro

from benchmarks.meta import run_meta
from benchmarks.perf.retrieval_server import start_server
from envs import World, WorldConfig
from envs.rewards import exact_match, normalize_answer, score_answer
from envs.tasks import as_gold_answers
from retrieval.peers import (
    Script,
    gem_episode,
    passages_text,
    search_r1_documents,
    search_r1_request,
    skyrl_episode,
)

# --- part 1: one episode per client ------------------------------------------------------------


def _hops_seen(script: Script, observations: Sequence[str]) -> int:
    return sum(
        a.lower() in obs.lower() for a, obs in zip(script.hop_answers, observations, strict=True)
    )


def search_r1_episode(url: str, script: Script, topk: int) -> dict[str, Any]:
    """Search-R1's client: one batch request per `<search>`, EM on the answer."""
    observations = []
    with httpx.Client(timeout=60) as client:
        for query in script.queries:
            body, headers = search_r1_request([query], topk)
            response = client.post(f"{url}/retrieve", content=body, headers=headers)
            response.raise_for_status()
            docs = search_r1_documents(response.content)[0]
            observations.append(f"\n\n<information>{passages_text(docs).strip()}</information>\n\n")
    reward = exact_match(script.answer, script.golds)
    return {"reward": reward, "observations": observations}


EPISODES: dict[str, tuple[Callable[[str, Script, int], dict[str, Any]], str | None]] = {
    "search-r1": (search_r1_episode, None),
    "skyrl-gym": (skyrl_episode, "skyrl_gym.envs.search.env"),
    "gem": (gem_episode, "gem.tools.search_tool"),
}
"""Client -> (episode, the peer module it needs, or None)."""


def _missing(module: str | None) -> str | None:
    """Why a peer cannot run here (its import error), or None."""
    if module is None:
        return None
    try:
        __import__(module)
    except ImportError as err:
        return f"{module} is not importable: {err}"
    return None


def run_peer_episodes(url: str, scripts: Sequence[Script], topk: int) -> dict[str, Any]:
    """Every client's episodes against the server at `url`."""
    out: dict[str, Any] = {}
    for name, (episode, module) in EPISODES.items():
        reason = _missing(module)
        if reason is not None:
            out[name] = {"skipped": reason}
            continue
        runs = [(s, episode(url, s, topk)) for s in scripts]
        out[name] = {
            "episodes": len(runs),
            "mean_reward": sum(r["reward"] for _, r in runs) / len(runs),
            "searches": sum(len(s.queries) for s, _ in runs),
            "hops_seen": sum(_hops_seen(s, r["observations"]) for s, r in runs),
            "first_observation": runs[0][1]["observations"][0][:300],
        }
    return out


def world_scripts(world: World, n: int) -> list[Script]:
    """The first `n` questions of `world` with their expert decompositions."""
    scripts = []
    for task in list(world.tasks)[:n]:
        d = world.decomposition(task.task_id)
        scripts.append(
            Script(
                question=task.question,
                golds=task.golden_answers,
                queries=tuple(s.query for s in d.steps),
                hop_answers=tuple(s.answer for s in d.steps),
                answer=d.answer,
            )
        )
    return scripts


# --- part 2: scoring against FlashRAG -----------------------------------------------------------


def _variants(gold: str, other: str, rng: random.Random) -> Iterator[str]:
    yield gold
    yield gold.upper()
    yield f"The {gold}."
    yield f"It was {gold}, I think"
    yield gold[: max(1, len(gold) // 2)]
    yield other
    yield rng.choice(["", "The", "a", "yes", "no", "no answer", "noanswer", "N/A", "—"])


def scoring_pairs(golds: Sequence[tuple[str, ...]], seed: int) -> list[tuple[str, Any]]:
    """Prediction/gold pairs made from real gold lists.

    Each prediction is scored against the list and, as a bare string, against its first gold;
    each first gold is also scored against an empty or article-only gold.
    """
    rng = random.Random(seed)
    pairs: list[tuple[str, Any]] = []
    for answers in golds:
        other = rng.choice(golds)[0]
        for pred in _variants(answers[0], other, rng):
            pairs += [(pred, list(answers)), (pred, answers[0])]
        pairs.append((answers[0], rng.choice(["The", "", "the The", "an"])))
    return pairs


def compare_with_flashrag(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """Disagreements between `score_answer` and the installed FlashRAG metrics on `pairs`."""
    from flashrag.evaluator.metrics import ExactMatch, F1_Score, Sub_ExactMatch

    config = {"dataset_name": "nq"}  # any name but curatedtrec, whose golds are regexes
    em, sub, f1 = ExactMatch(config), Sub_ExactMatch(config), F1_Score(config)
    counts = {"em": 0, "f1": 0, "sub_em": 0, "sub_em_documented": 0, "sub_em_below_em": 0}
    examples: list[Any] = []
    for pred, golds in pairs:
        ours = score_answer(pred, golds)
        counts["em"] += ours.em != em.calculate_em(pred, golds)
        counts["f1"] += ours.f1 != f1.token_level_scores(pred, golds)["f1"]
        counts["sub_em_below_em"] += ours.sub_em < ours.em
        theirs = sub.calculate_sub_em(pred, golds)
        if ours.sub_em != theirs:
            counts["sub_em"] += 1
            documented = (
                theirs == 1.0
                and normalize_answer(pred) != ""
                and any(normalize_answer(g) == "" for g in as_gold_answers(golds))
            )
            counts["sub_em_documented"] += documented
            if len(examples) < 3:
                examples.append([pred, golds])
    return {"pairs": len(pairs), "disagreements": counts, "sub_em_examples": examples}


def _shared_golds(data_dir: Path, per_file: int) -> list[tuple[str, ...]]:
    from envs.qa_datasets import load_file

    golds: list[tuple[str, ...]] = []
    for path in sorted(data_dir.rglob("*.jsonl"))[:8]:
        try:
            golds += [t.golden_answers for t in load_file(path, limit=per_file).tasks]
        except Exception as err:  # a sample in a format no loader takes: skip, say so
            print(f"skipped {path.name}: {err}", file=sys.stderr)
    return golds


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Args:
    """Interop benchmark options."""

    n_episodes: int = 5
    """scripted episodes per client (the world's first questions)"""
    topk: int = 3
    """documents per search (Search-R1's default)"""
    world_seed: int = 0
    """the synthetic world served"""
    data_dir: Path = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    """the shared real dataset samples, for gold answers (the world's only if absent)"""
    golds_per_file: int = 100
    """tasks read from each shared sample file"""
    json: bool = False
    """print one JSON object as the last line of stdout"""


def main(args: Args) -> dict[str, Any]:
    """Serve a world's index, run every client's episodes, compare scoring with FlashRAG."""
    world = World.generate(args.world_seed, WorldConfig())
    scripts = world_scripts(world, args.n_episodes)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = world.export(tmp)["corpus"]
        index_dir = Path(tmp) / "bm25"
        build = [sys.executable, "-m", "benchmarks.cli", "-q", "index", "build"]
        subprocess.run([*build, "--corpus", str(corpus), "--out", str(index_dir)], check=True)
        proc, url = start_server(index_dir)
        try:
            start = time.perf_counter()
            episodes = run_peer_episodes(url, scripts, args.topk)
            episodes_s = time.perf_counter() - start
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    golds = [t.golden_answers for t in world.tasks]
    if args.data_dir.is_dir():
        golds += _shared_golds(args.data_dir, args.golds_per_file)
    scoring = compare_with_flashrag(scoring_pairs(golds, seed=0))
    return {
        "server_command": "tracerl serve-retriever --index DIR --port 0",
        "episodes": episodes,
        "episodes_s": episodes_s,
        "scoring": scoring,
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def cli(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.perf.interop [--json]`."""
    args = tyro.cli(Args, args=argv)
    try:
        import flashrag.evaluator.metrics  # noqa: F401 - part 2 needs it
    except ImportError as err:
        raise SystemExit(
            f"benchmarks.perf.interop: flashrag-dev is needed ({err}); "
            "pip install --no-deps flashrag-dev==0.1.2"
        ) from err
    result = main(args)
    for name, report in result["episodes"].items():
        print(f"{name:<10} {report}", file=sys.stderr)
    print(f"scoring: {result['scoring']}", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
    counts = result["scoring"]["disagreements"]
    undocumented = counts["sub_em"] - counts["sub_em_documented"]
    if undocumented or counts["em"] or counts["f1"] or counts["sub_em_below_em"]:
        print("scoring differs from FlashRAG beyond the documented rule", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
