from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from envs.protocol import (
    CHARSET,
    MAX_CONTENT_CHARS,
    format_information,
    format_prompt,
    parse_action,
    to_charset,
)
from retrieval.base import Hit

TAGS = ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>"]


def test_parse_stops_at_the_first_closing_tag_whichever_it_is():
    assert parse_action("<search> a </search><answer> b </answer>").kind == "search"
    parsed = parse_action("<answer> b </answer><search> a </search>")
    assert (parsed.kind, parsed.content) == ("answer", "b")
    assert parsed.end == len("<answer> b </answer>")


def test_parse_takes_the_innermost_opening_tag():
    assert parse_action("<search> x <search> y </search>").content == "y"
    assert parse_action("<answer> no <search> q </search>").content == "q"


def test_parse_ignores_thinking_and_trailing_text():
    parsed = parse_action(
        "<think> I should look up Acme </think>\n<search>Acme founder</search> more"
    )
    assert (parsed.kind, parsed.content) == ("search", "Acme founder")


def test_invalid_actions_say_why():
    cases = {
        "just text": "no </search> or </answer> closing tag",
        "query </search>": "</search> without an opening <search>",
        "<search>   </search>": "empty search",
        "<answer></answer>": "empty answer",
        "<search> a <answer> b </search>": "search contains the tag <answer>",
        "<search>unterminated": "no </search> or </answer> closing tag",
    }
    for text, reason in cases.items():
        parsed = parse_action(text)
        assert parsed.kind == "invalid", text
        assert parsed.reason == reason
        assert parsed.content == ""


def test_overlong_content_is_invalid():
    parsed = parse_action("<search>" + "a" * (MAX_CONTENT_CHARS + 1) + "</search>")
    assert parsed.kind == "invalid" and "at most" in parsed.reason
    assert parse_action("<search>" + "a" * MAX_CONTENT_CHARS + "</search>").kind == "search"


def test_tags_are_case_sensitive_like_search_r1():
    assert parse_action("<SEARCH> x </SEARCH>").kind == "invalid"


@given(st.text())
def test_parser_never_raises_on_any_text(text):
    parsed = parse_action(text)
    assert parsed.kind in ("search", "answer", "invalid")
    assert 0 <= parsed.end <= len(text)
    assert (parsed.kind == "invalid") == (parsed.content == "")


@given(st.lists(st.sampled_from([*TAGS, " x ", "y", "\n", "</", "<"]), max_size=30))
def test_parser_never_raises_on_tag_soup(parts):
    text = "".join(parts)
    parsed = parse_action(text)
    if parsed.kind != "invalid":
        assert parsed.content == parsed.content.strip() and parsed.content
        assert parsed.content in text[: parsed.end]


def test_megabyte_actions_parse():
    junk = "<search" * (1 << 20 // 7)
    assert parse_action(junk).kind == "invalid"
    nested = "<answer>" * 100_000 + "x" + "</answer>"
    assert parse_action(nested).content == "x"
    long_query = "<search>" + "word " * 200_000 + "</search>"
    assert parse_action(long_query).kind == "invalid"


def test_information_format_is_search_r1_style_and_cut_to_max_doc_chars():
    hits = [
        Hit(doc_id="a", title="A", text="alpha text", score=2.0),
        Hit(doc_id="b", title="B", text="b" * 50, score=1.0),
    ]
    obs = format_information(hits, max_doc_chars=10)
    assert (
        obs
        == "\n<information>Doc 1(Title: A) alpha text\nDoc 2(Title: B) "
        + "b" * 10
        + "…</information>\n"
    )
    assert format_information([], max_doc_chars=10) == "\n<information>No results.</information>\n"


def test_emitted_text_stays_in_the_charset():
    hits = [Hit(doc_id="a", title="東京", text="emoji 🙂 and\r\x00 control", score=1.0)]
    obs = format_information(hits, max_doc_chars=100)
    assert set(obs) <= set(CHARSET)
    assert "\ufffd" in obs
    assert set(format_prompt("Q: {question}", "Zürich 北京")) <= set(CHARSET)
    assert to_charset("plain ascii\n") == "plain ascii\n"


def test_prompt_appends_a_question_mark_and_keeps_braces():
    assert format_prompt("{x} {question}", " Who ") == "{x} Who?"
