"""Supervised warm start: weighted next-token loss on demonstrations, checkpoints picked by EM.

The loop is plain PyTorch (AdamW, linear warm-up then cosine decay, length-bucketed batches
padded on the right). Right padding needs no attention mask under a causal model: pad tokens
come after every real token, so they can never be attended to, and their loss weight is 0.

Every `eval_every` steps (from `eval_from` on) a caller-supplied `evaluate(model)` returns the
sampled EM on a dev set (and `evaluate_reading(model)` the EM on a world never trained on), and
the weights are kept in memory. `select_checkpoint` then picks the one to ship: RL needs a
starting policy that is neither hopeless nor saturated, so the pick lies in a target band of
dev EM, and among those the one that reads best (highest EM on the unseen world: a policy that
memorised its world scores 0 there); training stops early once dev EM passes `stop_above`.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from harness.tiny_policy.config import SFTConfig
from harness.tiny_policy.demos import EncodedDemo

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["Checkpoint", "SFTResult", "select_checkpoint", "train_sft"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A dev evaluation during training, with the weights it was made on."""

    step: int
    dev_em: float
    state: dict[str, torch.Tensor] = field(repr=False)
    reading_em: float | None = None
    """EM on a world never trained on (None: not measured)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SFTResult:
    """What the warm start did."""

    n_steps: int
    wall_s: float
    tokens_per_s: float
    n_params: int
    log: tuple[dict[str, float], ...]
    """One record per logging window: step, loss (weighted), action_loss, lr, tokens_per_s."""
    checkpoints: tuple[Checkpoint, ...]
    stopped_early: bool


def select_checkpoint(checkpoints: Sequence[Checkpoint], band: tuple[float, float]) -> Checkpoint:
    """The best-reading checkpoint whose dev EM lies in the band (latest on a tie).

    Without a reading score, or with no checkpoint in the band, the one whose dev EM is
    closest to the band's middle.

    >>> cps = [Checkpoint(step=s, dev_em=e, state={}) for s, e in [(1, .1), (2, .4), (3, .8)]]
    >>> select_checkpoint(cps, (0.3, 0.6)).step
    2

    Raises:
        ValueError: for no checkpoints.
    """
    if not checkpoints:
        raise ValueError("no checkpoint to select from")
    low, high = band
    reading = [c for c in checkpoints if low <= c.dev_em <= high and c.reading_em is not None]
    if reading:
        return max(reversed(reading), key=lambda c: c.reading_em or 0.0)
    middle = (low + high) / 2
    return min(reversed(checkpoints), key=lambda c: abs(c.dev_em - middle))


def train_sft(
    model: PreTrainedModel,
    demos: Sequence[EncodedDemo],
    config: SFTConfig,
    *,
    pad_id: int,
    evaluate: Callable[[PreTrainedModel], float] | None = None,
    evaluate_reading: Callable[[PreTrainedModel], float] | None = None,
    progress: bool = False,
) -> SFTResult:
    """Train `model` in place on the demonstrations.

    Args:
        model: A causal LM (training mode is set here).
        demos: Token ids with per-token loss weights.
        config: Steps, optimiser, evaluation and band.
        pad_id: Id used to pad batches (never in the loss).
        evaluate: Returns the dev sampled EM of the model (called in eval mode, no grad).
        evaluate_reading: Returns its EM on a world never trained on (same conditions).
        progress: Draw a tqdm bar on stderr.

    Returns:
        The log, the kept checkpoints, and throughput.
    """
    if not demos:
        raise ValueError("no demonstrations to train on")
    rng = random.Random(config.seed)
    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    optim = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
    )
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    batches = _batches(demos, config.batch_size, rng, pad_id)
    sampler = torch.Generator().manual_seed(config.seed)
    log_records: list[dict[str, float]] = []
    checkpoints: list[Checkpoint] = []
    start = time.perf_counter()
    n_tokens = 0
    window: dict[str, float] = {"loss": 0.0, "action_loss": 0.0, "n": 0, "tokens": 0}
    window_start = start
    stopped_early = False
    step = 0
    model.train()
    bar = tqdm(total=config.max_steps, desc="warm start", disable=not progress, leave=False)
    while step < config.max_steps:
        ids, weights, action = next(batches)  # (B, T), (B, T), (B, T)
        lr = _lr(step, config)
        for group in optim.param_groups:
            group["lr"] = lr
        loss, action_loss = _weighted_loss(model, ids, weights, action, config, sampler)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optim.step()
        step += 1
        bar.update(1)
        window["loss"] += loss.item()
        window["action_loss"] += action_loss
        window["n"] += 1
        window["tokens"] += int((ids != pad_id).sum())
        n_tokens += int((ids != pad_id).sum())
        if step % 25 == 0 or step == config.max_steps:
            now = time.perf_counter()
            record = {
                "step": step,
                "loss": window["loss"] / window["n"],
                "action_loss": window["action_loss"] / window["n"],
                "lr": lr,
                "tokens_per_s": window["tokens"] / max(now - window_start, 1e-9),
                "elapsed_s": now - start,
            }
            log_records.append(record)
            bar.set_postfix(loss=f"{record['action_loss']:.3f}")
            log.debug("sft %s", record)
            window = {"loss": 0.0, "action_loss": 0.0, "n": 0, "tokens": 0}
            window_start = now
        due = step >= config.eval_from and (step - config.eval_from) % config.eval_every == 0
        if evaluate is not None and (due or step == config.max_steps):
            model.eval()
            with torch.no_grad():
                dev_em = float(evaluate(model))
                reading = None if evaluate_reading is None else float(evaluate_reading(model))
            model.train()
            state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            checkpoints.append(
                Checkpoint(step=step, dev_em=dev_em, state=state, reading_em=reading)
            )
            log.info(
                "warm start step %d: dev sampled EM %.3f, unseen-world EM %s",
                step,
                dev_em,
                "-" if reading is None else f"{reading:.3f}",
            )
            if dev_em > config.stop_above:
                stopped_early = step < config.max_steps
                break
        if config.max_time_s is not None and time.perf_counter() - start > config.max_time_s:
            log.warning("warm start hit max_time_s=%s at step %d", config.max_time_s, step)
            break
    bar.close()
    model.eval()
    wall = time.perf_counter() - start
    return SFTResult(
        n_steps=step,
        wall_s=wall,
        tokens_per_s=n_tokens / max(wall, 1e-9),
        n_params=n_params,
        log=tuple(log_records),
        checkpoints=tuple(checkpoints),
        stopped_early=stopped_early,
    )


def _weighted_loss(
    model: PreTrainedModel,
    ids: torch.Tensor,
    weights: torch.Tensor,
    action: torch.Tensor,
    config: SFTConfig,
    sampler: torch.Generator,
) -> tuple[torch.Tensor, float]:
    """Weighted next-token loss, with the output layer applied only where a loss is taken.

    Prompt and observation positions carry a small LM weight; only a random `lm_sample_rate`
    share of them is scored, at weight / rate, so the loss is unchanged in expectation while
    the vocabulary projection (a third of a tiny model's compute) mostly runs on action tokens.

    Returns:
        The loss to minimise, and the mean loss on imitated action tokens (for the log).
    """
    hidden = model.base_model(input_ids=ids).last_hidden_state[:, :-1]  # (B, T-1, H)
    targets, w, is_action = ids[:, 1:], weights[:, 1:], action[:, 1:]  # (B, T-1) each
    denominator = w.sum().clamp(min=1e-6)  # the full weight mass: sampling keeps its expectation
    rate = config.lm_sample_rate
    if rate < 1:
        keep = torch.rand(w.shape, generator=sampler) < rate  # (B, T-1)
        w = torch.where(is_action, w, torch.where(keep, w / rate, torch.zeros_like(w)))
    scored = w > 0  # (B, T-1)
    logits = model.get_output_embeddings()(hidden[scored]).float()  # (N, V)
    nll = F.cross_entropy(logits, targets[scored], reduction="none")  # (N,)
    loss = (nll * w[scored]).sum() / denominator
    learned = (w[scored] == 1.0) & is_action[scored]  # (N,) the imitated action tokens
    return loss, nll[learned].mean().item() if learned.any() else 0.0


def _lr(step: int, config: SFTConfig) -> float:
    """Linear warm-up, then cosine decay to 10% over the remaining steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _batches(
    demos: Sequence[EncodedDemo], batch_size: int, rng: random.Random, pad: int
) -> Any:  # an endless iterator of (ids, weights, action_mask) tensors
    """Endless length-bucketed batches: shuffle, sort within pools of 32 batches, shuffle."""
    while True:
        order = list(range(len(demos)))
        rng.shuffle(order)
        pool = batch_size * 32
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: len(demos[i].token_ids))
            batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        for batch in batches:
            width = max(len(demos[i].token_ids) for i in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # (B, T)
            weights = torch.zeros((len(batch), width))  # (B, T)
            action = torch.zeros((len(batch), width), dtype=torch.bool)  # (B, T)
            for row, i in enumerate(batch):
                n = len(demos[i].token_ids)
                ids[row, :n] = torch.tensor(demos[i].token_ids)
                weights[row, :n] = torch.tensor(demos[i].weights)
                action[row, :n] = torch.tensor(demos[i].action_mask)
            yield ids, weights, action
