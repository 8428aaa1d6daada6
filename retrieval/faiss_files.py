"""faiss files on disk: read an index without copying it, and view a flat file's vectors.

faiss has two memory-mapping flags, and each maps a different part of a file:

- `IO_FLAG_MMAP_IFC` (faiss >= 1.11) maps the codes of flat-code indexes (`IndexFlat`,
  `IndexScalarQuantizer`, `IndexPQ`) and the storage of HNSW indexes;
- `IO_FLAG_MMAP` maps only the inverted lists of IVF indexes. On a flat or HNSW file it maps
  nothing: faiss reads the whole file into anonymous memory (a flat file adds its whole size to
  resident memory, the same as no flag at all), and the two flags cannot be combined on an IVF
  file (faiss refuses it).

`read_index(path, mmap=True)` picks the flag from the file's four-byte type tag, so a 64.6 GB
`e5_Flat.index` opens in milliseconds and costs page cache for the rows a search touches, not
64.6 GB of RAM.

`FlatVectors` parses a flat file's header and views its rows as a read-only `(n, d)` float32
array over a memory map of the file, with no faiss involved: `tracerl index compress` streams the
rows from it, and the compressed index re-ranks its candidates from it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.errors import IndexFormatError

__all__ = [
    "PAGE_BYTES",
    "FlatVectors",
    "file_fingerprint",
    "index_fourcc",
    "read_index",
    "resident_pages",
]

PAGE_BYTES = mmap.PAGESIZE
_IVF_TAGS = (b"Iw", b"Iv")  # faiss's four-byte tags of IVF indexes: IwFl, IwPQ, IwSq, IvFl, ...
_FLAT_TAGS = {b"IxFI": "inner_product", b"IxF2": "l2"}
# fourcc, d (int32), ntotal (int64), two unused int64, is_trained (bool), metric_type (int32)
_HEADER = struct.Struct("<4siqqq?i")
_COUNT = struct.Struct("<Q")  # the code vector's length, in floats
_SAMPLE_BYTES = 1 << 20  # head and tail bytes hashed into a file's fingerprint


def file_fingerprint(path: Path) -> str:
    """SHA-256 of a file's size, first MiB and last MiB (16 hex digits).

    Hashing all of a 64 GB file would take minutes at every start; size plus both ends tells
    two different builds apart in practice.
    """
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(max(0, size - _SAMPLE_BYTES))
        digest.update(handle.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:16]


def index_fourcc(path: str | Path) -> bytes:
    """The four-byte type tag a faiss file starts with (`b"IxFI"` for `IndexFlatIP`).

    Raises:
        IndexFormatError: the file cannot be read or is shorter than four bytes.
    """
    try:
        with Path(path).open("rb") as handle:
            tag = handle.read(4)
    except OSError as err:
        raise IndexFormatError(f"cannot read faiss file {path}: {err}") from err
    if len(tag) != 4:
        raise IndexFormatError(f"{path} is not a faiss index (shorter than its 4-byte tag)")
    return tag


def read_index(path: str | Path, *, mmap: bool, ifc: bool = False) -> Any:
    """Read a faiss index, memory-mapping its bulk where faiss can.

    Args:
        path: the faiss file.
        mmap: map the file read-only (flat, HNSW and other flat-code indexes with
            `IO_FLAG_MMAP_IFC`, IVF indexes' inverted lists with `IO_FLAG_MMAP`) instead of
            reading it into memory.
        ifc: with `mmap`, use `IO_FLAG_MMAP_IFC` on an IVF file too: it maps the centroids
            and an HNSW quantizer's graph, not the lists (for a file whose lists are kept
            apart, `retrieval.ivf_lists`).

    Raises:
        IndexFormatError: the file is missing or faiss cannot read it, or faiss is older than
            1.11 and `mmap` is asked for.
    """
    import faiss

    path = Path(path)
    if not path.is_file():
        raise IndexFormatError(f"faiss index {path} is not a file")
    flags = 0
    if mmap:
        if not hasattr(faiss, "IO_FLAG_MMAP_IFC"):
            raise IndexFormatError(
                f"faiss {faiss.__version__} cannot map flat or HNSW files (IO_FLAG_MMAP_IFC "
                "came in faiss 1.11); pip install 'faiss-cpu>=1.11'"
            )
        ivf = index_fourcc(path)[:2] in _IVF_TAGS
        lists = ivf and not ifc
        flags = (faiss.IO_FLAG_MMAP if lists else faiss.IO_FLAG_MMAP_IFC) | faiss.IO_FLAG_READ_ONLY
    try:
        return faiss.read_index(str(path), flags)
    except RuntimeError as err:
        raise IndexFormatError(f"{path}: faiss cannot read it ({err})") from err


@dataclass(frozen=True, slots=True)
class _Layout:
    n: int
    d: int
    metric: str
    offset: int


def _flat_layout(path: Path) -> _Layout:
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(_HEADER.size + _COUNT.size)
    if len(head) < _HEADER.size + _COUNT.size:
        raise IndexFormatError(f"{path} is too short for a faiss flat index")
    tag, d, n, _, _, _, metric_type = _HEADER.unpack_from(head)
    if tag not in _FLAT_TAGS:
        raise IndexFormatError(
            f"{path} is a faiss {tag.decode('latin-1')!r} index, not a flat one (IxFI or IxF2); "
            "compress and re-rank need the flat file (e5_Flat.index), whose rows are the vectors"
        )
    (count,) = _COUNT.unpack_from(head, _HEADER.size)
    offset = _HEADER.size + _COUNT.size
    if count != n * d or size != offset + 4 * n * d:
        raise IndexFormatError(
            f"{path}: header says {n} vectors of dim {d}, but the file holds {size} bytes "
            f"({offset + 4 * n * d} expected); the file is truncated or not a faiss flat index"
        )
    del metric_type  # IxFI / IxF2 already name the metric
    return _Layout(n=n, d=d, metric=_FLAT_TAGS[tag], offset=offset)


class FlatVectors:
    """The rows of a faiss flat file (`IndexFlatIP` / `IndexFlatL2`), mapped read-only.

    `vectors` is an `(n, d)` float32 view of the file: reading rows faults in their pages (page
    cache, which the OS may evict), and nothing is copied into anonymous memory. Row i of
    Search-R1's `e5_Flat.index` is passage i of `wiki-18.jsonl`.

    Args:
        path: the flat file.
        random_access: tell the kernel that rows are read at random (`MADV_RANDOM`), so a
            re-rank that reads 3 KB does not pull in 128 KB of read-ahead around it.

    Raises:
        IndexFormatError: the file is not a faiss flat index or its size disagrees with its header.
    """

    def __init__(self, path: str | Path, *, random_access: bool = True) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise IndexFormatError(f"flat index {self.path} is not a file")
        layout = _flat_layout(self.path)
        self.n, self.d, self.metric, self.offset = layout.n, layout.d, layout.metric, layout.offset
        self._fd = os.open(self.path, os.O_RDONLY)
        self._map = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        if random_access:
            self._map.madvise(mmap.MADV_RANDOM)
        # the rows start at byte 45, so the view is unaligned; numpy reads it correctly
        self.vectors: np.ndarray = np.frombuffer(
            self._map, dtype="<f4", count=self.n * self.d, offset=self.offset
        ).reshape(self.n, self.d)

    @property
    def file_bytes(self) -> int:
        """The file's size."""
        return self.offset + 4 * self.n * self.d

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """A float32 copy of rows `ids` (any shape), shape `ids.shape + (d,)`."""
        return np.asarray(self.vectors[ids.reshape(-1)].reshape(*ids.shape, self.d))

    def pages_of(self, ids: np.ndarray) -> np.ndarray:
        """The distinct file pages (by index) that rows `ids` lie on."""
        first = (self.offset + 4 * self.d * ids.reshape(-1).astype(np.int64)) // PAGE_BYTES
        last = (self.offset + 4 * self.d * (ids.reshape(-1).astype(np.int64) + 1) - 1) // PAGE_BYTES
        return np.unique(np.concatenate([first, last]))

    def drop_cache(self) -> None:
        """Evict the file's pages from the page cache (this mapping's and the OS's).

        `MADV_DONTNEED` unmaps them from this process, then `POSIX_FADV_DONTNEED` asks the OS to
        drop the clean, now unmapped pages; other processes mapping the file keep theirs.
        """
        self._map.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def resident_pages(self) -> int:
        """How many of the file's pages are in the page cache now (`mincore`)."""
        return resident_pages(self._map)

    def close(self) -> None:
        """Unmap and close the file (views of `vectors` must be gone)."""
        self.vectors = np.empty((0, self.d), dtype=np.float32)
        self._map.close()
        os.close(self._fd)


def resident_pages(mapping: mmap.mmap) -> int:
    """The number of pages of a file mapping that are in the page cache (Linux `mincore`).

    Raises:
        OSError: `mincore` failed.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    length = len(mapping)
    n_pages = (length + PAGE_BYTES - 1) // PAGE_BYTES
    address = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    out = np.zeros(n_pages, dtype=np.uint8)
    done = libc.mincore(
        ctypes.c_void_p(address), ctypes.c_size_t(length), out.ctypes.data_as(ctypes.c_char_p)
    )
    if done != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mincore failed: {os.strerror(err)}")
    return int((out & 1).sum())
