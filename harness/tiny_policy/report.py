"""The table `tracerl init-model` prints: the warm start and its held-out EM by question kind."""

from __future__ import annotations

from rich.table import Table

from harness.tiny_policy.pipeline import PolicyArtifacts

__all__ = ["summary_table"]


def summary_table(artifacts: PolicyArtifacts) -> Table:
    """EM of the warm-started policy on held-out questions, greedy and sampled, by kind."""
    sft = artifacts.sft
    cached = " (cached)" if artifacts.reused else ""
    table = Table(
        title=(
            f"tiny policy{cached}: {sft['n_params']:,} params, step {sft['selected_step']} of "
            f"{sft['n_steps']}, {sft['wall_s']:.0f} s warm start; {artifacts.policy_dir}"
        )
    )
    greedy, sampled = artifacts.evals["heldout_greedy"], artifacts.evals["heldout_sampled"]
    table.add_column("held-out kind")
    table.add_column("questions", justify="right")
    table.add_column("greedy EM", justify="right")
    table.add_column(f"sampled EM (T=1, x{sampled.n_samples})", justify="right")
    for kind, n in greedy.n_by_kind.items():
        table.add_row(
            kind, str(n), f"{greedy.em_by_kind[kind]:.3f}", f"{sampled.em_by_kind[kind]:.3f}"
        )
    hard_g, hard_s = artifacts.evals["hard_greedy"], artifacts.evals["hard_sampled"]
    n_hard = hard_g.n_episodes
    table.add_row("hard kinds", str(n_hard), f"{hard_g.em:.3f}", f"{hard_s.em:.3f}", style="bold")
    table.add_row("all", str(greedy.n_episodes), f"{greedy.em:.3f}", f"{sampled.em:.3f}")
    return table
