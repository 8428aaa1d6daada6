"""The search-r1 protocol reproduces Search-R1's rollout text byte for byte.

The expected transcripts are written by hand from Search-R1's format rules (its rollout loop in
`search_r1/llm_agent/generation.py` and its prompt in
`Search-R1/scripts/data_process/nq_search.py`):

- prompt: the instruction text, then `Question: {question}\\n`, the question stripped and ended
  with "?";
- a search is answered with `\\n\\n<information>` + the documents + `</information>\\n\\n`, each
  document `Doc i(Title: <first line of contents>) <rest of contents>\\n`, the list stripped;
- an invalid action is answered with a fixed message that names no reason;
- an action is cut at its first `</search>`, else its first `</answer>`, and the leftmost
  `<search>…</search>` / `<answer>…</answer>` pair is the action (empty contents allowed).
"""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from envs import QATask, SearchQAEnv, TaskSet
from envs.errors import EnvConfigError
from envs.protocol import MAX_ACTION_CHARS, parse_action, parse_action_search_r1
from retrieval import BM25Retriever, read_corpus

PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: who founded the Zürich firm Acme Ltd?\n"
)
INVALID = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)
LONG = "Acme Ltd " + "was a firm in Zürich. " * 150  # 3,000+ characters: never cut

# wiki-18 lines: `contents` is the quoted title, a newline, then the text (which may itself
# hold newlines)
CORPUS = [
    {"id": "0", "contents": '"Acme Ltd"\nAcme Ltd was founded by Ann Vole in Zürich.\nIt makes'},
    {"id": "1", "contents": '"Ann Vole"\nAnn Vole (born 1901) was a Swiss engineer.'},
    {"id": "2", "contents": f'"Acme (disambiguation)"\n{LONG}'},
    {"id": "3", "contents": '"Bob"\nBob is a builder.'},
]


@pytest.fixture
def env(tmp_path: Path) -> SearchQAEnv:
    path = tmp_path / "wiki18.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in CORPUS), encoding="utf-8")
    question = "  who founded the Zürich firm Acme Ltd "
    task = QATask(task_id="q", question=question, golden_answers=("Ann Vole",))
    return SearchQAEnv(
        TaskSet([task]), BM25Retriever.build(read_corpus(path)), max_turns=5, protocol="search-r1"
    )


def test_a_whole_transcript_matches_search_r1_byte_for_byte(env: SearchQAEnv) -> None:
    prompt, _ = env.reset(seed=0, options={"task_id": "q"})
    assert prompt == PROMPT  # "ü" kept: no charset mapping
    actions = [
        "<think> I need the founder. </think>\n<search> Acme Ltd founded Ann Vole </search>",
        "I am not sure.",
        "<think> It was Ann Vole. </think>\n<answer> Ann Vole </answer>",
    ]
    transcript = prompt
    for action in actions:
        observation, reward, terminated, _, _ = env.step(action)
        transcript += action + observation
    hits = env.history[0].hits
    docs = {h.doc_id: h for h in hits}
    assert set(docs) == {"0", "2", "1"} and len(hits) == 3
    rendered = {
        "0": 'Doc {i}(Title: "Acme Ltd") Acme Ltd was founded by Ann Vole in Zürich.\nIt makes\n',
        "1": 'Doc {i}(Title: "Ann Vole") Ann Vole (born 1901) was a Swiss engineer.\n',
        "2": f'Doc {{i}}(Title: "Acme (disambiguation)") {LONG}\n',
    }
    documents = "".join(rendered[h.doc_id].format(i=i) for i, h in enumerate(hits, start=1))
    expected = (
        PROMPT
        + actions[0]
        + "\n\n<information>"
        + documents.strip()
        + "</information>\n\n"
        + actions[1]
        + INVALID
        + actions[2]
    )
    assert transcript == expected
    assert LONG.strip() in transcript  # never cut at max_doc_chars
    assert (reward, terminated) == (1.0, True)


def test_search_r1_parsing_rules() -> None:
    # </search> anywhere wins the cut, then the leftmost pair is the action
    assert parse_action_search_r1("<answer> a </answer><search> q </search>").kind == "answer"
    parsed = parse_action_search_r1("<search> a <answer>b</answer> </search>")
    assert (parsed.kind, parsed.content) == ("search", "a <answer>b</answer>")
    assert parse_action_search_r1("<search> x <search> y </search>").content == "x <search> y"
    assert parse_action_search_r1("<answer></answer>").kind == "answer"
    assert parse_action_search_r1("<search>never closed").kind == "invalid"


def test_empty_search_is_valid_and_shows_an_empty_information_block(env: SearchQAEnv) -> None:
    env.reset(seed=0, options={"task_id": "q"})
    observation, _, _, _, info = env.step("<search>  </search>")
    assert observation == "\n\n<information></information>\n\n"
    assert info["valid_action"] and info["n_tool_calls"] == 1


def test_the_default_protocol_is_unchanged_and_unknown_ones_are_refused(env: SearchQAEnv) -> None:
    ours = SearchQAEnv(env.tasks, env.retriever, max_doc_chars=50)
    ours.reset(seed=0, options={"task_id": "q"})
    observation, *_ = ours.step("<search> Acme Ltd founded </search>")
    assert observation.startswith("\n<information>Doc 1(Title: Acme Ltd) ")
    with pytest.raises(EnvConfigError, match="protocol"):
        SearchQAEnv(env.tasks, env.retriever, protocol="search_r1")  # type: ignore[arg-type]


_SEARCH_R1_PAIR = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def _search_r1_reference(text: str) -> tuple[str, str] | None:
    """Search-R1's own rule: cut at the first closer, then its regex's leftmost pair."""
    end = len(text)
    for closer in ("</search>", "</answer>"):
        if (at := text.find(closer)) != -1:
            end = at + len(closer)
            break
    match = _SEARCH_R1_PAIR.search(text, 0, end)
    return None if match is None else (match.group(1), match.group(2).strip())


def test_the_linear_parser_picks_the_pair_search_r1_s_regex_picks() -> None:
    rng = random.Random(7)
    pieces = ["<search>", "</search>", "<answer>", "</answer>", "a", " q ", "<", ">", "\n"]
    for _ in range(3_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        parsed = parse_action_search_r1(text)
        want = _search_r1_reference(text)
        got = None if parsed.kind == "invalid" else (parsed.kind, parsed.content)
        assert got == want, text


def test_parsing_time_grows_linearly_with_the_action() -> None:
    # many openers and no closer: Search-R1's regex rescans from every opener (quadratic)
    def seconds(n_chars: int) -> float:
        text = "<search>" * (n_chars // 8)
        start = time.process_time()
        parse_action_search_r1(text)
        parse_action_search_r1(text + "</answer>")
        return time.process_time() - start

    seconds(1_000)  # warm
    small, large = seconds(16_384), seconds(131_072)
    # 8x the text: a linear parser takes ~8x (a quadratic one ~64x); the floor keeps timer
    # granularity on a busy box from deciding, and a 128 KB action stays far under 0.05 s
    assert large <= 0.05 and large <= 16 * max(small, 1e-3)


def test_an_action_over_the_cap_is_invalid_before_parsing() -> None:
    text = "<answer>x</answer>" + " " * MAX_ACTION_CHARS
    for parse in (parse_action, parse_action_search_r1):
        parsed = parse(text)
        assert parsed.kind == "invalid" and f"at most {MAX_ACTION_CHARS}" in parsed.reason
