"""`tracerl tree show FILE`: render rollout trees as text, and as a picture coloured by V̂.

FILE holds trees written with `RolloutTree.to_json()`: one tree (a JSON object), a JSON list
of trees, or JSON Lines (one tree per line).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro

from retrieval.corpus import check_regular_file
from retrieval.errors import IndexFormatError
from trace_alloc import RolloutTree, TreeFormatError

__all__ = ["Show", "load_trees", "render_text", "save_picture", "tree"]

_MAX_TREE_BYTES = 4 << 30  # read whole: a training run's tree files are far smaller

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Show:
    """Print rollout trees as text; optionally save a picture of one."""

    file: tyro.conf.Positional[Path]
    """trees as JSON (one object or a list) or JSON Lines"""
    index: int | None = None
    """show only the tree at this position in the file (default: all, the picture: the first)"""
    width: int = 60
    """characters of turn text shown per node"""
    picture: Path | None = None
    """save a PNG of the tree here, nodes coloured by V̂ (the mean leaf reward below them)"""


def load_trees(path: Path) -> list[RolloutTree]:
    """Read trees from a JSON object, a JSON list, or JSON Lines.

    Raises:
        TreeFormatError: no such file, not a regular file (a FIFO would block forever), over
            4 GiB, unreadable JSON or an invalid tree (the message names the line).
    """
    try:  # a FIFO would block the read forever, a device never end
        check_regular_file(path, what="tree file", max_bytes=_MAX_TREE_BYTES)
    except IndexFormatError as err:
        raise TreeFormatError(str(err)) from None
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise TreeFormatError(f"{path}: not valid JSON ({err})") from err
        return [RolloutTree.from_dict(item) for item in items]
    try:
        return [RolloutTree.from_dict(json.loads(text))]
    except json.JSONDecodeError:
        pass  # several objects: JSON Lines
    trees = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                trees.append(RolloutTree.from_json(line))
            except TreeFormatError as err:
                raise TreeFormatError(f"{path}:{number}: {err}") from err
    return trees


def _clip(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def render_text(tree: RolloutTree, *, width: int = 60) -> str:
    """The tree as indented lines: one per node, with V̂, leaf count, mixed flag and reward.

    >>> from trace_alloc import Prompt, Rollout, Turn
    >>> t = RolloutTree.from_prompt(Prompt(prompt_id="q1", text="Who?"))
    >>> turn = Turn(action_text="<answer>A</answer>", action_token_ids=(1, 2))
    >>> _ = t.add_rollout(0, Rollout(turns=(turn,), reward=1.0))
    >>> _ = t.add_rollout(0, Rollout(turns=(turn,), reward=0.0))
    >>> print(render_text(t))
    q1 "Who?"  V̂=0.50  leaves=2  mixed  tokens=4  tool calls=0
    ├── [1] <answer>A</answer>  r=1
    └── [2] <answer>A</answer>  r=0
    """
    values = tree.values()
    count, _, _, _ = tree.leaf_stats()
    mixed = tree.mixed()
    spend = tree.spend()
    head = (
        f'{tree.prompt_id} "{_clip(tree.prompt_text, width)}"  '
        f"V̂={values[0]:.2f}  leaves={count[0]}  {'mixed' if mixed[0] else 'not mixed'}"
        f"  tokens={spend.n_tokens}  tool calls={spend.n_tool_calls}"
    )
    if count[0] == 0:
        head = f'{tree.prompt_id} "{_clip(tree.prompt_text, width)}"  (no rollouts)'
    lines = [head]

    def walk(node_id: int, prefix: str) -> None:
        children = tree.nodes[node_id].children
        for k, child in enumerate(children):
            last = k == len(children) - 1
            node = tree.nodes[child]
            assert node.turn is not None
            text = _clip(node.turn.action_text + node.turn.observation_text, width)
            if node.is_leaf:
                info = f"r={node.reward:g}"
            else:
                flag = "  mixed" if mixed[child] else ""
                info = f"V̂={values[child]:.2f}  leaves={count[child]}{flag}"
            lines.append(f"{prefix}{'└── ' if last else '├── '}[{child}] {text}  {info}")
            walk(child, prefix + ("    " if last else "│   "))

    walk(0, "")
    return "\n".join(lines)


def _layout(tree: RolloutTree) -> tuple[np.ndarray, np.ndarray]:
    """x: leaves spaced evenly in depth-first order, parents centred; y: minus depth."""
    x = np.zeros(len(tree.nodes))
    next_x = 0.0

    def place(node_id: int) -> float:
        nonlocal next_x
        children = tree.nodes[node_id].children
        if not children:
            x[node_id] = next_x
            next_x += 1.0
        else:
            x[node_id] = float(np.mean([place(c) for c in children]))
        return x[node_id]

    place(0)
    y = -np.array([n.depth for n in tree.nodes], dtype=np.float64)
    return x, y


def save_picture(tree: RolloutTree, path: Path) -> None:
    """Draw the tree with each node coloured by V̂ (red 0 → green 1); leaves are squares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = _layout(tree)
    values = tree.values()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * tree.n_leaves + 2), 1.2 * (1 - y.min()) + 1.5))
    for node in tree.nodes[1:]:
        assert node.parent_id is not None
        ax.plot([x[node.parent_id], x[node.node_id]], [y[node.parent_id], y[node.node_id]],
                color="0.6", lw=0.8, zorder=1)  # fmt: skip
    leaf = np.array([n.is_leaf for n in tree.nodes])
    colour = np.where(np.isnan(values), 0.5, values)
    kwargs: dict[str, Any] = {
        "cmap": "RdYlGn",
        "vmin": 0.0,
        "vmax": 1.0,
        "edgecolors": "k",
        "zorder": 2,
    }
    points = ax.scatter(x[~leaf], y[~leaf], c=colour[~leaf], s=120, marker="o", **kwargs)
    ax.scatter(x[leaf], y[leaf], c=colour[leaf], s=60, marker="s", **kwargs)
    fig.colorbar(points, ax=ax, label="V̂ (mean leaf reward below)")
    ax.set_title(_clip(f"{tree.prompt_id}: {tree.prompt_text}", 80), fontsize=9)
    depths = np.arange(int(-y.min()) + 1)
    ax.set_yticks(-depths, ["prompt", *(str(d) for d in depths[1:])])
    ax.set_ylabel("turn")
    ax.set_xticks([])
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _select(trees: Sequence[RolloutTree], index: int | None) -> list[RolloutTree]:
    if index is None:
        return list(trees)
    if not -len(trees) <= index < len(trees):
        raise ValueError(f"--index {index}: the file holds {len(trees)} tree(s)")
    return [trees[index]]


def tree(argv: list[str]) -> int:
    """`tracerl tree show FILE`."""
    config = tyro.extras.subcommand_cli_from_dict({"show": Show}, args=argv, prog="tracerl tree")
    try:
        trees = load_trees(config.file)
        chosen = _select(trees, config.index)
    except (OSError, ValueError) as err:  # TreeFormatError is a ValueError
        raise SystemExit(f"tracerl tree: {err}") from err
    print("\n\n".join(render_text(t, width=config.width) for t in chosen))
    if config.picture is not None and chosen:
        save_picture(chosen[0], config.picture)
        log.info("saved %s", config.picture)
    return 0
