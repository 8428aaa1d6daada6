"""Typed errors of the harness package."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BackendUnavailable",
    "CheckpointError",
    "ContextLengthExceeded",
    "EndpointError",
    "EndpointRejected",
    "EngineTimeoutError",
    "HarnessError",
    "MalformedReply",
    "PluginError",
    "RankMismatchError",
    "Refused",
    "ReplyTooLarge",
    "ResumeError",
    "RolloutError",
    "RunAborted",
]


class HarnessError(Exception):
    """Base class of every harness error."""


class EndpointError(HarnessError, ConnectionError):
    """An HTTP model endpoint did not answer within its retry budget (connection, 429, 5xx)."""


class EndpointRejected(HarnessError, ValueError):
    """An HTTP model endpoint refused a request (4xx) or sent a reply that is not the API's."""


class ContextLengthExceeded(EndpointRejected):
    """An HTTP model endpoint refused a prompt longer than the model's context."""


class MalformedReply(EndpointRejected):
    """A 200 reply that is not the API's (not JSON, `"choices": []`), still after the retries."""


class ReplyTooLarge(MalformedReply):
    """A reply over the endpoint's `max_reply_bytes` (not asked again: it would cost as much)."""


class EngineTimeoutError(HarnessError, TimeoutError):
    """Generation engines did not answer within their timeout (a hung vLLM engine)."""


class PluginError(HarnessError, ValueError):
    """A user's `MODULE:CLASS` cannot be imported, built, or is not the protocol it plugs into."""


class ResumeError(HarnessError, ValueError):
    """`resume=True` on a run with no checkpoint, or a fresh run over an existing one."""


class RolloutError(HarnessError, RuntimeError):
    """The engine cannot run a request (unknown snapshot, no room in the context, bad reward)."""


class CheckpointError(HarnessError, ValueError):
    """A checkpoint is missing, incomplete, or from an incompatible version."""


class BackendUnavailable(HarnessError, ImportError):
    """A backend's optional dependency is missing; the message names the extra to install."""


class RankMismatchError(HarnessError, RuntimeError):
    """State that must be the same on every rank is not (a bug, or a nondeterministic input)."""


class RunAborted(HarnessError, RuntimeError):
    """A run stopped itself: too many of its episodes failed step after step (a dead retriever)."""


class Refused(HarnessError, ValueError):
    """Input refused for several reasons at once: a header, then one line per reason.

    `tracerl` prints every reason, one line each (other errors keep only their first line), so
    a refusal that lists five problems shows all five.
    """

    def __init__(self, header: str, reasons: Sequence[str]) -> None:
        self.header = header
        self.reasons = tuple(reasons)
        super().__init__("\n".join([f"{header}:", *(f"- {r}" for r in self.reasons)]))

    def __reduce__(self) -> tuple[type[Refused], tuple[str, tuple[str, ...]]]:
        # pickled by its own arguments: a Ray task's error travels back whole
        return type(self), (self.header, self.reasons)
