"""The two trainers run one tree step: the same pool, settings and seed give the same trees.

The CPU trainer's step (`harness.training.trainer._step`) and the OpenRLHF sample generator's
(`TreeSamplesGenerator.run_tree_step`, with the transformers backend standing in for vLLM as in
a rehearsal) both call `harness.training.tree_step.TreeStep`; this plays step 1 through each on
the shipped warm start and compares every tree, node by node, and the predictor they learnt.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np

from envs import World
from harness.openrlhf.config import TreeTrainConfig
from harness.openrlhf.launcher import parse_openrlhf_args
from harness.openrlhf.rehearsal import PromptList
from harness.openrlhf.samples import TreeSamplesGenerator
from harness.policies import TransformersBackend
from harness.training import BudgetConfig, EvalConfig, TrainConfig
from harness.training import trainer as cpu
from retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parents[3]
WARM_START = ROOT / "harness" / "tiny_policy" / "warm_start"


def _nodes(tree) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Every node's place, tokens and outcome: what makes two trees the same tree."""
    return [
        (
            n.node_id,
            n.parent_id,
            n.wave,
            n.reward,
            None if n.turn is None else (n.turn.action_token_ids, n.turn.observation_token_ids),
        )
        for n in tree.nodes
    ]


def test_the_cpu_and_the_openrlhf_trainer_grow_the_same_trees(tmp_path):
    config = TrainConfig(
        run_dir=tmp_path / "cpu",
        policy=WARM_START,
        steps=1,
        budget=BudgetConfig(per_step=8, pool_size=2),
        eval=EvalConfig(every=0),
        tensorboard=False,
        progress=False,
    )
    run = cpu.set_up(config)
    record, cpu_result = cpu._step(run, cpu.resume(run), 1)

    # the OpenRLHF path over the same world's questions and index, the same env and sampling
    corpus = run.tasks.train.corpus(1)
    pool = record["data/pool"]
    labels = [json.dumps(corpus.tasks[task_id].to_json()) for task_id in pool]
    world = World.generate(config.task.world_seed, config.task.world)
    BM25Retriever.build(world.documents).save(tmp_path / "index")
    args = parse_openrlhf_args(
        [
            *("--actor.model_name_or_path", str(WARM_START), "--data.prompt_dataset", "p.jsonl"),
            *("--vllm.num_engines", "1", "--actor.num_gpus_per_node", "1"),
            *("--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "4"),
            *("--rollout.max_new_tokens", str(config.rollout.max_new_tokens)),
            *("--data.max_len", str(config.rollout.max_total_tokens)),
        ]
    )
    generator = TreeSamplesGenerator(
        NS(args=args),
        PromptList(pool, labels),
        None,
        run.tokenizer,
        [],
        config=TreeTrainConfig(retriever=str(tmp_path / "index"), env=config.task.env),
        backend=TransformersBackend(WARM_START, run.tokenizer, seed=config.seed),
    )
    generator.run_tree_step(pool, labels)
    ours = generator.last_step
    assert ours is not None

    assert [t.prompt_id for t in ours.trees] == [t.prompt_id for t in cpu_result.trees] == pool
    assert sum(t.n_leaves for t in cpu_result.trees) == 8  # the budget was spent: a real step
    for a, b in zip(cpu_result.trees, ours.trees, strict=True):
        assert _nodes(a) == _nodes(b)
    assert ours.train_indices == cpu_result.train_indices
    assert len(ours.waves) == len(cpu_result.waves)
    assert generator.last_metrics["rollout/n_train_leaves"] == record["policy/n_train_leaves"]
    histories = [t.history(n.node_id) for t in ours.trees for n in t.nodes]
    np.testing.assert_allclose(
        generator.tree_step.predictor.predict(histories),
        run.tree_step.predictor.predict(histories),
    )
