"""A compressed index built from a flat faiss file, re-ranked exactly from that same file.

Search-R1's `e5_Flat.index` (21M x 768 fp32, 64.6 GB) cannot sit in the memory of one ordinary
box. `compress_flat_index` builds a small IVF index from it, with no re-encoding of a single
passage:

1. a seeded uniform sample of rows trains the coarse quantizer (k-means, `nlist` cells, with an
   HNSW graph over the centroids) and the codes;
2. every row is then read once, in chunks of `chunk_rows`, with `pread` into one reused buffer
   (the chunk's page cache is dropped after use) and added to the index;
3. the index is written to `DIR/index.faiss` with `DIR/compressed.json` (the preset, the
   factory string, the flat file's fingerprint, the build's seed and threads, and the search
   defaults).

Peak memory of the build is about
`4·d·n_train + n·(code_bytes + 8) + 4·d·nlist·(1 + 2·hnsw_m/d) + 3·4·d·chunk_rows` bytes: the
training sample, the growing index (codes and 8-byte ids), the centroids with their graph, and a
chunk with faiss's temporaries (faiss trains the codes on a subsample of at most a few thousand
rows, so they add little). For wiki-18 with the default preset (21.0M rows, `nlist` 65,536,
30 training rows per cell, `rabitqfs`'s 128 bytes a row with its id and block padding) that is
6.0 + 2.7 + 0.2 + 0.6 GB, about 9.5 GB.

The fast-scan presets' lists (rabitqfs's codes) are stored beside the index, not in it
(`retrieval.ivf_lists`): faiss cannot map them, and reading them all at open took most of a cold
start. `CompressedIndex` maps them and copies a list into memory when a query first probes it,
then the rest in a background thread after the first search.

`CompressedIndex` serves it: the IVF codes are in memory (the bytes each query reads), and the
`k·k_factor` best candidates of each query are re-scored exactly, in C++, from the flat file,
memory-mapped read-only (`retrieval.faiss_files.FlatVectors`): no copy, only the pages of the
candidates come into the page cache, which the OS may evict. `k_factor` 0 skips the re-rank (and
the flat file).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from retrieval.errors import IndexFileError, IndexFormatError, IndexMismatchError
from retrieval.faiss_files import FlatVectors, file_fingerprint, read_index
from retrieval.index_files import (
    FileWatch,
    atomic_directory,
    build_lock,
    check_out,
    check_sizes,
    file_table,
    table_from_json,
    table_to_json,
    verify_hashes,
)
from retrieval.ivf_lists import LIST_FILES, LazyLists, has_split_lists, split_lists, splittable

__all__ = [
    "COMPRESSED_NAME",
    "PRESETS",
    "SEARCH_LAWS",
    "CompressConfig",
    "CompressedIndex",
    "Preset",
    "SearchDefaults",
    "SearchLaw",
    "check_compressed_files",
    "check_compressed_record",
    "compress_flat_index",
    "fitted_search",
    "read_compressed_record",
    "rerank",
]

log = logging.getLogger(__name__)

COMPRESSED_NAME = "compressed.json"
_INDEX_NAME = "index.faiss"
_SCHEMA_VERSION = 1

Preset = Literal[
    "rabitqfs",
    "rabitqfs2",
    "pq96fs",
    "pq192fs",
    "opq96fs",
    "rabitq4",
    "rabitq3",
    "rabitqfs4",
    "sq4",
    "sq8",
    "hnsw-sq8",
]
PRESETS: dict[str, str] = {
    "rabitqfs": "IVF{nlist}_HNSW32,RaBitQfs",
    "rabitqfs2": "IVF{nlist}_HNSW32,RaBitQfs2",
    "pq96fs": "IVF{nlist}_HNSW32,PQ96x4fs",
    "pq192fs": "IVF{nlist}_HNSW32,PQ192x4fs",
    "opq96fs": "OPQ96_{d},IVF{nlist}_HNSW32,PQ96x4fs",
    "rabitq4": "IVF{nlist}_HNSW32,RaBitQ4",
    "rabitq3": "IVF{nlist}_HNSW32,RaBitQ3",
    "rabitqfs4": "IVF{nlist}_HNSW32,RaBitQfs4",
    "sq4": "IVF{nlist}_HNSW32,SQ4",
    "sq8": "IVF{nlist}_HNSW32,SQ8",
    "hnsw-sq8": "HNSW32,SQ8",
}
"""Preset name -> faiss factory string. `rabitqfs`: RaBitQ's 1-bit codes (96 bytes at d = 768,
with per-row correction factors) scanned with faiss's fast-scan kernels, meant to be re-ranked
from the flat file; `rabitqfs2`, `rabitqfs4`: the same with 1 and 3 extra bits a dimension
that re-estimate the fast scan's best; `pq*fs`: 4-bit fast-scan product codes (96
sub-quantizers make 48-byte codes); `rabitq*`, `sq4`: 3-4 bits per dimension; `sq8`,
`hnsw-sq8`: 8 bits per dimension, the near-lossless references."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchDefaults:
    """Search settings a compressed index is served with unless told otherwise."""

    nprobe: int = 64
    """IVF cells scanned per query"""
    k_factor: int = 32
    """candidates re-ranked exactly from the flat file, per hit asked for (0: no re-rank)"""
    ef_search: int = 0
    """HNSW candidate list over the centroids (or over the vectors for hnsw-sq8); 0 picks
    max(2·nprobe, 64)"""

    def __post_init__(self) -> None:
        if self.nprobe < 1 or self.k_factor < 0 or self.ef_search < 0:
            raise ValueError(f"nprobe must be >= 1, k_factor and ef_search >= 0: {self}")

    @property
    def ef(self) -> int:
        """The HNSW candidate list size actually used."""
        return self.ef_search or max(2 * self.nprobe, 64)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompressConfig:
    """How `compress_flat_index` builds."""

    preset: Preset = "rabitqfs"
    """the index family (`PRESETS`; docs/decisions.md, "Wiki-18 on one CPU box",
    says why rabitqfs)"""
    nlist: int = 0
    """IVF cells; 0 picks n / 320 (65,536 for wiki-18), so that lists hold about 320 rows"""
    train_per_list: int = 30
    """training rows per IVF cell (faiss's k-means wants 39 or more and warns below; 30 at
    wiki scale keeps the sample at 6 GB; the k-means time: benchmarks/RESULTS.md, "Wiki scale:
    search speed and memory")"""
    max_train: int = 2_000_000
    """cap on the training sample"""
    chunk_rows: int = 65_536
    """rows read and added per step (about 200 MB at d = 768)"""
    seed: int = 0
    """seeds the sample and k-means"""
    search: SearchDefaults = SearchDefaults()
    """what `CompressedIndex` uses unless told otherwise"""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r}: choose one of {sorted(PRESETS)}")
        if self.nlist < 0 or self.train_per_list < 1 or self.chunk_rows < 1 or self.max_train < 1:
            raise ValueError(f"nlist >= 0, train_per_list, chunk_rows, max_train >= 1: {self}")

    def nlist_for(self, n: int) -> int:
        """The IVF cell count for `n` rows."""
        return self.nlist or max(1, round(n / 320))

    def factory(self, n: int, d: int) -> str:
        """The faiss factory string for `n` rows of dimension `d`."""
        return PRESETS[self.preset].format(nlist=self.nlist_for(n), d=d)

    def n_train(self, n: int) -> int:
        """Training rows for `n` rows."""
        if self.preset == "hnsw-sq8":
            return min(n, 100_000)  # SQ8 trains per-dimension ranges only
        return min(n, self.max_train, max(self.train_per_list * self.nlist_for(n), 10_000))


def _is_ivf(preset: str) -> bool:
    return PRESETS[preset].startswith(("IVF", "OPQ"))


def _read_rows(fd: int, flat: FlatVectors, rows: np.ndarray, buffer: np.ndarray) -> np.ndarray:
    """Copy sorted `rows` of the flat file into `buffer[: len(rows)]`, one `pread` per run."""
    row_bytes = 4 * flat.d
    out = buffer[: len(rows)]
    view = out.reshape(-1).view(np.uint8)
    i = 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and rows[j] == rows[j - 1] + 1:
            j += 1
        offset = flat.offset + int(rows[i]) * row_bytes
        got = os.preadv(fd, [view[i * row_bytes : j * row_bytes].data], offset)
        if got != (j - i) * row_bytes:
            raise IndexFormatError(f"{flat.path}: short read at row {rows[i]}")
        i = j
    return out


def compress_flat_index(
    flat_path: str | Path,
    out_dir: str | Path,
    config: CompressConfig | None = None,
    *,
    n_rows: int | None = None,
    centroids: np.ndarray | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Build a compressed index from a faiss flat file and write it to `out_dir`.

    Args:
        flat_path: an `IndexFlatIP` / `IndexFlatL2` file (Search-R1's `e5_Flat.index`).
        out_dir: the directory to write (`index.faiss`, `compressed.json`, the lists). The
            build goes into a new directory beside it that then takes its place in one atomic
            rename, so a kill leaves the old index or the new one, never a mix.
        config: preset, cells, sample and chunk sizes, seed, search defaults.
        n_rows: index only the first `n_rows` rows (benchmarks at several sizes); None: all.
        centroids: IVF centroids (nlist, d) from an earlier build over the same rows, which
            skips k-means (the codes are still trained); None: train them.
        progress: draw a tqdm bar over the chunks.

    Returns:
        The record written to `compressed.json`.

    Raises:
        IndexFormatError: the flat file is not a faiss flat index.
        ValueError: `n_rows` is out of range.
        IndexFormatError: `out_dir` exists and is not a compressed index directory, or is a
            symbolic link or a mount point.
        IndexBusyError: another build into `out_dir` is running (its PID is named).
    """
    out_dir = Path(out_dir)
    # refused before the sample is read and k-means trained, not at the end of an hour's build
    check_out(out_dir, marker=COMPRESSED_NAME, overwrite=True)
    with build_lock(out_dir):
        return _compress_flat_index(
            flat_path, out_dir, config, n_rows=n_rows, centroids=centroids, progress=progress
        )


def _compress_flat_index(
    flat_path: str | Path,
    out_dir: str | Path,
    config: CompressConfig | None,
    *,
    n_rows: int | None,
    centroids: np.ndarray | None,
    progress: bool,
) -> dict[str, Any]:
    import faiss

    config = config or CompressConfig()
    flat_path = Path(flat_path)
    out_dir = Path(out_dir)
    flat = FlatVectors(flat_path)
    n = flat.n if n_rows is None else n_rows
    if not 1 <= n <= flat.n:
        raise ValueError(f"n_rows={n_rows}: the flat file holds {flat.n} rows")
    d = flat.d
    metric = faiss.METRIC_INNER_PRODUCT if flat.metric == "inner_product" else faiss.METRIC_L2
    factory = config.factory(n, d)
    start = time.perf_counter()
    index = faiss.index_factory(d, factory, metric)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.cp.seed = config.seed
        ivf.cp.verbose = False
        if centroids is not None:
            if centroids.shape != (ivf.nlist, d):
                raise ValueError(f"centroids of shape {centroids.shape}, expected {(ivf.nlist, d)}")
            # a quantizer that holds nlist vectors is not trained again (faiss IndexIVF::train)
            ivf.quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    elif centroids is not None:
        raise ValueError(f"preset {config.preset} has no IVF centroids to reuse")
    log.info("compressing %d rows of dim %d from %s as %s", n, d, flat_path, factory)

    fd = os.open(flat_path, os.O_RDONLY)
    try:
        n_train = config.n_train(n)
        rng = np.random.default_rng(config.seed)
        rows = np.sort(rng.choice(n, size=n_train, replace=False))
        sample = np.empty((n_train, d), dtype=np.float32)
        _read_rows(fd, flat, rows, sample)
        train_start = time.perf_counter()
        index.train(sample)
        train_s = time.perf_counter() - train_start
        del sample
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

        add_start = time.perf_counter()
        buffer = np.empty((config.chunk_rows, d), dtype=np.float32)
        for lo in tqdm(
            range(0, n, config.chunk_rows), desc="add", unit="chunk", disable=not progress
        ):
            hi = min(n, lo + config.chunk_rows)
            chunk = _read_rows(fd, flat, np.arange(lo, hi), buffer)
            index.add(chunk)
            # the rows are read once: their page cache would only crowd out the server's
            os.posix_fadvise(
                fd, flat.offset + lo * 4 * d, (hi - lo) * 4 * d, os.POSIX_FADV_DONTNEED
            )
        add_s = time.perf_counter() - add_start
    finally:
        os.close(fd)
        flat.close()

    with atomic_directory(out_dir, marker=COMPRESSED_NAME) as work:
        # fast-scan lists go beside the index, where they can be read (retrieval.ivf_lists)
        list_bytes = split_lists(index, work) if splittable(index) else 0
        faiss.write_index(index, str(work / _INDEX_NAME))
        record: dict[str, Any] = {
            "schema_version": _SCHEMA_VERSION,
            "kind": "compressed",
            "preset": config.preset,
            "factory": factory,
            "n_rows": n,
            "dim": d,
            "metric": flat.metric,
            "nlist": config.nlist_for(n) if _is_ivf(config.preset) else 0,
            "n_train": n_train,
            "centroids": "given" if centroids is not None else "trained",
            "seed": config.seed,
            "threads": faiss.omp_get_max_threads(),
            "flat_file": str(flat_path.resolve()),
            "flat_fingerprint": file_fingerprint(flat_path),
            "flat_rows": flat.n,
            "index_bytes": (work / _INDEX_NAME).stat().st_size + list_bytes,
            "lists": "split" if list_bytes else "in-index",
            "train_s": round(train_s, 3),
            "add_s": round(add_s, 3),
            "build_s": round(time.perf_counter() - start, 3),
            "search": asdict(config.search),
            # the table of the files above: checked at open, and part of the served index id
            "files": table_to_json(file_table(work, exclude={COMPRESSED_NAME})),
        }
        (work / COMPRESSED_NAME).write_text(json.dumps(record, indent=2) + "\n")
    log.info(
        "compressed index %s: %d rows, %.1f MB (%.1f B/row), built in %.1f s",
        out_dir,
        n,
        record["index_bytes"] / 1e6,
        record["index_bytes"] / n,
        record["build_s"],
    )
    return record


def read_compressed_record(directory: str | Path) -> dict[str, Any]:
    """The `compressed.json` of a compressed index directory.

    Raises:
        IndexFormatError: it is missing, not JSON, or of another schema version.
    """
    path = Path(directory) / COMPRESSED_NAME
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise IndexFormatError(
            f"{path}: cannot read it ({err}); build one with `tracerl index compress`"
        ) from err
    if record.get("schema_version") != _SCHEMA_VERSION or record.get("kind") != "compressed":
        raise IndexFormatError(f"{path}: not a compressed index of schema {_SCHEMA_VERSION}")
    return record


_LAYOUTS = ("split", "in-index")
"""Where a compressed index keeps its IVF lists: in `LIST_FILES` beside `index.faiss`, or in it."""


def check_compressed_record(directory: str | Path, record: dict[str, Any]) -> None:
    """Check that `compressed.json` agrees with itself: a known lists layout its table serves.

    A table that lists the split list files under `"lists": "in-index"` would open the empty
    lists `index.faiss` keeps once they are split out: every query 0 hits. So would a split
    layout whose table misses one of them, and no table can lack `index.faiss`.

    Raises:
        IndexFormatError: the layout is unknown, or contradicts the table.
        IndexFileError: the table lacks a file the layout needs.
    """
    source = Path(directory) / COMPRESSED_NAME
    if "files" not in record:
        return
    table = table_from_json(record["files"], source=str(source))
    listed = [name for name in LIST_FILES if name in table]
    layout = record.get("lists", "split" if listed else "in-index")
    if layout not in _LAYOUTS:
        raise IndexFormatError(
            f"{source}: unknown lists layout {str(layout)[:40]!r} (expected one of "
            f"{list(_LAYOUTS)}); the record was edited or written by another tool: rebuild it "
            "with `tracerl index compress --overwrite`"
        )
    if _INDEX_NAME not in table:
        raise IndexFileError(
            Path(directory) / _INDEX_NAME,
            "is not in compressed.json's file table, and a compressed index cannot open without "
            "it; rebuild the index",
        )
    if layout == "split" and len(listed) != len(LIST_FILES):
        missing = next(name for name in LIST_FILES if name not in table)
        raise IndexFileError(
            Path(directory) / missing,
            'is not in compressed.json\'s file table, but its lists are split ("lists": '
            '"split") and are read from it; rebuild the index',
        )
    if layout == "in-index" and listed:
        raise IndexFormatError(
            f'{source} says "lists": "in-index", but its file table lists '
            f"{', '.join(listed)}: the lists are in those files and {_INDEX_NAME} holds empty "
            "ones, so every query would get no hits; the record was edited: rebuild the index"
        )


def check_compressed_files(directory: str | Path, *, hashes: bool = False) -> None:
    """Compare a compressed directory's files with `compressed.json`'s table.

    Sizes and names always, and the record against itself (`check_compressed_record`);
    `hashes` also hashes every file. A directory written before the table existed is only
    warned about, except under `hashes`, which has nothing to check it against.

    Raises:
        IndexFormatError: `compressed.json` is missing or malformed, contradicts itself, or
            has no table under `hashes`.
        IndexFileError: naming the missing, resized, changed or extra file.
    """
    directory = Path(directory)
    record = read_compressed_record(directory)
    if "files" not in record:
        if hashes:
            raise IndexFormatError(
                f"cannot verify {directory}: its {COMPRESSED_NAME} has no file table (it was "
                "written before compressed.json listed its files), so there is nothing to check "
                "its files against; rebuild it (`tracerl index compress --overwrite`)"
            )
        log.warning(
            "%s was written before compressed.json listed its files: they are not checked; "
            "rebuild it (`tracerl index compress --overwrite`) to get the checks",
            directory,
        )
        return
    check_compressed_record(directory, record)
    table = table_from_json(record["files"], source=str(directory / COMPRESSED_NAME))
    check_sizes(directory, table, exclude={COMPRESSED_NAME})
    if hashes:
        verify_hashes(directory, table)


class CompressedIndex:
    """A compressed index directory, searched with an exact re-rank from its flat file.

    Has `ntotal`, `d` and `search(vectors, k) -> (scores, ids)` like a faiss index, so
    `PrebuiltRetriever` serves it with a corpus and an encoder.

    Args:
        directory: written by `compress_flat_index`.
        flat_path: the flat file to re-rank from; None: the one the directory names. Needed
            unless `search.k_factor` is 0.
        search: search settings; None: the directory's defaults.

    Raises:
        IndexFormatError: a file is unreadable.
        IndexFileError: a file is missing, of another size than `compressed.json` records,
            or not in its table.
        IndexMismatchError: the flat file is not the one the index was built from.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        flat_path: str | Path | None = None,
        search: SearchDefaults | None = None,
    ) -> None:
        import faiss

        self.directory = Path(directory)
        self.record = read_compressed_record(self.directory)
        self.settings = search or SearchDefaults(**self.record["search"])
        self._lists: LazyLists | None = None
        self.check_files()
        split = (
            self.record.get("lists", "split" if has_split_lists(self.directory) else "") == "split"
        )
        if split and not has_split_lists(self.directory):  # a directory without a file table
            missing = [name for name in LIST_FILES if not (self.directory / name).is_file()]
            raise IndexFileError(self.directory / missing[0], "is missing; rebuild the index")
        # read, not mapped: the centroids and graph are small, and a mapping of a file that
        # shrinks later kills the process with SIGBUS
        self._index = read_index(self.directory / _INDEX_NAME, mmap=False)
        watched = [self.directory / _INDEX_NAME]
        if split:  # the lists come in as queries probe them
            self._lists = LazyLists(self._index, self.directory)
            watched += [self.directory / name for name in LIST_FILES]
        self.ntotal = int(self._index.ntotal)
        self.d = int(self._index.d)
        ivf_lists: Any = faiss.try_extract_index_ivf(self._index)
        in_lists = -1 if split or ivf_lists is None else int(ivf_lists.invlists.compute_ntotal())
        if in_lists not in (-1, self.ntotal):
            raise IndexFileError(
                self.directory / _INDEX_NAME,
                f"holds {in_lists} rows in its lists but says {self.ntotal}: its lists were "
                "split out and compressed.json does not say so (every query would get no "
                "hits); rebuild the index",
            )
        self._flat: FlatVectors | None = None
        if self.settings.k_factor > 0:
            path = Path(flat_path if flat_path is not None else self.record["flat_file"])
            if not path.is_file():
                raise IndexFormatError(
                    f"flat file {path} not found: pass the e5_Flat.index the index was built "
                    "from (--faiss-index), or serve without re-ranking (--k-factor 0)"
                )
            if file_fingerprint(path) != self.record["flat_fingerprint"]:
                raise IndexMismatchError(
                    f"{path} is not the flat file {self.directory} was built from (fingerprint "
                    f"{file_fingerprint(path)}, expected {self.record['flat_fingerprint']})"
                )
            self._flat = FlatVectors(path)
            watched.append(path)
        self._watch = FileWatch(watched)
        self._ivf = faiss.try_extract_index_ivf(self._index)
        self._ip = self.record["metric"] == "inner_product"
        self.set_search(self.settings)

    def check_files(self, *, hashes: bool = False) -> None:
        """`check_compressed_files` of this index's directory."""
        check_compressed_files(self.directory, hashes=hashes)

    @property
    def nlist(self) -> int:
        """IVF cells (0 for an HNSW index)."""
        return int(self._ivf.nlist) if self._ivf is not None else 0

    def set_search(self, settings: SearchDefaults) -> None:
        """Change nprobe / k_factor / ef_search (k_factor > 0 needs the flat file opened).

        Raises:
            ValueError: a re-rank is asked for, but the index was opened without its flat file.
        """
        import faiss

        if settings.k_factor > 0 and self._flat is None:
            raise ValueError("k_factor > 0 needs the flat file; open the index with k_factor > 0")
        self.settings = settings
        hnsw = faiss.SearchParametersHNSW(efSearch=settings.ef)  # type: ignore[attr-defined]
        if self._ivf is not None:
            self._params: Any = faiss.SearchParametersIVF(  # type: ignore[call-arg]
                nprobe=settings.nprobe, quantizer_params=hnsw
            )
        else:
            self._params = hnsw

    def centroids(self) -> np.ndarray:
        """The IVF centroids (nlist, d), to reuse in another build over the same rows."""
        if self._ivf is None:
            raise ValueError(f"{self.directory} is not an IVF index")
        return np.asarray(self._ivf.quantizer.reconstruct_n(0, self._ivf.nlist))

    def coarse(self, vectors: np.ndarray) -> np.ndarray:
        """The `nprobe` IVF cells each query scans, (Q, nprobe) (the coarse quantizer's step)."""
        if self._ivf is None:
            raise ValueError(f"{self.directory} is not an IVF index")
        hnsw = self._params.quantizer_params
        _, cells = self._ivf.quantizer.search(vectors, self.settings.nprobe, params=hnsw)
        return np.asarray(cells)

    def close(self) -> None:
        """Unmap the flat file and close the list files."""
        if self._lists is not None:
            self._lists.close()
        if self._flat is not None:
            self._flat.close()
            self._flat = None

    @property
    def flat(self) -> FlatVectors | None:
        """The mapped flat file re-ranked from (None without re-rank)."""
        return self._flat

    def describe(self) -> dict[str, Any]:
        """What a manifest records of this index (its build and search settings)."""
        return {
            "index_file": str(self.directory),
            "compressed": {k: v for k, v in self.record.items() if k != "search"},
            "search": asdict(self.settings),
        }

    def candidates(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The compressed index's own top `k·k_factor` (top `k` without re-rank), best first."""
        import faiss

        n_candidates = min(self.ntotal, k * max(1, self.settings.k_factor))
        if self._lists is None or self._lists.complete.is_set():
            scores, ids = self._index.search(vectors, n_candidates, params=self._params)
            return scores, ids
        # lists still loading: the cells to probe first, then only their lists are awaited
        ivf: Any = self._ivf  # the IVF index itself (split lists: no pre-transform in front)
        distances, cells = ivf.quantizer.search(
            vectors, self.settings.nprobe, params=self._params.quantizer_params
        )
        self._lists.ensure(cells)
        scores = np.empty((len(vectors), n_candidates), dtype=np.float32)
        ids = np.empty((len(vectors), n_candidates), dtype=np.int64)
        # the same answers as search(): the same cells, the same codes (the SWIG call: faiss's
        # Python wrapper of search_preassigned takes no search parameters)
        ivf.search_preassigned_c(
            len(vectors),
            faiss.swig_ptr(vectors),
            n_candidates,
            faiss.swig_ptr(np.ascontiguousarray(cells)),
            faiss.swig_ptr(np.ascontiguousarray(distances)),
            faiss.swig_ptr(scores),
            faiss.swig_ptr(ids),
            False,
            self._params,
        )
        return scores, ids

    @property
    def lists(self) -> LazyLists | None:
        """The IVF lists loaded on demand (None: the index file holds them)."""
        return self._lists

    def load_lists(self) -> None:
        """Load every list now and wait: the state a server reaches after its first search."""
        if self._lists is not None:
            self._lists.load_rest_in_background()
            self._lists.wait()

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top `k` rows per query, scored exactly from the flat file when re-ranking.

        Args:
            vectors: float32 queries, (Q, d).
            k: hits per query.

        Returns:
            (scores, ids), each (Q, k); missing hits have id -1.
        """
        self._watch.check()
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        scores, ids = self.candidates(vectors, k)  # (Q, k·k_factor)
        if ids.size and int(ids.max()) >= self.ntotal:
            # faiss's re-rank stops at the first bad id, and the corpus has no such row
            raise IndexFileError(
                self.directory / ("lists.ids" if self._lists is not None else _INDEX_NAME),
                f"holds row id {int(ids.max())}, past the index's {self.ntotal} rows: it is "
                "damaged; check it with `tracerl index verify` and rebuild",
            )
        if self._flat is not None:
            scores, ids = rerank(self._flat, vectors, ids, k, inner_product=self._ip)
        if self._lists is not None:  # after the first answer, not competing with it
            self._lists.load_rest_in_background()
        return scores[:, :k], ids[:, :k]


def rerank(
    flat: FlatVectors, vectors: np.ndarray, ids: np.ndarray, k: int, *, inner_product: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top `k` among candidate rows `ids` (Q, m), scored from the flat file's rows.

    faiss's `knn_inner_products_by_idx` / `knn_L2sqr_by_idx` score the candidates in C++ straight
    from the mapped rows, one OpenMP task per query: no gathered copy, several times faster than
    numpy's gather and product (benchmarks/RESULTS.md, "Wiki scale: search speed and memory").
    Candidates are read up to a query's first
    -1 (faiss pads short result lists at the end).

    Returns:
        (scores, ids), each (Q, k): inner products, or squared L2 distances, best first;
        missing hits have id -1 (and faiss's worst score, -/+3.4e38).
    """
    import faiss

    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    n_q, m = ids.shape
    scores = np.empty((n_q, k), dtype=np.float32)
    out_ids = np.empty((n_q, k), dtype=np.int64)
    # faiss's SWIG functions: present since faiss 1.7, not in its type information
    scorer = faiss.knn_inner_products_by_idx if inner_product else faiss.knn_L2sqr_by_idx  # type: ignore[attr-defined]
    scorer(
        faiss.swig_ptr(vectors),
        faiss.swig_ptr(flat.vectors),
        faiss.swig_ptr(ids),
        flat.d,
        n_q,
        flat.n,
        m,
        k,
        faiss.swig_ptr(scores),
        faiss.swig_ptr(out_ids),
        m,  # the row stride of ids; faiss's default (-1) strides by ny, not by m
    )
    return scores, out_ids


@dataclass(frozen=True, slots=True)
class SearchLaw:
    """Search settings that met 10-recall@10 >= 0.98 against exact flat, as laws in N.

    nprobe = `nprobe_scale` · (N / 10⁶) ** `nprobe_power` and k_factor likewise, fitted by
    `benchmarks/perf/retrieval_scale.py` on its e5 stand-in (docs/decisions.md, "Wiki-18 on one
    CPU box"); beyond the largest N measured they are extrapolations.
    """

    nprobe_scale: float
    nprobe_power: float
    k_factor_scale: float
    k_factor_power: float

    def at(self, n: int) -> SearchDefaults:
        """The settings for `n` rows (nprobe at least 8, k_factor at least 1)."""
        millions = n / 1e6
        return SearchDefaults(
            nprobe=max(8, math.ceil(self.nprobe_scale * millions**self.nprobe_power)),
            k_factor=max(1, math.ceil(self.k_factor_scale * millions**self.k_factor_power)),
        )


SEARCH_LAWS: dict[str, SearchLaw] = {
    # goal nprobe 3, 4, 6 and k_factor 2, 2, 4 at 0.125, 0.25, 0.5M rows: 38 and 24 at 21.0M
    "rabitqfs": SearchLaw(8.32, 0.50, 5.04, 0.50),
    # goal nprobe 2, 3, 6 and k_factor 16, 16, 32: 111 and 185 at 21.0M
    "pq192fs": SearchLaw(9.91, 0.79, 40.3, 0.50),
}
"""Fitted laws by preset; a preset without one is served with the default preset's."""


def fitted_search(preset: str, n: int) -> SearchDefaults:
    """The served defaults for `preset` over `n` rows (`SEARCH_LAWS`)."""
    return SEARCH_LAWS.get(preset, SEARCH_LAWS[CompressConfig().preset]).at(n)
