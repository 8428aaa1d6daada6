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
- `kl` is dropped afterwards, as the parent does.

Length penalties (`--reward.overlong_buffer_len`, `--reward.stop_properly_penalty_coef`) act on
scalar rewards, which no longer drive the advantages; the launcher rejects them.
"""

from __future__ import annotations

from harness.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf.models (imported below) needs flash_attn; see openrlhf_compat.py

import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # noqa: E402

from harness.errors import HarnessError  # noqa: E402

__all__ = ["TreeExperienceMaker"]


class TreeExperienceMaker(RemoteExperienceMaker):
    """A `RemoteExperienceMaker` whose samples arrive with their advantages already computed."""

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
