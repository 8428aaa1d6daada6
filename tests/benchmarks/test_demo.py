"""`tracerl demo` end to end on a tiny recipe: policy, before/after eval, RL, reports, caches."""

from __future__ import annotations

import json

import pytest

from benchmarks.research.demo import DemoConfig, demo, run_demo
from benchmarks.research.demo_gain import figures
from harness.metrics_log import read_metrics

pytest.importorskip("openrlhf")


@pytest.mark.slow
def test_demo_trains_evaluates_reports_and_reuses_its_caches(tmp_path, tiny_recipe):
    config = DemoConfig(
        run_dir=tmp_path / "demo",
        steps=2,
        budget_per_step=8,
        pool_size=4,
        eval_questions=4,
        eval_samples=2,
        unseen_questions=3,
        unseen_samples=2,
        curve_every=1,
        curve_samples=1,
        progress=False,
    )
    first = run_demo(config, tiny_recipe)
    assert not first["policy_reused"] and not first["rl_reused"]
    held, unseen = first["sets"]["heldout"], first["sets"]["unseen"]
    assert (held["n_questions"], held["n_samples"]) == (4, 2)
    assert (unseen["n_questions"], unseen["n_samples"]) == (3, 2)
    for c in (held, unseen):
        gain = c["gain"]
        assert gain["low"] <= gain["mean"] <= gain["high"]
        assert gain["mean"] == pytest.approx(c["after"]["mean"] - c["before"]["mean"])
        assert c["before_metrics"]["n"] == 2 * c["n_questions"]
    # the learning curve: held-out EM before step 1 and after every step
    evals = [r["step"] for r in read_metrics(config.run_dir / "rl") if "eval/em" in r]
    assert evals == [0, 1, 2]
    assert (config.run_dir / "rl" / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert (config.run_dir / "rl" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((config.run_dir / "report" / "report.json").read_text())
    assert [r["agent"] for r in report["reports"]] == [
        "warm start (heldout)",
        "after TRACE (heldout)",
        "warm start (unseen)",
        "after TRACE (unseen)",
    ]
    assert first["summary"].startswith("TRACE RL ") and "95 % CI" in first["summary"]
    saved = json.loads((config.run_dir / "demo.json").read_text())
    assert saved["sets"] == first["sets"]
    keys = figures(saved)
    assert keys["rl_gain_em"] == held["gain"]["mean"]
    # the mean over questions is a weighted mean of the kinds' EM (equal samples per question)
    assert keys["kind_em_min"] - 1e-9 <= keys["warm_start_em"] <= keys["kind_em_max"] + 1e-9

    second = run_demo(config, tiny_recipe)  # a warm cache: nothing is rebuilt or retrained
    assert second["policy_reused"] and second["rl_reused"]
    assert second["sets"]["heldout"]["after"] == held["after"]  # same questions, same seed


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--steps" in out and "--budget-per-step" in out and "--eval-samples" in out
