"""The metadata every benchmark records beside its figures, and the record it is written into."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def run_meta() -> dict[str, Any]:
    """Date, commit, CPU, Python and argv of this run."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    cpu = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "cpu": cpu,
        "n_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "argv": sys.argv,
    }


def machine_description(note: str = "") -> str:
    """The CPU, its cores, Python and the load average now, plus `note` (who else used the box)."""
    meta = run_meta()
    load = ""
    loadavg = Path("/proc/loadavg")
    if loadavg.is_file():
        load = f", load average {loadavg.read_text().split()[0]} at the start"
    text = f"{meta['cpu']}, {meta['n_cpus']} CPUs, Python {meta['python']}{load}"
    return f"{text}; {note}" if note else text


def write_record(
    path: Path,
    result: dict[str, Any],
    *,
    command: str,
    notes: list[str] | None = None,
    **fields: str,
) -> None:
    """Write `result` (a benchmark's `--json` object) as a record that RESULTS.md renders.

    The record holds the command line, the date, the machine and the commit beside the figures;
    `fields` adds the rendering's `section`, `title`, `measures` and `machine`, `notes` the prose
    a reader needs beside the figures (docs/style.md §2.8; `python -m benchmarks.records`).
    """
    meta = run_meta()
    record = {
        "schema_version": 1,
        "command": command,
        "date": meta["date"],
        "machine": machine_description(),
        "commit": meta["commit"],
        "provenance": "written by `benchmarks.records run`",
        **fields,
        "notes": notes or [],
        "result": result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# --- run keys: a cached run is reused only under the key of everything that decides it --------

ROOT = Path(__file__).resolve().parents[1]
CODE_PACKAGES = ("envs", "harness", "retrieval", "trace_alloc")
"""The packages whose code decides a training run (benchmarks only drives and reports)."""
LIBRARIES = ("torch", "numpy", "scipy", "transformers", "tokenizers")
"""The libraries whose versions decide a run's floating-point results."""
UNKEYED_FIELDS = ("run_dir", "resume", "steps", "progress", "tensorboard", "checkpoint_every",
                  "keep_checkpoints")  # fmt: skip
"""`TrainConfig` fields that do not decide a run's steps: where it is written, how far it has
gone (a run trained to 10 steps and resumed to 20 is the 20-step run), and how it reports."""
KEY_FILE = "run_key.json"


def _digest_files(paths: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def code_digest(root: Path = ROOT) -> str:
    """sha256 of every file of `CODE_PACKAGES` as it is on disk (uncommitted edits included)."""
    files = [p for package in CODE_PACKAGES for p in (root / package).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]  # fmt: skip
    return _digest_files(files, root)


def library_versions() -> dict[str, str]:
    """The installed version of each of `LIBRARIES` ("" for one that is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = ""
    return out


def run_key(config: dict[str, Any]) -> str:
    """The key of a training run: sha256 of everything that decides it.

    That is the resolved config (`TrainConfig.to_json()`, every allocator default written out)
    less `UNKEYED_FIELDS`, the start policy's files, the code (`code_digest`) and the library
    versions. Two runs with one key on one machine take the same steps bit for bit.
    """
    decided = {k: v for k, v in config.items() if k not in UNKEYED_FIELDS}
    policy = Path(str(config.get("policy", "")))
    policy_digest = (
        _digest_files([p for p in policy.rglob("*") if p.is_file()], policy)
        if policy.is_dir()
        else str(policy)
    )
    payload = {"config": decided, "policy": policy_digest, "code": code_digest(),
               "libraries": library_versions()}  # fmt: skip
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def claim_run_dir(run_dir: Path, key: str) -> dict[str, Any]:
    """Make `run_dir` the home of the run with `key`, before training in it.

    A directory holding a run of another key (or of none: written before keys) is moved aside
    to `NAME.stale-OLDKEY` and never resumed or reused; a directory of this key is kept, and
    this commit is added to the commits it was trained at.

    Returns:
        The key file's record: `key` and `commits`.
    """
    path = run_dir / KEY_FILE
    held = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if run_dir.exists() and any(run_dir.iterdir()) and (held or {}).get("key") != key:
        old = (held or {}).get("key", "unkeyed")
        aside = run_dir.with_name(f"{run_dir.name}.stale-{old}")
        n = 1
        while aside.exists():
            n += 1
            aside = run_dir.with_name(f"{run_dir.name}.stale-{old}-{n}")
        run_dir.rename(aside)
        log.warning("%s holds a run of key %s, not %s: moved to %s", run_dir, old, key, aside)
        held = None
    record = held or {"key": key, "commits": []}
    commit = run_meta()["commit"]
    if commit not in record["commits"]:
        record["commits"].append(commit)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    return dict(record)


def run_fingerprint(run_dir: Path) -> dict[str, Any]:
    """What a rerun must reproduce: digests of the log (timings aside) and the final weights.

    With them, the generated tokens of each step, to say where two runs part.
    """
    import torch

    from harness.training import latest_checkpoint, read_metrics

    records = read_metrics(run_dir)
    log_digest = hashlib.sha256()
    for record in records:
        kept = {k: v for k, v in record.items() if not k.startswith("perf/")}
        log_digest.update(json.dumps(kept, sort_keys=True, default=str).encode())
    checkpoint = latest_checkpoint(run_dir)
    weights = hashlib.sha256()
    if checkpoint is not None:
        state = torch.load(checkpoint / "model.pt", weights_only=True)
        for name in sorted(state):
            weights.update(name.encode() + state[name].contiguous().numpy().tobytes())
    return {
        "metrics": log_digest.hexdigest()[:16],
        "weights": weights.hexdigest()[:16] if checkpoint is not None else "",
        "tokens_by_step": [int(r.get("budget/tokens", 0)) for r in records],
    }


def keyed_run(config: Any) -> dict[str, Any]:
    """Train `config` (a `TrainConfig`) in its run directory, under its key.

    A finished run of the same key is reused, a killed one resumed; a run of another key is
    moved aside first (`claim_run_dir`).

    Returns:
        What a record lists for the run: `key`, `commits`, `code` (`code_digest`, which the key
        covers), `fingerprint` and the resolved `train_config` (what `python -m
        benchmarks.records verify` reruns).
    """
    import dataclasses

    from harness.training import latest_checkpoint, train

    resolved = config.to_json()
    key = run_key(resolved)
    held = claim_run_dir(config.run_dir, key)
    checkpoint = latest_checkpoint(config.run_dir)
    done = json.loads((checkpoint / "state.json").read_text())["step"] if checkpoint else 0
    if done < config.steps:
        train(dataclasses.replace(config, resume=checkpoint is not None))
    return {"key": key, "commits": held["commits"], "code": code_digest()[:16],
            "train_config": resolved, "fingerprint": run_fingerprint(config.run_dir)}  # fmt: skip


def rerun_fingerprint(train_config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Train a recorded run's resolved config afresh in `run_dir`; returns its fingerprint."""
    import dataclasses

    from harness.training import load_config, train

    if run_dir.exists():
        shutil.rmtree(run_dir)  # a rerun starts afresh
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(train_config), encoding="utf-8")
    config = load_config(run_dir)
    train(dataclasses.replace(config, run_dir=run_dir, resume=False, progress=False))
    return run_fingerprint(run_dir)
