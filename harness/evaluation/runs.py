"""Resumable benchmark runs: episodes streamed to disk as they finish, and read back.

A `tracerl bench` run writes into its output folder, before the first episode:

- `run.json`: `{"schema_version", "created_at", "config"}`, the settings that fix the results
  (every flag except `--resume`, `--progress` and `--json`), so `--resume` can refuse a folder
  written by another command;

and while it runs, `trajectories.jsonl`: one line per finished episode, appended and flushed as
each one ends. A run killed at any point leaves every finished episode on disk (a line cut by
the kill is ignored). `--resume` reads them back, plays only the questions without one, and
writes the report of the whole run: the same report as a run that was never stopped, because
records are sorted back into task order and the creation time is the first start's.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envs.qa_datasets import BenchmarkError
from harness.rollout.evaluation import EpisodeRecord

__all__ = [
    "RUN_NAME",
    "EpisodeStream",
    "RunState",
    "check_fresh_out",
    "read_finished",
    "write_atomic",
]

log = logging.getLogger(__name__)

RUN_NAME = "run.json"
_SCHEMA_VERSION = 1
VOLATILE = ("resume", "progress", "json", "overwrite")
"""Flags that change how a run shows itself, never its results."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState:
    """What a resumed run must agree with: the first start's time and settings."""

    created_at: str
    config: dict[str, Any]

    def write(self, directory: Path) -> None:
        """Write `run.json` into `directory` (created if needed)."""
        directory.mkdir(parents=True, exist_ok=True)
        payload = {
            "schema_version": _SCHEMA_VERSION,
            "created_at": self.created_at,
            "config": self.config,
        }
        write_atomic(directory / RUN_NAME, json.dumps(payload, indent=2) + "\n")

    @classmethod
    def read(cls, directory: Path) -> RunState:
        """Read `run.json`.

        Raises:
            BenchmarkError: there is none, or it is not one.
        """
        path = directory / RUN_NAME
        try:
            payload = json.loads(path.read_text("utf-8"))
            return cls(created_at=str(payload["created_at"]), config=dict(payload["config"]))
        except FileNotFoundError as err:
            raise BenchmarkError(
                f"--resume: {directory} holds no run to resume (no {RUN_NAME}); drop --resume"
            ) from err
        except (ValueError, KeyError, TypeError) as err:
            raise BenchmarkError(f"--resume: {path} is not a run file ({err})") from err

    def check_same(self, config: Mapping[str, Any], directory: Path) -> None:
        """Refuse to resume a run written with other settings.

        Raises:
            BenchmarkError: names the flags that differ.
        """
        keys = sorted(set(self.config) | set(config))
        differ = [k for k in keys if self.config.get(k) != config.get(k)]
        if differ:
            flags = ", ".join("--" + k.replace("_", "-") for k in differ)
            raise BenchmarkError(
                f"--resume: {directory} was written by another command (it differs in {flags}); "
                "rerun that command with --resume, or choose another --out"
            )


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` by replacing it whole: a kill leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


RUN_FILES = (RUN_NAME, "trajectories.jsonl", "report.json")
"""Files that mark a folder as holding a run."""


def check_fresh_out(directory: Path, *, overwrite: bool) -> None:
    """Refuse to start a run in a folder that holds one, unless `overwrite` (then clear it).

    Raises:
        BenchmarkError: `directory` holds a run and `overwrite` is off (one line, with the way
            out).
    """
    held = [directory / name for name in RUN_FILES if (directory / name).exists()]
    if not held:
        return
    if not overwrite:
        raise BenchmarkError(
            f"--out {directory} already holds a run ({held[0].name}): pass --resume to finish "
            "it, --overwrite to replace it, or choose another --out"
        )
    for path in held:
        path.unlink()


def read_finished(path: Path) -> dict[str, dict[str, EpisodeRecord]]:
    """The episodes a run streamed to `trajectories.jsonl`: agent -> task id -> record.

    A last line without its newline (the run was killed while writing it) is ignored, whatever
    byte it was cut at (inside a multi-byte UTF-8 character too: the file is read as bytes and
    only whole lines are decoded); any other unreadable line is an error.

    Raises:
        BenchmarkError: a line in the middle of the file is not an episode (names the line).
    """
    finished: dict[str, dict[str, EpisodeRecord]] = defaultdict(dict)
    if not path.is_file():
        return finished
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1]:
        log.warning("%s: ignoring a last line cut short by the stop", path)
    for line_no, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
            finished[str(record["agent"])][str(record["task_id"])] = EpisodeRecord.from_json(record)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise BenchmarkError(
                f"--resume: {path}:{line_no} is not an episode ({type(err).__name__}: "
                f"{str(err)[:200]}); remove the line or rerun without --resume"
            ) from None
    return finished


MAX_TEXT_CHARS = 100_000
"""The most characters of one action or observation a trajectory line stores (a turn of 512
tokens is a few thousand); more is cut, with a note naming this cap."""


class EpisodeStream:
    """Appends each finished episode to `trajectories.jsonl` and flushes it at once.

    Args:
        path: the file.
        append: add to it (`--resume`) instead of starting it afresh.
        max_text_chars: the cap on each stored action and observation, so that a runaway
            endpoint cannot make one line (and the file) huge; the scores are not affected.
    """

    def __init__(self, path: Path, *, append: bool, max_text_chars: int = MAX_TEXT_CHARS) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if append and path.is_file():
            _drop_torn_line(path)
        self._handle: IO[str] = path.open("a" if append else "w", encoding="utf-8")
        self.max_text_chars = max_text_chars

    def write(self, agent: str, record: EpisodeRecord) -> None:
        """Append one episode (a whole line, then flush)."""
        line = {"agent": agent, **record.to_json()}
        for turn in line["turns"]:
            for key in ("action", "observation"):
                turn[key] = _capped(turn[key], self.max_text_chars)
        self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file."""
        self._handle.close()


def _capped(text: str, cap: int) -> str:
    """`text`, or its first `cap` characters and a note naming the cap."""
    if len(text) <= cap:
        return text
    return (
        f"{text[:cap]}[... {len(text) - cap:,} more characters not stored: the trajectory "
        f"cap max_text_chars={cap:,}]"
    )


def _drop_torn_line(path: Path) -> None:
    """Cut a last line that a kill left without its newline, so appends start a new line."""
    with path.open("rb+") as handle:
        data = handle.read()
        if data and not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)
