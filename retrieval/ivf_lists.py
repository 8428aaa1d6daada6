"""IVF fast-scan lists kept beside the index file, mapped, and loaded as queries probe them.

faiss maps the inverted lists of an IVF file only when they are `ArrayInvertedLists`
(`IO_FLAG_MMAP`). The fast-scan indexes (`IndexIVFRaBitQFastScan`, `IndexIVFPQFastScan`) keep
theirs as `BlockInvertedLists` (codes packed in blocks of 32 rows for the SIMD kernels), which
faiss 1.15 reads into memory whatever the flag: opening wiki-18's `rabitqfs` index means
reading 2.7 GB before the first answer (measured: the same anonymous memory with
`IO_FLAG_MMAP`, `IO_FLAG_MMAP_IFC` or no flag). So a compressed directory stores them apart:

- `index.faiss`: the index with empty lists: centroids, their HNSW graph and the codes'
  parameters (200 MB at 21M rows), read into memory (a mapping would kill the process with
  SIGBUS if the file shrank later);
- `lists.codes`, `lists.ids`, `lists.sizes.npy`: every list's packed code blocks and its ids,
  end to end, and the row count of each list.

`LazyLists` reads a list with `pread` straight into faiss's in-memory lists the first time a
query probes it (a read fails with an error if the file shrank after open, where a mapping
would kill the process with SIGBUS); the copy is of the packed blocks, byte for byte: no
re-encoding. After the first search a background thread copies the rest, so a warm server
searches faiss's own lists at faiss's own speed, and a cold one reads only what its first
queries touch.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np

from retrieval.errors import IndexChangedError, IndexFileError, IndexFormatError

__all__ = ["LIST_FILES", "LazyLists", "has_split_lists", "split_lists", "splittable"]

log = logging.getLogger(__name__)

LIST_FILES = ("lists.codes", "lists.ids", "lists.sizes.npy")
"""The files `split_lists` writes beside the index."""
_BACKGROUND_STEP = 256  # lists copied per lock hold by the background thread


def splittable(index: Any) -> bool:
    """Whether `index` is an IVF index whose lists are faiss's `BlockInvertedLists`."""
    import faiss

    # an IVF index itself: one behind a pre-transform (opq96fs) keeps its lists inside
    if not isinstance(index, faiss.IndexIVF):
        return False
    # faiss's type information lacks the fast-scan lists' class and attributes: read as Any
    lists = cast(Any, faiss.downcast_InvertedLists(cast(Any, index).invlists))
    block: Any = faiss.BlockInvertedLists  # type: ignore[attr-defined]
    return isinstance(lists, block)


def has_split_lists(directory: Path) -> bool:
    """Whether `directory` holds the files `split_lists` writes."""
    return all((directory / name).is_file() for name in LIST_FILES)


def _block_bytes(sizes: np.ndarray, n_per_block: int, block_size: int) -> np.ndarray:
    """Bytes of each list's packed codes: whole blocks of `n_per_block` rows."""
    return (sizes + n_per_block - 1) // n_per_block * block_size


def split_lists(index: Any, directory: Path) -> int:
    """Move a fast-scan IVF index's lists into `LIST_FILES` under `directory`.

    The index keeps its quantizer, parameters and `ntotal`, with empty lists in their place;
    write it to `index.faiss` afterwards.

    Returns:
        The bytes written (codes and ids).
    """
    import faiss

    lists = cast(Any, faiss.downcast_InvertedLists(index.invlists))
    nlist, n_per_block, block_size = int(lists.nlist), int(lists.n_per_block), lists.block_size
    sizes = np.array([lists.list_size(i) for i in range(nlist)], dtype=np.int64)
    code_bytes = _block_bytes(sizes, n_per_block, int(block_size))
    with (
        (directory / "lists.codes").open("wb") as codes,
        (directory / "lists.ids").open("wb") as ids,
    ):
        for i in range(nlist):
            if sizes[i] == 0:
                continue
            codes.write(faiss.rev_swig_ptr(lists.get_codes(i), int(code_bytes[i])).tobytes())
            ids.write(faiss.rev_swig_ptr(lists.get_ids(i), int(sizes[i])).tobytes())
    np.save(directory / "lists.sizes.npy", sizes, allow_pickle=False)
    packer = index.get_CodePacker()
    empty = faiss.BlockInvertedLists(nlist, packer)  # type: ignore[attr-defined]
    packer.this.disown()  # the lists own their packer, the index its lists
    index.replace_invlists(empty, True)
    empty.this.disown()
    return int(code_bytes.sum() + 8 * sizes.sum())


class LazyLists:
    """The lists of an index opened without them, read from their files on demand.

    Args:
        index: the IVF fast-scan index read from `index.faiss` (its lists empty).
        directory: where `LIST_FILES` are.

    Raises:
        IndexFormatError: a file is missing, or its size disagrees with `lists.sizes.npy`.
    """

    def __init__(self, index: Any, directory: Path) -> None:
        import faiss

        self._lists = cast(Any, faiss.downcast_InvertedLists(index.invlists))
        self.sizes: np.ndarray = np.load(directory / "lists.sizes.npy", allow_pickle=False)
        if len(self.sizes) != self._lists.nlist:
            raise IndexFormatError(
                f"{directory}: lists.sizes.npy has {len(self.sizes)} lists, the index "
                f"{self._lists.nlist}"
            )
        code_bytes = _block_bytes(
            self.sizes, int(self._lists.n_per_block), int(self._lists.block_size)
        )
        self._code_end = np.cumsum(code_bytes)
        self._id_end = np.cumsum(self.sizes)
        self._directory = directory
        self._files: dict[str, int] = {}
        self._open(directory / "lists.codes", int(self._code_end[-1]))
        self._open(directory / "lists.ids", 8 * int(self._id_end[-1]))
        self._loaded = np.zeros(len(self.sizes), dtype=bool)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.complete = threading.Event()
        """set once every list is in memory"""
        self.failed: IndexFormatError | None = None
        """why the background loader stopped, if it did"""
        self._closing = threading.Event()

    def _open(self, path: Path, expected: int) -> None:
        size = path.stat().st_size
        if size != expected:
            raise IndexFileError(path, f"holds {size} bytes, lists.sizes.npy implies {expected}")
        fd = os.open(path, os.O_RDONLY)
        # a query's lists lie apart in the file: no read-ahead beyond the bytes asked for
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        self._files[path.name] = fd

    def _read(self, name: str, target: np.ndarray, offset: int) -> None:
        """`pread` a list file's bytes from `offset` into `target` (a view of faiss's memory).

        A read, unlike a mapping, fails with an error when the file shrank under us (a mapping
        past its end kills the process with SIGBUS).
        """
        view: Any = target.view(np.uint8)  # a writable buffer (numpy's stubs do not say so)
        got = os.preadv(self._files[name], [view], offset)
        if got != len(view):
            raise IndexChangedError(
                self._directory / name,
                f"ended at byte {offset + got}, before {offset + len(view)}: it was truncated "
                "after the index was opened; reopen the index (restart the server)",
            )

    def close(self) -> None:
        """Stop the background loader and close the list files.

        The lists already in memory stay searchable.
        """
        self._closing.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files = {}

    def _prefetch(self, name: str, start: int, stop: int) -> None:
        """Ask the kernel to read bytes [start, stop) of a list file ahead, in large requests."""
        if stop > start:
            os.posix_fadvise(self._files[name], start, stop - start, os.POSIX_FADV_WILLNEED)

    def _load(self, i: int) -> None:
        """Copy list `i` into faiss's lists (the caller holds the lock)."""
        import faiss

        n = int(self.sizes[i])
        if n:
            code_start = int(self._code_end[i - 1]) if i else 0
            id_start = int(self._id_end[i - 1]) if i else 0
            self._lists.resize(i, n)  # allocates whole blocks
            n_code = int(self._code_end[i]) - code_start
            codes = faiss.rev_swig_ptr(self._lists.get_codes(i), n_code)  # uint8
            self._read("lists.codes", codes, code_start)
            self._read("lists.ids", faiss.rev_swig_ptr(self._lists.get_ids(i), n), 8 * id_start)
        self._loaded[i] = True

    def ensure(self, cells: np.ndarray) -> None:
        """Load the lists `cells` names (any shape; -1 ignored) that are not loaded yet."""
        if self.complete.is_set():
            return
        wanted = np.unique(cells[cells >= 0])
        with self._lock:
            for i in wanted[~self._loaded[wanted]]:
                self._load(int(i))

    def load_rest_in_background(self) -> None:
        """Start a daemon thread copying every list not loaded yet (once; later calls: no-op)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._load_rest, name="ivf-lists", daemon=True)
        self._thread.start()

    def _load_rest(self) -> None:
        try:
            self._load_all()
        except IndexFormatError as err:  # queries then read their own lists, and fail alike
            self.failed = err
            log.error("stopped loading the IVF lists: %s", err)

    def _load_all(self) -> None:
        for start in range(0, len(self.sizes), _BACKGROUND_STEP):
            if self._closing.is_set():
                return
            stop = min(start + _BACKGROUND_STEP, len(self.sizes))
            # whole steps are read ahead in large requests: reads at random would be slow
            first = int(self._code_end[start - 1]) if start else 0
            self._prefetch("lists.codes", first, int(self._code_end[stop - 1]))
            first = int(self._id_end[start - 1]) if start else 0
            self._prefetch("lists.ids", 8 * first, 8 * int(self._id_end[stop - 1]))
            with self._lock:
                for i in range(start, stop):
                    if not self._loaded[i]:
                        self._load(i)
        self.complete.set()
        log.info("all %d IVF lists loaded", len(self.sizes))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every list is loaded (True), or `timeout` seconds (False)."""
        return self.complete.wait(timeout)

    @property
    def n_loaded(self) -> int:
        """How many lists are in memory."""
        return int(self._loaded.sum())
