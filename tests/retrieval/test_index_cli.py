"""`tracerl index build|search` and `tracerl serve-retriever`, called as the CLI table does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from retrieval import BM25Retriever, DenseRetriever, load_index, write_corpus
from retrieval.cli import index, serve_retriever


@pytest.fixture
def corpus_file(tmp_path: Path, toy_docs) -> Path:
    path = tmp_path / "corpus.jsonl"
    write_corpus(toy_docs, path)
    return path


def test_build_then_search_a_bm25_index(tmp_path, corpus_file, capsys, toy_bm25):
    out = tmp_path / "bm25"
    assert index(["build", "--corpus", str(corpus_file), "--kind", "bm25", "--out", str(out)]) == 0
    assert "built bm25 index" in capsys.readouterr().out
    loaded = load_index(out)
    assert isinstance(loaded, BM25Retriever)
    assert loaded.index_id == toy_bm25.index_id

    assert index(["search", str(out), "capital of Italy", "Konrad Zuse", "-k", "2"]) == 0
    text = capsys.readouterr().out
    assert "query: capital of Italy" in text and "d1" in text and "d6" in text

    assert index(["search", str(out), "capital of Italy", "--json", "-k", "1"]) == 0
    body = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert body["result"][0][0]["document"]["id"] == "d1"


def test_build_refuses_to_overwrite_without_the_flag(tmp_path, corpus_file, capsys):
    out = tmp_path / "bm25"
    args = ["build", "--corpus", str(corpus_file), "--out", str(out)]
    index(args)
    with pytest.raises(SystemExit, match="already holds an index; pass --overwrite"):
        index(args)
    assert index([*args, "--overwrite", "--stemmer", "None"]) == 0
    assert load_index(out).manifest.params["stemmer"] is None


def test_build_reports_a_bad_corpus_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "x"}\n{"id": 3}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: .*\"id\""):
        index(["build", "--corpus", str(bad), "--out", str(tmp_path / "i")])


def test_dense_only_flags_are_refused_for_bm25(tmp_path, corpus_file):
    with pytest.raises(SystemExit) as info:
        index(["build", "--corpus", str(corpus_file), "--out", str(tmp_path / "i"),
               "--model", "some/dir"])  # fmt: skip
    assert info.value.code != 0


def test_build_a_dense_hnsw_index_with_e5_style_prefixes(tmp_path, corpus_file, capsys, minilm):
    out = tmp_path / "dense"
    argv = ["build", "--corpus", str(corpus_file), "--kind", "dense", "--index-type", "hnsw",
            "--query-prefix", "query: ", "--passage-prefix", "passage: ",
            "--out", str(out)]  # fmt: skip
    assert index(argv) == 0
    loaded = load_index(out, encoder=minilm)
    assert isinstance(loaded, DenseRetriever)
    assert loaded.params.index_type == "hnsw"
    assert (loaded.params.query_prefix, loaded.params.passage_prefix) == ("query: ", "passage: ")
    assert loaded.search(["the capital of Italy"], k=1)[0][0].doc_id == "d1"


def test_search_a_running_server_by_url(toy_server, capsys):
    assert index(["search", toy_server.url, "river Paris", "-k", "1"]) == 0
    assert "d3" in capsys.readouterr().out


def test_tracerl_does_not_log_each_http_request_without_verbose(toy_server):
    # httpx logs every request at INFO; an env searching a server would print one per step
    def search(*flags: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "benchmarks.cli", *flags, "index", "search", toy_server.url,
                "river Paris", "-k", "1"]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)

    quiet, verbose = search(), search("-v")
    assert "d3" in quiet.stdout
    assert "HTTP Request" not in quiet.stderr
    assert "HTTP Request" in verbose.stderr


def test_search_and_serve_report_missing_indexes(tmp_path):
    with pytest.raises(SystemExit, match="neither an http"):
        index(["search", str(tmp_path / "absent"), "q"])
    with pytest.raises(SystemExit, match="does not exist"):
        serve_retriever(["--index", str(tmp_path / "absent")])


def test_tracerl_shows_library_debug_lines_only_with_verbose(corpus_file, tmp_path):
    # bm25s sets its logger to DEBUG at import; the user sees its debug line only under -v
    def build(*flags: str) -> str:
        out = str(tmp_path / "i")
        argv = [sys.executable, "-m", "benchmarks.cli", *flags, "index", "build",
                "--corpus", str(corpus_file), "--out", out, "--overwrite"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300)
        return done.stderr

    quiet, verbose = build(), build("-v")
    assert "built BM25 index" in quiet  # INFO still shows
    assert "Building index from IDs" not in quiet
    assert "Building index from IDs" in verbose  # the line exists; the level hides it
