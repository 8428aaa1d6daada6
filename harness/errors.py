"""Typed errors of the harness package."""

from __future__ import annotations

__all__ = [
    "BackendUnavailable",
    "CheckpointError",
    "ContextLengthExceeded",
    "EndpointError",
    "EndpointRejected",
    "EngineTimeoutError",
    "HarnessError",
    "MalformedReply",
    "RankMismatchError",
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
