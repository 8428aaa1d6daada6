"""`TreeExperienceMaker`: OpenRLHF's experience maker, except it keeps the tree advantages.

`RemoteExperienceMaker.make_experience_batch` (OpenRLHF 0.11.2) runs the actor and reference
forwards (old log-probs, KL) and then `compute_advantages_and_returns`, which rebuilds
`Experience.advantages` from one scalar reward per sample with a group baseline of
`--rollout.n_samples_per_prompt` consecutive samples. A tree step has a variable number of leaves
per prompt and its advantages are per turn, computed by `trace_alloc.tree_advantages` before the
samples ever reach the trainer, so this subclass keeps them:

- `advantages` stay as the tree gave them (zero off the action tokens);
- with the KL penalty in the reward (`--algo.kl.init_coef > 0` without `--algo.kl.use_loss`),
  each action token's advantage also gets the sum of the per-token penalties -β·KL from that
  token on, which is what OpenRLHF's REINFORCE returns (gamma = 1) add to a scalar reward;
  with `--algo.kl.use_loss` the actor adds KL to the loss and nothing changes here;
- `returns` = `advantages` (no critic reads them; OpenRLHF logs them);
- `kl` is dropped afterwards, as the parent does;
- the per-sample `kl` and `logprobs_diff` the parent logs are means over a sample's action
  tokens, 0/0 = NaN on a filler (`harness.openrlhf.experience.pad_to_multiple`); a filler gets
  the mean of the real samples instead, so the step's logged mean is theirs and never NaN.

Length penalties (`--reward.overlong_buffer_len`, `--reward.stop_properly_penalty_coef`) act on
scalar rewards, which no longer drive the advantages; the launcher rejects them.
"""

from __future__ import annotations

from harness.training.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf.models (imported below) needs flash_attn; see openrlhf_compat.py

import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402

from harness.errors import HarnessError  # noqa: E402

__all__ = [
    "FILLER_MEAN_KEYS",
    "TreeExperienceMaker",
    "add_rollout_logprob_gap",
    "fill_filler_means",
]

FILLER_MEAN_KEYS: tuple[str, ...] = ("kl", "logprobs_diff", "rollout_logprob_gap")
"""Per-sample `info` means over action tokens that `make_experience` sets (NaN on a sample
without action tokens)."""


class TreeExperienceMaker(RemoteExperienceMaker):
    """A `RemoteExperienceMaker` whose samples arrive with their advantages already computed."""

    @torch.no_grad()
    def make_experience(self, samples_list: list[Experience]) -> list[Experience]:
        """OpenRLHF's forwards and KL, then finite per-sample logs on fillers (module docstring)."""
        experiences = super().make_experience(samples_list)
        add_rollout_logprob_gap(experiences)
        fill_filler_means(experiences)
        return experiences

    @torch.no_grad()
    def compute_advantages_and_returns(self, experiences: list[Experience]) -> list[Experience]:
        """Keep the tree advantages, add the KL reward's returns-to-go, set returns.

        Args:
            experiences: Micro-batches after `make_experience` (log-probs and KL attached).

        Returns:
            The same objects, updated in place.

        Raises:
            HarnessError: a sample without precomputed advantages (it did not come from
                `TreeSamplesGenerator`).
        """
        missing = [i for i, e in enumerate(experiences) if e.advantages is None]
        if missing:
            raise HarnessError(
                f"micro-batches {missing[:5]} have no precomputed advantages: TreeExperienceMaker "
                "only takes samples from TreeSamplesGenerator (trace_alloc.tree_advantages)"
            )
        kl_coef = float(self.kl_ctl.value)
        kl_in_reward = kl_coef > 0 and not self.args.algo.kl.use_loss
        for exp in experiences:
            mask = exp.action_mask  # (B, A)
            advantages = exp.advantages.float() * mask  # (B, A)
            reward = exp.rewards.float()  # (B,)
            if kl_in_reward and exp.kl is not None:
                penalty = -kl_coef * exp.kl.float() * mask  # (B, A): KL as a per-token reward
                to_go = self.get_cumulative_returns(penalty, mask, 1.0)  # (B, A)
                advantages = advantages + to_go * mask  # the prompt's positions get nothing
                reward = reward + penalty.sum(dim=-1)  # (B,)
            exp.advantages = advantages
            exp.returns = advantages.clone()
            exp.info["return"] = reward
            exp.kl = None
        return experiences


def add_rollout_logprob_gap(experiences: list[Experience]) -> None:
    """Set `info["rollout_logprob_gap"]`: per sample, the mean |trainer - rollout| log-prob.

    The rollout log-probs are vLLM's (`processed_logprobs`: the sampled distribution), the
    trainer's are the actor's forward on the same tokens before any update; a temperature, a
    token shift or a weight sync gone wrong shows here (the GPU smoke asserts it < 0.1), while
    `ppo_kl` (old against new, both the trainer's) is about 0 on the first pass by construction.
    A sample without action tokens gets 0/0 = NaN, which `fill_filler_means` replaces.
    """
    for exp in experiences:
        if exp.rollout_log_probs is None or exp.action_log_probs is None:
            continue
        mask = exp.action_mask.float()  # (B, A)
        gap = (exp.action_log_probs.float() - exp.rollout_log_probs.float()).abs() * mask
        exp.info["rollout_logprob_gap"] = gap.sum(dim=-1) / mask.sum(dim=-1)  # (B,)


def fill_filler_means(experiences: list[Experience]) -> None:
    """Give samples without action tokens the mean of the others in `FILLER_MEAN_KEYS`.

    OpenRLHF logs each of these keys as a mean over samples, so the step's value becomes the
    mean over the real samples (0 when there are none), never NaN. Updates `info` in place.
    """
    for key in FILLER_MEAN_KEYS:
        rows = [(e.info[key], e.action_mask.sum(dim=-1) > 0) for e in experiences if key in e.info]
        if not rows:
            continue
        values = torch.cat([v.float() for v, _ in rows])  # (n_samples,)
        real = torch.cat([r for _, r in rows])  # (n_samples,)
        fill = values[real].mean() if bool(real.any()) else torch.tensor(0.0)
        for exp in experiences:
            if key in exp.info:
                has_actions = exp.action_mask.sum(dim=-1) > 0  # (B,)
                exp.info[key] = torch.where(has_actions, exp.info[key].float(), fill)
