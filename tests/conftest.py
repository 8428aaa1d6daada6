"""Shared test configuration: Hypothesis profiles and the path to the shared real datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# `ci` (default): derandomised and bounded; `thorough`: many more examples, for a local soak.
settings.register_profile(
    "ci",
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=10_000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO_ROOT = Path(__file__).resolve().parents[1]
# The real dev samples live beside the repository, in the steering repo's shared/ folder; a
# user's clone does not have it, so tests that need it skip with this reason.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
SHARED_DATA_REASON = (
    f"real dataset samples not found at {SHARED_DATA} (they live in the project's shared/ "
    "folder, which a plain clone does not have)"
)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real dataset samples; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(SHARED_DATA_REASON)
    return SHARED_DATA
