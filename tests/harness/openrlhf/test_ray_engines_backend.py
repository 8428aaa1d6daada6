"""`RayEnginesBackend` over `RolloutRayActor`-shaped Ray actors: completions keep ids, text,
log-probs and finish reasons; requests carry their own seeds; routing follows cached prefixes."""

from __future__ import annotations

import pytest
from openrlhf_fakes import EchoPolicy, SlowPolicy

from harness.errors import EngineTimeoutError, HarnessError
from harness.policies.base import SamplingParams
from harness.policies.openrlhf_ray import RayEnginesBackend

# Ray workers that import vLLM take about a minute to start on a 2-core machine (once per session)
pytestmark = pytest.mark.slow

SAMPLING = SamplingParams(max_new_tokens=8, seed=7)


@pytest.fixture
def engines(ray_local, fake_engines):
    """The shared engines, answering with `EchoPolicy` (a test may set another ending)."""
    ray_local.get([e.set_policy.remote(EchoPolicy()) for e in fake_engines])
    return fake_engines


def seen(ray, engine):
    return ray.get(engine.seen.remote())


def block(start: int) -> list[int]:
    """32 tokens: two whole routing blocks."""
    return list(range(start, start + 32))


def test_completions_carry_ids_text_logprobs_and_finish_reasons(ray_local, engines):
    stop, eos = engines
    ray_local.get(eos.set_policy.remote(EchoPolicy("eos")))
    out = RayEnginesBackend([stop]).generate([[1, 2], [3]], SAMPLING)
    assert [c.finish_reason for c in out] == ["stop", "stop"]
    for c in out:
        assert len(c.token_ids) == 3 and c.logprobs == (-0.5, -1.0, -1.5)
        assert c.text == " ".join(map(str, c.token_ids)) + "</answer>"
    [short] = RayEnginesBackend([stop]).generate([[1]], SamplingParams(max_new_tokens=2))
    assert short.finish_reason == "length" and len(short.token_ids) == 2
    [ended] = RayEnginesBackend([eos], eos_text="<eos>").generate([[1]], SAMPLING)
    assert ended.finish_reason == "eos" and not ended.text.endswith("<eos>")
    [quiet] = RayEnginesBackend([stop]).generate([[1]], SamplingParams(logprobs=False, seed=1))
    assert quiet.logprobs == ()


def test_each_request_has_its_own_seed_and_a_seeded_call_repeats(engines):
    backend = RayEnginesBackend(engines[:1])
    a = backend.generate([[5, 6]] * 3, SAMPLING)
    assert len({c.token_ids for c in a}) == 3  # same prefix, different samples
    assert backend.generate([[5, 6]] * 3, SAMPLING) == a
    assert backend.generate([[5, 6]] * 3, SamplingParams(max_new_tokens=8, seed=8)) != a


def test_unseeded_requests_leave_sampling_to_the_engine(ray_local, engines):
    # a per-request seed puts vLLM on its slow per-request sampling path; training turns it off
    seeded = RayEnginesBackend(engines[:1])._request(SAMPLING, base=5, index=2)
    unseeded = RayEnginesBackend(engines[:1], seeded=False)._request(SAMPLING, base=5, index=2)
    assert seeded.seed is not None and unseeded.seed is None
    assert unseeded.temperature == seeded.temperature and unseeded.stop == seeded.stop


def test_forks_of_a_prefix_go_to_the_engine_that_holds_it(ray_local, engines):
    backend = RayEnginesBackend(engines)
    before = [len(seen(ray_local, e)) for e in engines]
    a, b = block(100), block(500)
    backend.generate([a, a, b, b], SAMPLING)
    new = [seen(ray_local, e)[n:] for e, n in zip(engines, before, strict=True)]
    holder_a = 0 if a in new[0] else 1
    assert new[holder_a] == [a, a] and new[1 - holder_a] == [b, b]
    # a continuation of a's first turn: prefix + completion + observation
    [first] = backend.generate([a], SAMPLING)
    continuation = [*a, *first.token_ids, 7, 7, 7]
    backend.generate([continuation], SAMPLING)
    assert seen(ray_local, engines[holder_a])[-1] == continuation
    assert backend.n_routed_by_prefix >= 3


def test_a_popular_prefix_spills_over_past_the_imbalance_cap(ray_local, engines):
    backend = RayEnginesBackend(engines, max_imbalance=1.5)
    before = [len(seen(ray_local, e)) for e in engines]
    backend.generate([block(900)] * 8, SAMPLING)
    counts = sorted(len(seen(ray_local, e)) - n for e, n in zip(engines, before, strict=True))
    assert counts == [2, 6]  # cap = 1.5 x 8 / 2


def test_reset_routing_forgets_the_prefixes(engines):
    backend = RayEnginesBackend(engines)
    backend.generate([block(40)], SAMPLING)
    backend.generate([block(40)], SAMPLING)
    assert backend.n_routed_by_prefix == 1
    backend.reset_routing()
    backend.generate([block(40)], SAMPLING)
    assert backend.n_routed_by_prefix == 1


def test_bad_input_is_refused(ray_local, engines):
    backend = RayEnginesBackend(engines)
    with pytest.raises(ValueError, match="prefix 1 is empty"):
        backend.generate([[1], []], SAMPLING)
    assert backend.generate([], SAMPLING) == []
    with pytest.raises(ValueError):
        RayEnginesBackend([])
    with pytest.raises(ValueError):
        RayEnginesBackend(engines, max_imbalance=0.5)
    ray_local.get(engines[0].set_policy.remote(EchoPolicy("abort")))
    with pytest.raises(HarnessError, match="aborted"):
        RayEnginesBackend(engines[:1]).generate([[1]], SAMPLING)


def test_a_hung_engine_times_out_with_a_clear_error_instead_of_blocking(ray_local, engines):
    import time

    ray_local.get(engines[1].set_policy.remote(SlowPolicy(4.0)))
    backend = RayEnginesBackend(engines, timeout_s=0.5)
    start = time.perf_counter()
    with pytest.raises(EngineTimeoutError, match=r"within 0.5 s \(engines still busy: \[1\]\)"):
        backend.generate([block(0), block(100)], SAMPLING)
    assert time.perf_counter() - start < 3.0
    ray_local.get(engines[1].set_policy.remote(EchoPolicy()))  # queued behind the sleep


def test_submitted_requests_come_back_as_each_finishes_and_a_hung_one_times_out(ray_local, engines):
    # what lets the tree-rollout engine drop lockstep: the fast engine's answer is collected
    # (and its episode can go on) while the slow engine is still generating
    from harness.policies.base import ConcurrentPolicyBackend

    ray_local.get(engines[1].set_policy.remote(SlowPolicy(1.5)))
    backend = RayEnginesBackend(engines, timeout_s=30.0)
    assert isinstance(backend, ConcurrentPolicyBackend)
    fast, slow = backend.submit([block(0), block(100)], SAMPLING)
    first = backend.wait([fast, slow])
    assert [handle for handle, _ in first] == [fast]
    second = backend.wait([slow])
    assert [handle for handle, _ in second] == [slow]
    together = backend.generate([block(0), block(100)], SAMPLING)
    assert [c for _, c in first + second] == together  # the same requests, the same seeds
    ray_local.get(engines[1].set_policy.remote(SlowPolicy(4.0)))
    hung_backend = RayEnginesBackend(engines, timeout_s=0.5)
    _, stuck = hung_backend.submit([block(0), block(100)], SAMPLING)  # the second on engine 1
    with pytest.raises(EngineTimeoutError, match=r"engines still busy: \[1\]"):
        hung_backend.wait([stuck])
    ray_local.get(engines[1].set_policy.remote(EchoPolicy()))  # queued behind the sleep
