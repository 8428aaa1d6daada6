"""The files of an index directory: a table of their sizes and hashes, and how they are replaced.

Every index directory records, in the manifest written last (`manifest.json`, or
`compressed.json` for a compressed index), a table of every other file under it: its path
relative to the directory, its size and its SHA-256. Then:

- opening compares every size and the list of files (`check_sizes`; a few `stat` calls): a
  missing, short, long or extra file is refused with one `IndexFileError` naming it, so a
  directory a kill left half-written, or one a hand copied in part, never opens;
- `tracerl index verify DIR` (and `serve-retriever --verify`) hashes every file
  (`verify_hashes`): a bit flip is named too;
- a build writes into a fresh directory beside its target and swaps it in with one atomic
  rename (`atomic_directory`), so a kill at any moment leaves the old index or the new one;
- `FileWatch` remembers each file's inode, size and modification time at open; an index checks
  it before each search and refuses (`IndexChangedError`) once a file was replaced, truncated or
  written in place, instead of reading a mapping past its end (SIGBUS) or mixing two builds.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import logging
import os
import shutil
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import IndexChangedError, IndexFileError, IndexFormatError

__all__ = [
    "FileEntry",
    "FileWatch",
    "atomic_directory",
    "check_sizes",
    "file_table",
    "table_digest",
    "table_from_json",
    "table_to_json",
    "verify_hashes",
]

log = logging.getLogger(__name__)

_HASH_CHUNK = 1 << 22
_RENAME_EXCHANGE = 2  # linux/fs.h: swap two paths in one step
_AT_FDCWD = -100


@dataclass(frozen=True, slots=True, kw_only=True)
class FileEntry:
    """One file of an index directory, as its manifest records it."""

    size: int
    sha256: str


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _listing(directory: Path, exclude: Collection[str]) -> dict[str, Path]:
    """Every file under `directory` by its relative POSIX path, `exclude` left out."""
    found: dict[str, Path] = {}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if name in exclude or path.is_dir():
            continue
        found[name] = path
    return found


def file_table(directory: str | Path, *, exclude: Collection[str]) -> dict[str, FileEntry]:
    """Size and SHA-256 of every file under `directory` but `exclude` (the manifest itself)."""
    return {
        name: FileEntry(size=path.stat().st_size, sha256=_sha256(path))
        for name, path in _listing(Path(directory), exclude).items()
    }


def table_to_json(table: dict[str, FileEntry]) -> dict[str, Any]:
    """The table as the manifest stores it: `{name: {"size", "sha256"}}`."""
    return {name: {"size": e.size, "sha256": e.sha256} for name, e in sorted(table.items())}


def table_from_json(record: Any, *, source: str) -> dict[str, FileEntry]:
    """Read a stored table.

    Raises:
        IndexFormatError: it is not `{name: {"size": int >= 0, "sha256": str}}`.
    """
    if not isinstance(record, dict):
        raise IndexFormatError(f"{source}: 'files' must be an object")
    table: dict[str, FileEntry] = {}
    for name, entry in record.items():
        size = entry.get("size") if isinstance(entry, dict) else None
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if (
            not isinstance(name, str)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
            or not isinstance(sha, str)
            or ".." in Path(name).parts
            or Path(name).is_absolute()
        ):
            raise IndexFormatError(f"{source}: bad entry {name!r} in 'files'")
        table[name] = FileEntry(size=size, sha256=sha)
    return table


def table_digest(table: dict[str, FileEntry]) -> str:
    """A short hash of the whole table: which files, their sizes and contents."""
    payload = "\n".join(f"{n}\t{e.size}\t{e.sha256}" for n, e in sorted(table.items()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def check_sizes(
    directory: str | Path, table: dict[str, FileEntry], *, exclude: Collection[str]
) -> None:
    """Refuse a directory whose files are not the table's: missing, another size, or extra.

    Raises:
        IndexFileError: naming the first file that differs and how.
    """
    directory = Path(directory)
    present = _listing(directory, exclude)
    for name, entry in sorted(table.items()):
        path = directory / name
        if name not in present:
            raise IndexFileError(path, "is missing; the index is incomplete, rebuild it")
        size = present[name].stat().st_size
        if size != entry.size:
            raise IndexFileError(
                path, f"holds {size} bytes, the manifest says {entry.size}; rebuild the index"
            )
    extra = sorted(set(present) - set(table))
    if extra:
        raise IndexFileError(
            directory / extra[0],
            f"is not in the manifest (with {len(extra) - 1} more); the directory mixes two "
            "builds or holds foreign files: rebuild the index or move the file out",
        )


def verify_hashes(directory: str | Path, table: dict[str, FileEntry]) -> None:
    """Hash every file of the table (reads the whole index).

    Raises:
        IndexFileError: a file's content is not the one the manifest recorded.
    """
    for name, entry in sorted(table.items()):
        path = Path(directory) / name
        try:
            actual = _sha256(path)
        except OSError as err:
            raise IndexFileError(path, f"cannot be read ({err.strerror})") from err
        if actual != entry.sha256:
            raise IndexFileError(
                path,
                f"has SHA-256 {actual[:16]}…, the manifest says {entry.sha256[:16]}…: it was "
                "changed after the build; rebuild the index",
            )


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux `renameat2(RENAME_EXCHANGE)`); False if unsupported."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this filesystem cannot exchange
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


@contextlib.contextmanager
def atomic_directory(out: str | Path, *, marker: str, overwrite: bool = True) -> Iterator[Path]:
    """Build an index in a fresh directory and put it at `out` in one step.

    Yields a new empty directory beside `out`; when the block ends without an exception, it
    takes `out`'s place by an atomic exchange of the two paths (the old index, if any, is then
    deleted). A kill before the exchange leaves the old index and a stray `.<name>.tmp-*`
    directory (removed by the next build); after it, the new index. An exception deletes the
    new directory.

    Args:
        out: where the index goes.
        marker: the file an index directory holds (its manifest): an existing `out` is
            replaced only if it holds it or is empty, so a wrong path loses nothing.
        overwrite: replace an index already at `out`.

    Raises:
        IndexFormatError: `out` holds an index and not `overwrite`, or holds something else.
    """
    out = Path(out)
    if out.exists():
        if (out / marker).is_file() and not overwrite:
            raise IndexFormatError(f"{out} already holds an index; pass --overwrite to replace it")
        if not out.is_dir() or (not (out / marker).is_file() and any(out.iterdir())):
            raise IndexFormatError(
                f"{out} exists and is not an index directory (no {marker}); refusing to replace "
                "it: pick another path"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a killed build
        shutil.rmtree(stale, ignore_errors=True)
    work = out.parent / f".{out.name}.tmp-{os.getpid()}"
    work.mkdir()
    try:
        yield work
        _fsync_tree(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if not out.exists():
        os.rename(work, out)
    elif _exchange(work, out):
        shutil.rmtree(work)  # now the old index
    else:  # no exchange on this filesystem: two renames, with the old kept until the second
        old = out.parent / f".{out.name}.tmp-old-{os.getpid()}"
        os.rename(out, old)
        os.rename(work, out)
        shutil.rmtree(old)
    _fsync_dir(out.parent)


def _fsync_tree(directory: Path) -> None:
    """Flush every file under `directory` to disk before it is renamed into place."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class _Identity:
    inode: int
    size: int
    mtime_ns: int


def _identity(path: Path) -> _Identity | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _Identity(st.st_ino, st.st_size, st.st_mtime_ns)


class FileWatch:
    """The identity (inode, size, mtime) of an index's files at open, to notice a change.

    Args:
        paths: the files an index reads after it is open.
    """

    def __init__(self, paths: Collection[Path]) -> None:
        self._seen = {path: _identity(path) for path in paths}

    def check(self) -> None:
        """Raise if any watched file was replaced, truncated, written or removed since open.

        Raises:
            IndexChangedError: naming the file; restart the server (or reopen the index).
        """
        for path, seen in self._seen.items():
            if _identity(path) != seen:
                raise IndexChangedError(
                    path,
                    "was replaced or changed after the index was opened; answers from it "
                    "would mix two builds or crash: reopen the index (restart the server)",
                )
