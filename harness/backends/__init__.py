"""Policy backends: one `PolicyBackend` protocol, several engines behind it."""

from harness.backends.base import BackendUnavailable, Completion, PolicyBackend, SamplingParams

__all__ = ["BackendUnavailable", "Completion", "PolicyBackend", "SamplingParams"]
