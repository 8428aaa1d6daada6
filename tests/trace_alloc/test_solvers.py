"""Stage-1 and Stage-2 solvers: formulas, exactness against brute force, degenerate cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_alloc import AllocError
from trace_alloc.solvers import (
    prefix_gain,
    root_gain,
    solve_prefixes,
    solve_roots,
    split_budget,
    v_prefix,
    v_root,
)

probs = st.floats(0.0, 1.0, allow_nan=False)


@given(p=probs, m=st.integers(1, 30))
def test_root_marginal_gain_is_the_difference_of_values(p, m):
    assert root_gain(p, m) == pytest.approx(v_root(p, m + 1) - v_root(p, m), abs=1e-12)


@given(p=probs, m=st.integers(2, 30))
def test_root_gain_is_non_increasing_from_two(p, m):
    assert root_gain(p, m + 1) <= root_gain(p, m) + 1e-12


def test_opening_a_prompt_is_worth_two_p_one_minus_p():
    p = np.linspace(0, 1, 11)
    assert np.allclose(v_root(p, 2), 2 * p * (1 - p))
    assert np.all(v_root(p, 1) == 0) and np.all(v_root(p, 0) == 0)
    assert np.all(root_gain(p, 0) == 0)


@given(q=probs, k=st.integers(0, 30))
def test_prefix_marginal_gain_is_the_difference_of_values(q, k):
    assert prefix_gain(q, k) == pytest.approx(v_prefix(q, k + 1) - v_prefix(q, k), abs=1e-12)


def _brute_roots(p, budget, cap, floor, low=2):
    """Largest feasible spend, then the best value at that spend, by enumeration."""
    options = [[m for m in [0, *range(low, cap + 1)] if m >= lo] for lo in floor]
    results = []
    for ms in itertools.product(*options):
        if sum(ms) <= budget:
            value = float(sum(v_root(pi, mi) for pi, mi in zip(p, ms, strict=True)))
            results.append((sum(ms), value))
    spend = max(s for s, _ in results)
    return spend, max(v for s, v in results if s == spend)


@given(
    p=st.lists(probs, min_size=1, max_size=4),
    budget=st.integers(0, 14),
    cap=st.integers(2, 5),
    data=st.data(),
)
def test_root_solver_matches_brute_force(p, budget, cap, data):
    low = data.draw(st.integers(2, cap))
    floor = [data.draw(st.sampled_from([0, 0, low])) for _ in p]
    if sum(floor) > budget:
        floor = [0] * len(p)
    sol = solve_roots(
        np.array(p), budget, max_per_prompt=cap, min_per_prompt=low, floor=np.array(floor)
    )
    spend, value = _brute_roots(p, budget, cap, floor, low)
    assert sol.n_rollouts == spend  # the whole budget whenever it can be spent
    assert sol.value == pytest.approx(value, abs=1e-9)
    assert sol.value == pytest.approx(float(v_root(np.array(p), sol.m).sum()), abs=1e-9)
    assert not np.any((sol.m > 0) & (sol.m < low))  # never one rollout, nor fewer than `low`
    assert np.all(sol.m <= cap) and np.all(sol.m >= np.array(floor))


@given(p=st.lists(probs, min_size=1, max_size=40), budget=st.integers(0, 200))
def test_root_solver_conserves_budget_when_feasible(p, budget):
    sol = solve_roots(np.array(p), budget, max_per_prompt=8)
    feasible = min(budget, 8 * len(p)) if budget != 1 else 0
    assert sol.n_rollouts == feasible
    assert set(np.unique(sol.m)) <= {0, *range(2, 9)}


def test_plain_greedy_is_not_exact_but_the_solver_is():
    # A's third rollout (+0.25) is better than opening B (+0.3)? No: greedy by gain opens B
    # (0.3 > 0.25) and is stuck with 0.8, while four rollouts on A give 0.875.
    p_b = (1 - np.sqrt(1 - 0.6)) / 2  # 2 p (1 - p) = 0.3
    sol = solve_roots(np.array([0.5, p_b]), 4, max_per_prompt=4)
    assert sol.m.tolist() == [4, 0]
    assert sol.value == pytest.approx(0.875)


@pytest.mark.parametrize("p_all", [0.0, 1.0])
def test_roots_with_certain_prompts_still_spend_the_budget(p_all):
    sol = solve_roots(np.full(5, p_all), 12, max_per_prompt=4)
    assert sol.n_rollouts == 12 and sol.value == 0.0 and not np.any(sol.m == 1)


@pytest.mark.parametrize("budget", [0, 1])
def test_budget_below_two_allocates_nothing(budget):
    assert solve_roots(np.array([0.5, 0.5]), budget, max_per_prompt=4).m.tolist() == [0, 0]


def test_single_prompt_takes_the_budget_up_to_its_cap():
    assert solve_roots(np.array([0.3]), 7, max_per_prompt=16).m.tolist() == [7]
    assert solve_roots(np.array([0.3]), 70, max_per_prompt=16).m.tolist() == [16]


def test_root_solver_rejects_bad_arguments():
    with pytest.raises(AllocError, match="max_per_prompt"):
        solve_roots(np.array([0.5]), 4, max_per_prompt=1)
    with pytest.raises(AllocError, match="min_per_prompt"):
        solve_roots(np.array([0.5]), 4, max_per_prompt=4, min_per_prompt=5)
    with pytest.raises(AllocError, match="floor"):
        solve_roots(np.array([0.5]), 4, max_per_prompt=4, min_per_prompt=3, floor=np.array([2]))
    with pytest.raises(AllocError, match="floor"):
        solve_roots(np.array([0.5]), 4, max_per_prompt=4, floor=np.array([1]))
    with pytest.raises(AllocError, match="floors need"):
        solve_roots(np.array([0.5, 0.5]), 3, max_per_prompt=4, floor=np.array([2, 2]))


@given(
    q=st.lists(probs, min_size=0, max_size=4),
    budget=st.integers(0, 8),
    cap=st.one_of(st.none(), st.integers(1, 4)),
)
def test_prefix_solver_matches_brute_force(q, budget, cap):
    k = solve_prefixes(np.array(q), budget, max_per_node=cap)
    limit = budget if cap is None else cap
    feasible = min(budget, len(q) * limit)
    assert int(k.sum()) == feasible and np.all(k <= limit)
    best = -np.inf
    for ks in itertools.product(range(limit + 1), repeat=len(q)):
        if sum(ks) == feasible:
            best = max(best, float(sum(v_prefix(qi, ki) for qi, ki in zip(q, ks, strict=True))))
    got = float(v_prefix(np.array(q), k).sum()) if q else 0.0
    assert got == pytest.approx(best if q else 0.0, abs=1e-9)


def test_prefix_solver_prefers_surprising_prefixes():
    # q near 1: the observed outcome will almost surely repeat; q = 0.5 flips half the time
    assert solve_prefixes(np.array([0.99, 0.5, 0.5]), 2).tolist() == [0, 1, 1]


@given(total=st.integers(0, 500), w=st.lists(st.integers(0, 20), min_size=1, max_size=20))
def test_split_budget_is_exact_and_proportional(total, w):
    shares = split_budget(total, np.array(w))
    if sum(w) == 0:
        assert shares.sum() == 0
        return
    assert shares.sum() == total
    exact = total * np.array(w) / sum(w)
    assert np.all(np.abs(shares - exact) < 1)
    assert np.all(shares[np.array(w) == 0] == 0)
