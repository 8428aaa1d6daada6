"""The learning-rate axis: each method's rate chosen on validation EM only, and its curve table."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from benchmarks.research.experiment import (
    ExperimentConfig,
    RunSpec,
    _check_validation_disjoint,
    _run_summary,
    choose_rates,
    run_specs,
)
from benchmarks.research.lr_axis import best_multiplier, check_disjoint, curve_table


def test_best_multiplier_takes_the_best_mean_over_seeds_not_the_best_seed():
    # x2 has the single best seed (0.9) but the lower mean
    assert best_multiplier({1.0: [0.50, 0.52], 2.0: [0.90, 0.05]}) == 1.0
    assert best_multiplier({0.25: [0.3], 0.5: [0.6, 0.62], 1.0: [0.55]}) == 0.5


def test_ties_go_to_the_rate_closest_to_one_then_the_smaller():
    assert best_multiplier({0.25: [0.5], 2.0: [0.5], 1.0: [0.5]}) == 1.0
    assert best_multiplier({0.5: [0.5], 2.0: [0.5]}) == 0.5  # equally far on a log scale
    assert best_multiplier({0.25: [0.5], 2.0: [0.5]}) == 2.0  # x2 is closer to x1 than x1/4


@pytest.mark.parametrize("curve", [{}, {1.0: []}, {1.0: [float("nan")]}, {0.0: [0.5]}], ids=str)
def test_best_multiplier_refuses_a_curve_it_cannot_choose_on(curve):
    with pytest.raises(ValueError, match="multiplier"):
        best_multiplier(curve)


def test_curve_table_marks_each_methods_chosen_rate():
    table = curve_table(
        {"uniform": {0.5: [0.2, 0.4], 1.0: [0.5, 0.5]}, "trace": {0.5: [0.6, 0.6], 1.0: [0.1, 0.1]}}
    )
    lines = table.splitlines()
    assert lines[0] == "| method | lr ×0.5 | lr ×1 | chosen |"
    assert lines[2] == "| uniform | 30.0 | **50.0** | ×1 |"
    assert lines[3] == "| trace | **60.0** | 10.0 | ×0.5 |"


def test_check_disjoint_names_the_set_it_shares_items_with():
    check_disjoint(["q1", "q2"], {"test": ["q3"]}, what="--flag")
    with pytest.raises(ValueError, match=r"--flag: .*\['q2'\] with the heldout test set"):
        check_disjoint(["q1", "q2"], {"fresh": ["q9"], "heldout test set": ["q2"]}, what="--flag")


def _summary(label, seed, rate, *, test_em, validation_em):
    return {"group": "main", "series": "leaves", "label": label, "seed": seed,
            "cell": f"main/leaves/{label}", "lr_multiplier": rate, "em": test_em,
            "validation_em": validation_em}  # fmt: skip


def _runs(test_em, validation_em):
    """Two methods x two rates x two seeds; EMs given per (method, rate)."""
    return {
        f"{label}-{rate}-{seed}": _summary(
            label,
            seed,
            rate,
            test_em=test_em[label, rate],
            validation_em=validation_em[label, rate],
        )
        for label in ("trace", "uniform")
        for rate in (0.5, 1.0)
        for seed in (0, 1)
    }


def test_the_rate_is_chosen_on_validation_em_and_test_results_never_change_it():
    validation = {("trace", 0.5): 0.6, ("trace", 1.0): 0.4,
                  ("uniform", 0.5): 0.3, ("uniform", 1.0): 0.5}  # fmt: skip
    test = dict.fromkeys(validation, 0.5)
    chosen = choose_rates(_runs(test, validation))
    assert chosen == {"leaves/trace": 0.5, "leaves/uniform": 1.0}
    # test EM that favours the other rate of each method: the choice stays
    flipped = {
        ("trace", 0.5): 0.1,
        ("trace", 1.0): 0.9,
        ("uniform", 0.5): 0.9,
        ("uniform", 1.0): 0.1,
    }
    assert choose_rates(_runs(flipped, validation)) == chosen
    # while validation EM that favours it moves the choice
    other = {k: 1 - v for k, v in validation.items()}
    assert choose_rates(_runs(test, other)) == {"leaves/trace": 1.0, "leaves/uniform": 0.5}


def test_a_method_trained_at_one_rate_keeps_it_and_needs_no_validation():
    runs = {"a": _summary("trace", 0, 1.0, test_em=0.5, validation_em=None)}
    assert choose_rates(runs) == {"leaves/trace": 1.0}
    runs["b"] = _summary("trace", 0, 2.0, test_em=0.5, validation_em=0.4)
    with pytest.raises(ValueError, match="without validation EM"):
        choose_rates(runs)


def test_the_rate_axis_trains_every_main_run_at_each_rate_and_keeps_rate_one_runs_as_they_were():
    base = ExperimentConfig(methods=("trace", "uniform"), seeds=(0,), token_series=False)
    axis = dataclasses.replace(base, lr_multipliers=(0.5, 1.0, 2.0))
    before, after = run_specs(base), run_specs(axis)
    main = [s for s in after if s.group == "main"]
    assert sorted((s.label, s.lr_multiplier) for s in main) == sorted(
        (m, r) for m in ("trace", "uniform") for r in (0.5, 1.0, 2.0)
    )
    assert {s.lr_multiplier for s in after if s.group != "main"} == {1.0}  # ablations at x1
    # at x1 the run directories and cache keys are the ones recorded before the axis existed
    ones = [s for s in after if s.lr_multiplier == 1.0]
    assert [s.run_id for s in ones] == [s.run_id for s in before]
    spec = RunSpec("main", "trace", "leaves", 3, (("name", "trace"),), 48)
    assert spec.run_id == "main-leaves-trace-s3"
    old_key = {"group": "main", "label": "trace", "series": "leaves", "seed": 3,
               "alloc": (("name", "trace"),), "per_step": 48, "predictor": "mlp"}  # fmt: skip
    assert spec.key() == old_key
    half = dataclasses.replace(spec, lr_multiplier=0.5)
    assert half.run_id == "main-leaves-trace-s3-lr0.5" and half.key()["lr_multiplier"] == 0.5


@pytest.mark.parametrize("rates", [(), (1.0, 1.0), (0.0, 1.0)])
def test_bad_rate_multipliers_are_refused(rates):
    with pytest.raises(ValueError, match="--lr-multipliers"):
        ExperimentConfig(lr_multipliers=rates)


def test_a_validation_world_that_is_a_test_or_training_world_is_refused():
    policy = SimpleNamespace(
        world_seed=0,
        demos=SimpleNamespace(first_world_seed=1000, n_worlds=40),
        eval=SimpleNamespace(dev_world_seed=999),
    )
    artifacts = SimpleNamespace(config=policy)
    for seed, name in ((2026, "test world"), (0, "training world"), (1010, "demo"), (999, "dev")):
        config = ExperimentConfig(lr_multipliers=(0.5, 1.0), validation_world_seed=seed)
        with pytest.raises(ValueError, match=f"--validation-world-seed: .*{name}"):
            _check_validation_disjoint(config, artifacts)


def test_the_run_summary_counts_optimizer_steps_and_averages_the_update_size_over_steps_taken():
    at = {"heldout": {"em": 0.5, "f1": 0.5}, "fresh_world": {"em": 0.4, "f1": 0.4}}
    metrics = [
        {"policy/optimizer_steps": 1, "policy/update_norm": 0.2, "policy/n_train_leaves": 5},
        {"policy/optimizer_steps": 0, "policy/update_norm": 0.0, "policy/n_train_leaves": 0},
        {"policy/optimizer_steps": 1, "policy/update_norm": 0.4, "policy/n_train_leaves": 3},
    ]
    result = {"evals": {"3": at}, "metrics": metrics, "displacement": 0.5, "validation_em": 0.3}
    summary = _run_summary(result, 3)
    assert summary["optimizer_steps"] == 2
    assert summary["update_norm"] == pytest.approx(0.3)  # the step without signal is left out
    assert summary["displacement"] == 0.5 and summary["validation_em"] == 0.3
    # a record from before the count was logged: one step per step with signal leaves
    old = [{"policy/n_train_leaves": n} for n in (4, 0, 2, 1)]
    summary = _run_summary({"evals": {"4": at}, "metrics": old}, 4)
    assert summary["optimizer_steps"] == 3 and summary["update_norm"] is None
