"""A run that fails loud: check the retriever at start, stop when step after step fails.

A dead retriever does not crash a run: every search fails after its retries, every episode ends
as failed and is left out of training (`harness.rollout.engine.leaves_to_train`), and the run goes
on training nothing. Both trainers (the CPU one and the OpenRLHF one) therefore

- ask the retriever's `/health` before the first step (`check_retriever`), so a wrong URL stops
  the run at once with the URL in the message;
- log every step's metrics, a step that kept no leaf included, with `rollout/failed_share`;
- feed each step's failed share to a `FailureStreak`, which raises `RunAborted` after
  `AbortConfig.steps` consecutive steps above `AbortConfig.failed_share`, with the cause (the
  retriever's last error) in one line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from harness.errors import HarnessError, RunAborted
from harness.training.config import AbortConfig
from retrieval import Retriever
from retrieval.cache import CachedRetriever
from retrieval.client import HTTPRetriever
from retrieval.errors import RequestRejected

__all__ = ["FailureStreak", "check_retriever", "failure_cause"]

log = logging.getLogger(__name__)


def _remote(retriever: Retriever | None) -> HTTPRetriever | None:
    inner = retriever.inner if isinstance(retriever, CachedRetriever) else retriever
    return inner if isinstance(inner, HTTPRetriever) else None


def check_retriever(retriever: Retriever) -> None:
    """Ask a remote retriever's `/health` once; local indexes need nothing.

    Raises:
        HarnessError: the server does not answer, with its URL and what to do.
    """
    remote = _remote(retriever)
    if remote is None:
        return
    try:
        health = remote.health()
    except RequestRejected:  # Search-R1's own servers have no /health; they answer searches
        remote.search(["health check"], k=1)
        return
    except Exception as err:
        raise HarnessError(
            f"the retriever at {remote.url} does not answer before the first step "
            f"({str(err).splitlines()[0][:300]}): start it (`tracerl serve-retriever --index "
            "DIR --host 0.0.0.0`) or fix the retriever URL; on several nodes it must be "
            "reachable from every one (`tracerl doctor --retriever URL`)"
        ) from err
    log.info("retriever %s answers: index %s", remote.url, health.get("index_id"))


def failure_cause(retriever: Retriever | None) -> str:
    """The retriever's last failure in one line, or '' (a local index, or no failure)."""
    remote = _remote(retriever)
    return remote.last_failure.splitlines()[0] if remote and remote.last_failure else ""


class FailureStreak:
    """Counts consecutive steps whose failed-episode share passes `config.failed_share`.

    >>> streak = FailureStreak(AbortConfig(failed_share=0.5, steps=2))
    >>> streak.observe(1, {"rollout/failed_share": 1.0})
    >>> streak.observe(2, {"rollout/failed_share": 0.9}, cause="no server")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    harness.errors.RunAborted: aborted at step 2: 2 steps in a row ... cause: no server
    """

    def __init__(self, config: AbortConfig) -> None:
        self.config = config
        self.count = 0

    def observe(self, step: int, record: Mapping[str, Any], *, cause: str = "") -> None:
        """Take one step's metrics (with `rollout/failed_share`).

        Raises:
            RunAborted: the streak reached `config.steps`.
        """
        share = float(record.get("rollout/failed_share", 0.0))
        self.count = self.count + 1 if share > self.config.failed_share else 0
        if self.count and self.count < self.config.steps:
            log.warning(
                "step %d: %.0f%% of its episodes failed (%d of %d failed steps before the run "
                "aborts)%s",
                step,
                100 * share,
                self.count,
                self.config.steps,
                f": {cause}" if cause else "",
            )
        if self.config.steps and self.count >= self.config.steps:
            raise RunAborted(
                f"aborted at step {step}: {self.count} steps in a row ended more than "
                f"{self.config.failed_share:.0%} of their episodes by a fault (the last "
                f"{share:.0%}), so nothing trains; cause: {cause or 'see the log'}"
            )
