"""Prebuilt indexes: a faiss file and corpus JSONL built the way Search-R1's index_builder does.

The fixture follows `search_r1/search/index_builder.py` step by step with the packaged MiniLM
in e5's role: each line's `contents` as `passage: <contents>`, tokenised with truncation at 180
tokens, mean-pooled over the attention mask, L2-normalised, added to
`faiss.index_factory(dim, "Flat", METRIC_INNER_PRODUCT)` in corpus order, and written with
`faiss.write_index`. The retriever must find what exact inner products say, and the server must
answer with each line's `id` and `contents` unchanged.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fastapi.testclient import TestClient  # noqa: E402

from retrieval.cli import ServeConfig, _serve_retriever  # noqa: E402
from retrieval.encoder import resolve_model_dir  # noqa: E402
from retrieval.errors import IndexMismatchError  # noqa: E402
from retrieval.prebuilt import CorpusLines, PooledEncoder, PrebuiltRetriever  # noqa: E402
from retrieval.server import create_app  # noqa: E402

LINES = [
    {"id": "0", "contents": '"Aaron Copland"\nAaron Copland was an American composer.'},
    {"id": "1", "contents": '"Zürich"\nZürich is the largest Swiss city.\nIt lies on a lake.'},
    {"id": "2", "contents": '"Mount Everest"\nMount Everest is the highest mountain on Earth.'},
    {"id": "3", "contents": '"Photosynthesis"\nPlants turn light into chemical energy.'},
    {"id": "4", "contents": '"Python (language)"\nPython is a programming language.'},
]


@functools.cache
def _model() -> tuple[object, object]:
    model_dir = str(resolve_model_dir(None))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    return tokenizer, transformers.AutoModel.from_pretrained(model_dir).eval()


def _search_r1_embed(texts: list[str], max_length: int) -> np.ndarray:
    """index_builder's encode_all: tokenise, mean-pool over the mask, normalise."""
    tokenizer, model = _model()
    inputs = tokenizer(
        texts, padding=True, truncation=True, return_tensors="pt", max_length=max_length
    )
    with torch.no_grad():
        output = model(**inputs, return_dict=True)
    hidden = output.last_hidden_state.masked_fill(~inputs["attention_mask"][..., None].bool(), 0.0)
    pooled = hidden.sum(dim=1) / inputs["attention_mask"].sum(dim=1)[..., None]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32)


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("wiki")
    corpus = folder / "wiki-18.jsonl"
    # a blank line in the middle: index rows count the records, as `datasets` reads them
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in LINES[:2])
    text += "\n" + "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in LINES[2:])
    corpus.write_text(text, encoding="utf-8")
    vectors = _search_r1_embed([f"passage: {line['contents']}" for line in LINES], 180)
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    path = folder / "e5_Flat.index"
    faiss.write_index(index, str(path))
    return path, corpus


@pytest.fixture(scope="module")
def encoder() -> PooledEncoder:
    return PooledEncoder()


@pytest.fixture(scope="module")
def retriever(prebuilt: tuple[Path, Path], encoder: PooledEncoder) -> PrebuiltRetriever:
    index, corpus = prebuilt
    return PrebuiltRetriever(index, corpus, encoder, query_prefix="query: ")


def test_search_finds_what_exact_inner_products_rank_first(retriever: PrebuiltRetriever) -> None:
    queries = ["which composer was American", "highest mountain", "city on a Swiss lake"]
    passages = _search_r1_embed([f"passage: {line['contents']}" for line in LINES], 180)
    wanted = _search_r1_embed([f"query: {q}" for q in queries], 256) @ passages.T  # (3, 5)
    rows = retriever.search(queries, 2)
    for hits, scores in zip(rows, wanted, strict=True):
        order = np.argsort(-scores)[:2]
        assert [h.doc_id for h in hits] == [LINES[i]["id"] for i in order]
        assert [h.score for h in hits] == pytest.approx(scores[order].tolist(), abs=1e-4)
    assert rows[0][0].doc_id == "0" and rows[1][0].doc_id == "2"


def test_the_corpus_stays_on_disk(retriever: PrebuiltRetriever) -> None:
    corpus = retriever.corpus
    assert len(corpus) == len(LINES)
    assert isinstance(corpus._offsets, np.memmap)  # offsets are mapped, lines read on demand
    assert corpus.offsets_path.is_file()
    assert corpus[1].contents == LINES[1]["contents"]
    assert corpus[4].doc_id == "4"  # the blank line is skipped


def test_the_server_answers_each_line_unchanged(retriever: PrebuiltRetriever) -> None:
    app = create_app(retriever, manifest=retriever.manifest)
    with TestClient(app) as client:
        reply = client.post("/retrieve", json={"queries": ["highest mountain"], "topk": 1})
        health = client.get("/health").json()
    assert reply.status_code == 200
    assert reply.json()["result"][0][0] == LINES[2]  # id and contents as in the file
    assert health["manifest"]["kind"] == "prebuilt"
    assert health["manifest"]["params"]["query_prefix"] == "query: "


def test_a_corpus_of_another_length_is_refused(
    prebuilt: tuple[Path, Path], encoder: PooledEncoder, tmp_path: Path
) -> None:
    index, _ = prebuilt
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps(LINES[0]) + "\n", encoding="utf-8")
    with pytest.raises(IndexMismatchError, match="row i of the index must be line i"):
        PrebuiltRetriever(index, short, encoder)


def test_stale_offsets_are_rebuilt(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps(LINES[0]) + "\n", encoding="utf-8")
    assert len(CorpusLines(corpus)) == 1
    corpus.write_text("".join(json.dumps(line) + "\n" for line in LINES), encoding="utf-8")
    assert len(CorpusLines(corpus)) == len(LINES)


def test_serve_flags_are_checked_before_anything_loads(prebuilt: tuple[Path, Path]) -> None:
    index, corpus = prebuilt
    with pytest.raises(ValueError, match="either --index DIR or --faiss-index"):
        _serve_retriever(ServeConfig())
    with pytest.raises(ValueError, match="needs --corpus"):
        _serve_retriever(ServeConfig(faiss_index=index))
    served = _serve_retriever(ServeConfig(faiss_index=index, corpus=corpus, query_prefix="query: "))
    assert served.search(["highest mountain"], 1)[0][0].doc_id == "2"
