"""Training checkpoints: written atomically, read back without unpickling anything but tensors.

A checkpoint is one directory, `run_dir/checkpoints/step_000010/`:

- `model.pt`: the policy's `state_dict` (torch's own format, loaded with `weights_only=True`);
- `optimizer.pt`: the optimizer's state (same format and loading rule);
- `predictor.npz`: the predictor's `state_dict` arrays (`allow_pickle=False`);
- `rng.pt`: torch's CPU generator state (a uint8 tensor);
- `state.json`: everything else as JSON with a `schema_version` (step, data cursor, budget
  carry, the allocator's and the engine's generator states, python's `random` state, metrics
  history, ...).

The directory is first written under a temporary name and then renamed, and
`checkpoints/latest.json` is replaced atomically after it, so a process killed at any moment
leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.errors import CheckpointError

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointError",
    "LoadedCheckpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "parameter_distance",
    "policy_distance",
    "policy_parameters",
    "save_checkpoint",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""Version of `state.json`; bumped on any change to its fields."""

_LATEST = "latest.json"
_STEP_DIR = re.compile(r"step_(\d+)")
_READ_ERRORS = (
    OSError,
    ValueError,
    RuntimeError,
    EOFError,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
)
"""What torch, numpy and json raise on a truncated or foreign file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedCheckpoint:
    """What `load_checkpoint` read back."""

    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    predictor: dict[str, np.ndarray]
    torch_rng: torch.Tensor
    state: dict[str, Any]


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    model: Mapping[str, torch.Tensor],
    optimizer: Mapping[str, Any],
    predictor: Mapping[str, np.ndarray],
    state: Mapping[str, Any],
    keep: int = 2,
) -> Path:
    """Write the checkpoint of `step` atomically and keep only the newest `keep` ones.

    Args:
        run_dir: The run's directory (checkpoints go under `run_dir/checkpoints`).
        step: The last finished step.
        model: The policy's state dict.
        optimizer: The optimizer's state dict (tensors, numbers, lists, dicts).
        predictor: The predictor's arrays.
        state: JSON-safe trainer state.
        keep: Checkpoints to keep, this one included: older ones (by step number) are deleted
            after the new one is in place. Newer ones, left by a run that was resumed from an
            earlier step, are left alone (this run overwrites them when it gets there).

    Returns:
        The checkpoint directory.
    """
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"

    def write(tmp: Path) -> None:
        _torch_save(dict(model), tmp / "model.pt")
        _torch_save(dict(optimizer), tmp / "optimizer.pt")
        _torch_save(torch.get_rng_state(), tmp / "rng.pt")
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in predictor.items()}
        np.savez(tmp / "predictor.npz", **arrays)
        record = {"schema_version": SCHEMA_VERSION, "step": step, **dict(state)}
        (tmp / "state.json").write_text(json.dumps(record), encoding="utf-8")

    write_dir_atomic(final, write)
    _write_atomic(root / _LATEST, json.dumps({"step": step, "path": final.name}))
    older = sorted((n, p) for p in root.iterdir() if (n := _step_of(p)) is not None and n < step)
    for _, old in older[: max(len(older) - max(keep, 1) + 1, 0)]:
        shutil.rmtree(old)
    log.info("saved checkpoint step %d to %s", step, final)
    return final


_FULL_BELOW_BYTES = 64 << 20
"""Free space under which a failed write is taken for a full disk."""


def _torch_save(obj: Any, path: Path) -> None:
    """`torch.save`, with a write its zip writer could not finish reported as what it is.

    torch's writer reports a full disk (or a file system that failed a write) as a
    `RuntimeError` about its own internals ("[enforce fail at inline_container.cc:672] .
    unexpected pos ..."), which would end a run as an internal error.

    Raises:
        OSError: `ENOSPC` ("No space left on device") when the file system is (nearly) full,
            else `EIO`, naming the file; the checkpoint is then not written, the previous one
            stays the latest.
    """
    try:
        torch.save(obj, path)
    except RuntimeError as err:
        text = str(err)
        if "inline_container" not in text and "PytorchStreamWriter" not in text:
            raise
        reason = text.strip().splitlines()[0][:200] if text.strip() else type(err).__name__
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        if free is not None and free < _FULL_BELOW_BYTES:
            raise OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)}: writing {path} ({free / 2**20:.1f} MiB free; "
                f"torch: {reason}); free some space and rerun with --resume",
            ) from err
        raise OSError(errno.EIO, f"cannot write {path} (torch: {reason})") from err


def _step_of(path: Path) -> int | None:
    """The step of a checkpoint directory's name (`step_000010` -> 10), or None."""
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match and path.is_dir() else None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run, or None if it has none.

    Raises:
        CheckpointError: `latest.json` is not a pointer, or names a directory that is missing.
    """
    pointer = run_dir / "checkpoints" / _LATEST
    if not pointer.exists():
        return None
    fix = (
        'point it at a complete step_* directory ({"step": 10, "path": "step_000010"}) or '
        "start a new --run-dir"
    )
    try:
        record = json.loads(pointer.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{pointer} is not a checkpoint pointer ({err}); {fix}") from err
    name = record.get("path") if isinstance(record, dict) else None
    if not isinstance(name, str) or _STEP_DIR.fullmatch(name) is None:
        raise CheckpointError(
            f"{pointer} holds no 'path' naming a step_* directory (got {str(record)[:100]}); {fix}"
        )
    path = pointer.parent / name
    if not (path / "state.json").exists():
        raise CheckpointError(f"{pointer} names {path}, which is missing or incomplete; {fix}")
    return path


def load_checkpoint(path: Path) -> LoadedCheckpoint:
    """Read a checkpoint directory written by `save_checkpoint`.

    Raises:
        CheckpointError: a file is missing, or `state.json` has another schema version.
    """
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        model = torch.load(path / "model.pt", weights_only=True)
        optimizer = torch.load(path / "optimizer.pt", weights_only=True)
        torch_rng = torch.load(path / "rng.pt", weights_only=True)
        with np.load(path / "predictor.npz", allow_pickle=False) as data:
            predictor = {k: data[k] for k in data.files}
    except _READ_ERRORS as err:
        first = next((line for line in str(err).splitlines() if line.strip()), repr(err))
        raise CheckpointError(
            f"cannot read checkpoint {path} ({first.strip()}): it is truncated or not one; "
            f"delete it and point {path.parent / _LATEST} at an earlier step_* directory, or "
            "start a new --run-dir"
        ) from err
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"checkpoint {path}: state.json holds no step; it is not one")
    if state.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has schema_version={state.get('schema_version')!r}; this trace-rl "
            f"reads version {SCHEMA_VERSION}"
        )
    return LoadedCheckpoint(
        path=path,
        step=int(state["step"]),
        model=model,
        optimizer=optimizer,
        predictor=predictor,
        torch_rng=torch_rng,
        state=state,
    )


def parameter_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """‖a − b‖₂ over every tensor `a` names, as if all were one flat vector (float64 sums).

    `b` may hold more names than `a` (a state dict lists a tied weight under both of its
    names; `policy_parameters` lists it once), so pass the trainable parameters as `a`.

    >>> a, b = {"w": torch.tensor([3.0, 0.0])}, {"w": torch.zeros(2), "x": torch.ones(1)}
    >>> parameter_distance(a, b)
    3.0

    Raises:
        ValueError: `b` lacks a name of `a`, or a tensor's shape differs.
    """
    total = 0.0
    for name, x in a.items():
        y = b.get(name)
        if y is None or y.shape != x.shape:
            found = "missing" if y is None else f"of shape {tuple(y.shape)}"
            raise ValueError(
                f"parameter {name} of shape {tuple(x.shape)} is {found} in the other policy: "
                "they are not the same architecture"
            )
        total += float((x.detach().double() - y.detach().double()).pow(2).sum())
    return total**0.5


def policy_parameters(policy: str | Path) -> dict[str, torch.Tensor]:
    """A transformers policy's parameters by name, tied weights once, in float32.

    `policy` is a model directory or a hub name, as `--policy` takes it.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    return {name: p.detach() for name, p in model.named_parameters()}


def policy_distance(a: str | Path, b: str | Path) -> float:
    """‖θ_a − θ_b‖₂ between two saved policies (e.g. a run's start policy and its `policy/`)."""
    return parameter_distance(policy_parameters(a), policy_parameters(b))


def write_dir_atomic(final: Path, write: Callable[[Path], None]) -> None:
    """Fill a directory at once: `write(tmp)` fills a sibling temp dir, which then replaces `final`.

    A process killed at any moment leaves either the old `final` or the new one (and maybe a
    stale `.NAME.tmp`, cleared on the next call), never a half-written `final`.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a process killed while writing
    tmp.mkdir()
    write(tmp)
    for path in tmp.iterdir():
        _fsync(path)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
