"""Env snapshots: immutable, JSON-serialisable values that restore an episode exactly.

A snapshot holds the env's configuration (to refuse a restore into a differently configured
env), the episode's task, every turn with the retrieval hits it saw (so a restored or forked
episode replays cached queries exactly, even if the retriever has changed since), and the
state of the env's random generator. Counters such as the turn index and the tool-call count
are derived from the turns, so a snapshot cannot contradict itself.

`WrapperSnapshot` nests one around the inner snapshot for each `ForkableWrapper` in a chain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from envs.errors import SnapshotError
from envs.protocol import ActionKind
from retrieval.base import Hit

__all__ = [
    "SCHEMA_VERSION",
    "AnySnapshot",
    "EnvSnapshot",
    "TurnRecord",
    "WrapperSnapshot",
    "snapshot_from_json",
]

SCHEMA_VERSION = 1
"""Bumped whenever the snapshot format or the env's replay semantics change."""

_KINDS: tuple[ActionKind, ...] = ("search", "answer", "invalid")


def _require(record: dict[str, Any], key: str, kind: str) -> Any:
    try:
        return record[key]
    except (KeyError, TypeError):
        raise SnapshotError(f"{kind} JSON has no field {key!r}", field=key) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnRecord:
    """One past turn: what was asked, and what the retriever answered.

    Attributes:
        kind: "search", "answer" or "invalid".
        content: the query, the answer, or (for an invalid action) the reason it was invalid.
        hits: the hits shown for a search (empty otherwise).
    """

    kind: ActionKind
    content: str
    hits: tuple[Hit, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "kind": self.kind,
            "content": self.content,
            "hits": [h.to_json() for h in self.hits],
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> TurnRecord:
        """Inverse of `to_json`.

        Raises:
            SnapshotError: a field is missing or malformed.
        """
        kind = _require(record, "kind", "turn")
        if kind not in _KINDS:
            raise SnapshotError(f"turn kind {kind!r} is not one of {_KINDS}", field="turns")
        try:
            hits = tuple(Hit.from_json(h) for h in _require(record, "hits", "turn"))
        except (KeyError, TypeError, ValueError) as err:
            raise SnapshotError(f"malformed hit in a turn: {err!r}", field="turns") from err
        return cls(kind=kind, content=str(_require(record, "content", "turn")), hits=hits)


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvSnapshot:
    """The whole mutable state of a `SearchQAEnv`, as an immutable value.

    Attributes:
        schema_version: `SCHEMA_VERSION` of the code that wrote it.
        env: the env class name.
        max_turns, top_k, reward, f1_threshold, max_doc_chars: the env's configuration.
        prompt_sha256: hash of the prompt template.
        task_id: the episode's task, or None before the first `reset`.
        index_id: the retriever's index id when the episode started.
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
    task_id: str | None
    index_id: str
    turns: tuple[TurnRecord, ...] = ()
    rng_state: str | None = None

    @property
    def turn_idx(self) -> int:
        """How many actions the episode has taken."""
        return len(self.turns)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (`json.dumps` it to store or send)."""
        return {
            "kind": "env",
            "schema_version": self.schema_version,
            "env": self.env,
            "max_turns": self.max_turns,
            "top_k": self.top_k,
            "reward": self.reward,
            "f1_threshold": self.f1_threshold,
            "max_doc_chars": self.max_doc_chars,
            "prompt_sha256": self.prompt_sha256,
            "task_id": self.task_id,
            "index_id": self.index_id,
            "turns": [t.to_json() for t in self.turns],
            "rng_state": self.rng_state,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> EnvSnapshot:
        """Inverse of `to_json`.

        Raises:
            SnapshotError: the record is from another schema version, or malformed; the error's
                `field` names the offending field.
        """
        version = _require(record, "schema_version", "snapshot")
        if version != SCHEMA_VERSION:
            raise SnapshotError(
                f"snapshot schema_version {version!r} is not {SCHEMA_VERSION}, the one this "
                "version of trace-rl reads; re-create the snapshot with this version",
                field="schema_version",
            )
        turns = _require(record, "turns", "snapshot")
        if not isinstance(turns, list):
            raise SnapshotError("snapshot field 'turns' is not a list", field="turns")
        try:
            return cls(
                schema_version=version,
                env=str(_require(record, "env", "snapshot")),
                max_turns=int(_require(record, "max_turns", "snapshot")),
                top_k=int(_require(record, "top_k", "snapshot")),
                reward=str(_require(record, "reward", "snapshot")),
                f1_threshold=float(_require(record, "f1_threshold", "snapshot")),
                max_doc_chars=int(_require(record, "max_doc_chars", "snapshot")),
                prompt_sha256=str(_require(record, "prompt_sha256", "snapshot")),
                task_id=_optional_str(_require(record, "task_id", "snapshot")),
                index_id=str(_require(record, "index_id", "snapshot")),
                turns=tuple(TurnRecord.from_json(t) for t in turns),
                rng_state=_optional_str(_require(record, "rng_state", "snapshot")),
            )
        except (TypeError, ValueError) as err:
            if isinstance(err, SnapshotError):
                raise
            raise SnapshotError(f"malformed snapshot: {err}", field="snapshot") from err

    def to_json_str(self) -> str:
        """The snapshot as one compact JSON string."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


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

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "kind": "wrapper",
            "schema_version": self.schema_version,
            "wrapper": self.wrapper,
            "state": json.loads(self.state),
            "inner": self.inner.to_json(),
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> WrapperSnapshot:
        """Inverse of `to_json`.

        Raises:
            SnapshotError: wrong schema version or a malformed record.
        """
        version = _require(record, "schema_version", "wrapper snapshot")
        if version != SCHEMA_VERSION:
            raise SnapshotError(
                f"wrapper snapshot schema_version {version!r} is not {SCHEMA_VERSION}",
                field="schema_version",
            )
        return cls(
            schema_version=version,
            wrapper=str(_require(record, "wrapper", "wrapper snapshot")),
            state=json.dumps(_require(record, "state", "wrapper snapshot"), sort_keys=True),
            inner=snapshot_from_json(_require(record, "inner", "wrapper snapshot")),
        )


AnySnapshot = EnvSnapshot | WrapperSnapshot


def snapshot_from_json(record: dict[str, Any]) -> AnySnapshot:
    """Read either kind of snapshot from its `to_json` form.

    Raises:
        SnapshotError: the record is not a snapshot of a known kind, or is malformed.
    """
    kind = _require(record, "kind", "snapshot")
    if kind == "env":
        return EnvSnapshot.from_json(record)
    if kind == "wrapper":
        return WrapperSnapshot.from_json(record)
    raise SnapshotError(
        f"unknown snapshot kind {kind!r} (expected 'env' or 'wrapper')", field="kind"
    )
