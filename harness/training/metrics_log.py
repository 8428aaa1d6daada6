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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from trace_alloc import RolloutTree, StepResult
    from trace_alloc.advantages import LeafAdvantage
    from trace_alloc.tree import Node, Turn

__all__ = ["PANELS", "Continuation", "MetricsLog", "advantage_metrics", "continuations_of",
           "flip_calibration", "plot_run", "read_metrics", "rollout_metrics",
           "tree_health"]  # fmt: skip

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def _turn(node: Node) -> Turn:
    """The turn of a node below the root (only the root has none)."""
    assert node.turn is not None, f"node {node.node_id} is a root"
    return node.turn


def rollout_metrics(result: StepResult) -> dict[str, Any]:
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
        **tree_health(result.trees),
        **flip_calibration(result),
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
        # what the abort rule reads (harness.training.run_guard); 0 for a step with no episode
        "rollout/failed_share": n_failed / len(rewards) if rewards else 0.0,
    }


def tree_health(trees: Sequence[RolloutTree]) -> dict[str, float]:
    """How a step's leaves are spread, and how much contrast they carry (issue 20).

    - `rollout/flips_per_continuation`: share of the continuations (rollouts forked from a
      turn prefix) whose reward differs from the outcome that every earlier leaf under their
      anchor agreed on; NaN when the step made none.
    - `rollout/max_leaves_per_tree`: leaves of the largest tree.
    - `rollout/reward_var_per_leaf`: the mean, over every leaf of the step, of the reward
      variance of its tree (p (1 − p)): a contrast measure that one flip in a large tree
      cannot inflate (one flip in 28 leaves adds 28 · 0.034 leaf-variances; a 4/8 group, 8 ·
      0.25). At most 0.25.

    >>> from trace_alloc import Rollout, RolloutTree, Turn
    >>> t = RolloutTree(prompt_id="q", prompt_text="Q?")
    >>> turn = Turn(action_text="s", action_token_ids=(1,))
    >>> a = t.add_rollout(0, Rollout(turns=(turn, turn), reward=0.0))
    >>> b = t.add_rollout(1, Rollout(turns=(turn,), reward=1.0), wave=1)  # flips
    >>> c = t.add_rollout(1, Rollout(turns=(turn,), reward=0.0), wave=1)  # repeats
    >>> h = tree_health([t])
    >>> h["rollout/flips_per_continuation"], h["rollout/max_leaves_per_tree"]
    (0.5, 3.0)
    >>> round(h["rollout/reward_var_per_leaf"], 3)
    0.222
    """
    flips = continuations = 0
    var_sum = n_leaves = max_leaves = 0.0
    for tree in trees:
        leaves = tree.leaves()
        if not leaves:
            continue
        rewards = np.array([tree.nodes[leaf].reward for leaf in leaves], dtype=np.float64)
        var_sum += len(leaves) * float(rewards.var())
        n_leaves += len(leaves)
        max_leaves = max(max_leaves, len(leaves))
        for c in continuations_of(tree):
            continuations += 1
            flips += c.flipped
    return {
        "rollout/flips_per_continuation": flips / continuations if continuations else math.nan,
        "rollout/max_leaves_per_tree": float(max_leaves),
        "rollout/reward_var_per_leaf": var_sum / n_leaves if n_leaves else math.nan,
    }


@dataclass(frozen=True, slots=True)
class Continuation:
    """One rollout forked from a turn prefix, and what it did to its anchor's outcome."""

    anchor: int
    """The node it was forked from."""
    wave: int
    """The driver wave that ran it."""
    flipped: bool
    """Its reward differs from the one outcome that every earlier leaf under the anchor had."""
    settled: bool
    """The tree's bare rollouts of earlier waves all had one outcome when it was placed."""


def continuations_of(tree: RolloutTree) -> list[Continuation]:
    """The continuations of a tree, in creation order (roots' rollouts are not among them)."""
    from trace_alloc.tree import bare_leaves

    # leaves under each node, children after parents (ids grow down the tree)
    under: list[list[int]] = [[] for _ in tree.nodes]
    for node in reversed(tree.nodes):
        if node.is_leaf:
            under[node.node_id].append(node.node_id)
        if node.parent_id is not None:
            under[node.parent_id] += under[node.node_id]
    bare = [(tree.nodes[b].wave, tree.nodes[b].reward) for b in bare_leaves(tree)]
    out = []
    for node in tree.nodes[1:]:
        anchor = tree.nodes[node.parent_id]  # type: ignore[index]
        if anchor.is_root or node.wave <= anchor.wave:
            continue  # a root rollout, or the turn its own rollout took next
        leaf = node.node_id
        while not tree.nodes[leaf].is_leaf:  # a rollout's turns have consecutive ids
            leaf += 1
        before = {tree.nodes[x].reward for x in under[anchor.node_id]
                  if tree.nodes[x].wave < node.wave}  # fmt: skip
        bare_before = {r for w, r in bare if w < node.wave}
        out.append(
            Continuation(
                anchor=anchor.node_id,
                wave=node.wave,
                flipped=len(before) == 1 and tree.nodes[leaf].reward not in before,
                settled=len(bare_before) == 1,
            )
        )
    return out


def flip_calibration(result: StepResult) -> dict[str, Any]:
    """Stage 2's predicted flip chances against the flips that happened, for one step.

    Each continuation is matched with the `RolloutRequest.p_flip` its allocator gave its
    anchor in its wave (allocators that give none are not scored).

    - `stage2/continuations`, `stage2/flips`: the step's continuations and flips;
    - `stage2/settled_share`: share of them placed in trees whose bare rollouts all agreed;
    - `stage2/flip_brier`: mean (p_flip − flipped)² over the scored ones (NaN if none);
    - `stage2/p_flip`, `stage2/p_flip_raw`, `stage2/flipped`, `stage2/settled`: one entry per
      scored continuation (lists: JSONL only), for pooled Brier scores and AUCs across steps
      and seeds, and for the trainers' `FlipCalibrator` (fitted on the raw chances).

    >>> from trace_alloc import Rollout, RolloutRequest, RolloutTree, Turn
    >>> from trace_alloc.driver import StepResult, WaveRecord
    >>> from trace_alloc.budget import Spend
    >>> t = RolloutTree(prompt_id="q", prompt_text="Q?")
    >>> turn = Turn(action_text="s", action_token_ids=(1,))
    >>> _ = t.add_rollout(0, Rollout(turns=(turn, turn), reward=0.0))
    >>> _ = t.add_rollout(0, Rollout(turns=(turn, turn), reward=1.0))
    >>> _ = t.add_rollout(1, Rollout(turns=(turn,), reward=1.0), wave=1)  # flips node 1's 0
    >>> wave = WaveRecord(wave=1, stage="prefixes", n_requests=1, spend=Spend(), alloc_s=0.0,
    ...     requests=(RolloutRequest(tree_index=0, node_id=1, n=1, p_flip=0.4),))
    >>> step = StepResult(trees=[t], train_indices=[0], spent=Spend(), limit=3.0, carry=0.0,
    ...     tokens_per_leaf=2.0, waves=(wave,))
    >>> c = flip_calibration(step)
    >>> c["stage2/flips"], c["stage2/settled_share"], round(c["stage2/flip_brier"], 2)
    (1, 0.0, 0.36)
    """
    p_flip = {(w.wave, r.tree_index, r.node_id): (r.p_flip, r.p_flip_raw) for w in result.waves
              for r in w.requests if r.p_flip is not None}  # fmt: skip
    n = flips = settled = 0
    scored: dict[str, list[Any]] = {"p_flip": [], "p_flip_raw": [], "flipped": [], "settled": []}
    for i, tree in enumerate(result.trees):
        for c in continuations_of(tree):
            n += 1
            flips += c.flipped
            settled += c.settled
            p, p_raw = p_flip.get((c.wave, i, c.anchor), (None, None))
            if p is not None:
                scored["p_flip"].append(round(p, 5))
                scored["p_flip_raw"].append(round(p if p_raw is None else p_raw, 5))
                scored["flipped"].append(int(c.flipped))
                scored["settled"].append(int(c.settled))
    errors = [(p - y) ** 2 for p, y in zip(scored["p_flip"], scored["flipped"], strict=True)]
    return {
        "stage2/continuations": n,
        "stage2/flips": flips,
        "stage2/settled_share": settled / n if n else math.nan,
        "stage2/flip_brier": sum(errors) / len(errors) if errors else math.nan,
        **{f"stage2/{k}": v for k, v in scored.items()},
    }


def advantage_metrics(
    trees: Sequence[RolloutTree], leaves: Sequence[LeafAdvantage]
) -> dict[str, float]:
    """How concentrated a step's gradient weight is: the health checks of a dominated step.

    A leaf's weight is Σ over its turns of |A_t| times the turn's action tokens (what the
    token-mean loss multiplies); a tree's weight is the sum over its leaves.

    - `advantage/max_abs`: the largest |A_t|;
    - `advantage/top_tree_share`: the heaviest tree's share of the step's weight;
    - `advantage/effective_trees`: (Σ w)² / Σ w², the number of equally weighted trees that
      would spread the weight as evenly.

    Args:
        trees: The trees the leaves index (`LeafAdvantage.tree_index`).
        leaves: The step's trained leaves.

    Returns:
        The three metrics; NaN when no leaf carries weight.
    """
    nan = math.nan
    weight: dict[int, float] = {}
    max_abs = 0.0
    for leaf in leaves:
        tree = trees[leaf.tree_index]
        tokens = np.array([tree.nodes[n].turn.n_tokens for n in leaf.node_ids])  # type: ignore[union-attr]
        a = np.abs(leaf.advantages)
        max_abs = max(max_abs, float(a.max()) if a.size else 0.0)
        weight[leaf.tree_index] = weight.get(leaf.tree_index, 0.0) + float((a * tokens).sum())
    w = np.array(list(weight.values()))
    total = float(w.sum()) if w.size else 0.0
    if total <= 0:
        return {"advantage/max_abs": nan, "advantage/top_tree_share": nan,
                "advantage/effective_trees": nan}  # fmt: skip
    return {
        "advantage/max_abs": max_abs,
        "advantage/top_tree_share": float(w.max()) / total,
        "advantage/effective_trees": total**2 / float((w**2).sum()),
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
    "effective ratio and contrast per leaf": (
        "rollout/effective_ratio",
        "rollout/reward_var_per_leaf",
        "rollout/flips_per_continuation",
    ),
    "gradient concentration": ("advantage/top_tree_share", "advantage/max_abs"),
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
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(5 * n_cols, 3.2 * n_rows), squeeze=False, layout="constrained"
    )  # constrained: the figure title keeps clear of the panels' titles
    for ax, (title, keys) in zip(axes.flat, PANELS.items(), strict=False):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
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
