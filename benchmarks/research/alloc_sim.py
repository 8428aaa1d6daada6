"""Rollout allocators at equal budget, on a simulated agent whose truth is known.

Question: at the same rollout budget, how much reward contrast does each allocator buy?

The headline measure is the contrast per leaf: the mean, over every leaf of a step, of its
tree's reward variance p (1 − p) (`harness.training.metrics_log.tree_health`). The effective
ratio (the share of mixed prompts) is still reported, but it counts a 28-leaf tree with one flip
as much as a group of 8 split 4/4, and an allocator tuned to it learned less (docs/decisions.md,
"Judging allocation").

The simulated policy (docs/trace_alloc.md, "Simulation benchmark"):

- **Questions** have a latent difficulty d = type + hops + topic effects (readable from the
  question text) + an idiosyncratic part (not readable, except by memorising a recurring
  question). The policy's ability θ grows linearly over the steps, the same for every allocator,
  and a question's success probability is p = σ(θ − d). The spread is set so that GRPO's
  effective ratio (uniform, G = 8) falls inside the paper's GRPO range, 26.8-42.8 %.
- **Turns.** Each search turn moves the success probability as a martingale,
  V' ~ Beta(κ V, κ (1 − V)), so E[V' | V] = V and V_t (1 − V_t) is exactly the contrast left
  (the paper's theory section). The agent answers with a hazard that grows with the searches
  done and with V; the terminal reward is Bernoulli(V). Search turns cost one tool call.
- **Text.** Question text carries type, hops, topic and invented names. Each observation
  lists three document titles, on-topic with probability V', plus a noisy bucket word of
  logit V'. So the real predictor (`trace_alloc.MLPPredictor` on hashed n-grams) has something
  to learn from, and nothing else.
- **Log-probs.** The mean token NLL of an action grows with 4 V (1 − V) of the state it was
  taken from (times log-normal noise), so entropy is an honest, noisy uncertainty signal.

Every allocator runs through `trace_alloc.run_step` with the same question pool each step, for
`--steps` steps, once with the budget in leaves and once in generated tokens (the token budget
equals `--leaves-per-step` times the mean tokens of a uniform rollout, measured by a pilot).
The predictor-based allocators train their own predictor online after each step
(`MemoryPredictor` by default: the text model plus each question's history); its Brier score and
its root and prefix AUC are measured on each step's nodes before it trains on them (held out,
prequential).

The default bank (1,000 questions, 128 per step, 60 steps: about 8 epochs) makes questions recur,
as in real RL; a second, single-pass row (a bank as large as the run, no question seen twice)
shows what the text model alone generalises, so that memory is not mistaken for it. TRACE is
compared with GRPO at equal leaves (`uniform`, G = 8) and at equal prompts
(`uniform[equal prompts]`, G = leaves / TRACE's active prompts).

Run: `python -m benchmarks.research.alloc_sim --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from tqdm import tqdm

from benchmarks.meta import run_meta
from harness.training import tree_health
from trace_alloc import (
    BudgetLimit,
    HashedNgramFeaturizer,
    MemoryPredictor,
    MLPPredictor,
    Prompt,
    Rollout,
    RolloutRequest,
    RolloutTree,
    Turn,
    learn_from_step,
    make_allocator,
    run_step,
)
from trace_alloc.base import Allocator, Predictor


@dataclass
class Args:
    """Allocation simulation options."""

    steps: int = 60
    """training steps per allocator and currency"""
    leaves_per_step: int = 512
    """leaf budget per step (the token budget is derived from it)"""
    pool_size: int = 128
    """candidate prompts per step (uniform uses the first leaves_per_step / G of them)"""
    group_size: int = 8
    """G of the group-based allocators"""
    prefer_unmixed: bool = False
    """TRACE's Stage-2 pooling into unmixed trees (`Trace.prefer_unmixed`; off: each tree gets
    its own m_i N continuations); the `trace[pooled]` row always pools"""
    n_questions: int = 1000
    """question bank size; the pool walks through it epoch by epoch (1,000 questions at 128 per
    step recur about every 8 steps: the multi-epoch regime of real RL)"""
    concentration: float = 3.0
    """κ of the per-turn Beta martingale: each search resolves 1 / (κ + 1) of the variance"""
    text_signal_std: float = 3.0
    """std of the difficulty part that the question text reveals (type, hops, topic; logit)"""
    idiosyncratic_std: float = 4.0
    """std of the difficulty part that the text does not reveal (logit scale)"""
    ability_start: float = -0.3
    """policy ability θ at step 0 (logit scale)"""
    ability_gain: float = 1.0
    """θ grows by this much over the run"""
    memory: bool = True
    """predictor-based allocators use `MemoryPredictor` (text model + each question's history);
    False: the text model alone (the paper's Ṽψ)"""
    prior_strength: float = 2.0
    """MemoryPredictor: bare rollouts the text model's prediction is worth"""
    memory_decay: float = 0.95
    """MemoryPredictor: weight kept per step by a past outcome"""
    replay_size: int = 2048
    """MemoryPredictor: root examples replayed into each text-model update"""
    single_pass: bool = True
    """also run uniform and trace on a bank where no question recurs (the second row)"""
    variants: tuple[str, ...] = ()
    """run only these variants (default: all); uniform and trace are always run"""
    seed: int = 0
    """seed of the world, the pools and every allocator"""
    plot: Path = Path("benchmarks/results/alloc_sim.png")
    """where to save the figure (empty: no figure)"""
    quick: bool = False
    """smoke test: 4 steps, 96 leaves, pool 32"""
    json: bool = False
    """print one JSON object as the last line of stdout"""
    progress: bool = True
    """progress bars on stderr"""

    def __post_init__(self) -> None:
        if self.quick:
            self.steps, self.leaves_per_step, self.pool_size, self.n_questions = 4, 96, 32, 64
        unknown = sorted(set(self.variants) - set(VARIANTS))
        if unknown:
            raise SystemExit(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")


# --- the simulated world ---

TYPES = {"comparison": -1.2, "bridge": 0.0, "inference": 0.8, "compositional": 1.6}
TOPICS = ("film", "novel", "river", "city", "band", "painter", "league", "ship", "dynasty",
          "protein", "election", "opera")  # fmt: skip
HOP_EFFECT = 1.0
SYLLABLES = ("ka", "lo", "mir", "ven", "tas", "dor", "ul", "ne", "shi", "bra", "quo", "fen")
DISTRACTORS = ("weather", "recipe", "football", "stock", "garden", "poem", "fashion", "car")


@dataclass(frozen=True)
class Question:
    """A question of the bank, with its hidden difficulty."""

    qid: str
    text: str
    hops: int
    topic: str
    difficulty: float


class SimWorld:
    """The question bank and the policy's ability schedule."""

    def __init__(self, args: Args) -> None:
        rng = np.random.default_rng(args.seed)
        topic_effect = dict(zip(TOPICS, rng.normal(0.0, 1.0, len(TOPICS)), strict=True))
        drawn = []
        for _ in range(args.n_questions):
            qtype = str(rng.choice(list(TYPES)))
            hops = int(rng.integers(2, 5))
            topic = str(rng.choice(TOPICS))
            readable = TYPES[qtype] + HOP_EFFECT * (hops - 3) + topic_effect[topic]
            drawn.append((qtype, hops, topic, readable, rng.normal(0.0, args.idiosyncratic_std)))
        readable = np.array([d[3] for d in drawn])
        scale = args.text_signal_std / readable.std()  # the readable part gets its set std
        self.questions: list[Question] = []
        for i, (qtype, hops, topic, part, hidden) in enumerate(drawn):
            names = [_name(rng) for _ in range(2)]
            difficulty = scale * (part - readable.mean()) + hidden
            text = f"{qtype} question {hops} hop about a {topic} : {names[0]} and {names[1]} ?"
            self.questions.append(Question(f"q{i}", text, hops, topic, float(difficulty)))
        self.by_id = {q.qid: q for q in self.questions}
        self.args = args

    def ability(self, step: int) -> float:
        """θ at a step (linear in the step index, the same for every allocator)."""
        return self.args.ability_start + self.args.ability_gain * step / max(1, self.args.steps - 1)

    def pool(self, step: int) -> list[Prompt]:
        """The step's candidate prompts: the bank walked epoch by epoch, reshuffled per epoch."""
        size, n = self.args.pool_size, len(self.questions)
        start = step * size
        out = []
        for k in range(start, start + size):
            epoch, offset = divmod(k, n)
            order = np.random.default_rng((self.args.seed, epoch)).permutation(n)
            q = self.questions[int(order[offset])]
            out.append(Prompt(prompt_id=q.qid, text=q.text))
        return out


def _name(rng: np.random.Generator) -> str:
    return "".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 4))))


class SimExecutor:
    """Runs rollout requests on the simulated policy (the benchmark's second engine).

    It reads the latent state of an anchor from `turn.info` (the simulator's env snapshot) and
    records the true success probability of every history it creates (`truth`), for the oracle.
    """

    def __init__(self, world: SimWorld, step: int, rng: np.random.Generator, kappa: float) -> None:
        self.world = world
        self.theta = world.ability(step)
        self.rng = rng
        self.kappa = kappa
        self.truth: dict[str, float] = {}

    def root_p(self, q: Question) -> float:
        """True success probability of a question at this step."""
        return 1.0 / (1.0 + math.exp(-(self.theta - q.difficulty)))

    def __call__(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> list[list[Rollout]]:
        """Run every request to the end."""
        out = []
        for r in requests:
            tree = trees[r.tree_index]
            q = self.world.by_id[tree.prompt_id]
            node = tree.nodes[r.node_id]
            if node.turn is None:
                v, searches = self.root_p(q), 0
            else:
                v, searches = float(node.turn.info["v"]), int(node.turn.info["searches"])
            history = tree.history(r.node_id)
            out.append([self._rollout(q, v, searches, history) for _ in range(r.n)])
        return out

    def _rollout(self, q: Question, v: float, searches: int, history: str) -> Rollout:
        rng = self.rng
        turns = []
        while True:
            hazard = (0.12 if searches < q.hops - 1 else 0.5) + 0.3 * v
            if searches >= 5 or (searches > 0 and rng.random() < hazard):
                break
            nll = (0.15 + 0.9 * 4 * v * (1 - v)) * float(rng.lognormal(0.0, 0.4))
            v = float(rng.beta(self.kappa * v, self.kappa * (1 - v))) if 0 < v < 1 else v
            v = min(max(v, 1e-6), 1 - 1e-6)
            searches += 1
            n_tok = 25 + int(rng.poisson(45))
            action = f" <search> {q.topic} hop {searches} </search>"
            titles = [q.topic if rng.random() < v else str(rng.choice(DISTRACTORS)) for _ in "abc"]
            bucket = int(np.clip(round(math.log(v / (1 - v)) + rng.normal(0, 1.0)), -4, 4))
            obs = f" <information> {' '.join(titles)} signal{bucket + 4} </information>"
            turns.append(
                Turn(
                    action_text=action,
                    action_token_ids=(0,) * n_tok,
                    action_logprobs=(-nll,) * n_tok,
                    observation_text=obs,
                    observation_token_ids=(0,) * 60,
                    n_tool_calls=1,
                    info={"v": v, "searches": searches},
                )
            )
            history += action + obs
            self.truth[history] = v
        reward = float(rng.random() < v)
        n_tok = 15 + int(rng.poisson(25))
        nll = (0.15 + 0.9 * 4 * v * (1 - v)) * float(rng.lognormal(0.0, 0.4))
        turns.append(
            Turn(
                action_text=" <answer> x </answer>",
                action_token_ids=(0,) * n_tok,
                action_logprobs=(-nll,) * n_tok,
                info={"v": reward, "searches": searches},
            )
        )
        return Rollout(turns=tuple(turns), reward=reward)


class OraclePredictor:
    """Knows the true success probability of every history the simulator made (upper bound)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world
        self.executor: SimExecutor | None = None

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """True V of each history."""
        assert self.executor is not None
        ex, by_text = self.executor, {q.text: q for q in self.world.questions}
        return np.array(
            [ex.truth[h] if h in ex.truth else ex.root_p(by_text[h]) for h in histories]
        )

    def update(
        self, histories: Sequence[str], targets: np.ndarray, **_: np.ndarray | None
    ) -> dict[str, float]:
        """Nothing to learn."""
        return {}

    def state_dict(self) -> dict[str, np.ndarray]:
        """No state."""
        return {}

    def load_state_dict(self, state: object) -> None:
        """No state."""


# --- one allocator, many steps ---


@dataclass
class Series:
    """Per-step measurements of one allocator in one currency."""

    effective_ratio: list[float] = field(default_factory=list)
    n_active: list[int] = field(default_factory=list)
    n_mixed: list[int] = field(default_factory=list)
    n_kept: list[int] = field(default_factory=list)
    n_kept_mixed: list[int] = field(default_factory=list)
    mixed_prefix_anchors: list[int] = field(default_factory=list)
    contrast_per_leaf: list[float] = field(default_factory=list)
    flips_per_continuation: list[float] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    alloc_ms: list[float] = field(default_factory=list)
    waves: list[int] = field(default_factory=list)
    n_roots: list[int] = field(default_factory=list)
    brier: list[float] = field(default_factory=list)
    auc: list[float] = field(default_factory=list)
    auc_root: list[float] = field(default_factory=list)
    auc_prefix: list[float] = field(default_factory=list)
    carry: float = 0.0


VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "uniform": ("uniform", {}),
    "dynamic_sampling": ("dynamic_sampling", {}),
    "prompt_predictor": ("prompt_predictor", {}),
    "random_tree": ("random_tree", {}),
    "entropy_tree": ("entropy_tree", {}),
    "trace": ("trace", {}),
    "trace[uniform/uniform]": ("trace", {"stage1": "uniform", "stage2": "uniform"}),
    "trace[active/uniform]": ("trace", {"stage2": "uniform"}),
    "trace[uniform/active]": ("trace", {"stage1": "uniform"}),
    "trace[stage1 only]": ("trace", {"continuations_per_rollout": 0}),
    "trace[m_i >= 4]": ("trace", {"min_per_prompt": 4}),
    "trace[m_i >= 8]": ("trace", {"min_per_prompt": 8}),
    "trace[m_i >= 2]": ("trace", {"min_per_prompt": 2}),
    "trace[pooled]": ("trace", {"prefer_unmixed": True}),
    "trace[no memory]": ("trace", {}),
    "trace[oracle]": ("trace", {}),
    "uniform[equal prompts]": ("uniform", {}),
}
"""Every row of the leaf-budget table. `uniform` is GRPO at equal leaves (G = 8);
`uniform[equal prompts]` is GRPO over as many prompts as TRACE activates (G = leaves / TRACE's
active prompts), so that a share is compared with a share at the same number of prompts."""
MAIN = ("uniform", "dynamic_sampling", "prompt_predictor", "random_tree", "entropy_tree", "trace")


def build(variant: str, args: Args, group_size: int | None = None) -> Allocator:
    """The allocator behind a variant name, with the benchmark's shared settings."""
    name, extra = VARIANTS[variant]
    group = {"group_size": group_size or args.group_size}
    config: dict[str, Any] = {
        "uniform": group,
        "dynamic_sampling": {
            **group,
            "batch_size": args.leaves_per_step // args.group_size,
            "wave_groups": args.leaves_per_step // args.group_size,
        },
        "prompt_predictor": group,
        "random_tree": {},
        "entropy_tree": {},
        "trace": {**group, "prefer_unmixed": args.prefer_unmixed},
    }[name]
    return make_allocator(name, **{**config, **extra})


def make_predictor(args: Args, *, memory: bool) -> Predictor:
    """The learned predictor: the hashed n-gram MLP, with each question's memory if asked."""
    text = MLPPredictor(HashedNgramFeaturizer(), seed=args.seed)
    if not memory:
        return text
    return MemoryPredictor(
        text,
        prior_strength=args.prior_strength,
        decay=args.memory_decay,
        replay_size=args.replay_size,
    )


def run_variant(
    variant: str,
    world: SimWorld,
    args: Args,
    budget: BudgetLimit,
    tokens_per_leaf: float,
    group_size: int | None = None,
) -> Series:
    """Run one allocator for `args.steps` steps and collect its series."""
    allocator = build(variant, args, group_size)
    oracle = OraclePredictor(world) if variant.endswith("[oracle]") else None
    predictor: Predictor | None = oracle
    if oracle is None and allocator.uses_predictor:
        predictor = make_predictor(args, memory=args.memory and "[no memory]" not in variant)
    series = Series()
    carry, estimate = 0.0, tokens_per_leaf
    for step in range(args.steps):
        # the same pool for every allocator; rollout noise is common per (step, variant)
        rng = np.random.default_rng((args.seed, step, 1))
        executor = SimExecutor(
            world, step, np.random.default_rng((args.seed, step, 2)), args.concentration
        )
        if oracle is not None:
            oracle.executor = executor
        result = run_step(
            allocator,
            world.pool(step),
            execute=executor,
            budget=budget,
            rng=rng,
            predictor=predictor,
            carry=carry,
            tokens_per_leaf=estimate,
        )
        carry, estimate = result.carry, result.tokens_per_leaf
        stats = result.stats
        kept = [result.trees[i] for i in result.train_indices]
        series.effective_ratio.append(stats.effective_ratio)
        series.n_active.append(stats.n_active)
        series.n_mixed.append(stats.n_mixed)
        series.n_kept.append(len(kept))
        series.n_kept_mixed.append(sum(t.is_mixed for t in kept))
        series.mixed_prefix_anchors.append(stats.n_mixed_prefix_anchors)
        health = tree_health(result.trees)
        series.contrast_per_leaf.append(health["rollout/reward_var_per_leaf"])
        series.flips_per_continuation.append(health["rollout/flips_per_continuation"])
        series.leaves.append(result.spent.n_leaves)
        series.tokens.append(result.spent.n_tokens)
        series.tool_calls.append(result.spent.n_tool_calls)
        series.alloc_ms.append(1e3 * result.alloc_s)
        series.waves.append(len(result.waves))
        series.n_roots.append(sum(len(t.root.children) for t in result.trees))
        if predictor is not None and oracle is None:
            metrics = learn_from_step(predictor, result.trees)  # scored before it learns
            series.brier.append(metrics["predictor/brier"])
            series.auc.append(metrics["predictor/auc"])
            series.auc_root.append(metrics["predictor/auc_root"])
            series.auc_prefix.append(metrics["predictor/auc_prefix"])
    series.carry = carry
    return series


def pilot_tokens_per_leaf(world: SimWorld, args: Args) -> float:
    """Mean generated tokens of one uniform rollout over the first steps' pools."""
    budget = BudgetLimit(per_step=args.leaves_per_step)
    spent = []
    for step in range(min(3, args.steps)):
        executor = SimExecutor(
            world, step, np.random.default_rng((args.seed, step, 9)), args.concentration
        )
        result = run_step(
            make_allocator("uniform", group_size=args.group_size),
            world.pool(step),
            execute=executor,
            budget=budget,
            rng=np.random.default_rng(0),
        )
        spent.append(result.spent.n_tokens / result.spent.n_leaves)
    return float(np.mean(spent))


def summarise(series: Series, first_epoch: int) -> dict[str, float]:
    """Per-step means (and the predictor's early and late Brier, its AUCs after epoch 1)."""
    k = max(1, len(series.brier) // 4)
    later = slice(min(first_epoch, max(0, len(series.auc_root) - 1)), None)
    return {
        "contrast_per_leaf": _mean(series.contrast_per_leaf),
        "flips_per_continuation": _mean(series.flips_per_continuation),
        "effective_ratio": float(np.mean(series.effective_ratio)),
        "n_active": float(np.mean(series.n_active)),
        "n_mixed": float(np.mean(series.n_mixed)),
        "roots_per_active": float(np.sum(series.n_roots) / max(1, np.sum(series.n_active))),
        "kept_effective_ratio": float(np.sum(series.n_kept_mixed) / max(1, np.sum(series.n_kept))),
        "n_kept_mixed": float(np.mean(series.n_kept_mixed)),
        "mixed_prefix_anchors": float(np.mean(series.mixed_prefix_anchors)),
        "leaves": float(np.mean(series.leaves)),
        "tokens": float(np.mean(series.tokens)),
        "tool_calls": float(np.mean(series.tool_calls)),
        "alloc_ms_median": float(statistics.median(series.alloc_ms)),
        "waves": float(np.mean(series.waves)),
        "final_carry": float(series.carry),
        "brier_first": _mean(series.brier[:k]),
        "brier_last": _mean(series.brier[-k:]),
        "auc_last": _mean(series.auc[-k:]),
        "auc_root_after_epoch1": _mean(series.auc_root[later]),
        "auc_prefix_after_epoch1": _mean(series.auc_prefix[later]),
        "auc_root_second_half": _mean(series.auc_root[len(series.auc_root) // 2 :]),
    }


def _mean(values: Sequence[float]) -> float:
    """Mean ignoring NaN (a step without both outcomes); NaN when nothing is left."""
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


def run_world(
    args: Args, variants: Sequence[str], tokens_variants: Sequence[str]
) -> tuple[dict[str, dict[str, dict[str, float]]], dict[str, dict[str, Series]], dict[str, float]]:
    """Every variant on one world, leaves then tokens; GRPO at equal prompts follows TRACE.

    Returns:
        `(table, runs, budget)`: per currency and variant the summary and the series, and the
        per-step budgets.
    """
    world = SimWorld(args)
    tokens_per_leaf = pilot_tokens_per_leaf(world, args)
    budgets = {
        "leaves": BudgetLimit(currency="leaves", per_step=args.leaves_per_step),
        "tokens": BudgetLimit(
            currency="tokens", per_step=round(args.leaves_per_step * tokens_per_leaf)
        ),
    }
    first_epoch = math.ceil(args.n_questions / args.pool_size)
    runs: dict[str, dict[str, Series]] = {"leaves": {}, "tokens": {}}
    # trace first: GRPO at equal prompts takes its group size from TRACE's active prompts
    order = sorted(variants, key=lambda v: (v == "uniform[equal prompts]", v != "trace"))
    jobs = [("leaves", v) for v in order] + [("tokens", v) for v in tokens_variants]
    for currency, variant in tqdm(
        jobs, desc="allocators", disable=not args.progress, file=sys.stderr
    ):
        group_size = None
        if variant == "uniform[equal prompts]":
            active = float(np.mean(runs["leaves"]["trace"].n_active))
            group_size = max(2, round(args.leaves_per_step / max(active, 1.0)))
        runs[currency][variant] = run_variant(
            variant, world, args, budgets[currency], tokens_per_leaf, group_size
        )
    table = {cur: {v: summarise(s, first_epoch) for v, s in by.items()} for cur, by in runs.items()}
    budget = {
        "leaves_per_step": args.leaves_per_step,
        "tokens_per_step": budgets["tokens"].per_step,
        "pilot_tokens_per_leaf": tokens_per_leaf,
        "pool_size": args.pool_size,
        "n_questions": args.n_questions,
        "epochs": args.steps * args.pool_size / args.n_questions,
    }
    return table, runs, budget


def comparison(leaves: dict[str, dict[str, float]]) -> dict[str, float]:
    """TRACE against GRPO at equal leaves (G = 8) and at equal prompts, side by side."""
    trace, grpo = leaves["trace"], leaves["uniform"]
    out = {
        "trace_over_uniform_contrast": trace["contrast_per_leaf"] / grpo["contrast_per_leaf"],
        "trace_over_uniform_share": trace["effective_ratio"] / grpo["effective_ratio"],
        "trace_over_uniform_mixed_prompts": trace["n_mixed"] / max(grpo["n_mixed"], 1e-9),
    }
    if "uniform[equal prompts]" in leaves:
        eq = leaves["uniform[equal prompts]"]
        out["trace_over_equal_prompts_share"] = trace["effective_ratio"] / eq["effective_ratio"]
        out["trace_over_equal_prompts_mixed_prompts"] = trace["n_mixed"] / max(eq["n_mixed"], 1e-9)
    return out


def main(args: Args) -> dict[str, Any]:
    """Run every allocator in both currencies (and the single-pass row); return the figures."""
    variants = list(VARIANTS)
    if args.variants:
        variants = [v for v in VARIANTS if v in {"uniform", "trace", *args.variants}]
    main_rows = [v for v in MAIN if v in variants]
    table, runs, budget = run_world(args, variants, main_rows)
    leaves, tokens = table["leaves"], table["tokens"]
    result: dict[str, Any] = {
        "contrast_per_leaf": {v: leaves[v]["contrast_per_leaf"] for v in main_rows},
        "effective_ratio": {v: leaves[v]["effective_ratio"] for v in main_rows},
        "mixed_prompts": {v: leaves[v]["n_mixed"] for v in main_rows},
        "trace_over_uniform": leaves["trace"]["effective_ratio"]
        / leaves["uniform"]["effective_ratio"],
        **comparison(leaves),
        "root_auc_after_epoch1": leaves["trace"]["auc_root_after_epoch1"],
        "prefix_auc_after_epoch1": leaves["trace"]["auc_prefix_after_epoch1"],
        "mixed_prefix_anchors": {v: leaves[v]["mixed_prefix_anchors"] for v in main_rows},
        "budget": budget,
        "table": table,
        "series": {
            cur: {
                v: {
                    "effective_ratio": s.effective_ratio,
                    "n_mixed": s.n_mixed,
                    "brier": s.brier,
                    "auc_root": s.auc_root,
                    "auc_prefix": s.auc_prefix,
                    "mixed_prefix_anchors": s.mixed_prefix_anchors,
                }
                for v, s in by.items()
            }
            for cur, by in runs.items()
        },
        "meta": run_meta(),
    }
    if "dynamic_sampling" in tokens:
        # effective groups the trainer gets at equal generated tokens: TRACE's mixed trees
        # against the mixed groups DAPO keeps (its batch is all mixed by construction)
        result["trace_over_dynamic_sampling_tokens"] = tokens["trace"]["n_mixed"] / max(
            tokens["dynamic_sampling"]["n_kept_mixed"], 1e-9
        )
    if args.single_pass:
        once = dataclasses.replace(
            args, quick=False, n_questions=max(args.n_questions, args.steps * args.pool_size)
        )
        single, _, single_budget = run_world(
            once, ["uniform", "trace", "uniform[equal prompts]"], []
        )
        rows = single["leaves"]
        result["single_pass"] = {
            "effective_ratio": {v: r["effective_ratio"] for v, r in rows.items()},
            "mixed_prompts": {v: r["n_mixed"] for v, r in rows.items()},
            **comparison(rows),
            "root_auc_second_half": rows["trace"]["auc_root_second_half"],
            "n_questions": single_budget["n_questions"],
            "table": rows,
        }
    result["targets"] = {
        "trace_over_uniform_contrast >= 1": result["trace_over_uniform_contrast"] >= 1.0,
        "trace_over_uniform_mixed_prompts >= 1.5": result["trace_over_uniform_mixed_prompts"]
        >= 1.5,
        "root_auc_after_epoch1 >= 0.85": result["root_auc_after_epoch1"] >= 0.85,
    }
    if args.plot.name:  # `--plot ""` parses as Path("."): no figure
        save_plot(result, args.plot)
    return result


def print_table(result: dict[str, Any]) -> None:
    """The per-allocator table (stderr), one block per currency, then the single-pass row."""
    console = Console(stderr=True, width=190)
    blocks = [(f"budget in {cur}", cur, rows) for cur, rows in result["table"].items()]
    if "single_pass" in result:
        n = result["single_pass"]["n_questions"]
        blocks.append((f"single pass ({n:,} questions, none recurs)", "leaves",
                       result["single_pass"]["table"]))  # fmt: skip
    columns = ("allocator", "contrast/leaf", "flips/cont.", "eff. ratio", "active", "mixed",
               "roots/active", "mixed prefixes", "leaves", "tokens", "alloc ms",
               "Brier first→last", "AUC root", "AUC prefix")  # fmt: skip
    for title, currency, rows in blocks:
        per_step = result["budget"][f"{currency}_per_step"]
        table = Table(title=f"{title} ({per_step:,} {currency} per step)")
        for col in columns:
            table.add_column(col, justify="right")
        for name, r in rows.items():
            table.add_row(
                escape(name),  # `trace[oracle]` is not rich markup
                f"{r['contrast_per_leaf']:.4f}",
                _fmt(r["flips_per_continuation"]),
                f"{100 * r['effective_ratio']:.1f}%",
                f"{r['n_active']:.1f}",
                f"{r['n_mixed']:.1f}",
                f"{r['roots_per_active']:.1f}",
                f"{r['mixed_prefix_anchors']:.1f}",
                f"{r['leaves']:.0f}",
                f"{r['tokens']:,.0f}",
                f"{r['alloc_ms_median']:.1f}",
                "-"
                if math.isnan(r["brier_first"])
                else f"{r['brier_first']:.3f}→{r['brier_last']:.3f}",
                _fmt(r["auc_root_after_epoch1"]),
                _fmt(r["auc_prefix_after_epoch1"]),
            )
        console.print(table)
    console.print(
        "TRACE / GRPO at equal leaves: contrast per leaf "
        f"{result['trace_over_uniform_contrast']:.2f}x (share "
        f"{result['trace_over_uniform_share']:.2f}x), mixed prompts "
        f"{result['trace_over_uniform_mixed_prompts']:.2f}x; at equal prompts: share "
        f"{result.get('trace_over_equal_prompts_share', float('nan')):.2f}x, mixed prompts "
        f"{result.get('trace_over_equal_prompts_mixed_prompts', float('nan')):.2f}x; root AUC "
        f"after epoch 1 {result['root_auc_after_epoch1']:.3f}; targets: {result['targets']}"
    )


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def save_plot(result: dict[str, Any], path: Path) -> None:
    """Effective ratio, mixed prompts and the predictor's root / prefix AUC per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]["leaves"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for name in (*MAIN, "trace[no memory]", "trace[oracle]"):
        if name not in series:
            continue
        s = series[name]
        style = {"linestyle": "--", "color": "k"} if name == "trace[oracle]" else {}
        axes[0].plot(_smooth(s["effective_ratio"]), label=name, **style)
        axes[1].plot(_smooth(s["n_mixed"]), label=name, **style)
        if s["auc_root"]:
            (line,) = axes[2].plot(_smooth(s["auc_root"]), label=f"{name} root")
            axes[2].plot(_smooth(s["auc_prefix"]), linestyle=":", color=line.get_color())
    axes[0].set(title="effective ratio (leaf budget)", xlabel="step", ylabel="mixed / active")
    axes[1].set(title="mixed prompts per step", xlabel="step")
    axes[2].set(title="predictor AUC before learning the step (root; prefix dotted)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _json_safe(value: Any) -> Any:
    """NaN (no predictor, no AUC) becomes null: strict JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _smooth(values: Sequence[float], window: int = 5) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.size < window:
        return v
    return np.convolve(v, np.ones(window) / window, mode="valid")


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        compact = {k: v for k, v in result.items() if k != "series"}
        print(json.dumps(_json_safe(compact), sort_keys=True), flush=True)
