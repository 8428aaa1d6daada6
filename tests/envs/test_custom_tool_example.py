"""The worked example examples/custom_tool.py runs: a user's tool next to search and calc."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from envs.tools import load_tool

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_tool.py"


def test_the_custom_tool_example_converts_answers_and_replays() -> None:
    spec = importlib.util.spec_from_file_location("custom_tool_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = module.main()
    assert result["converted"] == "\n<result>8.047 km</result>\n"
    assert result["rewards"] == (1.0, 1.0)  # text actions and structured calls score alike
    assert "convert: expected e.g. '5 mi in km'" in result["bad"]
    assert result["replayed"] == result["converted"]
    assert result["forked"] == "\n<result>16.094</result>\n"
    assert result["schema"]["function"]["parameters"]["required"] == ["quantity"]


def test_the_example_tool_loads_by_its_spec() -> None:
    assert load_tool("examples.custom_tool:ConvertTool").name == "convert"
