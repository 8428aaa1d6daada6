"""Smoke test of benchmarks/research/predictor_design.py, and the MiniLM featurizer it measures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_alloc import MLPPredictor
from trace_alloc.base import Featurizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_predictor_design_quick_prints_every_design_as_json():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.research.predictor_design",
            "--quick",
            "--json",
            "--no-progress",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert "hashed + MLP64 + MSE (default)" in result["designs"]
    for scores in result["designs"].values():
        assert 0.0 <= scores["prefix_mse_truth"] <= 1.0
        assert 0.0 <= scores["prefix_auc"] <= 1.0
    assert result["n_nodes"] > 0


@pytest.mark.slow
def test_minilm_featurizer_embeds_head_and_tail_and_trains():
    from harness.rollout.featurizers import MiniLMFeaturizer

    featurizer = MiniLMFeaturizer(head_words=4, tail_words=3)  # the packaged model, offline
    assert isinstance(featurizer, Featurizer) and featurizer.dim == 768
    x = featurizer.featurize(
        ["who founded the band", "who founded the band <search> x </search> doc"]
    )
    assert x.shape == (2, 768) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert np.all(x[0, 384:] == 0)  # a root has no turns: empty tail half
    assert np.any(x[1, 384:] != 0)
    predictor = MLPPredictor(featurizer, hidden=8)
    predictor.update(["who founded the band"], np.array([1.0]))
    assert predictor.predict(["who founded the band"]).shape == (1,)
