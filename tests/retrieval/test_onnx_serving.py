"""A query encoder served by ONNX Runtime alone: the same vectors as torch's, and no torch.

`tracerl index export-encoder` writes the packaged MiniLM (e5's role here) to ONNX once; the
compressed-index server then loads it with onnxruntime and `tokenizers` only. The torch-free
claim is checked where it matters, in a fresh process that builds the server as
`serve-retriever` does and answers through the HTTP app: neither torch nor transformers may be
in its `sys.modules`.
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
pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from retrieval.cli import ServeConfig, _serve_retriever  # noqa: E402
from retrieval.compressed import CompressConfig, SearchDefaults, compress_flat_index  # noqa: E402
from retrieval.errors import EncoderError  # noqa: E402
from retrieval.onnx_encoder import OnnxEncoder, export_encoder  # noqa: E402
from retrieval.prebuilt import PooledEncoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [
    "query: who wrote the iliad",
    "query: Zürich, Ünïcode and 東京 in one question",
    "query: " + "a very long question that goes on and on " * 40,  # truncated
    "",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "minilm"
    record = export_encoder(None, out)
    assert record["precision"] == "fp32" and record["hidden_size"] == 384
    return out


@pytest.mark.parametrize("max_length", [16, 256])
def test_the_export_embeds_as_torch_does(exported: Path, max_length: int) -> None:
    onnx = OnnxEncoder(exported, max_length=max_length)
    torch_encoder = PooledEncoder(None, max_length=max_length)
    for text in TEXTS:  # the same tokens: special tokens, truncation, normalisation
        expected = torch_encoder._tokenizer([text], max_length=max_length, truncation=True)
        assert onnx._tokenizer.encode(text).ids == expected["input_ids"][0]
    a, b = onnx.encode(TEXTS), torch_encoder.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (a * b).sum(1).min() > 0.99999  # fp32 both: equal up to rounding


def test_bad_exports_and_flags_are_refused(tmp_path: Path, exported: Path) -> None:
    with pytest.raises(EncoderError, match="export-encoder"):
        OnnxEncoder(tmp_path)
    with pytest.raises(EncoderError, match="mean or cls"):
        OnnxEncoder(exported, pooling="pooler")
    with pytest.raises(EncoderError, match=r"1\.\.512"):
        OnnxEncoder(exported, max_length=4096)


_SERVE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {root!r})
    from fastapi.testclient import TestClient
    from retrieval.cli import ServeConfig, _serve_retriever
    from retrieval.server import create_app
    from pathlib import Path
    config = ServeConfig(compressed=Path({index!r}), corpus=Path({corpus!r}),
                         encoder={encoder!r}, query_prefix="query: ")
    retriever = _serve_retriever(config)
    with TestClient(create_app(retriever, manifest=retriever.manifest)) as client:
        reply = client.post("/retrieve", json={{"queries": {queries!r}, "topk": 3}})
    print(json.dumps({{"status": reply.status_code, "body": reply.json(),
                      "torch": "torch" in sys.modules,
                      "transformers": "transformers" in sys.modules}}))
    """
)


def test_the_compressed_server_answers_without_importing_torch(
    tmp_path: Path, exported: Path
) -> None:
    passages = [
        f"passage: fact number {i} about the river {i % 7} and city {i % 11}" for i in range(600)
    ]
    encoder = PooledEncoder(None)
    vectors = encoder.encode(passages)
    flat = faiss.IndexFlatIP(384)
    flat.add(vectors)
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"id": str(i), "contents": p[9:]}) + "\n" for i, p in enumerate(passages)
        )
    )
    config = CompressConfig(preset="rabitqfs", nlist=4, search=SearchDefaults(nprobe=4, k_factor=8))
    compress_flat_index(tmp_path / "e5_Flat.index", tmp_path / "rabitqfs", config)
    queries = ["river 3 and city 5", "fact number 42"]
    code = _SERVE.format(
        root=str(ROOT),
        index=str(tmp_path / "rabitqfs"),
        corpus=str(corpus),
        encoder=str(exported),
        queries=queries,
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reply = json.loads(done.stdout.splitlines()[-1])
    assert reply["torch"] is False and reply["transformers"] is False
    assert reply["status"] == 200
    # the same hits as the same server with torch's fp32 encoder
    torch_served = _serve_retriever(
        ServeConfig(compressed=tmp_path / "rabitqfs", corpus=corpus, query_prefix="query: ")
    )
    expected = [[hit.doc_id for hit in hits] for hits in torch_served.search(queries, 3)]
    got = [[doc["id"] for doc in hits] for hits in reply["body"]["result"]]
    assert got == expected
    with pytest.raises(ValueError, match="fixed when it was exported"):
        _serve_retriever(
            ServeConfig(
                compressed=tmp_path / "rabitqfs",
                corpus=corpus,
                encoder=str(exported),
                encoder_precision="bf16",
            )
        )


def test_the_cli_will_not_overwrite_an_export(tmp_path: Path, exported: Path) -> None:
    from retrieval.cli import index

    (tmp_path / "onnx_encoder.json").write_text((exported / "onnx_encoder.json").read_text())
    with pytest.raises(SystemExit, match="already holds an export; pass --overwrite"):
        index(["export-encoder", "--out", str(tmp_path)])
