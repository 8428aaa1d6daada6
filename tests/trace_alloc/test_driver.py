"""The ask-tell driver and every allocator: exact budgets, caps, carries, contract errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from alloc_fakes import FixedPredictor, MartingaleExecutor, make_pool
from hypothesis import given
from hypothesis import strategies as st

from trace_alloc import (
    AllocError,
    BudgetExceededError,
    BudgetLimit,
    ExecutionError,
    RolloutRequest,
    Trace,
    UnknownNameError,
    make_allocator,
    run_step,
)
from trace_alloc.allocators import ALLOCATORS
from trace_alloc.base import AllocPlan


def step(name, *, budget=None, pool=40, seed=0, n_turns=3, carry=0.0, **cfg):
    if name == "trace":
        # the placement mechanics, on the predictor alone; the flip floor and the posterior
        # on the tree's own outcomes (the defaults) have tests of their own
        cfg = {"min_flip_prob": 0.0, "prefix_prior": None, **cfg}
    budget = budget or BudgetLimit(per_step=64)
    prompts, p = make_pool(pool, seed)
    engine = MartingaleExecutor(p, seed=seed, n_turns=n_turns)
    predictor = FixedPredictor({pr.text: p[pr.prompt_id] for pr in prompts})
    result = run_step(
        make_allocator(name, **cfg),
        prompts,
        execute=engine,
        budget=budget,
        rng=np.random.default_rng(seed),
        predictor=predictor,
        carry=carry,
        tokens_per_leaf=15.0,
    )
    return result, engine


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
@pytest.mark.parametrize("per_step", [2, 3, 17, 64, 101])
def test_every_allocator_spends_exactly_the_leaf_budget(name, per_step):
    result, _ = step(name, budget=BudgetLimit(per_step=per_step))
    assert result.spent.n_leaves == per_step
    assert result.carry == 0
    assert result.stats.spend == result.spent  # the meter agrees with the trees


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_no_prompt_ever_gets_exactly_one_root_rollout(name):
    for per_step in (5, 23, 64):
        result, _ = step(name, budget=BudgetLimit(per_step=per_step))
        roots = [len(t.root.children) for t in result.trees]
        assert 1 not in roots, roots


@given(
    name=st.sampled_from(sorted(ALLOCATORS)),
    per_step=st.integers(0, 150),
    pool=st.integers(1, 30),
    n_turns=st.integers(1, 4),
    seed=st.integers(0, 3),
)
def test_leaf_budget_is_never_exceeded_and_spent_when_feasible(name, per_step, pool, n_turns, seed):
    if per_step == 0:
        with pytest.raises(ValueError, match="per_step"):
            BudgetLimit(per_step=0)
        return
    result, _ = step(
        name, budget=BudgetLimit(per_step=per_step), pool=pool, n_turns=n_turns, seed=seed
    )
    assert result.spent.n_leaves <= per_step
    assert result.carry == result.spent.n_leaves - per_step
    if name == "trace" and per_step >= 2:
        # each tree's prefixes absorb up to m_i N = m_i continuations; one-turn episodes have
        # none, so the roots take it up to their caps
        expected = min(per_step, (2 if n_turns > 1 else 1) * 16 * pool)
        assert result.spent.n_leaves == expected
        # with the defaults' flip floor, a settled tree's share goes to its roots, never past
        # their cap, so a small pool may leave budget unspent
        floored, _ = step(
            name,
            budget=BudgetLimit(per_step=per_step),
            pool=pool,
            n_turns=n_turns,
            seed=seed,
            min_flip_prob=Trace.min_flip_prob,
            prefix_prior=Trace.prefix_prior,
        )
        assert min(per_step, 16 * pool) <= floored.spent.n_leaves <= expected


def test_trace_is_within_caps_and_gives_each_prompt_m_times_n_continuations():
    result, _ = step(
        "trace",
        budget=BudgetLimit(per_step=90),
        max_per_prompt=6,
        continuations_per_rollout=2,
        explore_frac=0.0,
        prefer_unmixed=False,  # the paper's rule: every tree gets its share
    )
    roots_wave = [w for w in result.waves if w.stage == "roots"]
    assert len(roots_wave) == 1 and roots_wave[0].spend.n_leaves == 30  # ⌈90 / 3⌉
    for tree in result.trees:
        m = len(tree.root.children)
        assert m == 0 or 2 <= m <= 6
        continuations = tree.n_leaves - m
        assert continuations == 2 * m  # Σ K = m_i N, exact here (30 · 2 = 60)
    assert result.spent.n_leaves == 90


def test_trace_stage_two_only_expands_unmixed_non_leaf_prefixes():
    result, _ = step("trace", budget=BudgetLimit(per_step=60), explore_frac=0.0)
    for tree in result.trees:
        for node in tree.nodes:
            if node.wave == 1 and node.parent_id is not None:
                anchor = tree.nodes[node.parent_id]
                if anchor.wave == 0 and anchor.parent_id is not None:
                    assert not anchor.is_leaf


def test_trace_min_per_prompt_concentrates_the_roots():
    result, _ = step("trace", budget=BudgetLimit(per_step=64), min_per_prompt=4, explore_frac=0.1)
    roots = [len(t.root.children) for t in result.trees]
    assert all(m == 0 or 4 <= m <= 16 for m in roots)
    assert sum(roots) == 32 and result.spent.n_leaves == 64
    with pytest.raises(ValueError, match="min_per_prompt"):
        Trace(min_per_prompt=17)


def test_trace_ablation_switches_change_the_plan():
    active, _ = step("trace", budget=BudgetLimit(per_step=64), explore_frac=0.0)
    uniform1, _ = step("trace", budget=BudgetLimit(per_step=64), stage1="uniform", group_size=8)
    assert [len(t.root.children) for t in uniform1.trees][:4] == [8, 8, 8, 8]
    assert sum(len(t.root.children) > 0 for t in uniform1.trees) == 4
    assert sum(len(t.root.children) > 0 for t in active.trees) != 4
    uniform2, _ = step("trace", budget=BudgetLimit(per_step=64), stage2="uniform")
    assert uniform2.spent.n_leaves == 64


def test_trace_filters_certain_prompts():
    prompts, p = make_pool(20)
    table = {pr.text: (0.5 if i < 5 else 0.0) for i, pr in enumerate(prompts)}
    result = run_step(
        Trace(explore_frac=0.0, continuations_per_rollout=0, p_clip=0.0),
        prompts,
        execute=MartingaleExecutor(p),
        budget=BudgetLimit(per_step=40),
        rng=np.random.default_rng(0),
        predictor=FixedPredictor(table),
    )
    assert [i for i, t in enumerate(result.trees) if t.n_leaves] == [0, 1, 2, 3, 4]


def test_dynamic_sampling_stops_at_its_batch_and_trains_on_mixed_groups_only():
    result, engine = step(
        "dynamic_sampling",
        budget=BudgetLimit(per_step=400),
        batch_size=3,
        wave_groups=2,
        group_size=4,
    )
    mixed = [i for i, t in enumerate(result.trees) if t.is_mixed]
    assert len(result.train_indices) == 3 and result.train_indices == mixed[:3]
    assert engine.calls == len(result.waves) >= 2
    assert result.spent.n_leaves < 400 and result.carry < 0  # unspent budget becomes credit


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_token_budget_overshoot_is_carried_and_exact_in_aggregate(name):
    budget = BudgetLimit(currency="tokens", per_step=900)
    carry, total = 0.0, 0
    for s in range(4):
        result, _ = step(name, budget=budget, carry=carry, seed=s)
        assert result.limit == 900 - carry
        assert result.spent.n_tokens >= result.limit or result.waves[-1].stage in ("full",)
        carry = result.carry
        total += result.spent.n_tokens
        first = result.waves[0].spend
        assert result.tokens_per_leaf == first.n_tokens / first.n_leaves
        assert len(result.waves) <= 6  # later waves are sized by the previous wave's cost
    assert total == 4 * 900 + carry
    assert 0 <= carry < 16 * 15  # at most one wave's worth of overshoot


def test_token_currency_needs_an_estimate():
    with pytest.raises(ValueError, match="tokens_per_leaf"):
        run_step(
            make_allocator("uniform"),
            make_pool(3)[0],
            execute=MartingaleExecutor(make_pool(3)[1]),
            budget=BudgetLimit(currency="tokens", per_step=100),
            rng=np.random.default_rng(0),
        )


def test_unknown_names_suggest_the_closest():
    with pytest.raises(UnknownNameError, match="Did you mean 'random_tree'"):
        make_allocator("random-tree")
    with pytest.raises(KeyError):  # also a KeyError for generic handlers
        make_allocator("nope")


def test_configs_validate_themselves():
    with pytest.raises(ValueError, match="max_per_prompt"):
        Trace(max_per_prompt=1)
    with pytest.raises(ValueError, match="group_size"):
        make_allocator("uniform", group_size=1)
    with pytest.raises(ValueError, match="iterations"):
        make_allocator("random_tree", iterations=0)


def test_trace_without_predictor_is_a_clear_error():
    prompts, p = make_pool(4)
    with pytest.raises(AllocError, match="needs a predictor"):
        run_step(
            Trace(),
            prompts,
            execute=MartingaleExecutor(p),
            budget=BudgetLimit(per_step=8),
            rng=np.random.default_rng(0),
        )


class Greedy:
    """An allocator that breaks the exact budget."""

    name = "greedy"
    uses_predictor = False

    def ask(self, view, *, predictor, rng):
        return AllocPlan(
            requests=(RolloutRequest(tree_index=0, node_id=0, n=view.leaves_left + 1),)
        )

    def train_indices(self, trees):
        return []


def test_driver_rejects_plans_over_an_exact_budget():
    prompts, p = make_pool(2)
    with pytest.raises(BudgetExceededError, match="asked for 9 leaves with 8 left"):
        run_step(
            Greedy(),
            prompts,
            execute=MartingaleExecutor(p),
            budget=BudgetLimit(per_step=8),
            rng=np.random.default_rng(0),
        )


def test_driver_rejects_an_executor_that_breaks_its_contract():
    prompts, p = make_pool(4)
    engine = MartingaleExecutor(p)

    def short(trees, requests):
        return [rollouts[:-1] for rollouts in engine(trees, requests)]

    with pytest.raises(ExecutionError, match="rollouts for"):
        run_step(
            make_allocator("uniform", group_size=2),
            prompts,
            execute=short,
            budget=BudgetLimit(per_step=4),
            rng=np.random.default_rng(0),
        )


def test_random_tree_shape_matches_tree_grpo():
    result, _ = step(
        "random_tree",
        budget=BudgetLimit(per_step=60),
        roots_per_prompt=2,
        expansions_per_iteration=2,
        iterations=2,
    )
    active = [t for t in result.trees if t.n_leaves]
    assert len(active) == 6  # 60 / (2 · (1 + 2 · 2))
    assert all(len(t.root.children) >= 2 for t in active)
    assert [w.stage for w in result.waves] == ["roots", "expand", "expand"]
    assert [w.spend.n_leaves for w in result.waves] == [12, 24, 24]


def test_entropy_tree_branches_at_the_most_uncertain_turns():
    result, _ = step(
        "entropy_tree",
        budget=BudgetLimit(per_step=30),
        penalty=0.0,
        expansions_per_iteration=1,
        roots_per_prompt=1,
        n_turns=4,
    )
    # the fake's search actions have NLL = v, so with no penalty each tree puts every
    # continuation at the prefix whose next action had the highest NLL
    for tree in result.trees:
        if tree.n_leaves < 2:
            continue
        counts = Counter(
            tree.nodes[c].parent_id
            for c in range(len(tree.nodes))
            if tree.nodes[c].wave > 0 and tree.nodes[tree.nodes[c].parent_id].wave == 0
        )
        assert len(counts) == 1


def test_trace_exploration_floor_reaches_prompts_the_predictor_would_filter():
    prompts, p = make_pool(30)
    table = {pr.text: (0.5 if i < 3 else 0.0) for i, pr in enumerate(prompts)}
    kwargs = {"continuations_per_rollout": 0, "p_clip": 0.0, "min_per_prompt": 2}
    counts = []
    for explore in (0.0, 0.5):
        result = run_step(
            Trace(explore_frac=explore, **kwargs),
            prompts,
            execute=MartingaleExecutor(p),
            budget=BudgetLimit(per_step=40),
            rng=np.random.default_rng(0),
            predictor=FixedPredictor(table),
        )
        opened = [i for i, t in enumerate(result.trees) if t.n_leaves]
        counts.append(sum(i >= 3 for i in opened))
        assert result.spent.n_leaves == 40
    assert counts[0] == 0  # without a floor, predicted-certain prompts are filtered out
    assert counts[1] >= 7  # ⌊0.5 · 40 / 2⌋ = 10 random floors, most on the filtered prompts


def test_trace_exploration_floor_survives_a_small_pool():
    """⌊0.05 · 12 / 2⌋ = 0 used to switch exploration off below M = 40 roots."""
    prompts, _ = make_pool(12)
    certain = FixedPredictor(default=0.0)  # the solver alone would open nothing
    result = run_step(
        make_allocator("trace", min_per_prompt=2),
        prompts,
        execute=MartingaleExecutor({pr.prompt_id: 0.5 for pr in prompts}),
        budget=BudgetLimit(per_step=24),
        rng=np.random.default_rng(0),
        predictor=certain,
    )
    assert result.waves[0].diagnostics["n_explore"] >= 1
    assert result.stats.n_active >= 1


def test_trace_prefer_unmixed_spends_stage_two_on_trees_not_yet_mixed():
    def spent_on_mixed(prefer: bool) -> tuple[int, int]:
        result, _ = step(
            "trace", budget=BudgetLimit(per_step=96), explore_frac=0.0, prefer_unmixed=prefer
        )
        mixed_after_roots = on_mixed = 0
        for tree in result.trees:
            bare = [n for n in tree.nodes if n.wave == 0 and n.is_leaf]
            if len({n.reward for n in bare}) == 2:
                mixed_after_roots += 1
                on_mixed += sum(1 for n in tree.nodes if n.wave > 0 and n.is_leaf)
        return mixed_after_roots, on_mixed

    mixed, on_mixed = spent_on_mixed(False)
    assert mixed > 0 and on_mixed > 0
    mixed, on_mixed = spent_on_mixed(True)
    assert mixed > 0 and on_mixed == 0


@given(
    per_step=st.integers(2, 160),
    pool=st.integers(1, 30),
    n_turns=st.integers(1, 4),
    n=st.integers(1, 3),
    currency=st.sampled_from(["leaves", "tokens"]),
    seed=st.integers(0, 3),
)
def test_trace_continuations_stay_in_their_own_tree(per_step, pool, n_turns, n, currency, seed):
    # the placement invariant (issue 20): tree i holds at most m_i N continuation leaves per
    # step, in either currency, whatever the pool and the episode length
    budget = BudgetLimit(currency=currency, per_step=per_step * (15 if currency == "tokens" else 1))
    result, _ = step("trace", budget=budget, pool=pool, n_turns=n_turns, seed=seed,
                     continuations_per_rollout=n)  # fmt: skip
    for tree in result.trees:
        m = len(tree.root.children)
        assert tree.n_leaves - m <= m * n


def test_trace_spreads_continuations_over_trees_where_pooling_piled_them_up():
    # the same step with the old pooled rule puts most continuations into few trees
    own, _ = step("trace", budget=BudgetLimit(per_step=96), explore_frac=0.0)
    pooled, _ = step("trace", budget=BudgetLimit(per_step=96), explore_frac=0.0,
                     prefer_unmixed=True)  # fmt: skip

    def most(result):
        return max(t.n_leaves - len(t.root.children) for t in result.trees)

    assert most(own) <= max(len(t.root.children) for t in own.trees)  # N = 1
    assert most(pooled) > most(own)
    with_cont = lambda r: sum(t.n_leaves > len(t.root.children) for t in r.trees)  # noqa: E731
    assert with_cont(own) > with_cont(pooled)


def test_trace_tree_without_prefixes_returns_its_share_to_roots_not_to_other_trees():
    # one-turn episodes: no tree has a prefix, so Stage 2's whole budget goes back to roots
    result, _ = step("trace", budget=BudgetLimit(per_step=40), n_turns=1, explore_frac=0.0)
    assert result.spent.n_leaves == 40
    assert all(t.n_leaves == len(t.root.children) for t in result.trees)
    assert result.waves[-1].diagnostics["n_top_up_roots"] == 20


def test_trace_flip_floor_skips_prefixes_that_cannot_flip():
    # a predictor sure of every prefix (p = 0.999 on histories, 0.5 on prompts): q ≈ 1 for a
    # success, so no continuation clears a floor of 0.05 and the budget goes to roots
    prompts, p = make_pool(30, 0)
    sure = FixedPredictor({pr.text: 0.5 for pr in prompts}, default=0.999)

    def run(floor: float):
        return run_step(
            make_allocator("trace", explore_frac=0.0, min_flip_prob=floor, p_clip=0.0),
            prompts,
            execute=MartingaleExecutor({k: 0.999 for k in p}, seed=0, n_turns=3),
            budget=BudgetLimit(per_step=48),
            rng=np.random.default_rng(0),
            predictor=sure,
        )

    off, on = run(0.0), run(0.05)
    continuations = lambda r: sum(t.n_leaves - len(t.root.children) for t in r.trees)  # noqa: E731
    assert continuations(off) == 24 and continuations(on) == 0
    assert on.spent.n_leaves == 48  # N fell to 0: the roots took the budget
    with pytest.raises(ValueError, match="min_flip_prob"):
        Trace(min_flip_prob=0.6)


def test_placement_check_rejects_a_plan_over_a_trees_share():
    from trace_alloc.allocators import check_placement

    result, _ = step("trace", budget=BudgetLimit(per_step=24), explore_frac=0.0)
    tree_index = next(i for i, t in enumerate(result.trees) if t.n_leaves)
    tree = result.trees[tree_index]
    prefix = next(n.node_id for n in tree.nodes[1:] if not n.is_leaf)
    m = len(tree.root.children)
    over = [RolloutRequest(tree_index=tree_index, node_id=prefix, n=m + 1)]
    with pytest.raises(AllocError, match="placement invariant"):
        check_placement(result.trees, over, 1)


def _bare_forest() -> list:
    """Two trees of 4 two-turn bare rollouts: one all failed (settled), one 2/4 (mixed)."""
    from trace_alloc import Rollout, RolloutTree, Turn

    turn = Turn(action_text=" t", action_token_ids=(1,))
    trees = []
    for name, rewards in (("settled", (0, 0, 0, 0)), ("mixed", (1, 0, 1, 0))):
        tree = RolloutTree(prompt_id=name, prompt_text=name)
        for r in rewards:
            tree.add_rollout(0, Rollout(turns=(turn, turn), reward=float(r)))
        trees.append(tree)
    return trees


def _ask(trace: Trace, trees: list, flip_calibration=None) -> list[RolloutRequest]:
    from trace_alloc.base import AllocView

    view = AllocView(
        trees=trees,
        wave=1,
        currency="leaves",
        remaining=8.0,
        leaves_left=8,
        flip_calibration=flip_calibration,
    )
    plan = trace.ask(view, predictor=FixedPredictor(default=0.9), rng=np.random.default_rng(0))
    return list(plan.requests)


def test_trace_conditions_prefixes_on_their_trees_bare_outcomes():
    # the predictor says 0.9 everywhere: blind to its tree, every failed prefix looks 90 %
    # flippable; conditioned on 0 of 4 bare successes, V = (1 · 0.9 + 0) / 5 = 0.18
    requests = _ask(Trace(explore_frac=0.0), _bare_forest())
    continuations = [r for r in requests if r.node_id != 0]
    assert {r.tree_index for r in continuations} == {1}  # the mixed tree only
    assert sum(r.n for r in continuations) == 4  # its own m_i N, never the settled tree's
    assert sum(r.n for r in requests if r.node_id == 0) == 4  # the settled tree's share: roots
    # V = (0.9 + 2) / 5 = 0.58: a failed prefix flips w.p. 0.58, a successful one 0.42
    assert {round(r.p_flip, 6) for r in continuations} <= {0.58, 0.42}
    blind = _ask(Trace(explore_frac=0.0, prefix_prior=None, min_flip_prob=0.0), _bare_forest())
    assert {r.tree_index for r in blind if r.node_id != 0} == {0, 1}
    settled = [r for r in blind if r.node_id != 0 and r.tree_index == 0]
    assert {round(r.p_flip, 6) for r in settled} == {0.9}


def test_trace_tree_own_rate_alone_keeps_continuations_in_mixed_trees():
    # k = 0 (the cheapest control): a settled tree's prefixes cannot flip at all
    requests = _ask(Trace(explore_frac=0.0, prefix_prior=0.0, p_clip=0.0), _bare_forest())
    assert {r.tree_index for r in requests if r.node_id != 0} == {1}
    assert {r.p_flip for r in requests if r.node_id != 0} == {0.5}
    with pytest.raises(ValueError, match="prefix_prior"):
        Trace(prefix_prior=-1.0)


def test_random_placement_is_scored_but_not_floored():
    # stage2="uniform" places on random prefixes of every tree, and logs their flip chances
    requests = _ask(Trace(explore_frac=0.0, stage2="uniform"), _bare_forest())
    continuations = [r for r in requests if r.node_id != 0]
    assert {r.tree_index for r in continuations} == {0, 1}
    assert all(r.p_flip is not None for r in continuations)


def test_a_flip_calibration_maps_the_logged_chances_but_the_floor_reads_the_raw_ones():
    # raw chances in the mixed tree are 0.58 and 0.42 (above); a calibration that divides by
    # 3 puts them under the 0.2 floor, yet the same prefixes get continuations: the calibrator
    # only ever sees prefixes above the floor, so it must not move the floor
    raw = _ask(Trace(explore_frac=0.0), _bare_forest())
    scaled = _ask(Trace(explore_frac=0.0), _bare_forest(), flip_calibration=lambda p: p / 3)
    cont_raw = [r for r in raw if r.node_id != 0]
    cont = [r for r in scaled if r.node_id != 0]
    assert {r.tree_index for r in cont} == {1} and sum(r.n for r in cont) == 4
    assert all(r.p_flip < 0.2 for r in cont)  # logged: calibrated
    for r in cont:
        assert r.p_flip == pytest.approx(r.p_flip_raw / 3)
        assert round(r.p_flip_raw, 6) in {0.58, 0.42}
    # without a calibration the two agree
    assert all(r.p_flip == r.p_flip_raw for r in cont_raw)


def test_run_step_passes_the_flip_calibration_to_every_stage2_wave():
    result, _ = step("trace", budget=BudgetLimit(per_step=64), explore_frac=0.0, n_turns=3)
    calibrated, _ = _step_calibrated(lambda p: np.full_like(p, 0.25))
    logged = [r for w in calibrated.waves for r in w.requests if r.p_flip is not None]
    assert logged and all(r.p_flip == 0.25 for r in logged)
    assert any(r.p_flip_raw != 0.25 for r in logged)
    assert all(r.p_flip == r.p_flip_raw for w in result.waves for r in w.requests if r.p_flip)


def _step_calibrated(calibration):
    prompts, p = make_pool(40, 0)
    return run_step(
        make_allocator("trace", min_flip_prob=0.0, prefix_prior=None, explore_frac=0.0),
        prompts,
        execute=MartingaleExecutor(p, seed=0, n_turns=3),
        budget=BudgetLimit(per_step=64),
        rng=np.random.default_rng(0),
        predictor=FixedPredictor({pr.text: p[pr.prompt_id] for pr in prompts}),
        flip_calibration=calibration,
    ), None
