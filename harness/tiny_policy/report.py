"""The table `tracerl init-model` prints: the warm start and its held-out EM by question kind."""

from __future__ import annotations

from rich.table import Table

from harness.tiny_policy.pipeline import PolicyArtifacts

__all__ = ["summary_table"]


def summary_table(artifacts: PolicyArtifacts) -> Table:
    """EM of the warm-started policy on held-out questions, greedy and sampled, by kind."""
    sft, evals = artifacts.sft, artifacts.evals
    cached = " (shipped)" if artifacts.shipped else " (cached)" if artifacts.reused else ""
    table = Table(
        title=(
            f"tiny policy{cached}: {sft['n_params']:,} params, step {sft['selected_step']} of "
            f"{sft['n_steps']}, {sft['wall_s']:.0f} s warm start; {artifacts.policy_dir}"
        )
    )
    greedy, sampled, unseen = (
        evals["heldout_greedy"],
        evals["heldout_sampled"],
        evals["unseen_sampled"],
    )
    table.add_column("question kind")
    table.add_column("held-out n", justify="right")
    table.add_column("greedy EM", justify="right")
    table.add_column(f"sampled EM (T=1, x{sampled.n_samples})", justify="right")
    table.add_column("unseen world, sampled EM", justify="right")
    for kind in sorted(set(greedy.n_by_kind) | set(unseen.n_by_kind)):
        cells = [
            f"{e.em_by_kind[kind]:.3f}" if kind in e.em_by_kind else "–"
            for e in (greedy, sampled, unseen)
        ]
        table.add_row(kind, str(greedy.n_by_kind.get(kind, 0)), *cells)
    table.add_row(
        "all kinds",
        str(greedy.n_episodes),
        f"{greedy.em:.3f}",
        f"{sampled.em:.3f} (mixed {sampled.mixed:.2f})",
        f"{unseen.em:.3f}",
        style="bold",
    )
    return table
