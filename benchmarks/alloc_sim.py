"""Rollout allocators at equal budget, on a simulated agent whose truth is known.

Question: at the same rollout budget, how much reward contrast does each allocator buy?

The simulated policy (docs/trace_alloc.md, "Simulation benchmark"):

- **Questions** have a latent difficulty d = type + hops + topic effects (readable from the
  question text) + an idiosyncratic part (not readable, except by memorising a recurring
  question). The policy's ability θ grows linearly over the steps, the same for every allocator,
  and a question's success probability is p = σ(θ − d). The spread is set so that GRPO's
  effective ratio (uniform, G = 8) falls inside the paper's GRPO range, 26.8-42.8 %.
- **Turns.** Each search turn moves the success probability as a martingale,
  V' ~ Beta(κ V, κ (1 − V)), so E[V' | V] = V and V_t (1 − V_t) is exactly the contrast left
  (trace_paper.md §2.4). The agent answers with a hazard that grows with the searches done and
  with V; the terminal reward is Bernoulli(V). Search turns cost one tool call.
- **Text.** Question text carries type, hops, topic and invented names. Each observation
  lists three document titles, on-topic with probability V', plus a noisy bucket word of
  logit V'. So the real predictor (`trace_alloc.MLPPredictor` on hashed n-grams) has something
  to learn from, and nothing else.
- **Log-probs.** The mean token NLL of an action grows with 4 V (1 − V) of the state it was
  taken from (times log-normal noise), so entropy is an honest, noisy uncertainty signal.

Every allocator runs through `trace_alloc.run_step` with the same question pool each step, for
`--steps` steps, once with the budget in leaves and once in generated tokens (the token budget
equals `--leaves-per-step` times the mean tokens of a uniform rollout, measured by a pilot).
The predictor-based allocators train their own predictor online after each step; its Brier score
is measured on each step's nodes before it trains on them (held out, prequential).

Run: `python -m benchmarks.alloc_sim --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

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
from rich.table import Table
from tqdm import tqdm

from benchmarks.meta import run_meta
from trace_alloc import (
    BudgetLimit,
    HashedNgramFeaturizer,
    MLPPredictor,
    Prompt,
    Rollout,
    RolloutRequest,
    RolloutTree,
    Turn,
    calibration_report,
    make_allocator,
    run_step,
    training_examples,
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
    n_questions: int = 4000
    """question bank size; the pool walks through it epoch by epoch"""
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
            self.steps, self.leaves_per_step, self.pool_size, self.n_questions = 4, 96, 32, 400


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


class World:
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

    def __init__(self, world: World, step: int, rng: np.random.Generator, kappa: float) -> None:
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

    def __init__(self, world: World) -> None:
        self.world = world
        self.executor: SimExecutor | None = None

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """True V of each history."""
        assert self.executor is not None
        ex, by_text = self.executor, {q.text: q for q in self.world.questions}
        return np.array(
            [ex.truth[h] if h in ex.truth else ex.root_p(by_text[h]) for h in histories]
        )

    def update(self, histories: Sequence[str], targets: np.ndarray) -> dict[str, float]:
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
    leaves: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    alloc_ms: list[float] = field(default_factory=list)
    waves: list[int] = field(default_factory=list)
    brier: list[float] = field(default_factory=list)
    auc: list[float] = field(default_factory=list)
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
    "trace[oracle]": ("trace", {}),
}
MAIN = ("uniform", "dynamic_sampling", "prompt_predictor", "random_tree", "entropy_tree", "trace")


def build(variant: str, args: Args) -> Allocator:
    """The allocator behind a variant name, with the benchmark's shared settings."""
    name, extra = VARIANTS[variant]
    group = {"group_size": args.group_size}
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
        "trace": group,
    }[name]
    return make_allocator(name, **config, **extra)


def run_variant(
    variant: str, world: World, args: Args, budget: BudgetLimit, tokens_per_leaf: float
) -> Series:
    """Run one allocator for `args.steps` steps and collect its series."""
    allocator = build(variant, args)
    oracle = OraclePredictor(world) if variant.endswith("[oracle]") else None
    predictor: Predictor | None = oracle
    if oracle is None and allocator.uses_predictor:
        predictor = MLPPredictor(HashedNgramFeaturizer(), seed=args.seed)
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
        series.leaves.append(result.spent.n_leaves)
        series.tokens.append(result.spent.n_tokens)
        series.tool_calls.append(result.spent.n_tool_calls)
        series.alloc_ms.append(1e3 * result.alloc_s)
        series.waves.append(len(result.waves))
        if predictor is not None and oracle is None:
            histories, targets, counts = training_examples(result.trees)
            report = calibration_report(predictor.predict(histories), targets, counts)
            series.brier.append(report.brier)
            series.auc.append(report.auc)
            predictor.update(histories, targets)
    series.carry = carry
    return series


def pilot_tokens_per_leaf(world: World, args: Args) -> float:
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


def summarise(series: Series) -> dict[str, float]:
    """Per-step means (and the predictor's early and late Brier)."""
    k = max(1, len(series.brier) // 4)
    return {
        "effective_ratio": float(np.mean(series.effective_ratio)),
        "n_active": float(np.mean(series.n_active)),
        "n_mixed": float(np.mean(series.n_mixed)),
        "kept_effective_ratio": float(np.sum(series.n_kept_mixed) / max(1, np.sum(series.n_kept))),
        "n_kept_mixed": float(np.mean(series.n_kept_mixed)),
        "mixed_prefix_anchors": float(np.mean(series.mixed_prefix_anchors)),
        "leaves": float(np.mean(series.leaves)),
        "tokens": float(np.mean(series.tokens)),
        "tool_calls": float(np.mean(series.tool_calls)),
        "alloc_ms_median": float(statistics.median(series.alloc_ms)),
        "waves": float(np.mean(series.waves)),
        "final_carry": float(series.carry),
        "brier_first": float(np.mean(series.brier[:k])) if series.brier else float("nan"),
        "brier_last": float(np.mean(series.brier[-k:])) if series.brier else float("nan"),
        "auc_last": float(np.nanmean(series.auc[-k:])) if series.auc else float("nan"),
    }


def main(args: Args) -> dict[str, Any]:
    """Run every allocator in both currencies; return the figures."""
    world = World(args)
    tokens_per_leaf = pilot_tokens_per_leaf(world, args)
    budgets = {
        "leaves": BudgetLimit(currency="leaves", per_step=args.leaves_per_step),
        "tokens": BudgetLimit(
            currency="tokens", per_step=round(args.leaves_per_step * tokens_per_leaf)
        ),
    }
    runs: dict[str, dict[str, Series]] = {"leaves": {}, "tokens": {}}
    jobs = [("leaves", v) for v in VARIANTS] + [("tokens", v) for v in MAIN]
    for currency, variant in tqdm(
        jobs, desc="allocators", disable=not args.progress, file=sys.stderr
    ):
        runs[currency][variant] = run_variant(
            variant, world, args, budgets[currency], tokens_per_leaf
        )
    table = {cur: {v: summarise(s) for v, s in by.items()} for cur, by in runs.items()}
    leaves, tokens = table["leaves"], table["tokens"]
    result: dict[str, Any] = {
        "effective_ratio": {v: leaves[v]["effective_ratio"] for v in MAIN},
        "trace_over_uniform": leaves["trace"]["effective_ratio"]
        / leaves["uniform"]["effective_ratio"],
        # effective groups the trainer gets at equal generated tokens: TRACE's mixed trees
        # against the mixed groups DAPO keeps (its batch is all mixed by construction)
        "trace_over_dynamic_sampling_tokens": tokens["trace"]["n_mixed"]
        / max(tokens["dynamic_sampling"]["n_kept_mixed"], 1e-9),
        "mixed_prefix_anchors": {v: leaves[v]["mixed_prefix_anchors"] for v in MAIN},
        "budget": {
            "leaves_per_step": args.leaves_per_step,
            "tokens_per_step": budgets["tokens"].per_step,
            "pilot_tokens_per_leaf": tokens_per_leaf,
        },
        "table": table,
        "series": {
            cur: {
                v: {
                    "effective_ratio": s.effective_ratio,
                    "brier": s.brier,
                    "mixed_prefix_anchors": s.mixed_prefix_anchors,
                }
                for v, s in by.items()
            }
            for cur, by in runs.items()
        },
        "meta": run_meta(),
    }
    result["targets"] = {
        "trace_over_uniform >= 2.3": result["trace_over_uniform"] >= 2.3,
        "trace_over_dynamic_sampling_tokens >= 1.2": result["trace_over_dynamic_sampling_tokens"]
        >= 1.2,
        "trace mixed prefix anchors > random_tree": leaves["trace"]["mixed_prefix_anchors"]
        > leaves["random_tree"]["mixed_prefix_anchors"],
    }
    if args.plot.name:  # `--plot ""` parses as Path("."): no figure
        save_plot(result, args.plot)
    return result


def print_table(result: dict[str, Any]) -> None:
    """The per-allocator table (stderr), one block per currency."""
    console = Console(stderr=True, width=170)
    columns = ("allocator", "eff. ratio", "active", "mixed", "kept mixed", "mixed prefixes",
               "leaves", "tokens", "tool calls", "alloc ms", "Brier first→last", "AUC")  # fmt: skip
    for currency, rows in result["table"].items():
        per_step = result["budget"][f"{currency}_per_step"]
        table = Table(title=f"budget in {currency} ({per_step:,} per step)")
        for col in columns:
            table.add_column(col, justify="right")
        for name, r in rows.items():
            table.add_row(
                name,
                f"{100 * r['effective_ratio']:.1f}%",
                f"{r['n_active']:.1f}",
                f"{r['n_mixed']:.1f}",
                f"{r['n_kept_mixed']:.1f}",
                f"{r['mixed_prefix_anchors']:.1f}",
                f"{r['leaves']:.0f}",
                f"{r['tokens']:,.0f}",
                f"{r['tool_calls']:.0f}",
                f"{r['alloc_ms_median']:.1f}",
                "-"
                if math.isnan(r["brier_first"])
                else f"{r['brier_first']:.3f}→{r['brier_last']:.3f}",
                "-" if math.isnan(r["auc_last"]) else f"{r['auc_last']:.3f}",
            )
        console.print(table)
    console.print(
        f"TRACE / uniform effective ratio: {result['trace_over_uniform']:.2f}x; "
        f"TRACE / DAPO effective groups at equal tokens: "
        f"{result['trace_over_dynamic_sampling_tokens']:.2f}x; targets: {result['targets']}"
    )


def save_plot(result: dict[str, Any], path: Path) -> None:
    """Effective ratio, mixed prefix anchors and predictor Brier per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result["series"]["leaves"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for name in (*MAIN, "trace[oracle]"):
        s = series[name]
        style = {"linestyle": "--", "color": "k"} if name == "trace[oracle]" else {}
        axes[0].plot(_smooth(s["effective_ratio"]), label=name, **style)
        axes[1].plot(_smooth(s["mixed_prefix_anchors"]), label=name, **style)
        if s["brier"]:
            axes[2].plot(s["brier"], label=name)
    axes[0].set(
        title="effective ratio (leaf budget; uniform = dynamic_sampling)",
        xlabel="step",
        ylabel="mixed / active prompts",
    )
    axes[1].set(title="mixed prefix anchors per step", xlabel="step")
    axes[2].set(title="predictor Brier on next step's nodes", xlabel="step")
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
