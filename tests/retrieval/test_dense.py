"""DenseRetriever and SentenceEncoder: semantics with MiniLM, faiss index types, persistence."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import retrieval.encoder
from retrieval import (
    DEFAULT_ENCODER,
    DenseRetriever,
    Document,
    Encoder,
    EncoderError,
    IndexFormatError,
    IndexMismatchError,
    Retriever,
    load_index,
)
from retrieval.encoder import model_fingerprint, model_signature, resolve_model_dir
from retrieval.onnx_encoder import cache_key


def _random_docs(n: int) -> list[Document]:
    return [Document(doc_id=f"r{i}", title=f"T{i}", text=f"passage number {i}") for i in range(n)]


# -- the real encoder ---------------------------------------------------------------------


def test_minilm_loads_offline_and_embeds_unit_vectors(minilm):
    assert isinstance(minilm, Encoder)
    assert minilm.name == DEFAULT_ENCODER
    assert minilm.dim == 384
    vectors = minilm.encode(["hello world", "a second, longer sentence about rivers"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_minilm_ranks_by_meaning(minilm, toy_docs):
    retriever = DenseRetriever.build(toy_docs, minilm)
    assert isinstance(retriever, Retriever)
    results = retriever.search(["the capital city of Italy", "an early computer pioneer"], k=3)
    assert [hits[0].doc_id for hits in results] == ["d1", "d6"]
    for hits in results:
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(-1.0 <= h.score <= 1.0 + 1e-5 for h in hits)


def test_a_batch_ranks_like_single_queries(minilm, toy_docs):
    retriever = DenseRetriever.build(toy_docs, minilm)
    queries = ["rivers of Europe", "capital", "mountains", "coffee in Paris"]
    batch = retriever.search(queries, k=4)
    single = [retriever.search([q], k=4)[0] for q in queries]
    # padding changes the last float bits, never the ranking on this corpus
    assert [[h.doc_id for h in hits] for hits in batch] == [
        [h.doc_id for h in hits] for hits in single
    ]
    for a, b in zip(batch, single, strict=True):
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


def test_save_then_load_with_the_manifest_encoder(tmp_path: Path, minilm, toy_docs):
    retriever = DenseRetriever.build(toy_docs, minilm, index_type="hnsw")
    retriever.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["kind"] == "dense"
    assert manifest["encoder"] == DEFAULT_ENCODER
    assert manifest["params"]["encoder_fingerprint"] == minilm.fingerprint
    assert manifest["params"]["index_type"] == "hnsw"
    loaded = load_index(tmp_path / "idx")  # loads MiniLM by the manifest's name
    assert isinstance(loaded, DenseRetriever)
    assert loaded.index_id == retriever.index_id
    queries = ["Italy", "a river in France"]
    assert [[h.doc_id for h in r] for r in loaded.search(queries, k=3)] == [
        [h.doc_id for h in r] for r in retriever.search(queries, k=3)
    ]


# -- faiss index types, on a fake encoder --------------------------------------------------


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_every_index_type_finds_a_passage_by_its_own_text(hash_encoder, index_type):
    docs = _random_docs(400)
    retriever = DenseRetriever.build(docs, hash_encoder, index_type=index_type, ivf_nprobe=4)
    queries = [f"T{i}\npassage number {i}" for i in range(0, 400, 7)]
    results = retriever.search(queries, k=5)
    top1 = [hits[0].doc_id for hits in results]
    assert top1 == [f"r{i}" for i in range(0, 400, 7)]
    for hits in results:
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)


def test_hnsw_recall_against_flat_is_high(hash_encoder):
    docs = _random_docs(2000)
    flat = DenseRetriever.build(docs, hash_encoder)
    hnsw = DenseRetriever.build(docs, hash_encoder, index_type="hnsw", hnsw_m=16)
    queries = [f"unrelated query {i}" for i in range(100)]
    exact = flat.search(queries, k=10)
    approx = hnsw.search(queries, k=10)
    recall = np.mean(
        [
            len({h.doc_id for h in a} & {h.doc_id for h in e}) / 10
            for a, e in zip(approx, exact, strict=True)
        ]
    )
    assert recall >= 0.9


def test_hnsw_builds_are_reproducible(hash_encoder):
    docs = _random_docs(1500)
    a = DenseRetriever.build(docs, hash_encoder, index_type="hnsw", hnsw_m=8)
    b = DenseRetriever.build(docs, hash_encoder, index_type="hnsw", hnsw_m=8)
    assert a.index_id == b.index_id
    queries = [f"q{i}" for i in range(50)]
    assert a.search(queries, k=10) == b.search(queries, k=10)


def test_prefixes_are_added_to_queries_and_passages(hash_encoder, toy_docs):
    retriever = DenseRetriever.build(
        toy_docs, hash_encoder, query_prefix="query: ", passage_prefix="passage: "
    )
    assert all(t.startswith("passage: ") for t in hash_encoder.texts)
    hash_encoder.texts.clear()
    retriever.search(["who?"], k=1)
    assert hash_encoder.texts == ["query: who?"]
    plain = DenseRetriever.build(toy_docs, hash_encoder)
    assert plain.index_id != retriever.index_id


def test_k_beyond_the_corpus_and_empty_batches(hash_encoder, toy_docs):
    retriever = DenseRetriever.build(toy_docs, hash_encoder)
    hits = retriever.search(["anything"], k=50)[0]
    assert sorted(h.doc_id for h in hits) == sorted(d.doc_id for d in toy_docs)
    assert retriever.search([], k=3) == []
    with pytest.raises(ValueError, match="positive integer"):
        retriever.search(["x"], k=0)
    with pytest.raises(TypeError):
        retriever.search("x", k=1)


def test_build_rejects_bad_input(hash_encoder, toy_docs):
    with pytest.raises(ValueError, match="empty corpus"):
        DenseRetriever.build([], hash_encoder)
    with pytest.raises(ValueError, match="duplicate"):
        DenseRetriever.build([*toy_docs, toy_docs[0]], hash_encoder)
    with pytest.raises(ValueError, match="index_type"):
        DenseRetriever.build(toy_docs, hash_encoder, index_type="lsh")


# -- persistence and mismatches -------------------------------------------------------------


@pytest.mark.parametrize("mmap", [False, True])
def test_save_and_load_round_trip(tmp_path: Path, hash_encoder, mmap):
    docs = _random_docs(300)
    for index_type in ("flat", "hnsw", "ivf"):
        built = DenseRetriever.build(docs, hash_encoder, index_type=index_type)
        built.save(tmp_path / index_type)
        loaded = DenseRetriever.load(tmp_path / index_type, hash_encoder, mmap=mmap)
        assert loaded.index_id == built.index_id
        queries = [f"q{i}" for i in range(20)]
        assert loaded.search(queries, k=7) == built.search(queries, k=7)


def test_loading_with_another_encoder_raises_a_mismatch(
    tmp_path: Path, hash_encoder, hash_encoder_cls, toy_docs
):
    DenseRetriever.build(toy_docs, hash_encoder).save(tmp_path / "idx")
    with pytest.raises(IndexMismatchError, match="fingerprint"):
        DenseRetriever.load(tmp_path / "idx", hash_encoder_cls(name="other"))


def test_loading_broken_or_foreign_directories(tmp_path: Path, hash_encoder, toy_docs, toy_bm25):
    toy_bm25.save(tmp_path / "bm25")
    with pytest.raises(IndexMismatchError, match="kind 'bm25', expected 'dense'"):
        DenseRetriever.load(tmp_path / "bm25", hash_encoder)
    with pytest.raises(IndexMismatchError, match="kind 'bm25', expected 'dense'"):
        load_index(tmp_path / "bm25", kind="dense")
    with pytest.raises(ValueError, match="did you mean 'dense'"):
        load_index(tmp_path / "bm25", kind="dens")
    DenseRetriever.build(toy_docs, hash_encoder).save(tmp_path / "idx")
    faiss_file = tmp_path / "idx" / "index.faiss"
    faiss_file.write_bytes(b"x" * faiss_file.stat().st_size)  # the size the manifest says
    with pytest.raises(IndexFormatError, match="faiss cannot read it"):
        DenseRetriever.load(tmp_path / "idx", hash_encoder)
    DenseRetriever.build(toy_docs[:4], hash_encoder).save(tmp_path / "small")
    shutil.copy(tmp_path / "small" / "index.faiss", tmp_path / "idx" / "index.faiss")
    # another build's file: the file table refuses it by size before faiss reads it
    with pytest.raises(IndexFormatError, match=r"holds \d+ bytes, the manifest says \d+"):
        DenseRetriever.load(tmp_path / "idx", hash_encoder)
    (tmp_path / "idx" / "index.faiss").unlink()
    with pytest.raises(IndexFormatError, match=r"index\.faiss is missing"):
        DenseRetriever.load(tmp_path / "idx", hash_encoder)


def test_encoder_folders_are_checked_and_fingerprinted_by_content(tmp_path: Path):
    with pytest.raises(EncoderError, match="does not exist"):
        resolve_model_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EncoderError, match="not a model folder"):
        resolve_model_dir(tmp_path / "empty")
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x01")
    before = model_fingerprint(model)
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert model_fingerprint(copy) == before  # the path does not matter
    (copy / "README.md").write_text("docs only")
    assert model_fingerprint(copy) == before
    (copy / "sub" / "weights.bin").write_bytes(b"\x00\x02")
    assert model_fingerprint(copy) != before


def test_model_signature_reads_the_small_files_and_the_ends_of_the_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(retrieval.encoder, "_WHOLE_BYTES", 1024)  # 16 MiB in use
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    weights = bytearray(range(256)) * (5 * 4096)  # 5 MiB, over the whole-file limit
    (model / "model.safetensors").write_bytes(weights)
    before = model_signature(model)
    copy = tmp_path / "copy"
    shutil.copytree(model, copy)
    assert model_signature(copy) == before  # the path does not matter
    (copy / "config.json").write_text('{"hidden_size": 9}')
    assert model_signature(copy) != before
    (copy / "config.json").write_text('{"hidden_size": 8}')
    weights[-1] ^= 1  # the last MiB is read
    (copy / "model.safetensors").write_bytes(weights)
    assert model_signature(copy) != before
    weights[-1] ^= 1
    weights[len(weights) // 2] ^= 1  # the middle is not: the signature's stated limit
    (copy / "model.safetensors").write_bytes(weights)
    assert model_signature(copy) == before
    assert model_fingerprint(copy) != model_fingerprint(model)  # the full hash sees it


def test_onnx_cache_key_changes_when_weights_are_rewritten_in_place(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\x00" * 64)
    key = cache_key("sig", model)
    assert cache_key("sig", model) == key and cache_key("other", model) != key
    stat = (model / "weights.bin").stat()
    os.utime(model / "weights.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert cache_key("sig", model) != key
