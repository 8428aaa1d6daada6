"""trace-rl's own flags for the OpenRLHF trainer (`tracerl train --backend openrlhf`).

Only what OpenRLHF has no flag for lives here: the allocator, the tree advantage, the budget
currency, the environment, the retriever and the predictor. Everything OpenRLHF already has
(model, Ray/vLLM/DeepSpeed layout, batch sizes, learning rate, KL, `--data.max_len`,
`--rollout.max_new_tokens`, `--rollout.temperature`, `--rollout.top_p`) is given after `--` to
OpenRLHF's own parser and read from there, never declared twice. The leaf budget of a step is
OpenRLHF's `--rollout.batch_size x --rollout.n_samples_per_prompt`: the trajectories GRPO would
sample from the same flags, so the comparison is at equal cost by construction.

The allocator, the predictor and the tree advantage take the CPU trainer's config types
(`harness.training.config`), and every concept has the flag it has in `tracerl train` (`--alloc.*`,
`--predictor.*`, `--loss.advantage`, `--budget.currency`, `--abort.*`, `--seed`; the env is
`--env.*` here and `--task.env.*` there, the same `SearchQAConfig`). The allocator is named and
set with trace_alloc's own dataclasses, so every field of every allocator is a flag
(`--alloc.name trace --alloc.trace.max-per-prompt 8`, `--alloc.name uniform
--alloc.uniform.group-size 8`). The old names `--advantage`, `--currency` and
`--tokens-per-step` still work, with a warning (`harness.training.config.RENAMED_FLAGS`). It imports
neither OpenRLHF nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from envs.search_qa import SearchQAConfig
from harness.training.config import (
    TRAINER_MAX_WAVES,
    AbortConfig,
    AdvantageConfig,
    AllocConfig,
    Currency,
    PredictorConfig,
    UserAllocatorFlags,
)

__all__ = ["TreeBudgetConfig", "TreeTrainConfig"]


@dataclass(frozen=True, kw_only=True)
class TreeBudgetConfig:
    """The equal-cost budget of a tree step (`--budget.*`, as in `tracerl train`)."""

    currency: Currency = "leaves"
    """`leaves`: OpenRLHF's `--rollout.batch_size x --rollout.n_samples_per_prompt` rollouts
    per step; `tokens`: `per_step` generated tokens."""
    per_step: int | None = None
    """Generated tokens per step; required with `--budget.currency tokens` (a leaf budget comes
    from OpenRLHF's flags)."""
    max_waves: int = TRAINER_MAX_WAVES
    """Safety bound on allocator waves per step (the CPU trainer's `--budget.max-waves`)."""

    def __post_init__(self) -> None:
        if self.currency == "tokens" and (self.per_step is None or self.per_step < 1):
            raise ValueError("--budget.currency tokens needs --budget.per-step > 0")
        if self.currency == "leaves" and self.per_step is not None:
            raise ValueError(
                "--budget.per-step is only read with --budget.currency tokens (a leaf budget is "
                "OpenRLHF's --rollout.batch_size x --rollout.n_samples_per_prompt)"
            )


@dataclass(frozen=True, kw_only=True)
class TreeTrainConfig(UserAllocatorFlags):
    """Tree-rollout settings of an OpenRLHF run; OpenRLHF's own flags follow `--`.

    `--allocator MODULE:CLASS` plugs in an allocator of your own (docs/extending.md).

    `tracerl train --backend openrlhf -- --help` lists OpenRLHF's flags; docs/openrlhf.md and
    scripts/train_qwen3_8b_hotpotqa.sh show a whole command.
    """

    retriever: str = "http://127.0.0.1:8000"
    """A Search-R1-protocol server URL (e.g. a wiki-18 e5 server, or `tracerl serve-retriever`),
    or a local index directory (`tracerl index build`)."""
    alloc: AllocConfig = field(default_factory=AllocConfig)
    """Which allocator spends the rollout budget (`--alloc.name`), with its settings."""
    loss: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The tree advantage (`--loss.advantage`); OpenRLHF's flags set the rest of the loss."""
    budget: TreeBudgetConfig = field(default_factory=TreeBudgetConfig)
    """The budget's currency and, for tokens, its size per step."""
    env: SearchQAConfig = field(default_factory=SearchQAConfig)
    """Search-R1 environment: turns, documents per search, reward, prompt template."""
    env_from_policy: bool = True
    """Take the protocol, turn limit, documents per search, document length and prompt template
    from the policy's own `policy_protocol.json` (a `tracerl init-model` or `tracerl train`
    policy, such as the shipped warm start): the environment it was trained for, which RL must
    not change. An `--env.*` flag overrides its field; a policy without the file (a hub model)
    keeps the `--env.*` settings. `--no-env-from-policy` ignores the file."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The online success predictor Ṽψ (hashed n-grams + a small MLP), as in the CPU trainer."""
    run_dir: Path = Path("runs/openrlhf")
    """Where `metrics.jsonl` and the predictor's checkpoints go (on the trainer's node)."""
    seed: int = 0
    """Seeds the allocator, the engine's sampling seeds and the predictor."""
    seeded_requests: bool = False
    """Give every vLLM request its own seed (reproducible per request, but vLLM's slow
    per-request sampling path); off, the engines' own generators sample (`--train.seed`)."""
    abort: AbortConfig = field(default_factory=AbortConfig)
    """When the run stops itself: K tree steps in a row with most episodes failed (a dead
    retriever), with the cause in one line (`harness.training.run_guard`)."""
    engine_timeout_s: float = 600.0
    """A turn's generate requests must all finish within this, or the step fails with a clear
    error (a hung vLLM engine would otherwise block the controller forever)."""
    update_norm: bool = False
    """Log ‖θ_after − θ_before‖ of every tree step (`policy/update_norm`). Each rank copies its
    share of the weights to host memory before the step (about 2 GB per rank for an 8B model in
    bf16 over 8 ranks) and the ranks all-reduce the squared changes, so it is opt-in. The
    optimizer steps taken (`policy/optimizer_steps`) are always logged."""
    shared_fs: tuple[str, ...] = ()
    """Filesystem types to count as shared besides the known network and cluster ones (NFS,
    Lustre, GPFS, ...): with several nodes, `--run-dir`, `--ckpt.path` and `--ckpt.output_dir`
    must lie on one (`harness.training.doctor.SHARED_FS_TYPES`)."""
    check_only: bool = False
    """Parse and check every flag (ours and OpenRLHF's), print the run's size, start nothing."""
    rehearse_steps: int = 0
    """With --check-only: also play this many tree steps with these very flags on this machine's
    CPU, the transformers backend standing in for vLLM (no Ray, vLLM or DeepSpeed), and print
    the leaves with a training signal per step (`harness.openrlhf.rehearsal`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rehearse_steps and not self.check_only:
            raise ValueError("--rehearse-steps is a --check-only option")
