"""Tools in the env: the calculator next to search, structured actions, and their snapshots."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from env_fakes import DOCS, TASKS, FakeRetriever

from envs import (
    BudgetMeter,
    SearchQAConfig,
    SearchQAEnv,
    SnapshotError,
    Tool,
    ToolCall,
    snapshot_from_json,
)
from envs.errors import EnvConfigError, ToolArgumentError
from envs.protocol import invalid_action_message, parse_action
from envs.tools import CalculatorTool, SearchTool, ToolContext, ToolResult, calculate, load_tool


class CountingEcho(Tool):
    """A tool that echoes its argument upper-cased and counts its runs; each call costs 2."""

    name = "echo"
    description = "say it louder"
    argument = "text"
    cost = 2
    runs: ClassVar[list[str]] = []

    def run(self, key: str, context: ToolContext) -> ToolResult:
        self.runs.append(key)
        return ToolResult(output=key.upper())


def _env(*tools: Tool, max_turns: int = 6) -> SearchQAEnv:
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=max_turns, top_k=2, tools=tools)
    env.reset(seed=0, options={"task_id": "q1"})
    return env


def test_calculator_answers_with_its_result_and_counts_one_tool_call() -> None:
    env = _env(CalculatorTool())
    obs, reward, terminated, truncated, info = env.step(
        "<think>x</think><calc> (1914 - 1889) * 2 </calc>"
    )
    assert obs == "\n<result>50</result>\n"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["action_kind"] == "calc" and info["valid_action"]
    assert info["tool_cost"] == 1 and info["n_tool_calls"] == 1
    assert env.history[-1].content == "(1914 - 1889) * 2"
    assert env.history[-1].output == "50"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("7 / 2", "3.5"),
        ("6 / 3", "2"),
        ("-2 ** 2", "-4"),
        ("17 // 5 % 3", "0"),
        ("1 / 0", "error: division by zero"),
        ("2 ** 101", "error: an exponent over 100"),
        ("(10 ** 60) * (10 ** 60)", "error: a result past 1e+100, or not a real number"),
        ("(-8) ** 0.5", "error: a result past 1e+100, or not a real number"),
    ],
)
def test_calculate_values_and_arithmetic_errors(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "Call is not arithmetic"),
        ("x + 1", "Name is not arithmetic"),
        ("'a' * 3", "Constant is not arithmetic"),
        ("1 << 4", "LShift is not arithmetic"),
        ("2 +", "not an arithmetic expression"),
        ("1" + "+1" * 150, "at most 200"),
    ],
)
def test_calculator_refuses_what_is_not_arithmetic(expression: str, why: str) -> None:
    with pytest.raises(ToolArgumentError, match=why):
        CalculatorTool().parse(expression)
    env = _env(CalculatorTool())
    obs, _, _, _, info = env.step(f"<calc>{expression}</calc>")
    assert not info["valid_action"] and info["action_kind"] == "invalid"
    assert why in env.history[-1].content
    assert "<calc> and </calc>" in obs  # the invalid-action message names the tool's tags


def test_a_tool_call_is_the_text_action_with_the_tools_tag() -> None:
    by_text, by_call = _env(), _env()
    text = by_text.step("<search> Acme founder </search>")
    call = by_call.step(ToolCall(name="search", arguments='{"query": " Acme founder "}'))
    assert call == text
    assert by_call.snapshot() == by_text.snapshot()
    answer = by_call.step({"name": "answer", "arguments": {"answer": "Lyon"}})
    assert answer[1:3] == (1.0, True) and answer[4]["answer"] == "Lyon"


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (ToolCall(name="search", arguments="{not json"), "not JSON"),
        (ToolCall(name="search", arguments="[1, 2]"), "not an object"),
        (ToolCall(name="search", arguments={"q": "x"}), "one string argument 'query'"),
        (ToolCall(name="search", arguments={"query": 3}), "one string argument 'query'"),
        (ToolCall(name="search", arguments={"query": "x", "k": "9"}), "one string argument"),
        (ToolCall(name="search", arguments={"query": "a </search> b"}), "holds the tag"),
        (ToolCall(name="search", arguments={"query": "   "}), "empty search"),
        (ToolCall(name="browse", arguments={"url": "x"}), "unknown tool 'browse'"),
        ({"arguments": {"query": "x"}}, "unknown tool None"),
    ],
)
def test_a_malformed_call_is_an_invalid_action_never_an_error(call: object, why: str) -> None:
    env = _env()
    obs, reward, terminated, _, info = env.step(call)  # type: ignore[arg-type]
    assert not info["valid_action"] and (reward, terminated) == (0.0, False)
    assert why in env.history[-1].content
    assert obs.startswith("\nMy previous action is invalid (")


def test_a_repeated_call_is_answered_from_the_history_and_costs_each_time() -> None:
    CountingEcho.runs.clear()
    env = _env(CountingEcho())
    first = env.step("<echo> hi </echo>")
    second = env.step(ToolCall(name="echo", arguments={"text": "hi"}))
    assert first[0] == second[0] == "\n<result>HI</result>\n"
    assert CountingEcho.runs == ["hi"]
    assert second[4]["n_tool_calls"] == 4


def test_snapshots_keep_tool_results_and_name_the_tools() -> None:
    CountingEcho.runs.clear()
    env = _env(CountingEcho(), CalculatorTool())
    env.step("<calc> 6 * 7 </calc>")
    env.step("<echo> hi </echo>")
    text = env.snapshot().to_json()
    record = json.loads(text)
    assert record["tools"] == ["search", "echo", "calc"]
    assert [t.get("output") for t in record["turns"]] == ["42", "HI"]
    restored = SearchQAEnv(
        TASKS, FakeRetriever(DOCS), max_turns=6, top_k=2,
        tools=(CountingEcho(), CalculatorTool()),
    )  # fmt: skip
    restored.restore(snapshot_from_json(text))  # type: ignore[arg-type]
    branch = env.fork()[0]
    for other in (restored, branch):
        assert other.step("<echo> hi </echo>") == env.fork()[0].step("<echo> hi </echo>")
    assert CountingEcho.runs == ["hi"]  # every replay came from the history
    search_only = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=6, top_k=2)
    with pytest.raises(SnapshotError) as err:
        search_only.restore(snapshot_from_json(text))  # type: ignore[arg-type]
    assert err.value.field == "tools"


def test_a_search_only_snapshot_keeps_its_json_form() -> None:
    env = _env()
    env.step("<search> Acme founder </search>")
    record = env.snapshot().to_dict()
    assert "tools" not in record
    assert set(record["turns"][0]) == {"kind", "content", "hits"}


def test_a_forged_tool_output_on_an_answer_is_refused() -> None:
    env = _env(CalculatorTool())
    env.step("<calc> 1 + 1 </calc>")
    record = env.snapshot().to_dict()
    record["turns"].append({"kind": "answer", "content": "2", "hits": [], "output": "x"})
    with pytest.raises(SnapshotError, match="has a tool's result"):
        env.restore(snapshot_from_json(json.dumps(record)))  # type: ignore[arg-type]


def test_the_prompt_names_the_other_tools_and_budget_meter_counts_their_cost() -> None:
    env = BudgetMeter(
        SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=(CountingEcho(),)),
        max_tool_calls=3,
    )
    prompt, _ = env.reset(seed=0, options={"task_id": "q1"})
    assert "<echo> text </echo>: say it louder" in prompt
    env.step("<search> Acme </search>")
    *_, truncated, info = env.step("<echo> a </echo>")
    assert info["budget"]["n_tool_calls"] == 3 and truncated


def test_tool_sets_are_checked() -> None:
    with pytest.raises(EnvConfigError, match="search-r1"):
        SearchQAEnv(TASKS, FakeRetriever(DOCS), protocol="search-r1", tools=(CalculatorTool(),))
    with pytest.raises(EnvConfigError, match="two tools are named 'calc'"):
        SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=(CalculatorTool(), CalculatorTool()))
    with pytest.raises(EnvConfigError, match="two tools are named 'search'"):
        SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=(SearchTool(),))
    with pytest.raises(EnvConfigError, match=r"not an envs\.Tool"):
        SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=(3,))  # type: ignore[arg-type]


def test_the_config_names_tools_by_spec_and_builds_them() -> None:
    config = SearchQAConfig(tools=["envs.tools:CalculatorTool"])  # type: ignore[arg-type]
    assert config.tools == ("envs.tools:CalculatorTool",)
    env = config.make_env(TASKS, FakeRetriever(DOCS))
    assert env.tool_names == ("search", "calc")
    by_object = SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=[CalculatorTool()])
    assert by_object.config == env.config
    with pytest.raises(EnvConfigError, match="expected MODULE:CLASS"):
        SearchQAConfig(tools=("calc",))
    with pytest.raises(EnvConfigError, match="cannot import"):
        SearchQAConfig(tools=("no_such_module_x:Calc",)).make_env(TASKS, FakeRetriever(DOCS))


def test_a_tool_that_takes_arguments_works_from_python() -> None:
    def make() -> Tool:
        class Scaled(CalculatorTool):  # a local class needing an argument: no spec rebuilds it
            def __init__(self, factor: int) -> None:
                self.factor = factor

            def run(self, key: str, context: ToolContext) -> ToolResult:
                return ToolResult(output=calculate(f"({key}) * {self.factor}"))

        return Scaled(10)

    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), tools=[make()])
    env.reset(seed=0)
    assert env.step("<calc> 4 + 2 </calc>")[0] == "\n<result>60</result>\n"


def test_function_schema_and_load_tool() -> None:
    schema = SearchTool().function_schema()
    assert schema["function"]["name"] == "search"
    assert schema["function"]["parameters"]["required"] == ["query"]
    assert isinstance(load_tool("envs.tools:CalculatorTool"), CalculatorTool)
    for spec, why in [
        ("envs.tools", "MODULE:CLASS"),
        ("no_such_module_x:Tool", "cannot import"),
        ("envs.tools:ToolCall", "no Tool subclass"),
    ]:
        with pytest.raises(EnvConfigError, match=why):
            load_tool(spec)


def test_the_text_parser_reads_every_tools_tag_and_only_those() -> None:
    tools = ("search", "calc")
    assert parse_action("<calc> 1 + 1 </calc><search> x </search>", tools).kind == "calc"
    assert parse_action("<calc> 1 + 1 </calc>").reason == "no </search> or </answer> closing tag"
    assert parse_action("no tags", tools).reason == "no </search>, </calc> or </answer> closing tag"
    assert parse_action("<calc> <search> </calc>", tools).reason == "calc contains the tag <search>"
    long = parse_action(f"<calc>{'1+' * 1_100}1</calc>", tools)
    assert long.reason == "calc of 2201 characters (at most 2000)"
    message = invalid_action_message("x", tools)
    assert message.endswith(
        "To use calc, I should put its input between <calc> and </calc>. Let me try again.\n"
    )
    assert invalid_action_message("x") == invalid_action_message("x", ("search",))


def test_a_calls_reason_quotes_the_caller_within_the_observation_space() -> None:
    env = _env()
    keys = {f"北京{i}": "x" for i in range(1_000)}
    obs, *_, info = env.step(ToolCall(name="search", arguments=keys))
    assert not info["valid_action"] and len(env.history[-1].content) <= 300
    assert env.observation_space.contains(obs) and "\ufffd" in obs
    obs, *_ = env.step(ToolCall(name="北京", arguments={}))
    assert env.observation_space.contains(obs) and "unknown tool" in obs
