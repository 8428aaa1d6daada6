"""The Search-R1 text protocol: the prompt, action parsing, and observation formatting.

A policy reasons in `<think>…</think>`, searches with `<search>query</search>` and answers with
`<answer>…</answer>` (docs/design.md §2). An action is the text up to and including the first
`</search>` or `</answer>`, whichever comes first; everything after it is ignored, as a harness
stops generation there anyway. The environment answers a search with

    \\n<information>Doc 1(Title: T) text\\nDoc 2(Title: T2) text</information>\\n

Parsing is linear in the input (`str.find`/`str.rfind`, no backtracking regex), so a 1 MB action
costs a few milliseconds and can never raise.

`Protocol` names the two dialects. `"trace-rl"` (the default) is the one above. `"search-r1"`
reproduces Search-R1's rollout loop byte for byte, for evaluating its checkpoints: a search
is answered with `\\n\\n<information>Doc 1(Title: "T") text\\nDoc 2(…)</information>\\n\\n`, the
title is the first line of the document's `contents` as it is (quotes included) and the text is
the rest, never cut; an invalid action gets Search-R1's fixed message; an action is parsed as
Search-R1 parses it (`parse_action_search_r1`); the prompt keeps every character. The
remaining differences are listed in docs/benchmarks.md, "Where we differ from Search-R1".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from retrieval.base import Hit, normalize_query

__all__ = [
    "CHARSET",
    "DEFAULT_PROMPT_TEMPLATE",
    "MAX_ACTION_CHARS",
    "MAX_CONTENT_CHARS",
    "MAX_TEXT_CHARS",
    "PROTOCOLS",
    "ActionKind",
    "ParsedAction",
    "Protocol",
    "format_information",
    "format_information_search_r1",
    "format_prompt",
    "invalid_action_message",
    "parse_action",
    "parse_action_search_r1",
    "to_charset",
]

ActionKind = str
"""What an action was: "answer", "invalid", or the name of a tool ("search", or a user's)."""
Protocol = Literal["trace-rl", "search-r1"]
PROTOCOLS: tuple[Protocol, ...] = ("trace-rl", "search-r1")

MAX_TEXT_CHARS = 1 << 16
"""`max_length` of the env's text spaces: every prompt and observation fits in it."""

MAX_ACTION_CHARS = 1 << 20
"""An action longer than this is invalid before it is parsed: a policy's turn is a few thousand
tokens, and the cap bounds a step's parsing whatever a caller sends."""

MAX_CONTENT_CHARS = 2_000
"""An answer, or a query once normalised, longer than this is an invalid action (it bounds
retrieval time and stays under every server's query limit; `ServerLimits` allows 4,096)."""

_MAX_RAW_QUERY_CHARS = MAX_TEXT_CHARS
"""A search's raw content over this is invalid before it is normalised (bounds the work)."""

# Printable ASCII plus the Latin, IPA, Greek and Cyrillic blocks, general punctuation, currency,
# letterlike symbols, arrows and maths operators: what English Wikipedia-derived QA corpora
# use. Text spaces need an explicit charset (AsyncVectorEnv's shared memory stores character
# indices), and a full-Unicode one is slow to build and large per space. Anything else is shown as
# U+FFFD, the replacement character.
_CHARSET_RANGES: tuple[tuple[int, int], ...] = (
    (0x0020, 0x007E),
    (0x00A0, 0x04FF),
    (0x1E00, 0x1EFF),
    (0x2000, 0x206F),
    (0x20A0, 0x20C0),
    (0x2100, 0x214F),
    (0x2190, 0x22FF),
)
CHARSET: str = "\t\n" + "".join(chr(c) for lo, hi in _CHARSET_RANGES for c in range(lo, hi + 1))
CHARSET += "\ufffd"
"""Every character an env may emit (prompts, observations)."""

_OUTSIDE_CHARSET = re.compile(
    "[^\\t\\n" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in _CHARSET_RANGES) + "\\ufffd]"
)


def to_charset(text: str) -> str:
    """Replace every character outside `CHARSET` by U+FFFD.

    >>> to_charset("Zürich\\r\\n北京")
    'Zürich\\ufffd\\n\\ufffd\\ufffd'
    """
    return _OUTSIDE_CHARSET.sub("\ufffd", text)


DEFAULT_PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: {question}\n"
)
"""Search-R1's instruction prompt (`make_prefix`, instruct variant), with `{question}`."""


def format_prompt(template: str, question: str, *, exact: bool = False) -> str:
    """Fill a prompt template as Search-R1 does: strip the question, end it with "?".

    The placeholder is replaced literally (not `str.format`), so templates may hold braces.
    Characters outside `CHARSET` become U+FFFD unless `exact` (the search-r1 protocol).

    >>> format_prompt("Q: {question}", " Who founded Acme ")
    'Q: Who founded Acme?'
    >>> format_prompt("Q: {question}", "北京", exact=True)
    'Q: 北京?'
    """
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    prompt = template.replace("{question}", question)
    return prompt if exact else to_charset(prompt)


_PROTOCOL_TAGS = ("<information>", "</information>", "<think>", "</think>")


def _closers(tools: Sequence[str]) -> tuple[tuple[str, ActionKind], ...]:
    """Each action's closing tag and kind: the tools', then the answer's."""
    return tuple((f"</{kind}>", kind) for kind in (*tools, "answer"))


@dataclass(frozen=True, slots=True)
class ParsedAction:
    """What an action text asks for.

    Attributes:
        kind: "search", "answer", or "invalid".
        content: the stripped query or answer ("" when invalid).
        reason: why the action is invalid ("" when valid).
        end: the index just past the closing tag in the input (the input's length when no
            closing tag was found): the part of the text that the action consumed.
        query: for a search, `normalize_query(content)`: what the retriever is sent and the
            key of the episode's result cache ("" otherwise).
    """

    kind: ActionKind
    content: str
    reason: str
    end: int
    query: str = ""


def parse_action(text: str, tools: Sequence[str] = ("search",)) -> ParsedAction:
    """Parse an action up to its first `</search>` or `</answer>` (or other tool's closing tag).

    The content is the text between the closing tag and the last matching opening tag before
    it. An action is invalid when it has no closing tag, no matching opening tag, an empty
    content, a content holding another protocol tag, an answer (or a call of a tool other than
    search) over `MAX_CONTENT_CHARS`, or a search whose query is over `MAX_CONTENT_CHARS` or
    empty once normalised (the query is normalised here, once, before its length is checked:
    the one rule for every retriever). `tools` names the env's tools (their tags).

    >>> parse_action("<think>hm</think> <search> Acme  Founder </search> junk")
    ParsedAction(kind='search', content='Acme  Founder', reason='', end=50, query='acme founder')
    >>> parse_action("<answer> Paris </answer><search>x</search>").content
    'Paris'
    >>> parse_action("I think it is Paris.").reason
    'no </search> or </answer> closing tag'
    """
    if (too_long := _too_long(text)) is not None:
        return too_long
    closers = _closers(tools)
    best_at, best_tag, best_kind = -1, "", "invalid"
    for tag, kind in closers:
        at = text.find(tag)
        if at != -1 and (best_at == -1 or at < best_at):
            best_at, best_tag, best_kind = at, tag, kind
    if best_at == -1:
        names = [tag for tag, _ in closers]
        reason = f"no {', '.join(names[:-1])} or {names[-1]} closing tag"
        return ParsedAction("invalid", "", reason, len(text))
    end = best_at + len(best_tag)
    opener = "<" + best_tag[2:]
    start = text.rfind(opener, 0, best_at)
    if start == -1:
        return ParsedAction("invalid", "", f"{best_tag} without an opening {opener}", end)
    content = text[start + len(opener) : best_at].strip()
    if not content:
        return ParsedAction("invalid", "", f"empty {best_kind}", end)
    if best_kind != "search" and len(content) > MAX_CONTENT_CHARS:
        reason = f"{best_kind} of {len(content)} characters (at most {MAX_CONTENT_CHARS})"
        return ParsedAction("invalid", "", reason, end)
    for closer, _ in closers:
        for tag in (closer.replace("/", "", 1), closer):
            if tag in content:
                return ParsedAction("invalid", "", f"{best_kind} contains the tag {tag}", end)
    for tag in _PROTOCOL_TAGS:
        if tag in content:
            return ParsedAction("invalid", "", f"{best_kind} contains the tag {tag}", end)
    if best_kind != "search":
        return ParsedAction(best_kind, content, "", end)
    return _bounded_search(content, end, allow_empty=False)


def _bounded_search(content: str, end: int, *, allow_empty: bool) -> ParsedAction:
    """A search with its query normalised once, then bounded: the one rule of both parsers.

    The bound applies to the normalised query, the text every retriever (local or remote) is
    sent, so a search that one retriever answers is never refused by another.
    """
    if len(content) > _MAX_RAW_QUERY_CHARS:  # bounds the normalisation's own work
        reason = f"search of {len(content)} characters (at most {MAX_CONTENT_CHARS} normalised)"
        return ParsedAction("invalid", "", reason, end)
    query = normalize_query(content)
    if not query and not allow_empty:
        return ParsedAction("invalid", "", "empty search once normalised", end)
    if len(query) > MAX_CONTENT_CHARS:
        reason = f"search of {len(query)} characters once normalised (at most {MAX_CONTENT_CHARS})"
        return ParsedAction("invalid", "", reason, end)
    return ParsedAction("search", content, "", end, query)


def invalid_action_message(reason: str | None, tools: Sequence[str] = ("search",)) -> str:
    """The observation that answers an invalid action: Search-R1's wording, plus the reason.

    A `reason` of None gives Search-R1's message exactly (the search-r1 protocol). Tools
    other than search each add a sentence naming their tags.

    >>> invalid_action_message("empty search")[:40]
    '\\nMy previous action is invalid (empty se'
    >>> invalid_action_message(None)[:33]
    '\\nMy previous action is invalid. I'
    """
    why = "" if reason is None else f" ({reason})"
    return (
        f"\nMy previous action is invalid{why}. If I want to search, I should put the "
        "query between <search> and </search>. If I want to give the final answer, I should "
        "put the answer between <answer> and </answer>."
        + "".join(
            f" To use {tool}, I should put its input between <{tool}> and </{tool}>."
            for tool in tools
            if tool != "search"
        )
        + " Let me try again.\n"
    )


def format_information(hits: Sequence[Hit], *, max_doc_chars: int) -> str:
    """Format search hits as the observation of a search turn.

    Each document's text is cut to `max_doc_chars` characters (with "…" when cut). No hits
    give an explicit "no results" line, never an empty observation.

    >>> h = Hit(doc_id="d1", title="Paris", text="Paris is in France.", score=1.0)
    >>> format_information([h], max_doc_chars=100)
    '\\n<information>Doc 1(Title: Paris) Paris is in France.</information>\\n'
    """
    if not hits:
        return "\n<information>No results.</information>\n"
    lines = []
    for i, hit in enumerate(hits, start=1):
        text = hit.text if len(hit.text) <= max_doc_chars else hit.text[:max_doc_chars] + "…"
        lines.append(f"Doc {i}(Title: {hit.title}) {text}")
    return to_charset("\n<information>" + "\n".join(lines) + "</information>\n")


def _too_long(text: str) -> ParsedAction | None:
    """The invalid action for a text over `MAX_ACTION_CHARS`, checked before any parsing."""
    if len(text) <= MAX_ACTION_CHARS:
        return None
    reason = f"action of {len(text)} characters (at most {MAX_ACTION_CHARS})"
    return ParsedAction("invalid", "", reason, len(text))


def parse_action_search_r1(text: str) -> ParsedAction:
    """Parse an action exactly as Search-R1's rollout loop does.

    The text is cut after its first `</search>` if it has one, else after its first
    `</answer>`; the action is then the leftmost `<search>…</search>` or `<answer>…</answer>`
    pair of the cut text, its content stripped. Unlike `parse_action`, an empty content and a
    content holding other tags are valid. A search's query is normalised and bounded by the
    same rule as `parse_action`'s (a query over `MAX_CONTENT_CHARS` once normalised is
    invalid), so no retriever can refuse it; an answer has no length limit. An action over
    `MAX_ACTION_CHARS` is invalid unparsed.

    Search-R1 takes the pair with `re.search(r"<(search|answer)>(.*?)</\1>")`, whose lazy scan
    restarts at every opening tag: quadratic in a text of many openers and no closer
    (benchmarks/RESULTS.md, "Index files that cannot lie, a server one client cannot starve"). The
    same leftmost pair is found here with four `str.find`s: the first `<tag>` of each kind either
    has a `</tag>` after it, and is that kind's leftmost match, or no later `<tag>` has one either;
    the earlier of the two kinds' matches wins.

    >>> parse_action_search_r1("<answer> x </answer> then <search> q </search>").content
    'x'
    >>> parse_action_search_r1("<search></search>")
    ParsedAction(kind='search', content='', reason='', end=17, query='')
    >>> parse_action_search_r1("no tags").kind
    'invalid'
    """
    if (too_long := _too_long(text)) is not None:
        return too_long
    end = len(text)
    for closer in ("</search>", "</answer>"):
        at = text.find(closer)
        if at != -1:
            end = at + len(closer)
            break
    best: tuple[int, str, str] | None = None  # (opener position, kind, content)
    for kind in ("search", "answer"):
        opener, closer = f"<{kind}>", f"</{kind}>"
        start = text.find(opener, 0, end)
        if start == -1:
            continue
        stop = text.find(closer, start + len(opener), end)
        if stop != -1 and (best is None or start < best[0]):
            best = (start, kind, text[start + len(opener) : stop])
    if best is None:
        return ParsedAction("invalid", "", "no <search>…</search> or <answer>…</answer>", end)
    _, kind, content = best
    if kind == "search":
        return _bounded_search(content.strip(), end, allow_empty=True)
    return ParsedAction("answer", content.strip(), "", end)


def format_information_search_r1(hits: Sequence[Hit]) -> str:
    """Format search hits exactly as Search-R1 shows them to its policy.

    Each document is `Doc i(Title: <first line of contents>) <the other lines>` followed by a
    newline; the whole list is stripped and wrapped in `\\n\\n<information>…</information>\\n\\n`.
    The title keeps wiki-18's double quotes and nothing is cut. No hits give an empty
    `<information></information>`, as Search-R1 does for an empty result list.

    >>> h = Hit(doc_id="0", title="Paris", text="Paris is in France.", score=1.0)
    >>> format_information_search_r1([h])
    '\\n\\n<information>Doc 1(Title: "Paris") Paris is in France.</information>\\n\\n'
    """
    lines = []
    for i, hit in enumerate(hits, start=1):
        title, _, text = hit.contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return f"\n\n<information>{''.join(lines).strip()}</information>\n\n"
