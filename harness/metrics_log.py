"""Per-step metrics: one JSON line per step in `run_dir/metrics.jsonl`, scalars to TensorBoard.

Keys follow CleanRL (`rollout/effective_ratio`, `budget/tokens`, `predictor/brier`,
`loss/policy`, `perf/tokens_per_s`, ...); every record also has `step`. Non-numeric values (the
step's prompt ids under `data/pool`) go to the JSONL file only.

A resumed run first cuts both logs back to the checkpoint's step (`MetricsLog(...,
resume_step=k)`): the JSONL is rewritten atomically with the records of steps ≤ k, and
TensorBoard is opened with `purge_step=k + 1`, so steps that ran after the checkpoint and were
lost with the process appear exactly once after the resume.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from trace_alloc import StepResult
    from trace_alloc.tree import Node, Turn

__all__ = ["PANELS", "MetricsLog", "plot_run", "read_metrics", "rollout_metrics"]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def _turn(node: Node) -> Turn:
    """The turn of a node below the root (only the root has none)."""
    assert node.turn is not None, f"node {node.node_id} is a root"
    return node.turn


def rollout_metrics(result: StepResult) -> dict[str, float]:
    """Contrast, outcome and behaviour statistics of one step's trees.

    One definition of the `rollout/*` keys, shared by the CPU and the OpenRLHF trainers.

    Args:
        result: One rollout step's trees and allocation statistics.

    Returns:
        The `rollout/*` metrics, NaN where a step has nothing to average.
    """
    stats = result.stats
    rewards, ems, lengths, searches, turns = [], [], [], [], []
    n_actions = n_valid = n_failed = 0
    for tree in result.trees:
        for node in tree.nodes[1:]:  # every generated turn once
            n_actions += 1
            n_valid += bool(_turn(node).info.get("valid_action", False))
        for leaf in tree.leaves():
            path = [_turn(tree.nodes[n]) for n in tree.path(leaf)[1:]]
            rewards.append(tree.nodes[leaf].reward)
            ems.append(float(path[-1].info.get("em", 0.0)))
            lengths.append(sum(t.n_tokens for t in path))
            searches.append(sum(t.n_tool_calls for t in path))
            turns.append(len(path))
            n_failed += path[-1].info.get("end") == "failed"
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    return {
        "rollout/reward": mean(rewards),
        "rollout/accuracy": mean(ems),
        "rollout/effective_ratio": stats.effective_ratio,
        "rollout/n_active_prompts": stats.n_active,
        "rollout/n_mixed_prompts": stats.n_mixed,
        "rollout/mixed_anchors": stats.n_mixed_anchors,
        "rollout/mixed_prefix_anchors": stats.n_mixed_prefix_anchors,
        "rollout/prefix_anchors": stats.n_prefix_anchors,
        "rollout/n_train_prompts": len(result.train_indices),
        "rollout/response_length": mean(lengths),
        "rollout/turns_per_episode": mean(turns),
        "rollout/searches_per_episode": mean(searches),
        "rollout/valid_action_rate": n_valid / n_actions if n_actions else float("nan"),
        "rollout/waves": len(result.waves),
        "rollout/failed_episodes": n_failed,
    }


class MetricsLog:
    """Appends step records to `metrics.jsonl` and, optionally, TensorBoard event files.

    Args:
        run_dir: The run's directory.
        tensorboard: Also write scalars under `run_dir/tensorboard`.
        resume_step: Resuming after this step: drop records of later steps first. None for a
            fresh run, which starts an empty log (the trainer refuses to start afresh over a
            run that has a checkpoint, so what this replaces never reached one).
    """

    def __init__(
        self, run_dir: Path, *, tensorboard: bool = True, resume_step: int | None = None
    ) -> None:
        self.path = run_dir / METRICS_FILE
        kept = [] if resume_step is None else read_metrics(run_dir)
        kept = [r for r in kept if int(r["step"]) <= (resume_step or 0)]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def write(self, step: int, record: Mapping[str, Any]) -> None:
        """Append one step's record (and its finite numeric values to TensorBoard)."""
        line = {"step": step, **record}
        self._file.write(json.dumps(line, allow_nan=True) + "\n")
        self._file.flush()  # a killed process loses at most the step it was running
        if self._writer is not None:
            for key, value in record.items():
                numeric = isinstance(value, int | float) and not isinstance(value, bool)
                if numeric and math.isfinite(value):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def close(self) -> None:
        """Close the files."""
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of a run's `metrics.jsonl`, in file order (a torn last line is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s line %d is not JSON (a write cut short?); skipped", path, i + 1)
    return records


# panel title -> the metric keys drawn in it
PANELS: dict[str, tuple[str, ...]] = {
    "reward and accuracy": ("rollout/reward", "rollout/accuracy", "eval/em"),
    "effective ratio": ("rollout/effective_ratio",),
    "mixed anchors": ("rollout/mixed_anchors", "rollout/mixed_prefix_anchors"),
    "predictor calibration": (
        "predictor/brier",
        "predictor/auc",
        "predictor/auc_root",
        "predictor/auc_prefix",
    ),
    "entropy and KL": ("policy/entropy", "policy/kl", "policy/approx_kl"),
    "response length (tokens)": ("rollout/response_length",),
    "actions": ("rollout/valid_action_rate", "rollout/searches_per_episode"),
    "budget spent (cumulative)": ("budget/total_leaves", "budget/total_tool_calls"),
    "generated tokens (cumulative)": ("budget/total_tokens",),
    "policy loss": ("loss/policy",),
    "throughput (tokens/s)": ("perf/tokens_per_s",),
    "step time (s)": ("perf/step_s", "perf/rollout_s", "perf/update_s"),
}


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw a run's curves, one panel per metric group, into a PNG.

    Args:
        run_dir: A `tracerl train` run directory.
        out: The image path (default `run_dir/curves.png`).

    Returns:
        The image path.

    Raises:
        FileNotFoundError: the run has no metrics yet.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    if not records:
        raise FileNotFoundError(f"{Path(run_dir) / METRICS_FILE} has no records to plot")
    out = Path(out) if out is not None else Path(run_dir) / "curves.png"
    n_cols = 3
    n_rows = -(-len(PANELS) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5 * n_cols, 3.2 * n_rows), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, PANELS.items(), strict=False):
        for key in keys:
            points = [
                (r["step"], r[key])
                for r in records
                if isinstance(r.get(key), int | float) and math.isfinite(r[key])
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o" if len(points) < 30 else None, ms=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    fig.suptitle(str(run_dir))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_learning_curve(run_dir: Path, out: Path | None = None, *, key: str = "eval/em") -> Path:
    """Held-out EM against RL step and against generated tokens, side by side, into a PNG.

    Args:
        run_dir: A `tracerl train` run directory evaluated while training (`--eval.every`).
        out: The image path (default `run_dir/learning_curve.png`).
        key: The evaluated metric.

    Returns:
        The image path.

    Raises:
        FileNotFoundError: the run has no record of `key` yet.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    tokens = 0
    steps, spent, values = [], [], []
    for record in records:
        tokens = record.get("budget/total_tokens", tokens)  # the eval before step 1 spent none
        value = record.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            steps.append(record["step"])
            spent.append(tokens)
            values.append(value)
    if not values:
        raise FileNotFoundError(f"{Path(run_dir) / METRICS_FILE} has no {key!r} to plot")
    out = Path(out) if out is not None else Path(run_dir) / "learning_curve.png"
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, xs, label in ((axes[0], steps, "RL step"), (axes[1], spent, "generated tokens")):
        ax.plot(xs, values, marker="o", ms=4)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out {key.split('/')[-1].upper()} (T=1)")
    fig.suptitle(f"{run_dir}: learning curve")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
