"""A memory-mapped index is mapped, not copied: its file does not land in anonymous memory.

faiss's `IO_FLAG_MMAP` maps only IVF inverted lists; a flat or HNSW file read with it is copied
whole into anonymous memory. Each case runs in a fresh subprocess, which reads its own
`/proc/self/smaps_rollup` before and after loading, so the test process's memory cannot blur
the figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

ROOT = Path(__file__).resolve().parents[2]
N_VECTORS, DIM = 20_000, 768  # a 61 MB file: far above the noise of a Python process

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").is_file(), reason="needs Linux /proc/self/smaps_rollup"
)

_MEASURE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})

    def anonymous_bytes():
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024

    import faiss, numpy  # imported before the first reading: their memory is not the index's
    from retrieval.faiss_files import read_index
    from retrieval.dense import DenseRetriever
    {setup}
    before = anonymous_bytes()
    {load}
    after = anonymous_bytes()
    {use}
    print(json.dumps({{"added": after - before}}))
    """
)


def _added_anonymous_bytes(setup: str, load: str, use: str = "") -> int:
    code = _MEASURE.format(root=str(ROOT), setup=setup, load=load, use=use)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["added"]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((N_VECTORS, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("mapped")
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    hnsw = faiss.IndexHNSWFlat(DIM, 4, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors[:5_000])
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, 16, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors[:2_000])
    ivf.add(vectors)
    paths = {}
    for name, index in (("flat", flat), ("hnsw", hnsw), ("ivf", ivf)):
        paths[name] = folder / f"{name}.index"
        faiss.write_index(index, str(paths[name]))
    return paths


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_mapped_index_adds_almost_no_anonymous_memory(files: dict[str, Path], kind: str) -> None:
    path = files[kind]
    size = path.stat().st_size
    load = f"index = read_index({str(path)!r}, mmap=True)"
    # a search reads every row: the pages it faults in are file-backed, not anonymous
    use = "index.search(numpy.ones((1, index.d), dtype='float32'), 3)"
    mapped = _added_anonymous_bytes("", load, use)
    assert mapped < 0.05 * size, f"{kind}: {mapped / 2**20:.1f} MiB added for {size / 2**20} MiB"


def test_the_measurement_sees_a_copied_index(files: dict[str, Path]) -> None:
    # without the mapping the whole file lands in anonymous memory: the probe above can fail
    path = files["flat"]
    copied = _added_anonymous_bytes("", f"index = read_index({str(path)!r}, mmap=False)")
    assert copied > 0.9 * path.stat().st_size


def test_a_dense_index_directory_loads_mapped(
    tmp_path: Path, vectors: np.ndarray, hash_encoder_cls: type
) -> None:
    from retrieval import DenseRetriever, Document

    n_docs = 2_000  # few documents, long vectors: the index is 60 MB, the corpus 60 kB
    long_vectors = vectors.reshape(n_docs, -1)

    class Fixed(hash_encoder_cls):
        def encode(self, texts, *, progress: bool = False):
            return long_vectors[: len(texts)]

    encoder = Fixed(dim=long_vectors.shape[1])
    documents = [Document(doc_id=str(i), title="", text=f"p{i}") for i in range(n_docs)]
    DenseRetriever.build(documents, encoder, index_type="flat").save(tmp_path)
    size = (tmp_path / "index.faiss").stat().st_size
    setup = textwrap.dedent(
        f"""
        sys.path.insert(0, {str(ROOT / "tests" / "retrieval")!r})
        from conftest import HashEncoder
        encoder = HashEncoder(dim={long_vectors.shape[1]})
        """
    )
    load = f"retriever = DenseRetriever.load({str(tmp_path)!r}, encoder, mmap=True)"
    use = "retriever.search(['p1'], 3)"
    added = _added_anonymous_bytes(setup, load, use)
    assert added < 0.05 * size, f"{added / 2**20:.1f} MiB added for {size / 2**20:.0f} MiB"


def test_a_compressed_index_opens_without_reading_its_fast_scan_lists(
    tmp_path: Path, vectors: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # faiss reads fast-scan lists into memory whatever the flag; kept beside the index, they
    # are mapped, and only the lists a query probes are copied in (retrieval/ivf_lists.py)
    import retrieval.compressed as compressed

    # 80,000 rows: 9 MB of lists, far above the 0.5-1 MB a Python process's opening adds
    rng = np.random.default_rng(5)
    rows = np.concatenate([vectors + 0.1 * rng.standard_normal(vectors.shape) for _ in range(4)])
    flat = faiss.IndexFlatIP(DIM)
    flat.add(rows.astype(np.float32))
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    del flat, rows
    config = compressed.CompressConfig(preset="rabitqfs", nlist=16)
    compressed.compress_flat_index(tmp_path / "flat.index", tmp_path / "split", config)
    with monkeypatch.context() as patch:
        patch.setattr(compressed, "splittable", lambda index: False)
        compressed.compress_flat_index(tmp_path / "flat.index", tmp_path / "whole", config)
    list_bytes = sum((tmp_path / "split" / n).stat().st_size for n in ("lists.codes", "lists.ids"))
    setup = "from retrieval.compressed import CompressedIndex"
    opened = {
        name: _added_anonymous_bytes(setup, f"index = CompressedIndex({str(tmp_path / name)!r})")
        for name in ("split", "whole")
    }
    assert opened["whole"] > 0.9 * list_bytes  # the measurement sees lists read at open
    # the same opening otherwise (0.5-1 MB of Python and faiss objects either way)
    assert opened["whole"] - opened["split"] > 0.9 * list_bytes, opened
