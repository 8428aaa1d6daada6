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
  it holds a lock beside its target (`build_lock`), so a second build into the same target is
  refused at once with the first one's PID, and deletes only the strays of dead builds;
- `FileWatch` remembers each file's inode, size, mtime and ctime at open; an index checks it
  before each search and refuses (`IndexChangedError`) once a file was replaced, truncated or
  written in place, instead of reading a mapping past its end (SIGBUS) or mixing two builds.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.errors import IndexBusyError, IndexChangedError, IndexFileError, IndexFormatError

__all__ = [
    "FileEntry",
    "FileWatch",
    "atomic_directory",
    "build_lock",
    "check_out",
    "check_sizes",
    "file_table",
    "lock_path",
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


def lock_path(out: str | Path) -> Path:
    """The lock file of the builds into `out`: `.NAME.lock` beside it, while a build runs."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


_HELD: dict[str, tuple[int, int]] = {}  # lock path -> (holding thread, depth): re-entry
_HELD_GUARD = threading.Lock()


def _read_holder(fd: int) -> int | None:
    """The PID the holder wrote into the lock file (None if not written yet or unreadable)."""
    for _ in range(20):  # the holder writes its PID just after it takes the lock
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        time.sleep(0.005)
    return None


@contextlib.contextmanager
def build_lock(out: str | Path) -> Iterator[None]:
    """Hold the lock of the builds into `out` (`lock_path`) for the block.

    A second build into the same `out` is refused at once, in one line naming the holder's
    PID, rather than made to wait: a launcher that starts the same build on every rank gets
    one build and clear refusals, and nobody waits behind a build that may take hours. The
    lock is an `flock` on `.NAME.lock` beside `out`, so the kernel releases it when its holder
    dies, even by `kill -9` (a killed holder leaves the file, which the next build reuses). The
    same thread may take it again (`atomic_directory` inside a command that already holds it).

    Raises:
        IndexBusyError: another process, or another thread of this one, holds it.
    """
    path = lock_path(out)
    key = os.path.abspath(path)
    me = threading.get_ident()
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and held[0] == me:
            _HELD[key] = (me, held[1] + 1)
        elif held is not None:
            raise IndexBusyError(
                f"{out} is being built by this process (PID {os.getpid()}, another thread): "
                f"wait for that build, or write this one elsewhere (lock {path})",
                os.getpid(),
            )
    if held is not None:  # re-entered by the holding thread
        try:
            yield
        finally:
            with _HELD_GUARD:
                _HELD[key] = (me, _HELD[key][1] - 1)
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fd = _lock_file(path, out)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        with _HELD_GUARD:
            _HELD[key] = (me, 1)
        try:
            yield
        finally:
            with _HELD_GUARD:
                del _HELD[key]
            # removed while still held: a builder that opened this file meanwhile finds it
            # unlinked once it gets the lock, and starts over on a new one (`_lock_file`)
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


def _lock_file(path: Path, out: str | Path) -> int:
    """Open and lock `path`, the file the path names at the moment the lock is held.

    Raises:
        IndexBusyError: another build holds it.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_holder(fd)
            os.close(fd)
            who = f"PID {pid}" if pid is not None else "another process"
            raise IndexBusyError(
                f"{out} is being built by {who} (lock {path}): wait for that build to end, "
                "or stop it, then run this one again",
                pid,
            ) from None
        except OSError as err:
            if err.errno not in _NO_FLOCK:
                os.close(fd)
                raise
            # a file system without flock (some network mounts): the build goes on unguarded
            log.warning(
                "cannot lock %s (%s): a second build into %s at the same time would not be "
                "refused; build on a local file system, or one build at a time",
                path,
                err.strerror,
                out,
            )
            return fd
        except BaseException:
            os.close(fd)
            raise
        try:
            now = path.stat()
        except FileNotFoundError:
            now = None
        held = os.fstat(fd)
        if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
            return fd
        os.close(fd)  # the holder before us removed this file as it finished: once more


def check_out(out: str | Path, *, marker: str, overwrite: bool) -> None:
    """Refuse, before any work, an `--out` that a build could not replace whole.

    Raises:
        IndexFormatError: `out` is a symbolic link, a mount point, a file, a directory that
            is not an index, or an index and not `overwrite`.
    """
    out = Path(out)
    if out.is_symlink():
        raise IndexFormatError(
            f"{out} is a symbolic link (to {os.readlink(out)}): a build replaces the directory "
            "at --out in one rename, which would replace the link itself; pass the directory it "
            f"points to (--out {out.resolve()}) or remove the link"
        )
    if not out.exists():
        return
    if out.is_dir() and os.path.ismount(out):
        raise IndexFormatError(
            f"{out} is a mount point: a build swaps a new directory into --out in one rename, "
            f"which cannot replace a mount point; build into a directory under it (--out "
            f"{out / 'index'})"
        )
    if (out / marker).is_file() and not overwrite:
        raise IndexFormatError(f"{out} already holds an index; pass --overwrite to replace it")
    if not out.is_dir() or (not (out / marker).is_file() and any(out.iterdir())):
        raise IndexFormatError(
            f"{out} exists and is not an index directory (no {marker}); refusing to replace "
            "it: pick another path"
        )


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, Linux), to tell a reused PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime


def _alive(pid: int, start: int | None) -> bool:
    """Whether process `pid` runs, and is the one that started at `start` (when known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    if start is None:
        return True
    now = _start_ticks(pid)
    return now is None or now == start


def _remove_strays(out: Path) -> None:
    """Delete the work directories of builds into `out` whose owner is dead.

    Called with the build lock held, so no other builder is running; a stray whose owner
    still runs (a build by an older trace-rl, which took no lock) is left alone and named.
    """
    for stray in out.parent.glob(f".{out.name}.tmp-*"):
        found = _STRAY.fullmatch(stray.name[len(out.name) + 1 :])
        if found is not None:
            pid, start = int(found.group(1)), found.group(2)
            if pid != os.getpid() and _alive(pid, None if start is None else int(start)):
                log.warning("left %s: its build (PID %d) is still running", stray, pid)
                continue
        if stray.is_symlink() or not stray.is_dir():
            stray.unlink(missing_ok=True)
        else:
            shutil.rmtree(stray, ignore_errors=True)
        log.info("removed %s, left by a build that was killed", stray)


_STRAY = re.compile(r"\.tmp-(?:old-)?(\d+)(?:-(\d+))?(?:-[0-9a-f]+)?")
"""`.tmp-PID`, `.tmp-old-PID` (older builds), `.tmp-PID-START-TOKEN` (the owner's start)."""


@contextlib.contextmanager
def atomic_directory(out: str | Path, *, marker: str, overwrite: bool = True) -> Iterator[Path]:
    """Build an index in a fresh directory and put it at `out` in one step.

    Holds the build lock of `out` (`build_lock`: a second build into `out` is refused at once,
    naming this one's PID) and yields a new empty directory beside `out`; when the block ends
    without an exception, it takes `out`'s place by an atomic exchange of the two paths (the
    old index, if any, is then deleted). A kill before the exchange leaves the old index and a
    stray `.<name>.tmp-*` directory (removed by the next build, once its owner is dead); after
    it, the new index. An exception deletes the new directory. Before the exchange the work
    directory must still be the one made here: one removed or replaced meanwhile (by a build
    that took no lock) fails the build, and nothing is replaced.

    Args:
        out: where the index goes.
        marker: the file an index directory holds (its manifest): an existing `out` is
            replaced only if it holds it or is empty, so a wrong path loses nothing.
        overwrite: replace an index already at `out`.

    Raises:
        IndexFormatError: `out` holds an index and not `overwrite`, holds something else, is a
            symbolic link or a mount point; or the work directory changed under the build.
        IndexBusyError: another build holds the lock of `out`.
    """
    out = Path(out)
    check_out(out, marker=marker, overwrite=overwrite)
    with build_lock(out):
        check_out(out, marker=marker, overwrite=overwrite)  # as it is now that we hold the lock
        _remove_strays(out)
        work = out.parent / (
            f".{out.name}.tmp-{os.getpid()}-{_start_ticks(os.getpid()) or 0}-{secrets.token_hex(3)}"
        )
        work.mkdir()
        # held open for the build: the directory's inode cannot be freed and reused by one made
        # in its place, so comparing it with what the path names before the swap is exact
        held = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield work
            _fsync_tree(work)
            if not _same_directory(held, work):
                raise IndexFormatError(
                    f"the build directory {work} was removed or replaced while the index was "
                    f"written (by another process?): {out} is left as it was; build again"
                )
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        finally:
            os.close(held)
        try:
            _swap_in(work, out)
        except OSError as err:
            shutil.rmtree(work, ignore_errors=True)
            raise IndexFormatError(
                f"cannot put the new index at {out} ({err.strerror or err}); it is left as it "
                "was. On a mount point or a read-only or special file system, build into a "
                "directory under it"
            ) from err
        _fsync_dir(out.parent)


def _same_directory(fd: int, path: Path) -> bool:
    """Whether `path` still names the directory open as `fd` (not removed, not replaced)."""
    held = os.fstat(fd)
    try:
        now = path.lstat()
    except FileNotFoundError:
        return False
    return held.st_nlink > 0 and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)


def _swap_in(work: Path, out: Path) -> None:
    """Put `work` at `out`: a rename, or an exchange with the old index (then deleted)."""
    if not out.exists():
        os.rename(work, out)
    elif _exchange(work, out):
        shutil.rmtree(work)  # now the old index
    else:  # no exchange on this filesystem: two renames, with the old kept until the second
        old = out.parent / f".{out.name}.tmp-old-{os.getpid()}"
        os.rename(out, old)
        os.rename(work, out)
        shutil.rmtree(old)


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
    ctime_ns: int
    """the inode's change time, which every write and `utime` moves and no user can set back:
    an in-place write that restores the mtime (`cp -p`, `rsync -t --inplace`, `touch -r`)
    still changes it"""


def _identity(path: Path) -> _Identity | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _Identity(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileWatch:
    """The identity (inode, size, mtime, ctime) of an index's files at open, to notice a change.

    ctime is what catches a same-size write whose mtime was put back; a `chmod`, `chown` or
    new hard link moves it too, and is refused alike (reopen the index after one).

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
