"""An engine that stops answering ends the step with `EngineTimeoutError` in bounded time, with
vLLM sleep mode on (both launch scripts use it): the step's clean-up must not send `sleep` to the
hung engine and wait for it forever (OpenRLHF's `batch_vllm_engine_call` has no timeout)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from openrlhf_fakes import HungEngine

from envs import QATask
from harness.errors import EngineTimeoutError
from harness.openrlhf.config import TreeTrainConfig
from harness.openrlhf.launcher import parse_openrlhf_args
from harness.openrlhf.rehearsal import PromptList
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever

pytestmark = pytest.mark.slow  # a local Ray

WARM_START = Path(__file__).resolve().parents[3] / "harness" / "tiny_policy" / "warm_start"
TIMEOUT_S = 1.0


@pytest.mark.timeout(120)  # before the fix, the clean-up waited on the hung engine forever
def test_a_hung_engine_ends_the_step_with_a_typed_error_in_bounded_time(ray_local, tmp_path):
    from transformers import AutoTokenizer

    from harness.openrlhf.samples import TreeSamplesGenerator

    engine = ray_local.remote(HungEngine).options(num_cpus=0).remote()
    assert ray_local.get(engine.seen.remote()) == []  # started, before the clock runs
    BM25Retriever.build([Document(doc_id="d", title="Ann", text="Ann was born in Lyon.")]).save(
        tmp_path / "index"
    )
    task = QATask(task_id="ann", question="Where was Ann born?", golden_answers=("Lyon",))
    args = parse_openrlhf_args(
        [
            *("--actor.model_name_or_path", str(WARM_START), "--data.prompt_dataset", "p.jsonl"),
            *("--vllm.num_engines", "1", "--rollout.max_new_tokens", "16"),
            *("--rollout.batch_size", "1", "--rollout.n_samples_per_prompt", "2"),
            *("--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1"),
            *("--train.colocate_all", "--vllm.enable_sleep"),  # sleep needs colocation
        ]
    )
    config = TreeTrainConfig(retriever=str(tmp_path / "index"), engine_timeout_s=TIMEOUT_S)
    generator = TreeSamplesGenerator(
        NS(args=args),
        PromptList([task.question], [json.dumps(task.to_json())]),
        None,
        AutoTokenizer.from_pretrained(WARM_START),
        [engine],
        config=config,
    )
    start = time.perf_counter()
    assert generator.args.vllm.enable_sleep
    with pytest.raises(EngineTimeoutError, match="did not finish within"):
        generator.generate_samples()
    elapsed = time.perf_counter() - start
    print(f"hung engine: EngineTimeoutError after {elapsed:.2f} s (timeout {TIMEOUT_S} s)")
    calls = ray_local.get(engine.seen.remote())
    assert calls[0] == "wake_up"
    assert "sleep" not in calls  # never sent to the hung engine
    ray_local.kill(engine)
