"""Every index kind answers 409 on damage, never 500 (issue 42): BM25 arrays that point past
the corpus, and a dense index that names a row the corpus lacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from retrieval import BM25Retriever, DenseRetriever, load_index
from retrieval.errors import IndexFileError

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["capital of Italy", "river Paris", "Konrad Zuse", "mountains", "capital", "city"]


def _damage_indices(directory: Path) -> None:
    """Point a few document ids past the corpus, in place and at the same size."""
    ids = np.load(directory / "bm25s" / "indices.csc.index.npy", mmap_mode="r+")
    ids[:: max(1, len(ids) // 7)] = 1_048_810  # what 20 bit flips made in the probe
    ids.flush()
    del ids


@pytest.fixture
def damaged(tmp_path: Path, toy_bm25: BM25Retriever) -> Path:
    toy_bm25.save(tmp_path / "bm25")
    _damage_indices(tmp_path / "bm25")
    return tmp_path / "bm25"


def test_damaged_bm25_arrays_are_refused_at_open_when_read(damaged: Path) -> None:
    with pytest.raises(IndexFileError, match=r"indices\.csc\.index\.npy is damaged .*past the"):
        load_index(damaged)


def test_damaged_bm25_arrays_mapped_raise_the_typed_error_at_search(damaged: Path) -> None:
    retriever = load_index(damaged, mmap=True)  # mapped arrays are not read through at open
    with pytest.raises(IndexFileError, match=r"fail a search .*the index is damaged"):
        for query in QUERIES:
            retriever.search([query], 3)


def test_a_server_on_damaged_bm25_answers_409_never_500(damaged, server_cls, tmp_path) -> None:
    server = server_cls(damaged, tmp_path / "server.log", "--mmap")
    server.start()  # port 0: the OS picks it, the ready line names it
    try:
        statuses = []
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for query in QUERIES:
                response = http.post("/retrieve", json={"queries": [query], "topk": 3})
                statuses.append(response.status_code)
                if response.status_code == 409:
                    assert "damaged" in response.json()["detail"]
            assert http.get("/health").status_code == 200  # still alive
    finally:
        server.stop()
    assert 500 not in statuses and 409 in statuses
    assert set(statuses) <= {200, 409}
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_server_refuses_to_start_on_damaged_bm25_read_into_memory(damaged: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "serve-retriever", "--index", str(damaged),
         "--port", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "is damaged" in done.stderr


def test_a_dense_index_naming_a_row_past_the_corpus_raises_the_typed_error(
    toy_docs, hash_encoder
) -> None:
    retriever = DenseRetriever.build(toy_docs, hash_encoder)
    real = retriever._index

    class Damaged:  # what a flipped HNSW link or IVF id gives back
        ntotal = real.ntotal

        def search(self, vectors, k, params=None):
            scores, rows = real.search(vectors, k, params=params)
            rows[0, 0] = len(toy_docs) + 5
            return scores, rows

    retriever._index = Damaged()
    with pytest.raises(IndexFileError, match="past the corpus's 8 documents"):
        retriever.search(["capital of Italy"], 2)
