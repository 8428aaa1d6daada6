"""Typed errors of the benchmarks package.

Each error also inherits the nearest builtin, so generic handlers (`except ValueError`,
`except ConnectionError`) still work.
"""

from __future__ import annotations

__all__ = [
    "BenchmarkError",
    "DatasetFormatError",
    "DatasetUnavailable",
    "NoParagraphsError",
    "UnknownBenchmarkNameError",
]


class BenchmarkError(Exception):
    """Base class of every benchmarks error."""


class DatasetFormatError(BenchmarkError, ValueError):
    """A dataset file or record does not have the fields its format needs."""


class DatasetUnavailable(BenchmarkError, ConnectionError):
    """A hub dataset could not be loaded (offline, no such repo); the message says what to do."""


class NoParagraphsError(BenchmarkError, ValueError):
    """A corpus was asked of datasets that carry no paragraphs (Bamboogle, NQ-open)."""


class UnknownBenchmarkNameError(BenchmarkError, LookupError):
    """A name (dataset, format, agent) is not in its registry; the message lists the valid ones."""
