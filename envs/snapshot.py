"""Env snapshots: immutable, JSON-serialisable values that restore an episode exactly.

A snapshot holds the env's configuration (to refuse a restore into a differently configured
env), the episode's task, every turn with the retrieval hits it saw (so a restored or forked
episode replays cached queries exactly, even if the retriever has changed since), and the
state of the env's random generator. Counters such as the turn index and the tool-call count
are derived from the turns, so a snapshot cannot contradict itself.

`WrapperSnapshot` nests one around the inner snapshot for each `ForkableWrapper` in a chain.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envs.errors import SnapshotError
from envs.protocol import MAX_TEXT_CHARS, ActionKind
from retrieval.base import Hit

__all__ = [
    "MAX_WRAPPER_DEPTH",
    "SCHEMA_VERSION",
    "AnySnapshot",
    "EnvSnapshot",
    "TurnRecord",
    "WrapperSnapshot",
    "canonical_text",
    "check_hits",
    "check_snapshot_schema",
    "snapshot_from_dict",
    "snapshot_from_json",
    "task_fingerprint",
]

SCHEMA_VERSION = 1
"""Bumped whenever the snapshot format or the env's replay semantics change."""

_DEFAULT_TOOLS = ("search",)

MAX_WRAPPER_DEPTH = 64
"""The most `WrapperSnapshot`s one snapshot may nest (a real wrapper chain is a handful)."""
_MAX_ID_CHARS = 1_024  # task, index and document ids
_MAX_STRING_CHARS = MAX_TEXT_CHARS  # any other string: turn contents, hit titles and texts
_MAX_RNG_STATE_CHARS = 8_192  # PCG64 ~170 characters, MT19937 (624 32-bit words) at most ~7,400
_SHORT = reprlib.Repr()  # Python 3.11's takes no arguments
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 80, 80, 40


_SURROGATE = re.compile("[\ud800-\udfff]")


def canonical_text(text: str) -> str:
    r"""`text` as a JSON round trip gives it back: each surrogate pair joined into its character.

    JSON spells every character past U+FFFF as two escapes, a high and a low surrogate
    (`"\ud83d\udfff"`), so it cannot tell a lone high surrogate followed by a lone low one
    (two code points, which Python strings can hold) from the character they spell: `json.loads`
    gives back `"\U0001f7ff"`. The env reads every action and hit through this, so what it
    stores is already what a snapshot's JSON restores; lone surrogates stay as they are (JSON's
    escapes carry them exactly).

    >>> canonical_text("a\ud83d\udfffb") == "a\U0001f7ffb"
    True
    >>> canonical_text("\udfff\ud83d") == "\udfff\ud83d"  # low then high: no pair
    True
    """
    if _SURROGATE.search(text) is None:  # the common case: nothing to join
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def short_repr(value: Any) -> str:
    """A bounded repr for an error message: forged values can nest 5,000 deep or be huge."""
    return _SHORT.repr(value)


def check_hits(hits: Any, *, top_k: int) -> tuple[Hit, ...]:
    """The schema of one search's hits, shared by a live search and a restored snapshot.

    Raises:
        ValueError: `hits` is not a sequence of at most `top_k` `Hit`s with string ids, titles
            and texts within their size limits and a finite float score.
    """
    if isinstance(hits, str | bytes) or not isinstance(hits, Sequence):
        raise ValueError(f"hits are a {type(hits).__name__}, not a sequence of Hit")
    if len(hits) > top_k:
        raise ValueError(f"{len(hits)} hits, more than top_k={top_k}")
    for i, hit in enumerate(hits):
        if not isinstance(hit, Hit):
            raise ValueError(f"hit {i} is a {type(hit).__name__}, not a Hit")
        _check_str(hit.doc_id, f"hit {i} doc_id", _MAX_ID_CHARS)
        _check_str(hit.title, f"hit {i} title", _MAX_STRING_CHARS)
        _check_str(hit.text, f"hit {i} text", _MAX_STRING_CHARS)
        if type(hit.score) not in (float, int) or not math.isfinite(hit.score):
            raise ValueError(f"hit {i} score {hit.score!r} is not a finite number")
    return tuple(hits)


def _check_str(value: Any, name: str, max_chars: int) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name} is a {type(value).__name__}, not a str")
    if len(value) > max_chars:
        raise ValueError(f"{name} has {len(value)} characters, over the limit of {max_chars}")


def check_snapshot_schema(snap: EnvSnapshot) -> None:
    """Check every field's type and size, without reference to any env.

    What depends on the env (its configuration, its tasks, its `max_turns` and `top_k`, what
    a turn's content may be) is checked by the env's `restore`.

    Raises:
        SnapshotError: a field has the wrong type or is over its size limit; `err.field`
            names it.
    """
    checks: list[tuple[str, Any, type | tuple[type, ...]]] = [
        ("schema_version", snap.schema_version, int),
        ("env", snap.env, str),
        ("max_turns", snap.max_turns, int),
        ("top_k", snap.top_k, int),
        ("reward", snap.reward, str),
        ("f1_threshold", snap.f1_threshold, (float, int)),
        ("max_doc_chars", snap.max_doc_chars, int),
        ("prompt_sha256", snap.prompt_sha256, str),
        ("protocol", snap.protocol, str),
        ("tools", snap.tools, (tuple, list)),
        ("task_id", snap.task_id, (str, type(None))),
        ("task_sha256", snap.task_sha256, (str, type(None))),
        ("index_id", snap.index_id, str),
        ("turns", snap.turns, (tuple, list)),
        ("rng_state", snap.rng_state, (str, type(None))),
    ]
    for name, value, kind in checks:
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SnapshotError(
                f"snapshot field {name!r} is a {type(value).__name__}, which it cannot be",
                field=name,
            )
    sizes = {
        "env": (snap.env, _MAX_ID_CHARS),
        "reward": (snap.reward, _MAX_ID_CHARS),
        "prompt_sha256": (snap.prompt_sha256, _MAX_ID_CHARS),
        "protocol": (snap.protocol, _MAX_ID_CHARS),
        "task_id": (snap.task_id or "", _MAX_ID_CHARS),
        "task_sha256": (snap.task_sha256 or "", _MAX_ID_CHARS),
        "index_id": (snap.index_id, _MAX_ID_CHARS),
        "rng_state": (snap.rng_state or "", _MAX_RNG_STATE_CHARS),
    }
    for name, (value, limit) in sizes.items():
        if len(value) > limit:
            raise SnapshotError(
                f"snapshot field {name!r} has {len(value)} characters, over the limit of {limit}",
                field=name,
            )
    for i, name in enumerate(snap.tools):
        try:
            _check_str(name, f"tool {i}", _MAX_ID_CHARS)
        except ValueError as err:
            raise SnapshotError(f"snapshot field 'tools': {err}", field="tools") from None
    if not math.isfinite(snap.f1_threshold):
        raise SnapshotError(
            f"snapshot f1_threshold {snap.f1_threshold} is not finite", field="f1_threshold"
        )
    for i, turn in enumerate(snap.turns):
        try:
            if not isinstance(turn, TurnRecord):
                raise ValueError(f"is a {type(turn).__name__}, not a TurnRecord")
            _check_str(turn.kind, "its kind", _MAX_ID_CHARS)
            _check_str(turn.content, "its content", _MAX_STRING_CHARS)
            _check_str(turn.output, "its output", _MAX_STRING_CHARS)
            check_hits(turn.hits, top_k=snap.top_k)
        except ValueError as err:
            raise SnapshotError(f"snapshot turn {i} {err}", field="turns") from None


def _require(record: dict[str, Any], key: str, kind: str) -> Any:
    try:
        return record[key]
    except (KeyError, TypeError):
        raise SnapshotError(f"{kind} JSON has no field {key!r}", field=key) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """One past turn: what was asked, and what the retriever (or another tool) answered.

    Attributes:
        kind: a tool's name ("search", ...), "answer" or "invalid".
        content: the query (a tool's argument), the answer, or (for an invalid action) the
            reason it was invalid.
        hits: the hits shown for a search (empty otherwise).
        output: another tool's text result (`envs.tools.ToolResult.output`; "" otherwise, and
            then absent from the JSON, so search-only snapshots keep their form).
    """

    kind: ActionKind
    content: str
    hits: tuple[Hit, ...] = ()
    output: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        record: dict[str, Any] = {
            "kind": self.kind,
            "content": self.content,
            "hits": [h.to_json() for h in self.hits],
        }
        if self.output:
            record["output"] = self.output
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> TurnRecord:
        """Inverse of `to_json`.

        Raises:
            SnapshotError: a field is missing or malformed.
        """
        kind = _typed(record, "kind", "turn", str)
        hits = []
        for item in _typed(record, "hits", "turn", list):
            hits.append(
                Hit(
                    doc_id=_typed(item, "id", "hit", str),
                    title=_typed(item, "title", "hit", str),
                    text=_typed(item, "text", "hit", str),
                    score=_float(item, "score", "hit"),
                )
            )
        output = _typed(record, "output", "turn", str) if "output" in record else ""
        return cls(
            kind=kind,
            content=_typed(record, "content", "turn", str),
            hits=tuple(hits),
            output=output,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvSnapshot:
    """The whole mutable state of a `SearchQAEnv`, as an immutable value.

    Attributes:
        schema_version: `SCHEMA_VERSION` of the code that wrote it.
        env: the env class name.
        max_turns, top_k, reward, f1_threshold, max_doc_chars: the env's configuration.
        prompt_sha256: hash of the prompt template.
        protocol: the env's protocol ("trace-rl" or "search-r1"); absent from snapshots
            written before it existed, which were all "trace-rl".
        tools: the env's tools' names; absent from the JSON of a search-only env (and from
            snapshots written before tools existed), which reads back as ("search",).
        task_id: the episode's task, or None before the first `reset`.
        task_sha256: the task's fingerprint (`task_fingerprint`: question and gold answers),
            so a restore into an env whose task of that id differs (another world's
            `film_star_birthplace-003`) is refused; None in snapshots written before it
            existed, and before the first `reset`.
        index_id: the retriever's index id when the episode started (the corpus's, so the
            world's, fingerprint).
        turns: the episode's turns so far, oldest first.
        rng_state: JSON of the env's `np_random` bit-generator state, or None if never seeded.
    """

    schema_version: int = SCHEMA_VERSION
    env: str
    max_turns: int
    top_k: int
    reward: str
    f1_threshold: float
    max_doc_chars: int
    prompt_sha256: str
    protocol: str = "trace-rl"
    tools: tuple[str, ...] = _DEFAULT_TOOLS
    task_id: str | None
    task_sha256: str | None = None
    index_id: str
    turns: tuple[TurnRecord, ...] = ()
    rng_state: str | None = None

    @property
    def turn_idx(self) -> int:
        """How many actions the episode has taken."""
        return len(self.turns)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (`to_json` gives the text to store or send)."""
        record: dict[str, Any] = {
            "kind": "env",
            "schema_version": self.schema_version,
            "env": self.env,
            "max_turns": self.max_turns,
            "top_k": self.top_k,
            "reward": self.reward,
            "f1_threshold": self.f1_threshold,
            "max_doc_chars": self.max_doc_chars,
            "prompt_sha256": self.prompt_sha256,
            "protocol": self.protocol,
            "task_id": self.task_id,
            "task_sha256": self.task_sha256,
            "index_id": self.index_id,
            "turns": [t.to_json() for t in self.turns],
            "rng_state": self.rng_state,
        }
        if tuple(self.tools) != _DEFAULT_TOOLS:
            record["tools"] = list(self.tools)
        return record

    def to_json(self) -> str:
        """The snapshot as one compact, ASCII-only JSON text (see `_json_str`)."""
        return _json_str(self.to_dict())

    def __getattr__(self, name: str) -> Any:
        raise _removed(type(self).__name__, name)

    @classmethod
    def from_json(cls, text: str) -> EnvSnapshot:
        """Inverse of `to_json`: the snapshot in a JSON text.

        Raises:
            SnapshotError: `text` is not a str (a dict goes to `from_dict`), not JSON, or not
                an env snapshot.
        """
        return cls.from_dict(_parse_text(text, "EnvSnapshot.from_json", "EnvSnapshot.from_dict"))

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> EnvSnapshot:
        """Inverse of `to_dict`.

        Raises:
            SnapshotError: the record is not a dict (JSON text goes to `from_json`), is from
                another schema version, or malformed; the error's `field` names the field.
        """
        _require_dict(record, "EnvSnapshot.from_dict", "EnvSnapshot.from_json")
        version = _require(record, "schema_version", "snapshot")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise SnapshotError(
                f"snapshot schema_version {short_repr(version)} is not {SCHEMA_VERSION}, the one "
                "this version of trace-rl reads; re-create the snapshot with this version",
                field="schema_version",
            )
        where = "snapshot"
        snap = cls(
            schema_version=version,
            env=_typed(record, "env", where, str),
            max_turns=_typed(record, "max_turns", where, int),
            top_k=_typed(record, "top_k", where, int),
            reward=_typed(record, "reward", where, str),
            f1_threshold=_float(record, "f1_threshold", where),
            max_doc_chars=_typed(record, "max_doc_chars", where, int),
            prompt_sha256=_typed(record, "prompt_sha256", where, str),
            protocol=_typed(record, "protocol", where, str) if "protocol" in record else "trace-rl",
            tools=tuple(_typed(record, "tools", where, list))
            if "tools" in record
            else _DEFAULT_TOOLS,
            task_id=_typed(record, "task_id", where, (str, type(None))),
            task_sha256=_typed(record, "task_sha256", where, (str, type(None)))
            if "task_sha256" in record
            else None,
            index_id=_typed(record, "index_id", where, str),
            turns=tuple(TurnRecord.from_json(t) for t in _typed(record, "turns", where, list)),
            rng_state=_typed(record, "rng_state", where, (str, type(None))),
        )
        check_snapshot_schema(snap)
        return snap


_RENAMED = {"to_json_str": "to_json"}
"""Methods a snapshot no longer has, and what replaced them (no alias: docs/decisions.md,
"Actions, snapshots and forking")."""


def _removed(owner: str, name: str) -> AttributeError:
    """The error for a missing attribute, naming the replacement of a removed method.

    >>> print(_removed("EnvSnapshot", "to_json_str"))
    EnvSnapshot.to_json_str() was removed: call to_json() (the JSON text; to_dict() gives the dict)
    >>> print(_removed("EnvSnapshot", "nope"))
    'EnvSnapshot' object has no attribute 'nope'
    """
    new = _RENAMED.get(name)
    if new is None:
        return AttributeError(f"{owner!r} object has no attribute {name!r}")
    return AttributeError(
        f"{owner}.{name}() was removed: call {new}() (the JSON text; to_dict() gives the dict)"
    )


def task_fingerprint(question: str, golden_answers: Sequence[str]) -> str:
    """SHA-256 (hex, first 16 characters) of a task's question and gold answers."""
    text = json.dumps([question, list(golden_answers)], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _parse_text(text: Any, reader: str, dict_reader: str) -> Any:
    """The JSON value in `text`, which must be a str (`reader` names the caller)."""
    if not isinstance(text, str):
        raise SnapshotError(
            f"{reader} reads JSON text (a str), not a {type(text).__name__}; for the dict "
            f"`to_dict` gives, use {dict_reader}",
            field="kind",
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise SnapshotError(f"{reader}: the text is not JSON ({err})", field="kind") from None


def _require_dict(record: Any, reader: str, text_reader: str) -> None:
    if not isinstance(record, dict):
        hint = f"; for JSON text, use {text_reader}" if isinstance(record, str) else ""
        raise SnapshotError(
            f"{reader} reads the dict `to_dict` gives, not a {type(record).__name__}{hint}",
            field="kind",
        )


def _json_str(record: dict[str, Any]) -> str:
    """Compact JSON with ASCII escapes.

    Escapes keep any string writable as UTF-8, even an answer holding a lone surrogate (which
    `json.loads` reads back exactly).
    """
    return json.dumps(record, separators=(",", ":"))


_JSON_NAMES = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def _typed(record: Any, key: str, where: str, types: type | tuple[type, ...]) -> Any:
    """`record[key]`, which must be one of `types` (a JSON true/false is never a number)."""
    value = _require(record, key, where)
    if isinstance(value, bool) or not isinstance(value, types):
        got = "null" if value is None else _JSON_NAMES.get(type(value), "a list or an object")
        raise SnapshotError(f"{where} field {key!r} is {got}, which it cannot be", field=key)
    return value


def _float(record: Any, key: str, where: str) -> float:
    """`record[key]` as a float; a JSON integer too large for one is refused, not an overflow."""
    value = _typed(record, key, where, (int, float))
    try:
        return float(value)
    except OverflowError:
        raise SnapshotError(
            f"{where} field {key!r} is an integer too large for a float", field=key
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class WrapperSnapshot:
    """A `ForkableWrapper`'s own state around the snapshot of what it wraps.

    Attributes:
        wrapper: the wrapper's class name (checked on restore).
        state: the wrapper's state as a JSON string (immutable).
        inner: the snapshot of the wrapped env.
    """

    schema_version: int = SCHEMA_VERSION
    wrapper: str
    state: str
    inner: AnySnapshot

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (`to_json` gives the text)."""
        return {
            "kind": "wrapper",
            "schema_version": self.schema_version,
            "wrapper": self.wrapper,
            "state": json.loads(self.state),
            "inner": self.inner.to_dict(),
        }

    def to_json(self) -> str:
        """The snapshot as one compact, ASCII-only JSON text (see `_json_str`)."""
        return _json_str(self.to_dict())

    def __getattr__(self, name: str) -> Any:
        raise _removed(type(self).__name__, name)

    @classmethod
    def from_json(cls, text: str) -> WrapperSnapshot:
        """Inverse of `to_json`.

        Raises:
            SnapshotError: `text` is not a str (a dict goes to `from_dict`), or see `from_dict`.
        """
        return cls.from_dict(
            _parse_text(text, "WrapperSnapshot.from_json", "WrapperSnapshot.from_dict")
        )

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> WrapperSnapshot:
        """Inverse of `to_dict`.

        Raises:
            SnapshotError: not a dict, a wrong schema version or a malformed record.
        """
        _require_dict(record, "WrapperSnapshot.from_dict", "WrapperSnapshot.from_json")
        return cls._from_json(record, depth=0)

    @classmethod
    def _from_json(cls, record: dict[str, Any], *, depth: int) -> WrapperSnapshot:
        version = _require(record, "schema_version", "wrapper snapshot")
        if type(version) is not int or version != SCHEMA_VERSION:
            raise SnapshotError(
                f"wrapper snapshot schema_version {short_repr(version)} is not {SCHEMA_VERSION}",
                field="schema_version",
            )
        state = _require(record, "state", "wrapper snapshot")
        try:
            state_text = json.dumps(state, sort_keys=True)
        except (TypeError, ValueError, RecursionError) as err:
            raise SnapshotError(f"wrapper state is not JSON: {err!r}", field="state") from None
        if len(state_text) > _MAX_STRING_CHARS:
            raise SnapshotError(
                f"wrapper state of {len(state_text)} characters, over the limit of "
                f"{_MAX_STRING_CHARS}",
                field="state",
            )
        return cls(
            schema_version=version,
            wrapper=_typed(record, "wrapper", "wrapper snapshot", str),
            state=state_text,
            inner=_snapshot_from_json(_require(record, "inner", "wrapper snapshot"), depth + 1),
        )


AnySnapshot = EnvSnapshot | WrapperSnapshot


def snapshot_from_dict(record: dict[str, Any]) -> AnySnapshot:
    """Read either kind of snapshot from its `to_dict` form.

    Raises:
        SnapshotError: the record is not a dict (text goes to `snapshot_from_json`), not a
            snapshot of a known kind, is malformed, or nests more than `MAX_WRAPPER_DEPTH`
            wrapper snapshots.
    """
    _require_dict(record, "snapshot_from_dict", "snapshot_from_json")
    return _snapshot_from_json(record, 0)


def snapshot_from_json(text: str) -> AnySnapshot:
    """Read either kind of snapshot from its `to_json` text.

    Raises:
        SnapshotError: `text` is not a str (a dict goes to `snapshot_from_dict`), not JSON,
            or see `snapshot_from_dict`.
    """
    return _snapshot_from_json(_parse_text(text, "snapshot_from_json", "snapshot_from_dict"), 0)


def _snapshot_from_json(record: Any, depth: int) -> AnySnapshot:
    if depth > MAX_WRAPPER_DEPTH:
        raise SnapshotError(
            f"snapshot nests more than {MAX_WRAPPER_DEPTH} wrapper snapshots", field="inner"
        )
    kind = _require(record, "kind", "snapshot")
    if kind == "env":
        return EnvSnapshot.from_dict(record)
    if kind == "wrapper":
        return WrapperSnapshot._from_json(record, depth=depth)
    raise SnapshotError(
        f"unknown snapshot kind {short_repr(kind)} (expected 'env' or 'wrapper')", field="kind"
    )
