"""`tracerl demo` end to end on a tiny recipe: policy, before/after eval, RL, reports, caches."""

from __future__ import annotations

import json

import pytest

from benchmarks.demo import demo
from benchmarks.research.demo_gain import figures
from harness.evaluation.demo import DemoConfig, run_demo
from harness.training.metrics_log import read_metrics

pytest.importorskip("openrlhf")


@pytest.mark.slow
def test_demo_trains_on_fresh_worlds_evaluates_held_out_sets_and_reuses_its_caches(
    tmp_path, tiny_recipe
):
    config = DemoConfig(
        run_dir=tmp_path / "demo",
        steps=2,
        budget_per_step=8,
        pool_size=4,
        unseen_questions=4,
        unseen_samples=2,
        fact_disjoint_questions=3,
        fact_disjoint_samples=2,
        decoy_questions=3,
        decoy_samples=2,
        curve_every=1,
        curve_questions=4,
        curve_samples=2,
        progress=False,
    )
    first = run_demo(config, tiny_recipe)
    assert not first["policy_reused"] and not first["rl_reused"]
    sets = first["sets"]
    assert list(sets) == ["unseen", "fact_disjoint", "decoy"]
    assert (sets["unseen"]["n_questions"], sets["unseen"]["n_samples"]) == (4, 2)
    assert (sets["fact_disjoint"]["n_questions"], sets["decoy"]["n_questions"]) == (3, 3)
    for c in sets.values():
        gain = c["gain"]
        assert gain["low"] <= gain["mean"] <= gain["high"]
        assert gain["mean"] == pytest.approx(c["after"]["mean"] - c["before"]["mean"])
        assert c["before_metrics"]["n"] == 2 * c["n_questions"]
    # the unseen set takes its questions equally from each unseen world (2 x 2)
    report = json.loads((config.run_dir / "report" / "report.json").read_text())
    assert [r["agent"] for r in report["reports"]] == [
        f"{side} ({name})"
        for name in ("unseen", "fact_disjoint", "decoy")
        for side in ("warm start", "after TRACE")
    ]
    trajectories = (config.run_dir / "report" / "trajectories.jsonl").read_text().splitlines()
    unseen_ids = {
        json.loads(line)["task_id"]
        for line in trajectories
        if json.loads(line)["agent"] == "warm start (unseen)"
    }
    assert {i.split("/")[0] for i in unseen_ids} == {"w5000", "w5001"}
    # RL trained on one fresh world per step, none of them a held-out or warm-start world
    records = read_metrics(config.run_dir / "rl")
    worlds = [r["data/world_seed"] for r in records if "data/world_seed" in r]
    assert worlds == [100_000, 100_001]
    # the learning curve: unseen-world EM before step 1 and after every step
    curve = [r for r in records if "eval/unseen/em" in r]
    assert [r["step"] for r in curve] == [0, 1, 2]
    # one evaluator: with the table's questions, samples and seed, the curve's evaluations of
    # the live policy before step 1 and after the last play the episodes the table's
    # evaluations of the saved policies play, so every figure agrees, not only EM
    table = {r["agent"]: r["overall"] for r in report["reports"]}
    for point, side in ((curve[0], "warm start (unseen)"), (curve[-1], "after TRACE (unseen)")):
        assert point["eval/unseen/em"] == table[side]["em"]
        assert point["eval/answered"] == table[side]["answered"]
        assert point["eval/searches_per_episode"] == table[side]["searches"]
        assert point["eval/tokens_per_episode"] == table[side]["tokens"] > 0
    assert (config.run_dir / "rl" / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert first["summary"].startswith("TRACE RL on 2 freshly generated worlds")
    assert "unseen-world EM" in first["summary"] and "95 % CI" in first["summary"]
    saved = json.loads((config.run_dir / "demo.json").read_text())
    assert saved["sets"] == first["sets"]
    keys = figures(saved)
    assert keys["rl_gain_unseen_em"] == sets["unseen"]["gain"]["mean"]
    assert keys["decoy_em_after"] == sets["decoy"]["after"]["mean"]
    assert (keys["unseen_questions"], keys["unseen_samples"]) == (4, 2)

    second = run_demo(config, tiny_recipe)  # a warm cache: nothing is rebuilt or retrained
    assert second["policy_reused"] and second["rl_reused"]
    assert second["sets"]["unseen"]["after"] == sets["unseen"]["after"]  # same questions, seed


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--steps" in out and "--budget-per-step" in out and "--unseen-samples" in out
    assert "--prefer-unmixed" in out
