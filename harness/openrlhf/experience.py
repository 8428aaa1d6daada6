"""Leaves of rollout trees as OpenRLHF `Experience`s, with their tree advantages already inside.

Each leaf is trained as its own root-to-leaf sequence (docs/design.md §1). The layout is the one
OpenRLHF's `SamplesGenerator._process_response_into_experience` gives a multi-turn response
(0.11.2, samples_generator.py), so every downstream piece (micro-batching, the actor's log-prob
forward, the replay buffer, `PolicyLoss`) reads it unchanged:

- `sequences` and `attention_mask` are `(1, T)`: the prompt, then each turn's action and
  observation tokens, cut to `max_len`;
- `action_mask`, `rollout_log_probs` and `advantages` are `(1, T - 1)`: position j describes
  token j + 1, the token predicted from the first j + 1 (OpenRLHF's shift by one); observation
  and prompt tokens have mask 0 and advantage 0;
- `rewards` and `scores` are the leaf's terminal reward, `(1,)`.

`advantages` is a "step" field of `Experience`, so `concat_experiences`, `split_experience_batch`
and the replay buffer carry it to `PolicyLoss` untouched; `TreeExperienceMaker` only has to not
overwrite it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from trace_alloc import RolloutTree
from trace_alloc.advantages import LeafAdvantage, TokenAdvantages

if TYPE_CHECKING:
    from openrlhf.trainer.ppo_utils.experience import Experience

__all__ = [
    "FILLER_TOKENS",
    "INFO_KEYS",
    "actor_ranks",
    "batch_unit",
    "experience_from_tokens",
    "experiences_from_leaves",
    "leaf_truncated",
    "pad_to_multiple",
    "spread_over_ranks",
    "token_advantages_of_episode",
]

T = TypeVar("T")

INFO_KEYS: tuple[str, ...] = ("response_clip_ratio", "reward", "score", "tree/n_turns", "filler")
"""Per-sample `Experience.info` keys; every experience carries all of them, because
`Experience.concat_experiences` merges `info` key by key and a missing key would misalign a batch.
OpenRLHF's actor averages them into its step logs."""


def experience_from_tokens(
    tokens: TokenAdvantages,
    *,
    reward: float,
    max_len: int,
    prompt: str,
    label: str,
    truncated: bool = False,
    has_logprobs: bool = True,
    n_turns: int = 0,
) -> Experience:
    """One token sequence (a leaf, or an evaluation episode) as a one-row `Experience`.

    Args:
        tokens: The sequence, its action mask, per-token advantages and sampling log-probs, all
            of shape `(T,)` (what `LeafAdvantage.to_tokens` returns).
        reward: The terminal reward (becomes `rewards`, `scores` and `info["reward"]`).
        max_len: Keep only the first `max_len` tokens (OpenRLHF's `--data.max_len`).
        prompt: OpenRLHF's prompt string for this question (evaluation groups by it).
        label: The dataset label (the task's JSON).
        truncated: Whether the last action hit the per-turn token cap.
        has_logprobs: False when the engine recorded no sampling log-probs; then
            `rollout_log_probs` is None rather than zeros that would look like certainty.
        n_turns: Turns on the path (logged as `tree/n_turns`).

    Returns:
        An `Experience` laid out as the module docstring says.

    Raises:
        ValueError: `max_len` < 2, or arrays of different lengths.
    """
    from openrlhf.trainer.ppo_utils.experience import Experience

    if max_len < 2:
        raise ValueError(f"max_len={max_len}: a sequence needs at least 2 tokens")
    n = len(tokens.token_ids)
    if not (len(tokens.action_mask) == len(tokens.advantages) == len(tokens.logprobs) == n):
        raise ValueError(
            f"token arrays disagree in length: ids {n}, mask {len(tokens.action_mask)}, "
            f"advantages {len(tokens.advantages)}, logprobs {len(tokens.logprobs)}"
        )
    sequences = torch.as_tensor(tokens.token_ids[:max_len], dtype=torch.long)  # (T,)
    attention_mask = torch.ones_like(sequences)  # (T,)
    # Shift by one: position j of an action-level field describes token j + 1.
    # long, not bool, as OpenRLHF builds it (its padding and sums expect integers)
    action_mask = torch.as_tensor(tokens.action_mask[1:max_len], dtype=torch.long)  # (T - 1,)
    advantages = torch.as_tensor(tokens.advantages[1:max_len], dtype=torch.float32)  # (T - 1,)
    advantages = advantages * action_mask  # zero off the actions, whatever the input said
    rollout_log_probs = (
        torch.as_tensor(tokens.logprobs[1:max_len], dtype=torch.float32) * action_mask
        if has_logprobs
        else None
    )  # (T - 1,)
    total_length = int(sequences.numel())
    clipped = n > max_len
    info = {
        "response_clip_ratio": torch.tensor([float(clipped)]),
        "reward": torch.tensor([float(reward)]),
        "score": torch.tensor([float(reward)]),
        "tree/n_turns": torch.tensor([float(n_turns)]),
        "filler": torch.tensor([0.0]),
    }
    return Experience(
        sequences=sequences.unsqueeze(0),  # (1, T)
        attention_mask=attention_mask.unsqueeze(0),  # (1, T)
        action_mask=action_mask.unsqueeze(0),  # (1, T - 1)
        rollout_log_probs=None if rollout_log_probs is None else rollout_log_probs.unsqueeze(0),
        advantages=advantages.unsqueeze(0),  # (1, T - 1)
        prompts=[prompt],
        labels=[label],
        images=[None],
        mm_train_inputs=[None],
        rewards=torch.tensor([float(reward)]),  # (1,)
        scores=torch.tensor([float(reward)]),  # (1,)
        # Generated tokens only: OpenRLHF's first-to-last span would count observations too.
        response_length=torch.tensor([int(action_mask.sum())]),  # (1,)
        truncated=torch.tensor([bool(truncated)]),  # (1,)
        total_length=torch.tensor([float(total_length)]),  # (1,)
        info=info,
    )


def leaf_truncated(tree: RolloutTree, leaf_id: int) -> bool:
    """Whether the leaf's last action was cut by the per-turn token cap.

    Reads `Turn.info["finish_reason"]`, which the rollout engine records from the backend's
    `Completion.finish_reason`.
    """
    turn = tree.nodes[leaf_id].turn
    return turn is not None and turn.info.get("finish_reason") == "length"


def experiences_from_leaves(
    trees: Sequence[RolloutTree],
    leaves: Sequence[LeafAdvantage],
    *,
    max_len: int,
    prompts: Sequence[str],
    labels: Sequence[str],
) -> list[Experience]:
    """Every leaf as an `Experience`, in the order of `leaves`.

    Args:
        trees: The trees the advantages were computed on (`LeafAdvantage.tree_index` indexes
            this sequence).
        leaves: `trace_alloc.tree_advantages(trees, mode)`.
        max_len: See `experience_from_tokens`.
        prompts: OpenRLHF's prompt string of each tree.
        labels: The dataset label of each tree.

    Returns:
        One `Experience` per leaf.

    Raises:
        ValueError: `prompts`/`labels` do not match `trees`, or a leaf names a missing tree.
    """
    if not (len(prompts) == len(labels) == len(trees)):
        raise ValueError(f"{len(trees)} trees but {len(prompts)} prompts and {len(labels)} labels")
    out = []
    for leaf in leaves:
        if not 0 <= leaf.tree_index < len(trees):
            raise ValueError(f"leaf {leaf.leaf_id} names tree {leaf.tree_index} of {len(trees)}")
        tree = trees[leaf.tree_index]
        path = tree.path(leaf.leaf_id)[1:]
        turns = [tree.nodes[nid].turn for nid in path]
        has_logprobs = all(t is not None and len(t.action_logprobs) == t.n_tokens for t in turns)
        reward = tree.nodes[leaf.leaf_id].reward
        assert reward is not None  # a LeafAdvantage always names a leaf
        out.append(
            experience_from_tokens(
                leaf.to_tokens(tree),
                reward=reward,
                max_len=max_len,
                prompt=prompts[leaf.tree_index],
                label=labels[leaf.tree_index],
                truncated=leaf_truncated(tree, leaf.leaf_id),
                has_logprobs=has_logprobs,
                n_turns=len(path),
            )
        )
    return out


FILLER_TOKENS = 2
"""Tokens in a filler: the least an `Experience` holds (one token predicted from another)."""


def pad_to_multiple(experiences: list[Experience], multiple: int) -> list[Experience]:
    """Append short zero-weight fillers until the count is a multiple of `multiple`.

    OpenRLHF splits a step's samples evenly over its data-parallel ranks and steps the optimizer
    every `--train.batch_size` samples; a tree step yields a variable number of leaves (only the
    leaves with a training signal are kept), so nearly every step needs fillers: up to
    `multiple - 1` of them. A filler is the first `FILLER_TOKENS` tokens of the shortest leaf,
    with action mask and advantages zero and `info["filler"]` 1, so its forward and backward
    passes cost next to nothing. OpenRLHF 0.11.2 normalises the loss by the action tokens of the
    optimizer step (token mode) or by its sequences with at least one action token (sample
    mode), both read from the action mask (`utils/loss_utils.py`), so a filler adds nothing to
    the loss, its gradient or either normaliser: the step's update is the same with or without
    fillers, as in the CPU trainer. (The per-sample and per-micro-batch means OpenRLHF logs
    would be 0/0 on fillers; `TreeExperienceMaker` and `TreePolicyModelActor` keep them finite.)

    Args:
        experiences: One-row experiences (not modified).
        multiple: The unit the count must be a multiple of (>= 1).

    Returns:
        A new list: the experiences, then the fillers. An empty input stays empty.

    Raises:
        ValueError: `multiple` < 1.
    """
    if multiple < 1:
        raise ValueError(f"multiple={multiple}: must be >= 1")
    out = list(experiences)
    n_fillers = (-len(out)) % multiple
    if not out or not n_fillers:
        return out
    source = min(experiences, key=lambda e: int(e.sequences.shape[-1]))
    n = min(FILLER_TOKENS, int(source.sequences.shape[-1]))
    info: Mapping[str, torch.Tensor] = {**source.info, "filler": torch.tensor([1.0])}
    filler = dataclasses.replace(
        source,
        sequences=source.sequences[:, :n].clone(),  # (1, n)
        attention_mask=source.attention_mask[:, :n].clone(),  # (1, n)
        action_mask=torch.zeros_like(source.action_mask[:, : n - 1]),  # (1, n - 1)
        advantages=torch.zeros_like(source.advantages[:, : n - 1]),  # (1, n - 1)
        rollout_log_probs=(
            None
            if source.rollout_log_probs is None
            else torch.zeros_like(source.rollout_log_probs[:, : n - 1])
        ),
        response_length=torch.zeros_like(source.response_length),
        truncated=torch.zeros_like(source.truncated),
        total_length=torch.tensor([float(n)]),
        info=dict(info),
    )
    out += [dataclasses.replace(filler, info=dict(filler.info)) for _ in range(n_fillers)]
    return out


def spread_over_ranks(padded: list[T], n_real: int, ranks: int) -> list[T]:
    """Reorder a padded step so that every rank's chunk gets its share of the real leaves.

    OpenRLHF deals a step's samples to the ranks in equal contiguous chunks; with the fillers at
    the end, the last ranks would get only fillers and do no work. Here the real leaves go round
    robin over the chunks, each chunk's fillers after its leaves. The gradient is the same (the
    loss normaliser is global); only the work is shared out.

    >>> spread_over_ranks(["a", "b", "c", "f", "f", "f"], 3, 2)
    ['a', 'c', 'f', 'b', 'f', 'f']
    """
    if ranks < 1 or len(padded) % ranks:
        raise ValueError(f"{len(padded)} samples do not split into {ranks} equal chunks")
    size = len(padded) // ranks
    chunks: list[list[T]] = [padded[r:n_real:ranks] for r in range(ranks)]
    fillers = iter(padded[n_real:])
    out: list[T] = []
    for chunk in chunks:
        out += [*chunk, *(next(fillers) for _ in range(size - len(chunk)))]
    return out


def token_advantages_of_episode(
    token_ids: Sequence[int], action_mask: Sequence[bool], logprobs: Sequence[float]
) -> TokenAdvantages:
    """An evaluation episode's token stream with zero advantages (evaluation trains nothing)."""
    n = len(token_ids)
    return TokenAdvantages(
        token_ids=np.asarray(token_ids, dtype=np.int64),
        action_mask=np.asarray(action_mask, dtype=bool),
        advantages=np.zeros(n),
        logprobs=np.asarray(logprobs, dtype=np.float64),
    )


def batch_unit(args: Any) -> int:
    """The sample count a step must be a multiple of, for OpenRLHF to split it evenly.

    Rollout micro-batches (`--rollout.micro_batch_size`) are dealt in equal chunks to the
    effective actor ranks, and each rank steps its optimizer every `--train.batch_size` samples
    (globally); both must come out whole on every rank, or ranks disagree on the number of
    DeepSpeed steps.

    >>> from types import SimpleNamespace as NS
    >>> args = NS(train=NS(batch_size=8), rollout=NS(micro_batch_size=2),
    ...           actor=NS(num_nodes=1, num_gpus_per_node=4), ds=NS(ring_attn_size=1,
    ...           tensor_parallel_size=1))
    >>> batch_unit(args)
    8
    """
    return math.lcm(args.train.batch_size, args.rollout.micro_batch_size * actor_ranks(args))


def actor_ranks(args: Any) -> int:
    """Data-parallel actor ranks: GPUs over the ring-attention and tensor-parallel groups."""
    gpus = args.actor.num_nodes * args.actor.num_gpus_per_node
    return max(gpus // args.ds.ring_attn_size // args.ds.tensor_parallel_size, 1)
