"""The headline experiment's script, end to end on a tiny recipe: runs, caching, outputs."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import tyro

from benchmarks.research import experiment
from benchmarks.research.experiment import ExperimentConfig, RunSpec, main, run_specs
from benchmarks.research.lr_axis import best_multiplier
from harness.training.metrics_log import read_metrics

pytest.importorskip("openrlhf")


def test_run_specs_cover_methods_series_seeds_and_ablations():
    config = ExperimentConfig(
        methods=("trace", "uniform"),
        seeds=(0, 1),
        ablation_seeds=None,
        budgets=((16, 2),),
        predictor_ablation=True,
        leaves_per_step=32,
    )
    specs = run_specs(config)
    main_runs = [s for s in specs if s.group == "main"]
    assert len(main_runs) == 2 * 2 * 2  # methods x seeds x series
    assert {s.per_step for s in main_runs if s.series == "leaves"} == {32}
    assert {s.per_step for s in main_runs if s.series == "tokens"} == {None}  # measured later
    stages = {s.label for s in specs if s.group == "stages"}
    assert stages == {"s1_uniform-s2_uniform", "s1_uniform-s2_active", "s1_active-s2_uniform"}
    budget = {(s.label, s.per_step) for s in specs if s.group == "budget"}
    assert budget == {("trace-M16-N2", 48), ("uniform-L48", 48)}  # M(1+N) leaves for both
    (off,) = {s for s in specs if s.group == "predictor" and s.seed == 0}
    assert off.predictor == "constant" and dict(off.alloc) == {"name": "trace"}
    assert len({s.run_id for s in specs}) == len(specs)


def test_each_methods_allocator_settings_reach_its_runs_and_their_keys():
    from harness.training.config import AllocatorSettings
    from trace_alloc import Trace

    settings = AllocatorSettings(trace=Trace(min_per_prompt=2, prefer_unmixed=True))
    config = ExperimentConfig(methods=("trace", "uniform"), seeds=(0,), alloc=settings)
    specs = {(s.group, s.label): s for s in run_specs(config)}
    trace = dict(specs[("main", "trace")].alloc)
    assert trace == {"name": "trace", "min_per_prompt": 2, "prefer_unmixed": True}
    assert dict(specs[("main", "uniform")].alloc) == {"name": "uniform"}
    stage = dict(specs[("stages", "s1_uniform-s2_active")].alloc)
    assert stage["min_per_prompt"] == 2 and stage["stage1"] == "uniform"
    # the defaults leave the specs (and so the run directories' keys) as they were
    default = {(s.group, s.label): s for s in run_specs(ExperimentConfig(methods=("trace",)))}
    assert dict(default[("main", "trace")].alloc) == {"name": "trace"}
    parsed = tyro.cli(ExperimentConfig, args=["--alloc.trace.min-per-prompt", "2"])
    assert parsed.alloc.trace.min_per_prompt == 2


def test_default_runs_the_headline_pair_on_five_seeds_and_the_rest_on_three():
    specs = run_specs(ExperimentConfig())
    seeds: dict[tuple[str, str, str], set[int]] = {}
    for s in specs:
        seeds.setdefault((s.group, s.series, s.label), set()).add(s.seed)
    for series in ("leaves", "tokens"):
        for method in ("trace", "uniform"):
            assert seeds[("main", series, method)] == {0, 1, 2, 3, 4}
    for method in ("dynamic_sampling", "random_tree"):
        assert seeds[("main", "leaves", method)] == {0, 1, 2}
        assert ("main", "tokens", method) not in seeds
    stages = {k for k in seeds if k[0] == "stages"}
    assert len(stages) == 3 and all(seeds[k] == {0, 1, 2} for k in stages)
    config = ExperimentConfig()  # at least 3 epochs over the 254 training questions
    assert config.steps * config.pool_size >= 3 * 254


def test_config_rejects_unknown_methods_and_bad_eval_steps():
    with pytest.raises(ValueError, match="unknown methods"):
        ExperimentConfig(methods=("trace", "ppo"))
    with pytest.raises(ValueError, match="eval_at"):
        ExperimentConfig(steps=10, eval_at=(4, 8))


def test_quick_is_a_reduced_configuration():
    quick = ExperimentConfig(quick=True).resolved()
    assert quick.methods == ("trace", "uniform", "dynamic_sampling")
    assert quick.seeds == (0,) and quick.steps == quick.eval_at[-1]
    assert {s.seed for s in run_specs(quick)} == {0}  # one seed for every method
    assert not (quick.token_series or quick.stage_ablation or quick.budgets)
    assert quick.name == "quick"


def test_gpu_recipe_prints_one_launch_command_per_method_and_seed(capsys):
    assert experiment.cli(["--backend", "openrlhf", "--seeds", "0", "1", "--json"]) == 0
    out = capsys.readouterr().out.splitlines()
    commands = json.loads(out[-1])["commands"]
    assert len(commands) == 2 * len(ExperimentConfig().methods)
    first = shlex.split(commands[0])
    assert "scripts/train_qwen3_8b_hotpotqa.sh" in first and first[-2:] == ["--seed", "0"]
    assert "MODEL=Qwen/Qwen3-8B" in first
    assert any(a.startswith("ALLOC_ARGS=--alloc.name trace ") for a in first)


@pytest.mark.slow
def test_experiment_runs_every_cell_writes_results_and_resumes(tmp_path, tiny_recipe):
    recipe = dataclasses.replace(
        tiny_recipe, world=dataclasses.replace(tiny_recipe.world, questions_per_kind=6)
    )
    config = ExperimentConfig(
        name="t",
        out_dir=tmp_path / "exp",
        policy_run_dir=tmp_path / "policy",
        methods=("trace", "uniform"),
        seeds=(0,),
        steps=2,
        eval_at=(1, 2),
        leaves_per_step=8,
        pool_size=4,
        budgets=(),
        stage_ablation=False,
        predictor_ablation=False,
        test_questions=4,
        test_samples=1,
        heldout_samples=1,
        results_dir=tmp_path / "results",
        progress=False,
    )
    first = main(config, recipe)

    runs = first["runs"]
    assert set(runs) == {s.run_id for s in run_specs(config)}
    assert len(runs) == 2 * 2  # methods x series
    for run_id, summary in runs.items():
        assert set(summary["evals"]) == {"1", "2"}
        assert [r["step"] for r in read_metrics(config.out_dir / run_id)] == [1, 2]
        assert 0.0 <= summary["effective_ratio"] <= 1.0
    leaves = runs["main-leaves-trace-s0"]
    assert leaves["total_leaves"] == 2 * 8  # exactly the leaf budget, every step
    tokens = runs["main-tokens-uniform-s0"]
    assert first["tokens_per_step"] == round(8 * first["start_eval"]["heldout"]["tokens"])
    # the token budget is met with a carry: within one step's overshoot of the total
    assert tokens["total_tokens"] >= first["tokens_per_step"] * 2 - 1
    assert set(first["accuracy"]) == {"trace", "uniform"}
    assert first["accuracy"]["trace"]["n"] == 1
    assert set(first["paired"]["leaves"]) == {"trace"}
    assert set(first["paired_tokens"]["trace"]) >= {"diff", "p"}
    assert "trace" in first["tokens_to_grpo_final"]
    saved = json.loads((tmp_path / "results" / "experiment-t.json").read_text())
    assert saved["accuracy"] == first["accuracy"]
    assert (tmp_path / "results" / "experiment-t.png").read_bytes()[:4] == b"\x89PNG"
    results_md = tmp_path / "results" / f"experiment-{config.name}.md"  # a record includes it
    section = results_md.read_text()
    assert "| trace |" in section and "Paired differences" in section

    # A rerun trains nothing; an evaluation lost to a kill is redone with the same draws.
    trained = {r: (config.out_dir / r / "metrics.jsonl").stat().st_mtime_ns for r in runs}
    evals_file = config.out_dir / "main-leaves-uniform-s0" / "experiment_evals.json"
    record = json.loads(evals_file.read_text())
    del record["evals"]["2"]
    evals_file.write_text(json.dumps(record))
    second = main(config, recipe)
    after = {r: (config.out_dir / r / "metrics.jsonl").stat().st_mtime_ns for r in runs}
    assert after == trained
    assert (
        second["runs"]["main-leaves-uniform-s0"]["evals"] == runs["main-leaves-uniform-s0"]["evals"]
    )
    for summary in first["runs"].values():  # movement beside EM
        assert summary["optimizer_steps"] >= 0 and summary["displacement"] >= 0
    assert "‖θ_end − θ_start‖" in section

    # The learning-rate axis: the x1 runs above are read back (their ids and keys unchanged),
    # only the x2 runs train, and each method is compared at the rate validation chose.
    axis = dataclasses.replace(
        config, token_series=False, lr_multipliers=(1.0, 2.0), validation_questions=4
    )
    third = main(axis, recipe)
    assert {r: (config.out_dir / r / "metrics.jsonl").stat().st_mtime_ns for r in runs} == trained
    assert {"main-leaves-trace-s0-lr2", "main-leaves-uniform-s0-lr2"} <= set(third["runs"])
    curves = third["lr_multipliers"]["validation"]
    assert set(curves) == {"leaves/trace", "leaves/uniform"}
    for cell, chosen in third["lr_multipliers"]["chosen"].items():
        assert chosen == best_multiplier(curves[cell])
    assert third["summary"]["lr_multiplier"] == third["lr_multipliers"]["chosen"]
    assert "Learning rate: validation curve" in results_md.read_text()
    with pytest.raises(ValueError, match="--validation-world-seed"):
        main(dataclasses.replace(axis, validation_world_seed=axis.test_world_seed), recipe)

    with pytest.raises(ValueError, match="other settings"):  # never mixes two configurations
        main(dataclasses.replace(config, lr=1e-3), recipe)


def test_run_spec_ids_name_the_cell():
    spec = RunSpec("main", "trace", "tokens", 2, (("name", "trace"),), None)
    assert spec.run_id == "main-tokens-trace-s2"
