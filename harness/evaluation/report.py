"""Write evaluation reports: JSON, a Markdown table, every trajectory as JSONL, and a plot.

One run may evaluate several agents on the same questions (the default run compares the
scripted oracle and naive agents), so each file holds all of them:

- `report.json`: `{"schema_version", "meta", "reports": [Report.to_json(), ...]}`, where `meta`
  is what the run shares (dataset hashes, index manifest, env settings, seed, command line);
- `report.md`: tables overall, per dataset, per question type and per hop count;
- `trajectories.jsonl`: one episode per line, with its agent's name;
- `report.png`: EM per question type and agent (a heatmap), and the distribution of searches
  per question.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from harness.evaluation.runs import write_atomic
from harness.rollout.evaluation import SCHEMA_VERSION, Metrics, Report

__all__ = [
    "ACC_NOTE",
    "COLUMNS",
    "markdown_report",
    "markdown_table",
    "metric_cells",
    "plot_reports",
    "retrieval_setting",
    "write_reports",
]

log = logging.getLogger(__name__)

Group = Literal["overall", "dataset", "type", "hops"]

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("n", "n", "d"),
    ("EM", "em", ".3f"),
    ("F1", "f1", ".3f"),
    ("acc", "sub_em", ".3f"),
    ("answered", "answered", ".3f"),
    ("valid", "valid_action_rate", ".3f"),
    ("searches", "searches", ".2f"),
    ("turns", "turns", ".2f"),
    ("tokens", "tokens", ".1f"),
    ("recall", "recall", ".3f"),
)
"""(header, Metrics field, format) of every table column: the strict metrics first."""

ACC_NOTE = (
    "acc is sub-EM, FlashRAG's `acc`: some gold answer occurs inside the prediction. It is "
    'lenient ("no" matches "November"); EM and F1 are the strict metrics.'
)


def metric_cells(metrics: Metrics) -> list[str]:
    """A row's metric cells, formatted as `COLUMNS` says (unknown values as "–")."""
    return [_cell(getattr(metrics, field), spec) for _, field, spec in COLUMNS]


def retrieval_setting(retriever: Mapping[str, Any]) -> tuple[str, str | None]:
    """One line saying what the agents searched, and a warning when it flatters them.

    >>> retrieval_setting({"corpus": "c.jsonl", "kind": "BM25Retriever", "n_documents": 9,
    ...                    "top_k": 3, "distractor_pool": False})
    ('retrieval: BM25Retriever over c.jsonl, 9 documents, top-3', None)
    """
    where = retriever.get("corpus") or retriever.get("spec") or "?"
    n = retriever.get("n_documents")
    size = f"{n:,} documents" if isinstance(n, int) else "size unknown"
    line = f"retrieval: {retriever.get('kind')} over {where}, {size}, top-{retriever.get('top_k')}"
    warning = None
    if retriever.get("distractor_pool"):
        warning = (
            "WARNING: retrieval searches the pooled paragraphs shipped with the questions (the "
            "distractor pool), far easier than e5 over wiki-18's 21M passages; these numbers "
            "are not comparable with Search-R1 or FlashRAG tables"
        )
    return line, warning


def _groups(report: Report, group: Group) -> dict[str, Metrics]:
    if group == "overall":
        return {"all": report.overall}
    if group == "dataset":
        return report.by_dataset
    if group == "type":
        return report.by_type
    return report.by_hops


def _cell(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def markdown_table(reports: Sequence[Report], group: Group) -> str:
    """One Markdown table: a row per (agent, group), a column per metric.

    >>> from harness.rollout.evaluation import EpisodeRecord
    >>> ep = EpisodeRecord(task_id="q", dataset="d", question="?", golden_answers=("a",),
    ...     question_type="t", n_hops=2, answer="a", em=1.0, sub_em=1.0, f1=1.0, end="answer",
    ...     n_tool_calls=1, n_tokens=0, retrieved_doc_ids=(), supporting_doc_ids=(), turns=())
    >>> print(markdown_table([Report(agent="x", episodes=(ep,))], "type"))
    | agent | type | n | EM | F1 | acc | answered | valid | searches | turns | tokens | recall |
    |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
    | x | d/t | 1 | 1.000 | 1.000 | 1.000 | 1.000 | 0.000 | 1.00 | 0.00 | 0.0 | – |
    """
    headers = ["agent", group, *(h for h, _, _ in COLUMNS)]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    for report in reports:
        for name, metrics in _groups(report, group).items():
            lines.append("| " + " | ".join([report.agent, name, *metric_cells(metrics)]) + " |")
    return "\n".join(lines)


def markdown_report(reports: Sequence[Report], meta: Mapping[str, Any]) -> str:
    """report.md: what was run, then the four tables."""
    dataset = meta.get("dataset", {})
    lines = ["# tracerl bench", ""]
    partial = meta.get("partial")
    if partial:
        lines += [
            f"**PARTIAL REPORT**: {partial['error']}. Rerun the command with `--resume` to "
            "finish it.",
            "",
        ]
    if meta.get("command"):
        lines += ["```", str(meta["command"]), "```", ""]
    if dataset:
        lines.append(
            f"- dataset: `{dataset.get('name')}`, {dataset.get('n_tasks')} questions, "
            f"tasks sha256 `{str(dataset.get('tasks_sha256', ''))[:16]}`"
        )
    retriever = meta.get("retriever", {})
    if retriever:
        setting, warning = retrieval_setting(retriever)
        lines.append(f"- {setting}; index `{retriever.get('index_id')}`")
        if warning:
            lines.append(f"- **{warning}**")
    env = meta.get("env", {})
    if env:
        lines.append(
            f"- env: max_turns={env.get('max_turns')}, top_k={env.get('top_k')}, "
            f"reward={env.get('reward')}, seed={meta.get('seed')}"
        )
    for name, why in meta.get("skipped", {}).items():
        lines.append(f"- {name}: {why['n']} questions skipped: {why['reason']}")
    lines += [
        "- metrics: EM / F1 of the parsed `<answer>` only (SQuAD normalisation, best over "
        "aliases); no answer scores 0. " + ACC_NOTE + " valid = valid actions / actions; "
        "searches, turns, tokens per question; recall = supporting documents retrieved "
        "(– when unknown).",
        "",
    ]
    for title, group in (
        ("Overall", "overall"),
        ("Per dataset", "dataset"),
        ("Per question type", "type"),
        ("Per hop count", "hops"),
    ):
        lines += [f"## {title}", "", markdown_table(reports, group), ""]  # type: ignore[arg-type]
    return "\n".join(lines)


def plot_reports(reports: Sequence[Report], path: str | Path) -> Path:
    """Two panels: EM per question type and agent (a heatmap), and searches per question.

    A heatmap, not grouped bars: the demo's six reports over eighteen question kinds made 108
    bars whose labels and legend covered each other. Each cell says its EM and how many
    questions it rests on; the legend of the searches panel sits below the figure, outside
    the data.

    Returns:
        The PNG's path.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt
    import numpy as np

    path = Path(path)
    types = sorted({key for r in reports for key in r.by_type})
    em = np.full((len(types), len(reports)), np.nan)
    counts = np.zeros((len(types), len(reports)), dtype=int)
    for j, report in enumerate(reports):
        for i, name in enumerate(types):
            metrics = report.by_type.get(name)
            if metrics is not None:
                em[i, j], counts[i, j] = metrics.em, metrics.n
    heat_w = 2.6 + 1.05 * len(reports)  # inches: the row labels, then a column per agent
    height = max(3.6, 0.3 * len(types) + 2.2)
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(heat_w + 5.0, height),
        layout="constrained",
        width_ratios=(heat_w, 4.4),
    )
    image = left.imshow(em, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for (i, j), value in np.ndenumerate(em):
        if not np.isnan(value):
            color = "black" if value > 0.6 else "white"
            left.text(j, i, f"{value:.2f} n={counts[i, j]}", ha="center", va="center",
                      fontsize=6.5, color=color)  # fmt: skip
    left.set_xticks(np.arange(len(reports)), [_wrapped(r.agent) for r in reports], fontsize=7)
    left.set_yticks(np.arange(len(types)), types, fontsize=7)
    left.set_title("EM per question type", fontsize=10)
    fig.colorbar(image, ax=left, shrink=0.8, label="EM")
    max_searches = max(max(r.overall.searches_hist, default=0) for r in reports)
    bins = np.arange(max_searches + 1)
    for report in reports:
        hist = report.overall.searches_hist
        share = np.array([hist.get(int(b), 0) for b in bins], dtype=float) / report.overall.n
        right.plot(bins, share, marker="o", label=report.agent)
    right.set_xticks(bins)
    right.set_xlabel("searches per question")
    right.set_ylabel("share of questions")
    right.set_ylim(bottom=0.0)
    right.grid(alpha=0.3)
    right.set_title("Distribution of searches", fontsize=10)
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _wrapped(label: str) -> str:
    """`warm start (unseen)` on two lines, so a column's label fits its column."""
    return label.replace(" (", "\n(", 1)


def write_reports(
    reports: Sequence[Report], directory: str | Path, *, meta: Mapping[str, Any]
) -> dict[str, Path]:
    """Write report.json, report.md, trajectories.jsonl and report.png into `directory`.

    Returns:
        The paths written, by role (`json`, `markdown`, `trajectories`, `plot`).

    Raises:
        ValueError: no reports, or two reports with the same agent name.
    """
    if not reports and not meta.get("partial"):
        raise ValueError("no reports to write")
    names = [r.agent for r in reports]
    if len(set(names)) != len(names):
        raise ValueError(f"agent names must be unique in one report, got {names}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": directory / "report.json",
        "markdown": directory / "report.md",
        "trajectories": directory / "trajectories.jsonl",
        "plot": directory / "report.png",
    }
    payload = {
        "schema_version": SCHEMA_VERSION,
        "meta": dict(meta),
        "reports": [r.to_json() for r in reports],
    }
    # each file is replaced whole: a kill here leaves the streamed trajectories.jsonl (every
    # finished episode) or the final one (the same episodes, in task order), never a part
    write_atomic(paths["json"], json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    write_atomic(paths["markdown"], markdown_report(reports, meta) + "\n")
    lines = [
        json.dumps({"agent": report.agent, **episode.to_json()}, ensure_ascii=False) + "\n"
        for report in reports
        for episode in report.episodes
    ]
    write_atomic(paths["trajectories"], "".join(lines))
    if reports:
        tmp_plot = plot_reports(reports, directory / ".report.tmp.png")
        os.replace(tmp_plot, paths["plot"])
    log.info("wrote %s", ", ".join(str(p) for p in paths.values()))
    return paths
