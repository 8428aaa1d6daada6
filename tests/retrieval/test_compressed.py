"""The compressed index: built from a faiss flat file, re-ranked exactly from it, served unchanged.

Vectors are clustered (a few hundred cells of a 32-d mixture), as text embeddings are, so IVF
cells mean something; the flat file is written by faiss itself, as Search-R1 writes
`e5_Flat.index`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from fastapi.testclient import TestClient  # noqa: E402

from retrieval.cli import index as index_command  # noqa: E402
from retrieval.compressed import (  # noqa: E402
    COMPRESSED_NAME,
    SEARCH_LAWS,
    CompressConfig,
    CompressedIndex,
    SearchDefaults,
    check_compressed_files,
    compress_flat_index,
    fitted_search,
    rerank,
)
from retrieval.errors import (  # noqa: E402
    IndexChangedError,
    IndexFileError,
    IndexFormatError,
    IndexMismatchError,
)
from retrieval.faiss_files import FlatVectors  # noqa: E402
from retrieval.index_files import file_table, table_to_json  # noqa: E402
from retrieval.index_stats import exact_top_k, index_stats  # noqa: E402
from retrieval.peers import (  # noqa: E402
    gem_documents,
    gem_request,
    search_r1_documents,
    search_r1_request,
    skyrl_documents,
    skyrl_request,
)
from retrieval.prebuilt import PrebuiltRetriever  # noqa: E402
from retrieval.server import create_app  # noqa: E402

N, DIM = 6_000, 32


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((60, DIM))
    return _unit(centres[rng.integers(0, 60, N)] + 0.4 * rng.standard_normal((N, DIM)))


@pytest.fixture(scope="module")
def queries(vectors: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(1)
    return _unit(vectors[rng.integers(0, N, 50)] + 0.2 * rng.standard_normal((50, DIM)))


@pytest.fixture(scope="module")
def flat_file(tmp_path_factory: pytest.TempPathFactory, vectors: np.ndarray) -> Path:
    path = tmp_path_factory.mktemp("flat") / "e5_Flat.index"
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


@pytest.fixture(scope="module")
def sq8_dir(tmp_path_factory: pytest.TempPathFactory, flat_file: Path) -> Path:
    out = tmp_path_factory.mktemp("sq8")
    config = CompressConfig(preset="sq8", nlist=20, chunk_rows=1_000)
    compress_flat_index(flat_file, out, config)
    return out


def test_flat_vectors_are_the_rows_faiss_wrote(flat_file: Path, vectors: np.ndarray) -> None:
    flat = FlatVectors(flat_file)
    assert (flat.n, flat.d, flat.metric) == (N, DIM, "inner_product")
    assert np.array_equal(flat.vectors, vectors)
    assert np.array_equal(flat.rows(np.array([[3, 5]])), vectors[[3, 5]][None])
    flat.close()


def test_a_file_that_is_not_flat_is_refused(tmp_path: Path, vectors: np.ndarray) -> None:
    ivf = faiss.index_factory(DIM, "IVF4,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors[:500])
    ivf.add(vectors[:500])
    faiss.write_index(ivf, str(tmp_path / "ivf.index"))
    with pytest.raises(IndexFormatError, match="not a flat one"):
        FlatVectors(tmp_path / "ivf.index")


def test_a_truncated_flat_file_is_refused(tmp_path: Path, flat_file: Path) -> None:
    short = tmp_path / "short.index"
    short.write_bytes(flat_file.read_bytes()[:-100])
    with pytest.raises(IndexFormatError, match="truncated"):
        FlatVectors(short)


def test_rerank_returns_exact_scores_and_the_exact_top_10(
    sq8_dir: Path, flat_file: Path, vectors: np.ndarray, queries: np.ndarray
) -> None:
    # every cell scanned and 10x candidates: the re-ranked top 10 must be flat's own
    index = CompressedIndex(sq8_dir, search=SearchDefaults(nprobe=20, k_factor=10))
    scores, ids = index.search(queries, 10)
    exact_scores, exact_ids = exact_top_k(vectors, queries, 10)
    assert np.array_equal(ids, exact_ids)
    np.testing.assert_allclose(scores, exact_scores, rtol=1e-5)
    index.close()


@pytest.mark.parametrize("inner_product", [True, False])
def test_rerank_scores_each_candidate_exactly_and_pads_short_lists(
    flat_file: Path, vectors: np.ndarray, queries: np.ndarray, inner_product: bool
) -> None:
    rng = np.random.default_rng(3)
    ids = np.stack([rng.choice(N, 30, replace=False) for _ in queries])
    ids[0, 5:] = -1  # a short candidate list, padded as faiss pads it
    flat = FlatVectors(flat_file)
    scores, top = rerank(flat, queries, ids, 10, inner_product=inner_product)
    for q, row, got_s, got_i in zip(queries, ids, scores, top, strict=True):
        cand = np.unique(row[row >= 0])
        exact = vectors[cand] @ q if inner_product else ((vectors[cand] - q) ** 2).sum(1)
        order = np.argsort(-exact if inner_product else exact, kind="stable")[:10]
        assert set(got_i[: len(order)]) == set(cand[order])
        np.testing.assert_allclose(got_s[: len(order)], exact[order], rtol=1e-5, atol=1e-6)
    assert (top[0, 5:] == -1).all()  # 5 candidates give 5 hits
    flat.close()


def test_without_rerank_scores_are_the_codes_own(sq8_dir: Path, queries: np.ndarray) -> None:
    index = CompressedIndex(sq8_dir, search=SearchDefaults(nprobe=20, k_factor=0))
    assert index.flat is None  # the flat file is not even opened
    _, ids = index.search(queries, 10)
    assert ids.shape == (50, 10) and (ids >= 0).all()


def test_streaming_in_chunks_builds_the_same_index(
    tmp_path: Path, flat_file: Path, sq8_dir: Path, queries: np.ndarray
) -> None:
    one = tmp_path / "one"
    compress_flat_index(flat_file, one, CompressConfig(preset="sq8", nlist=20, chunk_rows=N))
    assert (one / "index.faiss").read_bytes() == (sq8_dir / "index.faiss").read_bytes()


def test_given_centroids_skip_kmeans_and_match(
    tmp_path: Path, flat_file: Path, sq8_dir: Path
) -> None:
    centroids = CompressedIndex(sq8_dir).centroids()
    out = tmp_path / "sq4"
    record = compress_flat_index(
        flat_file, out, CompressConfig(preset="sq4", nlist=20), centroids=centroids
    )
    assert record["centroids"] == "given"
    assert np.array_equal(CompressedIndex(out).centroids(), centroids)


@pytest.mark.parametrize("preset", ["pq192fs", "rabitqfs"])
def test_fast_scan_codes_with_rerank_find_the_top_10(tmp_path: Path, preset: str) -> None:
    # pq192fs splits the vectors into 192 parts: 192-d here, one dimension per 4-bit code;
    # rabitqfs keeps one bit a dimension
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((40, 192))
    x = _unit(centres[rng.integers(0, 40, 1_500)] + 0.5 * rng.standard_normal((1_500, 192)))
    q = _unit(x[:40] + 0.2 * rng.standard_normal((40, 192)))
    flat = faiss.IndexFlatIP(192)
    flat.add(x)
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    out = tmp_path / "pq"
    config = CompressConfig(preset=preset, nlist=5, search=SearchDefaults(nprobe=5, k_factor=0))
    compress_flat_index(tmp_path / "flat.index", out, config)
    _, exact = exact_top_k(x, q, 10)

    def recall(k_factor: int) -> float:
        index = CompressedIndex(out, search=SearchDefaults(nprobe=5, k_factor=k_factor))
        ids = index.search(q, 10)[1]
        return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact, strict=True)]))

    assert recall(16) >= 0.95
    assert recall(16) > recall(0)  # the exact re-rank is what lifts 1-bit and 4-bit codes


def test_another_flat_file_is_refused(tmp_path: Path, sq8_dir: Path, vectors: np.ndarray) -> None:
    other = tmp_path / "other.index"
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors[::-1].copy())
    faiss.write_index(index, str(other))
    with pytest.raises(IndexMismatchError, match="not the flat file"):
        CompressedIndex(sq8_dir, flat_path=other)


def test_stats_describe_the_geometry(flat_file: Path, sq8_dir: Path, queries: np.ndarray) -> None:
    flat = index_stats(flat_file, queries, n_pairs=2_000)
    assert flat.bytes_per_vector == pytest.approx(4 * DIM, rel=0.01)
    assert 0 < flat.gap_1_10 < flat.query_top1 <= 1.0 + 1e-6
    assert flat.gap_1_2 <= flat.gap_1_3 <= flat.gap_1_10
    compressed = index_stats(sq8_dir, queries, n_pairs=2_000)
    assert compressed.bytes_per_vector < flat.bytes_per_vector / 3  # 1 byte per dimension
    assert compressed.query_top1 == pytest.approx(flat.query_top1, abs=1e-3)
    with pytest.raises(IndexFormatError, match="dim"):
        index_stats(flat_file, queries[:, :8], n_pairs=10)


class _RowEncoder:
    """A fake encoder: query "row N" embeds as passage N's vector."""

    def __init__(self, vectors: np.ndarray) -> None:
        self._vectors = vectors
        self.name, self.fingerprint, self.dim = "rows", "rows-1", vectors.shape[1]

    def encode(self, texts, *, progress: bool = False):
        return self._vectors[[int(t.split()[-1]) for t in texts]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wiki.jsonl"
    lines = (json.dumps({"id": str(i), "contents": f'"T{i}"\npassage {i}'}) for i in range(N))
    path.write_text("\n".join(lines) + "\n")
    return path


def _rounded(value):
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def test_every_peer_client_gets_flat_s_answer_from_the_compressed_index(
    sq8_dir: Path, flat_file: Path, corpus: Path, vectors: np.ndarray
) -> None:
    encoder = _RowEncoder(vectors)
    compressed = CompressedIndex(sq8_dir, search=SearchDefaults(nprobe=20, k_factor=10))
    served = PrebuiltRetriever(compressed, corpus, encoder)
    reference = PrebuiltRetriever(flat_file, corpus, encoder)
    assert served.manifest.params["compressed"]["preset"] == "sq8"
    query = "row 17"
    with TestClient(create_app(served)) as a, TestClient(create_app(reference)) as b:
        for request, documents in (
            (search_r1_request([query, "row 9"], 3), search_r1_documents),
            (skyrl_request(query, 3), skyrl_documents),
            (gem_request(query, 3), gem_documents),
        ):
            body, headers = request
            got = a.post("/retrieve", content=body, headers=headers)
            want = b.post("/retrieve", content=body, headers=headers)
            assert got.status_code == want.status_code == 200
            # same documents in the same order; scores equal up to float rounding (numpy and
            # faiss sum the products in different orders)
            assert _rounded(documents(got.content)) == _rounded(documents(want.content))
    assert served.search([query], 1)[0][0].doc_id == "17"


def test_the_cli_compresses_and_measures(
    tmp_path: Path, flat_file: Path, queries: np.ndarray, capsys: pytest.CaptureFixture[str]
):
    out = tmp_path / "cli"
    # in-process: what `tracerl index compress|stats` runs
    assert index_command(["compress", "--faiss-index", str(flat_file), "--out", str(out),
                          "--preset", "sq8", "--nlist", "20", "--nprobe", "4"]) == 0  # fmt: skip
    record = json.loads((out / "compressed.json").read_text())
    assert record["search"]["nprobe"] == 4 and record["n_rows"] == N
    with pytest.raises(SystemExit, match="--overwrite"):  # tracerl prints it: a usage error
        index_command(["compress", "--faiss-index", str(flat_file), "--out", str(out)])
    np.save(tmp_path / "q.npy", queries)
    capsys.readouterr()
    assert index_command(["stats", str(out), "--queries", str(tmp_path / "q.npy"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["n_vectors"] == N


def test_compress_stores_the_default_preset_s_fitted_search(
    tmp_path: Path, flat_file: Path
) -> None:
    from retrieval.cli import index

    assert index(["compress", "--faiss-index", str(flat_file), "--out", str(tmp_path / "d")]) == 0
    record = json.loads((tmp_path / "d" / "compressed.json").read_text())
    assert record["preset"] == CompressConfig().preset == "rabitqfs"
    fitted = fitted_search("rabitqfs", N)
    assert record["search"] == asdict(fitted)
    law = SEARCH_LAWS["rabitqfs"]
    big = law.at(21_015_324)  # the laws grow with the rows, as fitted
    assert big.nprobe >= fitted.nprobe and big.k_factor >= fitted.k_factor
    assert fitted_search("sq4", N) == fitted  # a preset without a law gets the default's


def test_serve_retriever_flags_open_a_compressed_index(tmp_path: Path) -> None:
    from retrieval.cli import ServeConfig, _serve_retriever

    rng = np.random.default_rng(3)
    x = _unit(rng.standard_normal((2_000, 384)))  # the packaged MiniLM's dimension
    flat = faiss.IndexFlatIP(384)
    flat.add(x)
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "contents": f"p{i}"}) + "\n" for i in range(2_000))
    )
    out = tmp_path / "sq8"
    compress_flat_index(tmp_path / "flat.index", out, CompressConfig(preset="sq8", nlist=4))
    with pytest.raises(ValueError, match="needs --corpus"):
        _serve_retriever(ServeConfig(compressed=out))
    with pytest.raises(ValueError, match="two different indexes"):
        _serve_retriever(ServeConfig(compressed=out, index=tmp_path, corpus=corpus))
    with pytest.raises(ValueError, match="go with --compressed"):
        _serve_retriever(ServeConfig(faiss_index=tmp_path / "flat.index", corpus=corpus, nprobe=4))
    served = _serve_retriever(ServeConfig(compressed=out, corpus=corpus, nprobe=4, k_factor=2))
    assert served.manifest.params["search"]["nprobe"] == 4
    assert served.manifest.params["search"]["k_factor"] == 2
    hits = served.search(["anything at all"], 3)[0]
    assert len(hits) == 3 and hits[0].score >= hits[1].score >= hits[2].score


def _fast_scan_flat(tmp_path: Path, n: int, d: int) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(4)
    centres = rng.standard_normal((40, d))
    x = _unit(centres[rng.integers(0, 40, n)] + 0.5 * rng.standard_normal((n, d)))
    flat = faiss.IndexFlatIP(d)
    flat.add(x)
    faiss.write_index(flat, str(tmp_path / "flat.index"))
    return tmp_path / "flat.index", _unit(x[:30] + 0.2 * rng.standard_normal((30, d)))


def test_fast_scan_lists_load_as_queries_probe_them_with_the_same_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retrieval.compressed as compressed
    from retrieval.ivf_lists import LazyLists

    flat_path, q = _fast_scan_flat(tmp_path, 3_000, 192)
    config = CompressConfig(
        preset="rabitqfs", nlist=20, search=SearchDefaults(nprobe=3, k_factor=4)
    )
    split = compress_flat_index(flat_path, tmp_path / "split", config)
    assert split["lists"] == "split"
    assert {"lists.codes", "lists.ids", "lists.sizes.npy"} <= {
        p.name for p in (tmp_path / "split").iterdir()
    }
    with monkeypatch.context() as patch:  # the same build, its lists left inside the file
        patch.setattr(compressed, "splittable", lambda index: False)
        whole = compress_flat_index(flat_path, tmp_path / "whole", config)
    assert whole["lists"] == "in-index"
    assert split["index_bytes"] > (tmp_path / "split" / "index.faiss").stat().st_size

    started: list[LazyLists] = []
    monkeypatch.setattr(LazyLists, "load_rest_in_background", lambda self: started.append(self))
    index = CompressedIndex(tmp_path / "split")
    lists = index.lists
    assert lists is not None and lists.n_loaded == 0  # nothing read at open
    first = index.search(q[:1], 10)
    probed = np.unique(index.coarse(q[:1]))
    assert lists.n_loaded == len(probed) == 3  # only the probed lists were read
    assert started == [lists]  # the rest is asked for after the first search
    partial = index.search(q, 10)  # the preassigned path while lists are missing
    lists.ensure(np.arange(20))
    lists.complete.set()
    full = index.search(q, 10)  # faiss's own search over complete lists
    reference = CompressedIndex(tmp_path / "whole").search(q, 10)
    assert CompressedIndex(tmp_path / "whole").lists is None
    for got in (partial, full):
        assert np.array_equal(got[1], reference[1]) and np.allclose(got[0], reference[0])
    assert np.array_equal(first[1], reference[1][:1])


def test_the_background_thread_loads_every_list(tmp_path: Path) -> None:
    flat_path, q = _fast_scan_flat(tmp_path, 2_000, 64)
    config = CompressConfig(
        preset="rabitqfs", nlist=12, search=SearchDefaults(nprobe=2, k_factor=4)
    )
    compress_flat_index(flat_path, tmp_path / "idx", config)
    index = CompressedIndex(tmp_path / "idx")
    assert index.lists is not None
    before = index.search(q, 10)
    assert index.lists.wait(60) and index.lists.n_loaded == 12
    after = index.search(q, 10)
    assert np.array_equal(before[1], after[1])


def test_a_list_file_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    flat_path, _ = _fast_scan_flat(tmp_path, 1_000, 64)
    compress_flat_index(flat_path, tmp_path / "idx", CompressConfig(preset="rabitqfs", nlist=4))
    codes = tmp_path / "idx" / "lists.codes"
    codes.write_bytes(codes.read_bytes()[:-1])
    with pytest.raises(IndexFormatError, match=r"lists\.codes holds \d+ bytes"):
        CompressedIndex(tmp_path / "idx")


def _split_index(tmp_path: Path, name: str = "idx", seed: int = 0) -> tuple[Path, np.ndarray]:
    """A small fast-scan index whose lists are kept beside index.faiss (k_factor 0)."""
    flat_path, q = _fast_scan_flat(tmp_path, 1_000, 64)
    config = CompressConfig(
        preset="rabitqfs", nlist=4, seed=seed, search=SearchDefaults(nprobe=2, k_factor=0)
    )
    compress_flat_index(flat_path, tmp_path / name, config)
    return tmp_path / name, q


def _retable(directory: Path) -> None:
    """Record the directory's current files in compressed.json, as a build would have."""
    record = json.loads((directory / COMPRESSED_NAME).read_text())
    record["files"] = table_to_json(file_table(directory, exclude={COMPRESSED_NAME}))
    (directory / COMPRESSED_NAME).write_text(json.dumps(record))


@pytest.mark.parametrize("name", ["lists.codes", "lists.ids", "lists.sizes.npy"])
def test_a_missing_list_file_is_refused_not_answered_empty(tmp_path: Path, name: str) -> None:
    directory, _ = _split_index(tmp_path)
    (directory / name).unlink()
    with pytest.raises(IndexFileError, match=rf"{name} is missing") as caught:
        CompressedIndex(directory)
    assert caught.value.path == str(directory / name)
    # a directory written before the file table: refused by its own "lists": "split" record
    record = json.loads((directory / COMPRESSED_NAME).read_text())
    del record["files"]
    (directory / COMPRESSED_NAME).write_text(json.dumps(record))
    with pytest.raises(IndexFileError, match=r"lists\.\S+ is missing"):
        CompressedIndex(directory)


def test_an_extra_or_short_file_is_refused(tmp_path: Path) -> None:
    directory, _ = _split_index(tmp_path)
    (directory / "lists.codes.old").write_bytes(b"x")
    with pytest.raises(IndexFileError, match=r"lists\.codes\.old is not in the manifest"):
        CompressedIndex(directory)
    (directory / "lists.codes.old").unlink()
    ids = directory / "lists.ids"
    ids.write_bytes(ids.read_bytes()[:-8])
    with pytest.raises(IndexFileError, match=r"lists\.ids holds \d+ bytes, the manifest says"):
        CompressedIndex(directory)


def test_the_index_id_tells_two_builds_of_one_configuration_apart(tmp_path: Path) -> None:
    directory, _ = _split_index(tmp_path)
    before = CompressedIndex(directory).describe()
    codes = directory / "lists.codes"
    data = bytearray(codes.read_bytes())
    data[0] ^= 0xFF  # another build's content, of the same size, with its own table
    codes.write_bytes(bytes(data))
    _retable(directory)
    after = CompressedIndex(directory).describe()
    assert before["compressed"]["files"] != after["compressed"]["files"]
    del before["compressed"]["files"], after["compressed"]["files"]
    assert before == after  # the table is what tells them apart, so the served id differs


def test_verify_names_a_file_changed_in_place(tmp_path: Path) -> None:
    directory, _ = _split_index(tmp_path)
    check_compressed_files(directory, hashes=True)
    codes = directory / "lists.codes"
    data = bytearray(codes.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: the size check cannot see it
    codes.write_bytes(bytes(data))
    CompressedIndex(directory)  # opening checks sizes only
    with pytest.raises(IndexFileError, match=r"lists\.codes has SHA-256 .* changed after"):
        check_compressed_files(directory, hashes=True)
    assert index_command(["verify", str(directory)]) == 1


def test_files_changed_under_an_open_index_are_refused_not_a_crash(tmp_path: Path) -> None:
    directory, q = _split_index(tmp_path)
    other, _ = _split_index(tmp_path, "other", seed=1)
    index = CompressedIndex(directory)
    codes = directory / "lists.codes"
    codes.write_bytes(codes.read_bytes()[: codes.stat().st_size // 2])  # before any list is read
    with pytest.raises(IndexChangedError, match=r"lists\.codes was replaced or changed"):
        index.search(q, 5)
    # a list read past the new end fails as an error (a mapping would die of SIGBUS)
    lists = index.lists
    assert lists is not None
    with pytest.raises(IndexChangedError, match="truncated after the index was opened"):
        lists.ensure(np.arange(len(lists.sizes)))
    # index.faiss overwritten in place by another build (what --overwrite used to do)
    index = CompressedIndex(other)
    (other / "index.faiss").write_bytes((directory / "index.faiss").read_bytes())
    with pytest.raises(IndexChangedError, match=r"index\.faiss was replaced"):
        index.search(q, 5)


def test_row_ids_past_the_index_are_a_409_and_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory, q = _split_index(tmp_path)
    ids_file = directory / "lists.ids"
    ids = np.fromfile(ids_file, dtype="<i8")
    ids[::50] += 10_000_000  # past the 1,000 rows: a damaged file whose table was recomputed
    ids.tofile(ids_file)
    _retable(directory)
    index = CompressedIndex(directory)
    with pytest.raises(IndexFileError, match=r"lists\.ids holds row id \d+, past the index"):
        index.search(q, 5)

    class _Rows:
        name, fingerprint, dim = "rows", "rows", 64

        def encode(self, texts: list[str]) -> np.ndarray:
            return q[: len(texts)]

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "contents": "t{i}"}}\n' for i in range(1_000)))
    with TestClient(create_app(PrebuiltRetriever(index, corpus, _Rows()))) as client:
        queries = [f"q{i}" for i in range(len(q))]  # the queries searched above
        answer = client.post("/retrieve", json={"queries": queries, "topk": 5})
    assert answer.status_code == 409
    assert "past the index" in answer.json()["detail"]
    assert any("refused a batch" in r.getMessage() for r in caplog.records)


def test_a_failed_overwrite_leaves_the_old_index_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import retrieval.compressed as compressed
    import retrieval.ivf_lists as ivf_lists

    directory, q = _split_index(tmp_path)
    want = CompressedIndex(directory).search(q, 5)

    def dies_half_way(index: object, out: Path) -> int:
        (out / "lists.codes").write_bytes(b"half")  # the new build's first file, then a kill
        raise KeyboardInterrupt

    monkeypatch.setattr(compressed, "split_lists", dies_half_way)
    flat_path = tmp_path / "flat.index"
    config = CompressConfig(preset="rabitqfs", nlist=4, seed=1)
    with pytest.raises(KeyboardInterrupt):
        compress_flat_index(flat_path, directory, config)
    monkeypatch.setattr(compressed, "split_lists", ivf_lists.split_lists)
    got = CompressedIndex(directory).search(q, 5)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".idx")] == []
    # a directory that is not an index is never replaced
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(IndexFormatError, match="not an index directory"):
        compress_flat_index(flat_path, tmp_path / "notes", config)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
