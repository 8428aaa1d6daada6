"""`tracerl bench compare RUN ...`: which agent is better, on the questions the runs share.

Each run folder's `trajectories.jsonl` holds one episode per (agent, question). Every agent of
every run is one row; the first agent of the first run is the reference. Only the questions
that every agent answered are compared, so each difference is paired on the question: EM and
F1 minus the reference's, with a 95 % percentile-bootstrap interval over questions
(`harness.evaluation.stats.paired_difference`). Beside the scores, what each agent spent per
question: generated and prompt tokens, tool calls and seconds waiting for its endpoint, and
the p50 / p99 latency of its requests (agents behind an endpoint; `–` for the others). The
same table is repeated per dataset and per question kind, and `compare.png` draws EM and F1
with their intervals.

Writes OUT/compare.md, OUT/compare.json and OUT/compare.png, and prints the Markdown.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro

from envs.qa_datasets import BenchmarkError
from harness.evaluation.runs import read_finished, write_atomic
from harness.evaluation.stats import Estimate, bootstrap_mean, paired_difference
from harness.rollout.evaluation import EpisodeRecord

__all__ = ["CompareConfig", "Row", "bench_compare", "compare_agents", "load_runs"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CompareConfig:
    """Compare bench runs on the questions they share: paired EM / F1 differences and costs."""

    runs: tyro.conf.Positional[tuple[Path, ...]]
    """Run folders (`tracerl bench --out`); the first run's first agent is the reference."""
    out: Path = Path("runs/compare")
    """Where compare.md, compare.json and compare.png go."""
    seed: int = 0
    """Seeds the bootstrap."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One agent on one group of the shared questions."""

    agent: str
    n: int
    em: Estimate
    f1: Estimate
    em_diff: Estimate | None
    """EM minus the reference's, paired on the question (None for the reference)."""
    f1_diff: Estimate | None
    generated_tokens: float
    """Per question."""
    prompt_tokens: float | None
    """Per question, summed over its requests; None when the endpoint did not say."""
    tool_calls: float
    """Per question."""
    request_s: float | None
    """Seconds per question spent waiting for the endpoint; None for agents without one."""
    latency_p50: float | None
    latency_p99: float | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "agent": self.agent,
            "n": self.n,
            "em": self.em.to_json(),
            "f1": self.f1.to_json(),
            "em_diff": None if self.em_diff is None else self.em_diff.to_json(),
            "f1_diff": None if self.f1_diff is None else self.f1_diff.to_json(),
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tool_calls": self.tool_calls,
            "request_s": self.request_s,
            "latency_p50_s": self.latency_p50,
            "latency_p99_s": self.latency_p99,
        }


def load_runs(runs: Sequence[Path]) -> dict[str, dict[str, EpisodeRecord]]:
    """Every agent's episodes, labelled `RUN/agent` when two runs are compared.

    Raises:
        BenchmarkError: a folder without trajectories, or with an unreadable line.
    """
    agents: dict[str, dict[str, EpisodeRecord]] = {}
    for run in runs:
        path = run / "trajectories.jsonl"
        if not path.is_file():
            raise BenchmarkError(f"{run}: no trajectories.jsonl (is it a `tracerl bench` --out?)")
        for agent, episodes in read_finished(path).items():
            label = agent if len(runs) == 1 else f"{run.name}/{agent}"
            if label in agents:  # two runs in folders of one name: their paths tell them apart
                label = f"{run}/{agent}"
            if label in agents:
                raise BenchmarkError(f"{run} is named twice")
            agents[label] = episodes
    if not agents:
        raise BenchmarkError(f"{', '.join(map(str, runs))}: no episodes to compare")
    return agents


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _row(
    agent: str,
    episodes: Sequence[EpisodeRecord],
    reference: Sequence[EpisodeRecord] | None,
    seed: int,
) -> Row:
    """The scores and costs of `episodes`; differences against `reference` (same order)."""

    def diff(key: str) -> Estimate | None:
        if reference is None:
            return None
        before = {r.task_id: float(getattr(r, key)) for r in reference}
        after = {r.task_id: float(getattr(r, key)) for r in episodes}
        return paired_difference(before, after, seed=seed)

    turns = [t for r in episodes for t in r.turns]
    latencies = [t.latency_s for t in turns if t.latency_s is not None]
    prompts = [t.n_prompt_tokens for t in turns if t.n_prompt_tokens is not None]
    n = len(episodes)
    return Row(
        agent=agent,
        n=n,
        em=bootstrap_mean([r.em for r in episodes], seed=seed),
        f1=bootstrap_mean([r.f1 for r in episodes], seed=seed),
        em_diff=diff("em"),
        f1_diff=diff("f1"),
        generated_tokens=sum(r.n_tokens for r in episodes) / n,
        prompt_tokens=sum(prompts) / n if prompts else None,
        tool_calls=sum(r.n_tool_calls for r in episodes) / n,
        request_s=sum(latencies) / n if latencies else None,
        latency_p50=_percentile(latencies, 50),
        latency_p99=_percentile(latencies, 99),
    )


def _kind(record: EpisodeRecord) -> str:
    return f"{record.dataset}/{record.question_type or '-'}"


def compare_agents(
    agents: Mapping[str, Mapping[str, EpisodeRecord]], *, seed: int = 0
) -> dict[str, dict[str, list[Row]]]:
    """Rows overall, per dataset and per question kind, on the questions every agent played.

    Returns:
        `{"overall": {"all": rows}, "dataset": {name: rows}, "kind": {dataset/type: rows}}`,
        each `rows` in agent order, the reference first.

    Raises:
        BenchmarkError: the agents share no question (one line, naming them).
    """
    names = list(agents)
    shared = set.intersection(*(set(episodes) for episodes in agents.values()))
    if not shared:
        raise BenchmarkError(
            f"{' and '.join(names)} share no question: compare runs over the same questions "
            "(the same --dataset / --data-file, --limit or --sample)"
        )
    order = sorted(shared)
    groupings: dict[str, Callable[[EpisodeRecord], str]] = {
        "overall": lambda r: "all",
        "dataset": lambda r: r.dataset,
        "kind": _kind,
    }
    reference = agents[names[0]]
    out: dict[str, dict[str, list[Row]]] = {}
    for grouping, key in groupings.items():
        groups: dict[str, list[str]] = {}
        for task_id in order:
            groups.setdefault(key(reference[task_id]), []).append(task_id)
        out[grouping] = {
            group: [
                _row(
                    name,
                    [agents[name][t] for t in ids],
                    None if i == 0 else [reference[t] for t in ids],
                    seed,
                )
                for i, name in enumerate(names)
            ]
            for group, ids in sorted(groups.items())
        }
    return out


def _cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _diff_cell(estimate: Estimate | None) -> str:
    return "(reference)" if estimate is None else estimate.format(signed=True)


HEADERS = (
    "agent",
    "n",
    "EM",
    "EM diff [95% CI]",
    "F1",
    "F1 diff [95% CI]",
    "gen tok/q",
    "prompt tok/q",
    "tool calls/q",
    "request s/q",
    "p50 s",
    "p99 s",
)


def markdown_table(rows: Sequence[Row]) -> str:
    """One Markdown table, a row per agent."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|---|" + "---:|" * (len(HEADERS) - 1)]
    for row in rows:
        cells = [
            row.agent,
            str(row.n),
            f"{row.em.mean:.3f}",
            _diff_cell(row.em_diff),
            f"{row.f1.mean:.3f}",
            _diff_cell(row.f1_diff),
            f"{row.generated_tokens:.1f}",
            _cell(row.prompt_tokens, ".1f"),
            f"{row.tool_calls:.2f}",
            _cell(row.request_s, ".2f"),
            _cell(row.latency_p50, ".3f"),
            _cell(row.latency_p99, ".3f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(tables: Mapping[str, Mapping[str, Sequence[Row]]], runs: Sequence[Path]) -> str:
    """compare.md: the runs, then a table overall, per dataset and per question kind."""
    overall = tables["overall"]["all"]
    lines = [
        "# tracerl bench compare",
        "",
        f"Runs: {', '.join(f'`{r}`' for r in runs)}. {overall[0].n} questions every agent "
        f"played; differences are against `{overall[0].agent}`, paired on the question, with "
        "95 % percentile-bootstrap intervals over questions. Costs are per question; request "
        "s and the latency percentiles are for agents behind an endpoint (– otherwise).",
        "",
        "## Overall",
        "",
        markdown_table(overall),
        "",
    ]
    for grouping, title in (("dataset", "Per dataset"), ("kind", "Per question kind")):
        lines += [f"## {title}", ""]
        for group, rows in tables[grouping].items():
            lines += [f"### {group}", "", markdown_table(rows), ""]
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path) -> Path:
    """EM and F1 per agent with their intervals (left), and each difference (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = max(2.8, 0.55 * len(rows) + 1.6)
    fig, (scores, diffs) = plt.subplots(1, 2, figsize=(10.0, height), layout="constrained")
    y = np.arange(len(rows))
    for offset, metric, color in ((-0.17, "em", "C0"), (0.17, "f1", "C1")):
        estimates = [getattr(r, metric) for r in rows]
        means = np.array([e.mean for e in estimates])
        errors = np.array(
            [[e.mean - e.low for e in estimates], [e.high - e.mean for e in estimates]]
        )
        scores.errorbar(means, y + offset, xerr=errors, fmt="o", color=color, capsize=3,
                        label=metric.upper())  # fmt: skip
        compared = [(i, getattr(r, f"{metric}_diff")) for i, r in enumerate(rows)]
        compared = [(i, d) for i, d in compared if d is not None]
        if compared:
            at = np.array([i for i, _ in compared]) + offset
            mean = np.array([d.mean for _, d in compared])
            err = np.array([[d.mean - d.low for _, d in compared],
                            [d.high - d.mean for _, d in compared]])  # fmt: skip
            diffs.errorbar(mean, at, xerr=err, fmt="o", color=color, capsize=3,
                           label=metric.upper())  # fmt: skip
    labels = [r.agent for r in rows]
    for ax in (scores, diffs):
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top, every row inside
        ax.grid(axis="x", alpha=0.3)
    scores.set_xlim(-0.02, 1.02)
    scores.set_xlabel("score (95 % CI over questions)")
    scores.set_title(f"EM and F1 on {rows[0].n} shared questions", fontsize=10)
    diffs.axvline(0.0, color="0.4", linewidth=1)
    diffs.annotate("reference", (0.0, 0), xytext=(-4, 0), textcoords="offset points",
                   ha="right", va="center", fontsize=8, color="0.3")  # fmt: skip
    diffs.set_xlabel(f"minus {rows[0].agent} (paired, 95 % CI)")
    diffs.set_title("Difference against the reference", fontsize=10)
    fig.legend(*scores.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bench_compare(argv: list[str]) -> int:
    """`tracerl bench compare RUN ...`; 0 on success, 2 on bad input (one line)."""
    config = tyro.cli(CompareConfig, args=argv, prog="tracerl bench compare")
    try:
        if not config.runs:
            raise BenchmarkError("name at least one run folder (`tracerl bench --out DIR`)")
        agents = load_runs(config.runs)
        if len(agents) < 2:
            raise BenchmarkError(f"{config.runs[0]}: one agent; name another run to compare with")
        tables = compare_agents(agents, seed=config.seed)
    except BenchmarkError as err:
        print(f"tracerl bench compare: {err}", file=sys.stderr)
        return 2
    text = markdown(tables, config.runs)
    config.out.mkdir(parents=True, exist_ok=True)
    payload = {
        grouping: {group: [r.to_json() for r in rows] for group, rows in groups.items()}
        for grouping, groups in tables.items()
    }
    payload["runs"] = [str(r) for r in config.runs]  # type: ignore[assignment]
    write_atomic(config.out / "compare.md", text + "\n")
    write_atomic(config.out / "compare.json", json.dumps(payload, indent=1) + "\n")
    tmp = plot(tables["overall"]["all"], config.out / ".compare.tmp.png")
    tmp.replace(config.out / "compare.png")
    print(text)
    print(f"wrote {config.out / 'compare.md'}, compare.json, compare.png")
    return 0
