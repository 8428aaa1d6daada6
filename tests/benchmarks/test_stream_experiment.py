"""The stream experiment on synthetic records: rates from validation only, pairing, flips."""

from __future__ import annotations

import pytest

from benchmarks.research.stream_experiment import (
    StreamExperimentConfig,
    StreamRun,
    choose_rates,
    runs_of,
    summarise,
)

CONFIG = StreamExperimentConfig(steps=4, eval_at=(2, 4), seeds=(0, 1, 2), few_seeds=(0, 1),
                                leaf_seeds=(0, 1), probe_seeds=(0,),
                                arms=("trace", "grpo", "trace_n0", "dapo", "trace_blind"),
                                few_seed_arms=("dapo", "trace_blind"))  # fmt: skip


def _record(arm, seed, em, *, series="tokens", phase="main", lr=1.0, validation=None,
            scored=((), ()), continuations=0, flips=0, settled=0.0):  # fmt: skip
    """A run's record as `_do_run` returns it: EM as fractions, tokens 100 a step."""
    evals = {
        "test@2": {"test": {"em": em / 2, "n": 10}},
        "test_final@4": {k: {"em": em, "n": 10} for k in ("test", "fact_disjoint", "decoy")},
    }
    if validation is not None:
        evals["validation@4"] = {"validation": {"em": validation, "n": 10}}
    return {
        "run": {"phase": phase, "arm": arm, "series": series, "seed": seed, "lr_multiplier": lr},
        "evals": evals,
        "steps": {
            "tokens_by_step": [100.0, 200.0, 300.0, 400.0],
            "continuations": continuations,
            "flips": flips,
            "settled": settled,
            "scored": {"p_flip": list(scored[0]), "flipped": list(scored[1])},
            "effective_ratio": 0.5,
            "optimizer_steps": 4,
            "update_norm_mean": 0.2,
            "displacement": 0.5,
        },
    }


def test_rates_are_chosen_on_validation_never_on_test():
    # test EM rises with the rate, validation EM falls: the choice follows validation
    scan = [_record("grpo", 0, em=0.1 * m, lr=m, phase="lr", validation=0.5 - 0.1 * m)
            for m in (0.5, 1.0, 2.0)]  # fmt: skip
    chosen, curve = choose_rates(scan, steps=4)
    assert chosen == {"grpo": 0.5}
    assert curve["grpo"][2.0] == pytest.approx([30.0])  # in points
    # the family rule: DAPO takes GRPO's rate, the TRACE variants TRACE's
    runs = runs_of(CONFIG, {"grpo": 0.5, "trace": 2.0})
    rate = {(r.arm, r.series): r.lr_multiplier for r in runs}
    assert rate[("dapo", "tokens")] == 0.5 and rate[("trace_blind", "tokens")] == 2.0
    assert rate[("trace_n0", "tokens")] == 2.0 and rate[("grpo", "leaves")] == 0.5


def test_runs_put_the_headline_pair_first_and_keep_few_seed_arms_to_their_seeds():
    runs = runs_of(CONFIG, {})
    assert [(r.arm, r.seed) for r in runs[:2]] == [("trace", 0), ("grpo", 0)]
    assert {r.seed for r in runs if r.arm == "dapo"} == {0, 1}
    assert {r.seed for r in runs if r.arm == "trace" and r.series == "tokens"} == {0, 1, 2}
    assert [r.phase for r in runs if r.arm == "trace_random"] == ["probe"]
    assert StreamRun("main", "trace", "tokens", 3, 0.5).run_id == "tokens-trace-lr0.5-s3"


def test_summary_pairs_methods_by_seed_and_pools_stage_two():
    records = []
    for seed, (trace, grpo, n0) in enumerate([(0.60, 0.55, 0.58), (0.62, 0.58, 0.59),
                                              (0.61, 0.55, 0.61)]):  # fmt: skip
        records.append(_record("trace", seed, trace, continuations=10, flips=4, settled=2.0,
                               scored=((0.5, 0.5, 0.2, 0.2), (1, 0, 0, 0))))  # fmt: skip
        records.append(_record("grpo", seed, grpo))
        records.append(_record("trace_n0", seed, n0))
    records.append(_record("trace_random", 0, 0.0, phase="probe",
                           scored=((0.9, 0.1, 0.8), (1, 0, 0))))  # fmt: skip
    start = {"test_final": {"test": {"em": 0.40, "n": 10}}}
    out = summarise(records, start, CONFIG, {}, {})
    s = out["summary"]
    assert s["trace_minus_grpo_tokens"] == pytest.approx(5.0)  # (5 + 4 + 6) / 3 points
    assert s["trace_minus_grpo_tokens_ci_low"] < 5.0 < s["trace_minus_grpo_tokens_ci_high"]
    assert s["trace_n1_minus_n0_tokens"] == pytest.approx(5 / 3)
    assert s["trace_minus_dapo_tokens"] is None  # no DAPO run: no difference, not a zero
    assert s["grpo_gain_unseen"] == pytest.approx(56.0 - 40.0)
    assert s["flips_per_continuation"] == pytest.approx(0.4)
    assert s["settled_tree_continuation_share"] == pytest.approx(0.2)
    # Brier over (0.5, 1), (0.5, 0), (0.2, 0), (0.2, 0) x 3; the constant is 0.25 (1 - 0.25)
    assert s["flip_brier"] == pytest.approx((0.25 + 0.25 + 0.04 + 0.04) / 4)
    assert s["flip_brier_constant"] == pytest.approx(0.25 * 0.75)
    assert s["flip_brier_uncalibrated"] == s["flip_brier"]  # no raw chances logged: the same
    assert s["flip_auc_random_placement"] == pytest.approx(1.0)
    # TRACE's mean curve (40 → 30.5 → 61) passes GRPO's final 56 between 200 and 400 tokens
    assert s["tokens_to_grpo_final_ratio"] == pytest.approx((200 + 200 * 25.5 / 30.5) / 400)
    assert out["arms"]["tokens/trace"]["displacement"] == pytest.approx(0.5)


def test_test_and_validation_worlds_must_be_unseen_and_disjoint():
    from types import SimpleNamespace

    from benchmarks.research.stream_experiment import _check_worlds

    with pytest.raises(ValueError, match="--validation-world-seeds"):
        StreamExperimentConfig(test_world_seeds=(6000, 6001), validation_world_seeds=(6001,))
    policy = SimpleNamespace(
        world_seed=0,
        demos=SimpleNamespace(first_world_seed=1000, n_worlds=40),
        eval=SimpleNamespace(dev_world_seed=999),
    )
    artifacts = SimpleNamespace(config=policy)
    _check_worlds(CONFIG, artifacts)  # the defaults are unseen
    with pytest.raises(ValueError, match="demonstration worlds"):
        _check_worlds(StreamExperimentConfig(test_world_seeds=(1003,)), artifacts)


def test_a_runs_log_keeps_its_raw_flip_chances_beside_the_calibrated_ones():
    from benchmarks.research.stream_experiment import _run_metrics

    row = {"budget/total_tokens": 10.0, "stage2/p_flip": [0.4, 0.3], "stage2/flipped": [1, 0],
           "stage2/p_flip_raw": [0.7, 0.6], "stage2/settled": [0, 0]}  # fmt: skip
    old = {k: v for k, v in row.items() if k != "stage2/p_flip_raw"}  # logged before calibration
    scored = _run_metrics([row], {})["scored"]
    assert scored["p_flip"] == [0.4, 0.3] and scored["p_flip_raw"] == [0.7, 0.6]
    assert _run_metrics([old], {})["scored"]["p_flip_raw"] == [0.4, 0.3]


def test_the_bank_regime_trains_on_worlds_that_come_back_and_is_keyed_apart(tmp_path):
    from benchmarks.meta import run_key
    from benchmarks.research.stream_experiment import _Context, _train_config
    from harness.tiny_policy import init_model
    from harness.training import build_tasks

    artifacts = init_model(run_dir=tmp_path / "start")  # the shipped warm start, copied
    run = StreamRun("main", "grpo", "tokens", 0, 1.0)

    def train_config(bank: int):
        config = StreamExperimentConfig(steps=6, eval_at=(6,), bank=bank, run_dir=tmp_path)
        context = _Context(config=config, policy_run_dir=tmp_path / "start", tokens_per_step=900)
        return _train_config(run, context, artifacts, 6)

    banked, stream = train_config(3), train_config(0)
    assert banked.task.stream_bank == 3 and stream.task.stream_bank == 0
    source = build_tasks(banked.task, ()).train
    assert [source.seed(s) for s in range(1, 7)] == [source.seed(s) for s in (1, 2, 3)] * 2
    assert run_key(banked.to_json()) != run_key(stream.to_json())
    with pytest.raises(ValueError, match="--bank 6"):
        StreamExperimentConfig(steps=6, eval_at=(6,), bank=6)
