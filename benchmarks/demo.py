"""`tracerl demo` (what `make run` runs): the main job's command, on the top floor.

The job itself (`run_demo`: the warm start, its evaluation before, TRACE RL on fresh worlds,
the evaluation after, the report) lives in `harness.evaluation`, where research runs reuse its
pieces; this module parses the flags, runs it and prints the before/after table.
"""

from __future__ import annotations

from typing import Any

import tyro

from harness.evaluation import DemoConfig, run_demo

__all__ = ["demo"]

LABELS = {
    "unseen": "unseen worlds",
    "fact_disjoint": "fact-disjoint questions",
    "decoy": "decoy corpus (memory)",
}


def _print_table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="tracerl demo: sampled EM (T=1), 95 % bootstrap CI over questions")
    for column in ("test set", "questions x samples", "warm start", "after TRACE", "gain"):
        table.add_column(column, justify="left" if column == "test set" else "right")
    for name, c in record["sets"].items():
        cells = [
            f"{c[side]['mean']:{sign}.3f} [{c[side]['low']:.3f}, {c[side]['high']:.3f}]"
            for side, sign in (("before", ""), ("after", ""), ("gain", "+"))
        ]
        table.add_row(LABELS[name], f"{c['n_questions']} x {c['n_samples']}", *cells)
    console.print(table)
    unseen = record["sets"]["unseen"]
    kinds = Table(title="unseen-world EM by question kind")
    for column in ("kind", "warm start", "after TRACE"):
        kinds.add_column(column, justify="left" if column == "kind" else "right")
    for kind, em in unseen["before_by_kind"].items():
        after = unseen["after_by_kind"].get(kind, float("nan"))
        kinds.add_row(kind, f"{em:.3f}", f"{after:.3f}")
    console.print(kinds)
    t = record["times"]
    console.print(
        f"time: policy {t['policy_s']:.0f} s, eval {t['eval_before_s']:.0f}+{t['eval_after_s']:.0f}"
        f" s, RL {t['train_s']:.0f} s; total {t['total_s']:.0f} s"
    )
    paths = record["paths"]
    console.print(f"report: {paths['markdown']}; curves: {paths['curves']}")
    if "learning_curve" in paths:
        console.print(f"learning curve: {paths['learning_curve']}")
    console.print(record["summary"], style="bold")


def demo(argv: list[str]) -> int:
    """`tracerl demo`: the main job (`make run`)."""
    config = tyro.cli(DemoConfig, args=argv, prog="tracerl demo")
    record = run_demo(config)
    _print_table(record)
    return 0
