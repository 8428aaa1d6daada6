"""The `>>>` examples of the benchmarks modules (pytest's doctest run does not collect them)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "benchmarks.qa.qa_datasets",
    "benchmarks.qa.corpus",
    "benchmarks.qa.agents",
    "benchmarks.qa.report",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
