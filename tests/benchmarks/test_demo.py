"""`tracerl demo` end to end on a tiny recipe: policy, before/after eval, RL, reports, caches."""

from __future__ import annotations

import json

import pytest

from benchmarks.demo import DemoConfig, demo, run_demo
from harness.metrics_log import read_metrics

pytest.importorskip("openrlhf")


@pytest.mark.slow
def test_demo_trains_evaluates_reports_and_reuses_its_caches(tmp_path, tiny_recipe):
    config = DemoConfig(
        run_dir=tmp_path / "demo",
        steps=2,
        budget_per_step=8,
        pool_size=4,
        questions="all",
        eval_questions=4,
        progress=False,
    )
    first = run_demo(config, tiny_recipe)
    assert not first["policy_reused"] and not first["rl_reused"]
    assert first["n_questions"] == 4
    for side in ("before", "after"):
        assert first[side]["n"] == 4 and 0.0 <= first[side]["em"] <= 1.0
    steps = [r["step"] for r in read_metrics(config.run_dir / "rl")]
    assert steps == [1, 2]
    report = json.loads((config.run_dir / "report" / "report.json").read_text())
    assert [r["agent"] for r in report["reports"]] == ["warm start", "after TRACE"]
    assert (config.run_dir / "rl" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((config.run_dir / "demo.json").read_text())["after"] == first["after"]

    second = run_demo(config, tiny_recipe)  # a warm cache: nothing is rebuilt or retrained
    assert second["policy_reused"] and second["rl_reused"]
    assert second["after"]["em"] == first["after"]["em"]  # same questions, same seed
    assert second["times"]["train_s"] < first["times"]["train_s"]


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--steps" in out and "--budget-per-step" in out
