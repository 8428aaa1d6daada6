"""The CPU trainer: config round trips, the data cursor, the policy update, logs, plots, resume."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from envs import World, WorldConfig
from harness.errors import ResumeError
from harness.policies.policy_protocol import PROTOCOL_FILE, PolicyProtocol, read_policy_protocol
from harness.tiny_policy import tiny_env_config
from harness.training.checkpoint import policy_distance, policy_parameters
from harness.training.config import (
    AllocConfig,
    BudgetConfig,
    EvalConfig,
    OptimConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    load_config,
)
from harness.training.metrics_log import plot_run, read_metrics
from harness.training.trainer import DataCursor, train, update_policy

pytest.importorskip("openrlhf")

# a world of 9 two-hop questions and short observations: a policy for it trains in seconds
WORLD = WorldConfig(
    n_countries=2,
    n_cities=4,
    n_people=30,
    n_films=3,
    n_books=2,
    n_companies=2,
    n_universities=1,
    n_distractors=2,
    questions_per_kind=1,
    sentences_per_doc=1,
    max_hops=2,
)
ENV = dataclasses.replace(tiny_env_config(), max_turns=3, top_k=1, max_doc_chars=100)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """A tiny policy fitted to noisy oracle episodes, wrong answers included.

    It imitates the oracle's mistakes too, so its samples mix right and wrong answers: the
    contrast RL needs, in about a minute of CPU.
    """
    from harness.rollout.episodes import EpisodeCodec
    from harness.tiny_policy.demos import collect_demos, encode_demo
    from harness.tiny_policy.model import ModelConfig, build_model, save_policy
    from harness.tiny_policy.tokenizer import train_tokenizer

    world = World.generate(0, WORLD)
    demos = collect_demos(world, list(world.tasks), ENV, epsilon=0.5, n_variants=4)
    tokenizer = train_tokenizer([d.text for d in demos], vocab_size=1000)
    encoded = [encode_demo(d, EpisodeCodec(tokenizer)) for d in demos]
    width = max(len(e.token_ids) for e in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id)  # (N, T)
    weights = torch.zeros((len(encoded), width))  # (N, T)
    for i, e in enumerate(encoded):
        ids[i, : len(e.token_ids)] = torch.tensor(e.token_ids)
        weights[i, : len(e.token_ids)] = torch.tensor([1.0 if a else 0.05 for a in e.action_mask])
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    model = build_model(config, tokenizer)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is faster on a shared 2-core machine
    for _ in range(80):
        logits = model(input_ids=ids).logits[:, :-1]  # (N, T-1, V)
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )
        loss = (nll * weights[:, 1:]).sum() / weights[:, 1:].sum()
        optim.zero_grad()
        loss.backward()
        optim.step()
    torch.set_num_threads(threads)
    return save_policy(model.eval(), tokenizer, tmp_path_factory.mktemp("policy"))


def small_config(run_dir: Path, policy: Path, **overrides) -> TrainConfig:
    base = TrainConfig(
        run_dir=run_dir,
        policy=policy,
        steps=2,
        checkpoint_every=1,
        progress=False,
        tensorboard=False,
        torch_threads=1,
        task=TaskConfig(world=WORLD, env=ENV, train_split="all", eval_split="test"),
        alloc=AllocConfig.of("trace", continuations_per_rollout=1, explore_frac=0.0),
        budget=BudgetConfig(per_step=16, pool_size=4),
        rollout=RolloutConfig(max_new_tokens=24, max_total_tokens=512),
        optim=OptimConfig(lr=1e-3, micro_batch_size=8),
    )
    return dataclasses.replace(base, **overrides)


def test_the_data_cursor_is_seeded_distinct_and_resumable():
    ids = tuple(f"q{i}" for i in range(10))
    a = DataCursor(ids, seed=1)
    pools = [a.take(4) for _ in range(4)]
    assert all(len(set(p)) == 4 for p in pools)
    assert len(set(pools[0] + pools[1])) == 8  # no repeat within an epoch
    # two pools fit epoch 0; the third would straddle the boundary, so it opens epoch 1
    assert (a.epoch, a.position) == (1, 8)
    assert pools[0] != list(ids[:4])  # shuffled
    b = DataCursor(ids, seed=1)
    b.take(4)
    c = DataCursor(ids, seed=1, epoch=b.epoch, position=b.position)
    assert [c.take(4) for _ in range(3)] == pools[1:]
    assert DataCursor(ids, seed=2).take(4) != DataCursor(ids, seed=1).take(4)


# --- the update -------------------------------------------------------------------------------


class _Leaf:
    def __init__(self, ids, mask, adv):
        self.token_ids = np.asarray(ids, dtype=np.int64)
        self.action_mask = np.asarray(mask, dtype=bool)
        self.advantages = np.asarray(adv, dtype=np.float64)
        self.logprobs = np.zeros(len(ids))


def _leaves():
    # token 7 follows an action prefix with a positive advantage; observation tokens (9) are
    # masked; a second leaf pushes token 8 down
    return [
        _Leaf([1, 2, 7, 9, 9, 7], [0, 0, 1, 0, 0, 1], [0, 0, 1.0, 0, 0, 1.0]),
        _Leaf([1, 2, 8, 9], [0, 0, 1, 0], [0, 0, -1.0, 0]),
        _Leaf([1, 3, 7, 9, 9], [0, 0, 1, 0, 0], [0, 0, 0.5, 0, 0]),
    ]


def _grads(tiny_model, micro_batch_size: int) -> dict[str, torch.Tensor]:
    from harness.training.openrlhf_compat import openrlhf_losses

    class Capture:  # an optimizer step that keeps the gradients instead of applying them
        def __init__(self, model):
            self.model = model

        def backward(self, loss, *, last):
            loss.backward()

        def step(self, lr):
            return 0.0

        def model_state_dict(self):
            return self.model.state_dict()

    losses = openrlhf_losses()
    model = tiny_model()
    config = small_config(
        Path("x"), Path("p"), optim=OptimConfig(micro_batch_size=micro_batch_size)
    )
    metrics = update_policy(
        Capture(model), None, losses.PolicyLoss(), losses, _leaves(), config, pad_id=0, lr=1e-3
    )
    assert metrics["policy/n_train_tokens"] == 4
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_micro_batches_add_up_to_the_full_batch_gradient(tiny_model):
    whole, split = _grads(tiny_model, 8), _grads(tiny_model, 1)
    assert whole.keys() == split.keys()
    for name in whole:
        torch.testing.assert_close(whole[name], split[name], rtol=1e-4, atol=1e-7)


def test_an_update_raises_the_log_prob_of_positively_advantaged_actions_only(tiny_model):
    from harness.training.openrlhf_compat import openrlhf_losses
    from harness.training.optimizers import TorchOptimizer

    losses = openrlhf_losses()
    model = tiny_model()
    ids = torch.tensor([[1, 2, 7, 9], [1, 2, 8, 9]])

    def logp() -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(input_ids=ids).logits[:, 1], -1)  # (2, V) after "1 2"

    before = logp()
    config = small_config(Path("x"), Path("p"))
    optimizer = TorchOptimizer(model, lr=1e-2)
    for _ in range(5):
        update_policy(
            optimizer, None, losses.PolicyLoss(), losses, _leaves()[:2], config, pad_id=0, lr=1e-2
        )
    after = logp()
    assert after[0, 7] > before[0, 7]  # pushed up
    assert after[0, 8] < before[0, 8]  # pushed down


@pytest.mark.parametrize("temperature", [0.6, 1.7])
def test_the_loss_scores_log_probs_under_the_sampling_temperature(policy_dir, temperature):
    # on-policy, the trainer's log-probs must be the sampler's: OpenRLHF's Actor divides the
    # logits by the temperature; scoring raw logits left a gap of about 0.1-1 nat per token
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.policies import SamplingParams, TransformersBackend
    from harness.rollout.episodes import EpisodeCodec
    from harness.training.openrlhf_compat import openrlhf_losses

    class Capture:
        def __init__(self, model):
            self.model = model

        def backward(self, loss, *, last):
            loss.backward()

        def step(self, lr):
            return 0.0

        def model_state_dict(self):
            return self.model.state_dict()

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    prompt = EpisodeCodec(tokenizer).encode_prompt("Question: where was Ann born?")
    sampling = SamplingParams(temperature=temperature, max_new_tokens=12, seed=3)
    completion = TransformersBackend(model, tokenizer).generate([prompt], sampling)[0]
    n = completion.n_tokens
    leaf = _Leaf(
        [*prompt, *completion.token_ids],
        [0] * len(prompt) + [1] * n,
        [0.0] * len(prompt) + [1.0] * n,
    )
    leaf.logprobs = np.asarray([0.0] * len(prompt) + list(completion.logprobs))
    losses = openrlhf_losses()
    config = small_config(
        Path("x"), Path("p"), rollout=RolloutConfig(temperature=temperature, max_new_tokens=12)
    )
    metrics = update_policy(
        Capture(model), None, losses.PolicyLoss(), losses, [leaf], config, pad_id=0, lr=1e-3
    )
    assert metrics["policy/n_train_tokens"] == n
    assert metrics["policy/rollout_logprob_gap"] < 1e-4


def test_no_contrast_means_no_update():
    from harness.training.openrlhf_compat import openrlhf_losses

    losses = openrlhf_losses()
    config = small_config(Path("x"), Path("p"))
    out = update_policy(None, None, losses.PolicyLoss(), losses, [], config, pad_id=0, lr=1e-3)
    assert out["policy/n_train_leaves"] == 0
    assert out["policy/optimizer_steps"] == 0 and out["policy/update_norm"] == 0.0


@pytest.mark.parametrize("epochs", [1, 3])
def test_an_update_logs_its_optimizer_steps_and_how_far_it_moved_the_weights(tiny_model, epochs):
    from harness.training.checkpoint import parameter_distance
    from harness.training.openrlhf_compat import openrlhf_losses
    from harness.training.optimizers import TorchOptimizer

    losses = openrlhf_losses()
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = small_config(Path("x"), Path("p"), optim=OptimConfig(lr=1e-2, ppo_epochs=epochs))
    out = update_policy(
        TorchOptimizer(model, lr=1e-2), None, losses.PolicyLoss(), losses, _leaves(), config,
        pad_id=0, lr=1e-2,
    )  # fmt: skip
    after = {n: p.detach() for n, p in model.named_parameters()}
    assert out["policy/optimizer_steps"] == epochs
    assert out["policy/update_norm"] > 0
    assert out["policy/update_norm"] == pytest.approx(parameter_distance(before, after), rel=1e-9)


# --- whole runs ---------------------------------------------------------------------------------

KEYS = {
    "rollout/reward",
    "rollout/accuracy",
    "rollout/effective_ratio",
    "rollout/reward_var_per_leaf",  # the health metrics of issue 20
    "rollout/flips_per_continuation",
    "rollout/max_leaves_per_tree",
    "advantage/max_abs",
    "advantage/top_tree_share",
    "advantage/effective_trees",
    "policy/grad_norm",
    "policy/optimizer_steps",  # movement (issue 30)
    "policy/update_norm",
    "policy/rollout_logprob_gap",
    "rollout/mixed_anchors",
    "rollout/response_length",
    "rollout/valid_action_rate",
    "rollout/searches_per_episode",
    "predictor/brier",
    "predictor/auc",
    "predictor/auc_root",  # roots and prefixes apart, every step
    "predictor/auc_prefix",
    "policy/entropy",
    "policy/kl",
    "loss/policy",
    "budget/leaves",
    "budget/tokens",
    "budget/tool_calls",
    "perf/tokens_per_s",
    "data/pool",
}


def test_a_short_run_logs_every_metric_checkpoints_and_plots(tmp_path, policy_dir):
    config = small_config(
        tmp_path / "run",
        policy_dir,
        eval=EvalConfig(every=2, n_questions=4),
        loss=dataclasses.replace(small_config(tmp_path, policy_dir).loss, kl_coef=0.05),
        save_trees_every=1,
        tensorboard=True,
    )
    summary = train(config)
    records = read_metrics(config.run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]  # eval before step 1, then each step
    for record in records[1:]:
        assert set(record) >= KEYS, KEYS - set(record)
        assert record["budget/leaves"] == 16  # the leaf budget, exactly
        assert len(record["data/pool"]) == 4
    assert "eval/em" in records[0] and "eval/em" in records[2]
    assert sum(r["policy/n_train_leaves"] for r in records[1:]) > 0  # the update really ran
    assert summary.totals["leaves"] == 32
    assert summary.totals["tokens"] == sum(r["budget/tokens"] for r in records[1:])
    assert (summary.policy_dir / "config.json").exists()
    steps_taken = sum(r["policy/optimizer_steps"] for r in records[1:])
    assert summary.movement["policy/optimizer_steps_total"] == steps_taken > 0
    assert summary.movement["policy/displacement"] == pytest.approx(
        policy_distance(policy_dir, summary.policy_dir), rel=1e-6
    )
    assert summary.movement["policy/displacement"] > 0
    protocol = (summary.policy_dir / PROTOCOL_FILE).read_text()  # the env it was trained in
    assert read_policy_protocol(summary.policy_dir) == PolicyProtocol.of(
        config.task.env, world_seed=config.task.world_seed, world=config.task.world
    ), protocol
    assert (config.run_dir / "checkpoints" / "step_000002" / "model.pt").exists()
    assert list((config.run_dir / "tensorboard").iterdir())
    assert len(list((config.run_dir / "trees").glob("*.jsonl"))) == 2
    assert load_config(config.run_dir) == config
    png = plot_run(config.run_dir)
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ResumeError, match="already holds a run"):
        train(config)


def test_a_world_stream_trains_each_step_on_a_fresh_world_and_evaluates_every_set(
    tmp_path, policy_dir
):
    base = small_config(tmp_path, policy_dir)
    config = small_config(
        tmp_path / "run",
        policy_dir,
        task=dataclasses.replace(base.task, source="stream", stream_first_seed=300),
        eval=EvalConfig(every=2, n_questions=4, sets=("unseen", "fact_disjoint", "decoy", "split")),
    )
    summary = train(config)
    records = read_metrics(config.run_dir)
    assert [r["data/world_seed"] for r in records[1:]] == [300, 301]
    for record, seed in zip(records[1:], (300, 301), strict=True):
        assert len(record["data/pool"]) == 4
        assert all(i.startswith(f"w{seed}/") for i in record["data/pool"])
        assert record["budget/leaves"] == 16  # the budget meter is the same on every source
    for name in ("unseen", "fact_disjoint", "decoy", "split"):
        assert 0.0 <= records[0][f"eval/{name}/em"] <= 1.0
    assert records[0]["eval/em"] == records[0]["eval/unseen/em"]  # the first set is primary
    assert summary.totals["leaves"] == 32


def test_a_task_file_in_hotpotqa_format_trains_unchanged(tmp_path, policy_dir, shared_data):
    from harness.evaluation.bench import corpus

    hotpot = shared_data / "hotpotqa" / "hotpot_dev_distractor.migres200.jsonl"
    corpus(["--data-file", str(hotpot), "--out", str(tmp_path / "corpus")])
    task = TaskConfig(
        source="file",
        train_file=hotpot,
        eval_file=hotpot,
        index=str(tmp_path / "corpus" / "bm25"),
        env=ENV,
    )
    config = small_config(
        tmp_path / "run",
        policy_dir,
        steps=1,
        task=task,
        eval=EvalConfig(every=1, n_questions=2),
        budget=BudgetConfig(per_step=4, pool_size=2),
    )
    train(config)
    records = read_metrics(config.run_dir)
    questions = [json.loads(line)["_id"] for line in hotpot.read_text().splitlines()]
    assert set(records[1]["data/pool"]) <= set(questions)
    assert records[1]["budget/leaves"] == 4 and records[1]["budget/tool_calls"] >= 0
    assert 0.0 <= records[1]["eval/split/em"] <= 1.0


def _cli_args(run_dir: Path, policy: Path, steps: int) -> list[str]:
    world = [
        f"--task.world.{name.replace('_', '-')}={getattr(WORLD, name)}"
        for name in (
            "n_countries",
            "n_cities",
            "n_people",
            "n_films",
            "n_books",
            "n_companies",
            "n_universities",
            "n_distractors",
            "questions_per_kind",
            "sentences_per_doc",
            "max_hops",
        )
    ]
    return [
        f"--run-dir={run_dir}",
        f"--policy={policy}",
        f"--steps={steps}",
        "--checkpoint-every=1",
        "--no-progress",
        "--no-tensorboard",
        "--torch-threads=1",
        *world,
        f"--task.env.max-turns={ENV.max_turns}",
        f"--task.env.top-k={ENV.top_k}",
        f"--task.env.max-doc-chars={ENV.max_doc_chars}",
        "--task.train-split=all",
        "--task.eval-split=test",
        "--alloc.name=trace",
        "--alloc.trace.continuations-per-rollout=1",
        "--alloc.trace.explore-frac=0.0",
        "--budget.per-step=16",
        "--budget.pool-size=4",
        "--rollout.max-new-tokens=24",
        "--rollout.max-total-tokens=512",
        "--optim.lr=1e-3",
        "--optim.micro-batch-size=8",
    ]


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, policy_dir):
    from harness.training.cli import train as train_cli

    steps = 4
    killed_dir, straight_dir = tmp_path / "killed", tmp_path / "straight"
    # a real `tracerl train` process, killed with SIGKILL while it runs step 3
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.cli",
            "train",
            *_cli_args(killed_dir, policy_dir, steps),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # the log (rich) and the bars, one stream
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"},
    )
    seen = []
    for line in process.stdout:  # blocks on the process's own output: no sleeps
        seen.append(line)
        if "saved checkpoint step 2" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=120)
    assert process.returncode == -signal.SIGKILL, "".join(seen[-20:])
    assert [r["step"] for r in read_metrics(killed_dir)][:2] == [1, 2]

    assert train_cli([*_cli_args(killed_dir, policy_dir, steps), "--resume"]) == 0
    straight = train(small_config(straight_dir, policy_dir, steps=steps))

    resumed = read_metrics(killed_dir)
    reference = read_metrics(straight_dir)
    assert [r["step"] for r in resumed] == list(range(1, steps + 1))  # none lost, none twice
    assert [r["data/pool"] for r in resumed] == [r["data/pool"] for r in reference]
    assert sum(r["policy/n_train_leaves"] for r in reference) > 0  # weights really changed
    for a, b in zip(resumed, reference, strict=True):
        for key in ("rollout/reward", "budget/tokens", "budget/leaves", "rollout/mixed_anchors"):
            assert a[key] == b[key], (a["step"], key)
        for key in ("loss/policy", "predictor/brier", "policy/entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (a["step"], key)
        # Stage 2's calibrated flip chances: the calibrator's fit came back with the checkpoint
        assert a["stage2/p_flip"] == pytest.approx(b["stage2/p_flip"], abs=1e-4), a["step"]
    assert any(r["stage2/p_flip"] for r in reference[2:])  # continuations after the resume
    assert straight.steps == steps
    # a resumed run's movement is the whole run's, not the part after the resume
    moved = json.loads((killed_dir / "summary.json").read_text())["movement"]
    total = "policy/optimizer_steps_total"
    assert moved[total] == straight.movement[total]
    assert moved["policy/displacement"] == pytest.approx(
        straight.movement["policy/displacement"], rel=1e-4
    )
    resumed_state = torch.load(killed_dir / "checkpoints" / "step_000004" / "model.pt")
    straight_state = torch.load(straight_dir / "checkpoints" / "step_000004" / "model.pt")
    for name, tensor in straight_state.items():
        torch.testing.assert_close(resumed_state[name], tensor, rtol=1e-5, atol=1e-6)
    # the predictor (weights, Adam moments, memory, generator) comes back bit for bit
    with (
        np.load(killed_dir / "checkpoints" / "step_000004" / "predictor.npz") as resumed_p,
        np.load(straight_dir / "checkpoints" / "step_000004" / "predictor.npz") as straight_p,
    ):
        assert resumed_p.files == straight_p.files
        for key in straight_p.files:
            assert np.array_equal(resumed_p[key], straight_p[key]), key


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])  # 3: rollouts on a whole copy of the partitioned weights
def test_one_deepspeed_zero_step_trains_like_torch(tmp_path, policy_dir, stage):
    pytest.importorskip("deepspeed")
    torch_run = train(small_config(tmp_path / "torch", policy_dir, steps=1))
    zero_optim = OptimConfig(lr=1e-3, micro_batch_size=8, backend="deepspeed", zero_stage=stage)
    zero_run = train(small_config(tmp_path / "zero", policy_dir, steps=1, optim=zero_optim))
    a, b = torch_run.final, zero_run.final
    assert a["policy/n_train_leaves"] > 0
    assert a["data/pool"] == b["data/pool"] and a["rollout/reward"] == b["rollout/reward"]
    assert b["loss/policy"] == pytest.approx(a["loss/policy"], rel=1e-5)
    assert b["policy/grad_norm"] == pytest.approx(a["policy/grad_norm"], rel=1e-4)
    assert b["policy/optimizer_steps"] == a["policy/optimizer_steps"] == 1
    assert b["policy/update_norm"] == pytest.approx(a["policy/update_norm"], rel=1e-4)
    ours = torch.load(tmp_path / "zero" / "checkpoints" / "step_000001" / "model.pt")
    theirs = torch.load(tmp_path / "torch" / "checkpoints" / "step_000001" / "model.pt")
    start = policy_parameters(policy_dir)
    for name, w0 in start.items():
        assert_one_adam_step_alike(w0, theirs[name], ours[name], lr=zero_optim.lr, name=name)


F32_EPS = torch.finfo(torch.float32).eps
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which both backends use


def assert_one_adam_step_alike(
    w0: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, lr: float, name: str
) -> None:
    """Two first AdamW steps from `w0` (no weight decay) agree as far as float32 lets them.

    The first step moves a weight by lr * g / (|g| + eps): its gradient's sign times lr, once
    |g| is far above Adam's eps, whatever the float32 reduction order that computed g (ZeRO
    partitions and reduces in another order than torch). Where the step saturates (s = |step|/lr
    within 2^-10 of 1, so |g| > ~1000 eps) the two runs must agree to float32 rounding of the
    weight and of the step. Below that, Adam's normalisation amplifies a gradient's float32
    rounding error by up to 1/eps, so only what every first step obeys is asserted: it moves by at
    most lr. Compared in float64, so the check adds no rounding of its own.
    """
    w0, a, b = w0.double(), a.double(), b.double()
    step_a, step_b = a - w0, b - w0
    bound = lr * (1 + 4 * F32_EPS) + 4 * F32_EPS * w0.abs()
    assert (step_a.abs() <= bound).all() and (step_b.abs() <= bound).all(), name
    saturated = step_a.abs() / lr >= 1 - 2**-10
    rounding = 4 * F32_EPS * (w0.abs() + lr)  # the weight's and the step's float32 rounding
    off = ((step_a - step_b).abs() > rounding) & saturated
    assert not off.any(), f"{name}: {int(off.sum())} saturated steps differ beyond rounding"


@pytest.mark.slow
def test_two_runs_of_one_seed_are_bit_identical_under_another_hash_seed_and_load(
    tmp_path, policy_dir
):
    """`tracerl train` twice, the second with another PYTHONHASHSEED beside a busy process."""
    from benchmarks.perf.determinism import HOG, compare_runs

    steps = 3
    for name, hash_seed in (("a", "1"), ("b", "2")):
        hog = subprocess.Popen([sys.executable, "-c", HOG]) if name == "b" else None
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.cli",
                    "train",
                    *_cli_args(tmp_path / name, policy_dir, steps),
                ],
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": hash_seed},
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = compare_runs(tmp_path / "a", tmp_path / "b")
    assert report["steps_compared"] == steps
    assert sum(r["stage2/continuations"] for r in read_metrics(tmp_path / "a")) > 0
    assert sum(r["policy/n_train_leaves"] for r in read_metrics(tmp_path / "a")) > 0
    assert report["identical"], report


@pytest.mark.slow
def test_grpo_resumed_or_as_dapo_without_a_batch_target_trains_the_same_weights(
    tmp_path, policy_dir
):
    """Neither a resume nor DAPO's filter changes GRPO's run: logs and weights bit for bit."""
    from benchmarks.perf.determinism import compare_runs

    budget = BudgetConfig(currency="tokens", per_step=300, pool_size=4)

    def run(name: str, alloc: str, steps: int, **overrides) -> Path:
        config = small_config(tmp_path / name, policy_dir, steps=steps, budget=budget,
                              alloc=AllocConfig.of(alloc), **overrides)  # fmt: skip
        train(config)
        return tmp_path / name

    straight = run("straight", "uniform", 4)
    run("resumed", "uniform", 2)
    resumed = run("resumed", "uniform", 4, resume=True)
    assert compare_runs(straight, resumed)["identical"]
    report = compare_runs(straight, run("dapo", "dynamic_sampling", 4))
    assert report["weights_differ"] == [] and report["predictor_differs"] == []
    a, b = read_metrics(straight), read_metrics(tmp_path / "dapo")
    assert [r["budget/tokens"] for r in a] == [r["budget/tokens"] for r in b]
    assert sum(r["policy/n_train_leaves"] for r in a) > 0
