"""The tree trainer end to end on CPU: OpenRLHF's flags (parsed by its own parser), its strategy,
datasets and `train_step`, trace-rl's engine over fake Ray vLLM engines, a real BM25 retriever,
and an in-process stand-in for the DeepSpeed policy group that trains a tiny `Actor` with
OpenRLHF's `PolicyLoss`. What the stand-in replaces is the GPU part: DeepSpeed ranks, NCCL weight
sync and real vLLM generation (docs/openrlhf.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from openrlhf.models import Actor
from openrlhf.models.loss import PolicyLoss
from openrlhf_fakes import ScriptedSearchPolicy

from envs import QATask
from envs.search_qa import SearchQAConfig
from harness.openrlhf.config import TreeTrainConfig
from harness.openrlhf.experience import experiences_from_leaves, pad_to_multiple
from harness.openrlhf.launcher import parse_openrlhf_args
from harness.openrlhf.tree_trainer import TreePPOTrainer, TreePPOTrainerBase
from harness.tiny_policy.model import ModelConfig, build_model, save_policy
from harness.tiny_policy.tokenizer import train_tokenizer
from harness.training.config import AllocConfig
from harness.training.metrics_log import rollout_metrics
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever
from trace_alloc import tree_advantages
from trace_alloc.budget import Spend

pytestmark = pytest.mark.slow  # shares the Ray engines (about a minute to start, once)

DOCS = [
    Document(doc_id="d1", title="Acme", text="Acme was founded by Ann Vole."),
    Document(doc_id="d2", title="Ann Vole", text="Ann Vole was born in Lyon."),
    Document(doc_id="d3", title="Bolt", text="Bolt was founded by Bo Li."),
    Document(doc_id="d4", title="Bo Li", text="Bo Li was born in Oslo."),
    Document(doc_id="d5", title="Zed", text="Zed was founded by Cy Ray."),
    Document(doc_id="d6", title="Cy Ray", text="Cy Ray was born in Rome."),
]
TASKS = [
    QATask(
        task_id="acme", question="Where was the founder of Acme born?", golden_answers=("Lyon",)
    ),
    QATask(
        task_id="bolt", question="Where was the founder of Bolt born?", golden_answers=("Oslo",)
    ),
    QATask(task_id="zed", question="Where was the founder of Zed born?", golden_answers=("Rome",)),
]
TEMPLATE = "Question: {question}\n"


class CPUPolicyGroup:
    """In-process stand-in for OpenRLHF's `RayActorGroup` of `PolicyModelActor`s: one CPU rank
    with a tiny `Actor`, `PolicyLoss` and AdamW. Like the real group, its methods answer with
    Ray object refs."""

    def __init__(self, model_dir: Path, ray) -> None:
        self.ray = ray
        self.actor = Actor(str(model_dir), attn_implementation="sdpa")
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=1e-3)
        self.loss = PolicyLoss()
        self.buffer: list = []
        self.fits: list[list] = []  # the micro-batches each fit trained on
        self.n_broadcasts = 0
        self.n_schedule_advances = 0
        self.n_checkpoints = 0

    def async_run_method_batch(self, method_name, **kwargs):
        n = len(next(iter(kwargs.values())))
        method = getattr(self, method_name)
        return [self.ray.put([method(**{k: v[i] for k, v in kwargs.items()}) for i in range(n)])]

    def async_run_method(self, method_name, **kwargs):
        return [self.ray.put(getattr(self, method_name)(**kwargs))]

    def forward(self, sequences, action_mask, attention_mask, mm_train_inputs_list=None):
        assert not any(mm_train_inputs_list or [])  # text only
        with torch.no_grad():
            return self.actor(sequences, action_mask, attention_mask=attention_mask).float()

    def append(self, experience):
        self.buffer.append(experience)

    def fit(self, kl_ctl):
        from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

        # OpenRLHF's actor normalises by the action tokens of the whole optimizer step, so a
        # zero-weight filler (action mask 0) adds nothing and divides by nothing
        norm = _optimizer_step_loss_norm([e.action_mask for e in self.buffer], None, 1, 1)
        losses = []
        for exp in self.buffer:
            log_probs = self.actor(
                exp.sequences, exp.action_mask, attention_mask=exp.attention_mask
            )
            loss, *_ = self.loss(
                log_probs.float(),
                exp.action_log_probs,
                exp.advantages,
                action_mask=exp.action_mask,
                **norm,
            )
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            losses.append(loss.item())
        self.fits.append(self.buffer)
        self.buffer = []
        return {"policy_loss": float(np.mean(losses))}

    def broadcast_to_vllm(self):
        self.n_broadcasts += 1

    def advance_schedule(self):  # a step that kept no leaf (TreePolicyModelActor's method)
        self.n_schedule_advances += 1

    def save_checkpoint(self, **kwargs):
        self.n_checkpoints += 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    texts = [f"{d.title} {d.text}" for d in DOCS] + [t.question for t in TASKS]
    texts += ["<search> Acme </search> <information> Doc 1(Title: x) </information> <answer> x"]
    tokenizer = train_tokenizer(texts * 20, vocab_size=400)
    model = build_model(ModelConfig(hidden_size=64, n_layers=1, head_dim=32), tokenizer)
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    index = root / "index"
    BM25Retriever.build(DOCS).save(index)
    prompts = root / "prompts.jsonl"
    rows = [
        {"prompt": t.question, "task": json.dumps(t.to_json()), "datasource": "toy"} for t in TASKS
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return index, prompts


def test_tree_ppo_trainer_is_a_ray_actor_of_an_openrlhf_base_trainer():
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    assert callable(TreePPOTrainer.remote)
    assert issubclass(TreePPOTrainer.__ray_metadata__.modified_class, TreePPOTrainerBase)
    assert issubclass(TreePPOTrainerBase, BasePPOTrainer)


def test_two_tree_steps_train_the_policy_on_the_tree_advantages(
    ray_local, fake_engines, model_dir, data, tmp_path
):
    from openrlhf.utils import get_strategy

    index, prompts = data
    ray_local.get([e.set_policy.remote(ScriptedSearchPolicy(str(model_dir))) for e in fake_engines])
    args = parse_openrlhf_args(
        [
            *("--actor.model_name_or_path", str(model_dir), "--data.prompt_dataset", str(prompts)),
            *(
                "--eval.dataset",
                str(prompts),
                "--eval.steps",
                "2",
                "--eval.n_samples_per_prompt",
                "2",
            ),
            *("--vllm.num_engines", "2", "--rollout.max_new_tokens", "16", "--data.max_len", "512"),
            *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4"),
            *("--rollout.micro_batch_size", "2", "--train.micro_batch_size", "2"),
            *(
                "--train.batch_size",
                "4",
                "--actor.num_gpus_per_node",
                "1",
                "--ref.num_gpus_per_node",
                "1",
            ),
            *(
                "--algo.kl.init_coef",
                "0",
                "--ckpt.path",
                str(tmp_path / "ckpt"),
                "--ckpt.save_steps",
                "1",
            ),
            *("--train.seed", "3"),
        ]
    )
    config = TreeTrainConfig(
        seeded_requests=True,  # the fake engines sample from the request seed
        retriever=str(index),
        # 8 leaves = 4 roots + 4 continuations: at the default of 4 roots per opened prompt,
        # Stage 1 could open only one of a step's two prompts
        alloc=AllocConfig.of("trace", max_per_prompt=8, min_per_prompt=2),
        env=SearchQAConfig(prompt_template=TEMPLATE, max_turns=4, top_k=2, max_doc_chars=200),
        run_dir=tmp_path / "run",
        # a seed whose two steps both draw contrast (with seed 5 the second step of the
        # own-tree placement, issue 20, drew none and trained nothing)
        seed=6,
    )
    group = CPUPolicyGroup(model_dir, ray_local)
    before = [p.detach().clone() for p in group.actor.parameters()]
    trainer = TreePPOTrainerBase(
        str(model_dir),
        get_strategy(args),
        group,
        None,
        None,
        None,
        fake_engines,
        config=config,
        do_sample=True,
        max_len=512,
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
    )
    assert trainer.fit() == 2  # 3 prompts, 2 per step
    generator = trainer.samples_generator

    # every step trained a whole number of batches, on leaves of the step's trees
    assert len(group.fits) == 2 and group.n_broadcasts == 2
    assert group.n_checkpoints == 3  # one per step (--ckpt.save_steps 1), one best-eval
    sizes = [sum(len(mb.sequences) for mb in fit) for fit in group.fits]
    assert all(size % 4 == 0 and size > 0 for size in sizes)

    # the last step's advantages are exactly trace_alloc's tree advantages, leaf by leaf (the
    # leaves with signal; fillers have action mask 0,
    # docs/decisions.md, "One objective")
    step = generator.last_step
    kept = [step.trees[i] for i in step.train_indices]
    expected = pad_to_multiple(
        experiences_from_leaves(
            kept,
            [a for a in tree_advantages(kept, config.loss.advantage) if a.has_signal],
            max_len=512,
            prompts=["p"] * len(kept),
            labels=["l"] * len(kept),
        ),
        4,
    )
    trained = [
        (mb.advantages[i], mb.action_mask[i])
        for mb in group.fits[-1]
        for i in range(len(mb.sequences))
    ]
    assert len(trained) == len(expected)
    for (advantages, mask), exp in zip(trained, expected, strict=True):
        n = exp.advantages.shape[1]
        assert torch.allclose(advantages[:n], exp.advantages[0], atol=1e-6)
        assert torch.equal(mask[:n].long(), exp.action_mask[0])
        assert torch.count_nonzero(advantages[n:]) == 0

    # trees fork at turn prefixes, and the leaves finished with answers scored by the env
    assert any(len(tree.nodes[0].children) < tree.n_leaves for tree in step.trees)
    rewards = {n.reward for tree in step.trees for n in tree.nodes if n.reward is not None}
    assert rewards <= {0.0, 1.0}

    # the policy moved, the predictor learnt, metrics and tree state were written
    assert any(not torch.equal(a, b) for a, b in zip(before, group.actor.parameters(), strict=True))
    records = [
        json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1.0, 2.0]
    for record in records:
        assert 0.0 <= record["rollout/effective_ratio"] <= 1.0
        assert record["budget/leaves"] <= 8 and record["budget/tokens"] > 0
        assert {"predictor/brier", "loss/policy", "rollout/reward", "perf/step_s"} <= set(record)
        assert {"advantage/top_tree_share", "advantage/effective_trees"} <= set(record)
    assert records[-1]["budget/total_leaves"] == sum(r["budget/leaves"] for r in records)
    assert set(rollout_metrics(step)) <= set(records[-1])  # the CPU trainer's rollout keys
    assert (trainer.state_dir(2) / "predictor.npz").is_file()

    # evaluation groups n independent episodes per prompt, as OpenRLHF's metrics expect
    logs = trainer.evaluate(2, temperature=1.0, n_samples_per_prompt=2)
    assert logs["eval_num_samples"] == 6.0
    assert 0.0 <= logs["eval_toy_pass1"] <= logs["eval_toy_pass2"] <= 1.0


def test_tree_state_round_trips_through_its_checkpoint_files(
    ray_local, fake_engines, model_dir, data, tmp_path
):
    from openrlhf.trainer.ppo_trainer import prepare_datasets
    from openrlhf.utils import get_strategy
    from openrlhf.utils.utils import get_tokenizer

    from harness.openrlhf.samples import TreeSamplesGenerator

    index, prompts = data
    args = parse_openrlhf_args(
        [
            *("--actor.model_name_or_path", str(model_dir), "--data.prompt_dataset", str(prompts)),
            *("--vllm.num_engines", "2", "--rollout.max_new_tokens", "16", "--data.max_len", "512"),
            *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4"),
            *("--actor.num_gpus_per_node", "1"),
        ]
    )
    strategy = get_strategy(args)
    tokenizer = get_tokenizer(str(model_dir), None, "left", strategy)
    loader, _, _ = prepare_datasets(strategy, tokenizer)
    config = TreeTrainConfig(retriever=str(index), env=SearchQAConfig(prompt_template=TEMPLATE))
    a = TreeSamplesGenerator(strategy, loader, None, tokenizer, fake_engines, config=config)
    b = TreeSamplesGenerator(strategy, loader, None, tokenizer, fake_engines, config=config)
    sa, sb = a.tree_step, b.tree_step
    sa.predictor.update(["Q: acme", "Q: zed"], np.array([1.0, 0.0]))
    sa.carry, sa.tokens_per_leaf, sa.spent = -3.0, 41.5, Spend(n_leaves=9, n_tokens=99)
    sa.rng.integers(10, size=5)
    a.save_state(tmp_path / "state")
    b.load_state(tmp_path / "state")
    assert sb.carry == -3.0 and sb.tokens_per_leaf == 41.5 and sb.spent == sa.spent
    assert sb.predictor.predict(["Q: acme"]) == pytest.approx(sa.predictor.predict(["Q: acme"]))
    assert sb.rng.integers(1 << 30) == sa.rng.integers(1 << 30)
