"""OpenRLHF-integration tests: skipped without openrlhf; the flash_attn stand-in goes in first,
because these modules import openrlhf.models (harness/training/openrlhf_compat.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("openrlhf")

from harness.training.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray with 2 CPUs; fakes from `openrlhf_fakes` travel by value to its workers."""
    ray = pytest.importorskip("ray")
    import openrlhf_fakes

    ray.cloudpickle.register_pickle_by_value(openrlhf_fakes)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def fake_engines(ray_local):
    """Two `FakeEngine` Ray actors shared by the whole session; tests set their policy."""
    from openrlhf_fakes import FakeEngine

    actor = ray_local.remote(FakeEngine).options(num_cpus=0)
    engines = [actor.remote(), actor.remote()]
    # one request each, so the workers pay their vLLM import here, in parallel
    from harness.policies.base import SamplingParams
    from harness.policies.openrlhf_ray import RayEnginesBackend

    for engine in engines:
        RayEnginesBackend([engine]).generate([[1]], SamplingParams(max_new_tokens=4))
    return engines
