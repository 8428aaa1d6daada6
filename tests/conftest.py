"""Shared test configuration: Hypothesis profiles, the path to the shared real datasets, and how
the suite shares the machine under xdist (tests/xdist_groups.py)."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# the hook that puts tests sharing a costly thing in one xdist group (tests/xdist_groups.py)
from xdist_groups import pytest_collection_modifyitems  # noqa: F401

from envs import WorldConfig
from harness import tiny_policy


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker's torch gets its share of the cores, not all of them: two workers
    with a thread per core each would oversubscribe the machine. Child processes inherit it."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is not None:
        threads = max(1, len(os.sched_getaffinity(0)) // int(workers))
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections, held for the test's length.

    The OS gives it (port 0) and the socket stays bound, never listening: a connection gets
    ECONNREFUSED, and no other test worker can bind it meanwhile. A port found free and then
    released can be taken by another worker before the test uses it (pytest-xdist).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


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


# A tiny policy recipe for end-to-end tests of the demo and the experiment.
_TINY_RECIPE = tiny_policy.TinyPolicyConfig(
    world=WorldConfig(
        n_countries=3,
        n_cities=8,
        n_people=60,
        n_films=8,
        n_books=6,
        n_companies=4,
        n_universities=3,
        n_distractors=5,
        sentences_per_doc=2,
        questions_per_kind=2,
    ),
    vocab_size=600,
    model=tiny_policy.ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    ),
    demos=tiny_policy.DemonstrationConfig(n_worlds=1, target_variants=1),
    sft=tiny_policy.SFTConfig(max_steps=6, batch_size=4, warmup_steps=2, eval_from=3, eval_every=3),
    env=dataclasses.replace(tiny_policy.tiny_env_config(), max_turns=3),
    eval=tiny_policy.WarmStartEvalConfig(
        n_unseen_questions=4, n_dev_samples=1, n_samples=1, max_action_tokens=12
    ),
)


@pytest.fixture
def tiny_recipe() -> tiny_policy.TinyPolicyConfig:
    """A tiny policy recipe that builds in seconds (its accuracy is near zero)."""
    return _TINY_RECIPE
