"""The table `tracerl init-model` prints: the warm start and its held-out EM by question kind."""

from __future__ import annotations

from rich.table import Table

from harness.tiny_policy.pipeline import PolicyArtifacts

__all__ = ["summary_table"]


def summary_table(artifacts: PolicyArtifacts) -> Table:
    """EM of the warm-started policy on held-out questions, greedy and sampled, by kind."""
    sft, evals = artifacts.sft, artifacts.evals
    cached = " (cached)" if artifacts.reused else ""
    table = Table(
        title=(
            f"tiny policy{cached}: {sft['n_params']:,} params, step {sft['selected_step']} of "
            f"{sft['n_steps']}, {sft['wall_s']:.0f} s warm start; {artifacts.policy_dir}"
        )
    )
    n_samples = evals["hard_sampled"].n_samples
    table.add_column("held-out questions")
    table.add_column("n", justify="right")
    table.add_column("greedy EM", justify="right")
    table.add_column(f"sampled EM (T=1, x{n_samples})", justify="right")
    table.add_column("mixed", justify="right")
    for group in ("easy", "hard"):
        greedy, sampled = evals[f"{group}_greedy"], evals[f"{group}_sampled"]
        for kind, n in greedy.n_by_kind.items():
            g, s = greedy.em_by_kind[kind], sampled.em_by_kind[kind]
            table.add_row(kind, str(n), f"{g:.3f}", f"{s:.3f}", "")
        table.add_row(
            f"{group} kinds",
            str(greedy.n_episodes),
            f"{greedy.em:.3f}",
            f"{sampled.em:.3f}",
            f"{sampled.mixed:.3f}",
            style="bold",
        )
    unseen = evals["unseen_hard_sampled"]
    table.add_row("hard, unseen world", str(unseen.n_episodes), "", f"{unseen.em:.3f}", "")
    return table
