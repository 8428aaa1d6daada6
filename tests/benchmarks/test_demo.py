"""`tracerl demo` end to end on a tiny recipe: policy, before/after eval, RL, reports, caches."""

from __future__ import annotations

import json

import pytest

from benchmarks.demo import DemoConfig, demo, run_demo
from envs import WorldConfig
from harness.metrics_log import read_metrics
from harness.tiny_policy import (
    DemoConfig as DemosConfig,
)
from harness.tiny_policy import (
    EnvSettings,
    EvalConfig,
    ModelConfig,
    SFTConfig,
    TinyPolicyConfig,
)

pytest.importorskip("openrlhf")

TINY_RECIPE = TinyPolicyConfig(
    world=WorldConfig(
        n_countries=3,
        n_cities=8,
        n_people=60,
        n_films=8,
        n_books=6,
        n_companies=4,
        n_universities=3,
        n_distractors=5,
        sentences_per_doc=2,
        questions_per_kind=2,
    ),
    vocab_size=600,
    model=ModelConfig(hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128),
    demos=DemosConfig(n_worlds=1, target_variants=1),
    sft=SFTConfig(max_steps=6, batch_size=4, warmup_steps=2, eval_from=3, eval_every=3),
    env=EnvSettings(max_turns=3),
    eval=EvalConfig(n_unseen_questions=4, n_dev_samples=1, n_samples=1, max_action_tokens=12),
)


@pytest.mark.slow
def test_demo_trains_evaluates_reports_and_reuses_its_caches(tmp_path):
    config = DemoConfig(
        run_dir=tmp_path / "demo",
        steps=2,
        budget_per_step=8,
        pool_size=4,
        questions="all",
        eval_questions=4,
        progress=False,
    )
    first = run_demo(config, TINY_RECIPE)
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

    second = run_demo(config, TINY_RECIPE)  # a warm cache: nothing is rebuilt or retrained
    assert second["policy_reused"] and second["rl_reused"]
    assert second["after"]["em"] == first["after"]["em"]  # same questions, same seed
    assert second["times"]["train_s"] < first["times"]["train_s"]


def test_demo_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--steps" in out and "--budget-per-step" in out
