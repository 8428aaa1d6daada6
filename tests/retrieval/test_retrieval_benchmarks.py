"""Smoke tests of the retrieval benchmark scripts: `--quick --json`, last stdout line parsed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(module: str, *extra: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", module, "--quick", "--json", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_bm25_benchmark(tmp_path):
    # synthetic worlds only (no --data-dir there), so the test does not need the shared data
    result = _run("benchmarks.perf.retrieval_bm25", "--data-dir", str(tmp_path / "none"))
    assert result["n_documents"] == 3_000
    assert result["corpus"]["synthetic_documents"] == 3_000
    assert result["bm25s_over_rank_bm25_qps"] > 0
    assert 0.0 <= result["top10_agreement"] <= 1.0
    assert result["meta"]["commit"] is not None


@pytest.mark.slow
def test_server_benchmark(tmp_path):
    result = _run("benchmarks.perf.retrieval_server", "--data-dir", str(tmp_path / "none"))
    assert result["batched_over_unbatched_throughput"] > 0
    assert 0 < result["p50_ms"] <= result["p99_ms"]
    assert result["unbatched"]["server_stats"]["largest_batch"] == 1
    assert result["batched"]["n_requests"] == result["unbatched"]["n_requests"]


def test_server_benchmark_on_bm25(tmp_path):
    argv = ["--kind", "bm25", "--threads", "1", "--data-dir", str(tmp_path / "none")]
    result = _run("benchmarks.perf.retrieval_server", *argv)
    assert result["kind"] == "bm25"
    # both servers run with the same --threads: only batching may differ between them
    assert result["batched"]["server_flags"] == ["--threads", "1"]
    assert result["unbatched"]["server_flags"] == [
        "--threads",
        "1",
        "--batching.max-batch-queries",
        "1",
    ]
    assert result["batched_over_unbatched_throughput"] > 0
    assert result["unbatched"]["server_stats"]["largest_batch"] == 1
    assert (
        result["batched"]["server_stats"]["n_requests"]
        == result["unbatched"]["server_stats"]["n_requests"]
    )


@pytest.mark.slow
def test_dense_benchmark(tmp_path):
    result = _run("benchmarks.perf.retrieval_dense", "--data-dir", str(tmp_path / "none"))
    assert result["search"]["flat"]["recall_at_10_vs_flat"] == 1.0
    assert 0.0 <= result["hnsw_recall_at_10"] <= 1.0
    assert result["encode_passages_per_s"] > 0


@pytest.mark.slow
def test_wiki_scale_benchmark(tmp_path):
    # synthetic vectors only (no --data-dir there): the real-text check is skipped
    argv = ["--work-dir", str(tmp_path / "scale"), "--data-dir", str(tmp_path / "none")]
    result = _run("benchmarks.perf.retrieval_scale", *argv)
    headline = result["headline"]
    for key in (
        "memory_over_flat",
        "rerank_pages_touched_per_1000_queries",
        "recall10_vs_flat",
        "top3_set_agreement",
        "fp16_flat_top3_set_agreement",
        "cold_start_s",
        "encoder_qps_per_core_int8_or_bf16",
        "mmap_resident_over_file",
    ):
        assert key in headline, key
    assert 0.0 < headline["recall10_vs_flat"] <= 1.0
    assert headline["mmap_resident_over_file"] < 0.05  # the flat file is mapped, not copied
    served = result["sizes"][0]["presets"][result["default_preset"]]
    assert served["cold"]["same_as_warm"]  # a dropped page cache changes speed, not answers
    assert served["bytes_per_row"] < 768 * 4 / 8
    cold = result["cold_start_probe"]  # served as the docs serve: the ONNX export, no torch
    assert cold["torch_imported"] is False


@pytest.mark.slow
def test_query_dedupe_benchmark():
    result = _run("benchmarks.perf.query_dedupe")
    first = result["turns"][0]
    assert first["searches"] == 6 * 8  # every sample of every prompt opens with a search
    assert 1 <= first["distinct"] <= first["searches"]
    assert result["first_turn_duplicate_share"] == 1 - first["distinct"] / first["searches"]
