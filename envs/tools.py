"""Tools: the actions an env offers besides its final answer (search, and any of a user's).

A `Tool` has a name (also its text tag: `<calc> 2 + 3 </calc>`), an OpenAI function schema (for
models that call tools natively), an argument parser, an executor, an observation format and a
cost in the budget's tool-call currency. An env has search and the tools it is given next to
it (`SearchQAEnv(..., tools=[CalculatorTool()])`, or by spec in its config:
`SearchQAConfig(tools=("envs.tools:CalculatorTool",))`, `--tool`), and keeps every call's result
in its history, so a fork, a snapshot and a restore replay a call exactly: a repeated call (same
tool, same key) is answered from the history, never run again.

An action is a text (`"<search> q </search>"`) or a `ToolCall` (`ToolCall(name="search",
arguments={"query": "q"})`, the form a native tool call arrives in). A call is read as the text
action with the tool's tag around its one argument, so both forms give the same turn, the same
observation and the same snapshot; `answer` is the final answer's name (`{"answer": "..."}`).
Malformed arguments (not JSON, a missing or non-string argument, an unknown tool) make an
invalid action, never an error.

`CalculatorTool` is the worked example: arithmetic parsed with `ast` and evaluated node by
node (no `eval`), with bounds on its size and on the numbers it makes.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import operator
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from envs.errors import EnvConfigError, ToolArgumentError
from envs.protocol import (
    MAX_ACTION_CHARS,
    Protocol,
    format_information,
    format_information_search_r1,
    to_charset,
)
from retrieval.base import Hit, normalize_query

__all__ = [
    "ANSWER",
    "CalculatorTool",
    "SearchTool",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResult",
    "calculate",
    "call_as_text",
    "check_spec",
    "check_tools",
    "load_tool",
    "tool_spec",
]

ANSWER = "answer"
"""The name of the final answer, as a tool call (`arguments={"answer": ...}`)."""

_MAX_REASON_CHARS = 300
_RESERVED = frozenset({ANSWER, "invalid", "think", "information"})
_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A structured action: a tool's name and its arguments.

    Attributes:
        name: the tool's name, or "answer" for the final answer.
        arguments: the arguments as a mapping, or as the JSON text an API sends (parsed by the
            env; text that is not a JSON object makes an invalid action).
        call_id: the API's id for the call (`tool_calls[i].id`), echoed back with its result.
    """

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    call_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What one call returned: the state an env keeps for it in its history and snapshots.

    Attributes:
        output: the tool's answer as text ("" for search, whose answer is its hits).
        hits: the documents shown (search); counted in the info's "retrieved_doc_ids".
    """

    output: str = ""
    hits: tuple[Hit, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolContext:
    """What a tool may use of its env while it runs.

    Attributes:
        retrieve: the env's retriever for one normalised query, with the env's `top_k`, its
            retrieval deadline and its contract checks (raises `RetrievalFailedError`).
        protocol: the env's text protocol ("trace-rl" or "search-r1").
        max_doc_chars: the env's cut of each document's text in observations.
    """

    retrieve: Callable[[str], tuple[Hit, ...]]
    protocol: Protocol
    max_doc_chars: int


class Tool(ABC):
    """An action the env offers: subclass it, set the class attributes, implement `run`.

    Class attributes:
        name: the tool's name and text tag (lower case, e.g. "calc" for `<calc>...</calc>`).
        description: one line for the model (the prompt and the function schema).
        argument: the name of the tool's one string argument in a native call.
        argument_description: one line on that argument.
        cost: what a call costs in the budget's tool-call currency (`info["n_tool_calls"]`).

    A tool must be deterministic only through the env's history: a repeated call is answered
    from it. `parse` checks an argument before anything runs; `run` does the work; `observe`
    formats its result for the policy.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    argument: ClassVar[str] = "input"
    argument_description: ClassVar[str] = ""
    cost: ClassVar[int] = 1

    def function_schema(self) -> dict[str, Any]:
        """The tool in OpenAI's function-calling schema (the request's `tools` entry)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        self.argument: {
                            "type": "string",
                            "description": self.argument_description,
                        }
                    },
                    "required": [self.argument],
                },
            },
        }

    def prompt_line(self) -> str:
        """How the text protocol's prompt introduces the tool."""
        return f"<{self.name}> {self.argument} </{self.name}>: {self.description}"

    def parse(self, content: str) -> str:
        """Check an argument; return it as the turn keeps it.

        The protocol's parser has already stripped it and refused an empty one, one over
        `MAX_CONTENT_CHARS` and one holding a protocol tag.

        Raises:
            ToolArgumentError: the argument is not one this tool takes (an invalid action).
        """
        return content

    def key(self, content: str) -> str:
        """What `run` is given, and what a repeated call is recognised by."""
        return content

    @abstractmethod
    def run(self, key: str, context: ToolContext) -> ToolResult:
        """Do the call.

        Raises:
            RetrievalFailedError: the retriever failed (the env is left unchanged).
        """

    def observe(self, result: ToolResult, context: ToolContext) -> str:
        """The observation a call's result gives the policy."""
        return f"\n<result>{result.output}</result>\n"


class SearchTool(Tool):
    """The env's retriever as a tool: the default, and the only one of Search-R1's protocol."""

    name = "search"
    description = "search the knowledge source; returns the top documents"
    argument = "query"
    argument_description = "what to search for, a few words"

    def key(self, content: str) -> str:
        """The normalised query (what the retriever is sent)."""
        return normalize_query(content)

    def run(self, key: str, context: ToolContext) -> ToolResult:
        """The retriever's hits (Search-R1's empty query finds nothing)."""
        return ToolResult(hits=context.retrieve(key) if key else ())

    def observe(self, result: ToolResult, context: ToolContext) -> str:
        """`<information>` with the hits, in the env protocol's exact format."""
        if context.protocol == "search-r1":
            return format_information_search_r1(result.hits)
        return format_information(result.hits, max_doc_chars=context.max_doc_chars)


_MAX_EXPRESSION_CHARS = 200
_MAX_MAGNITUDE = 1e100  # beyond this a result is refused: it bounds every int the tool makes
_MAX_EXPONENT = 100
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


class CalculatorTool(Tool):
    """Arithmetic: `+ - * / // % **` and parentheses over integers and decimals.

    The expression is parsed by `ast` and only number, unary and binary nodes are evaluated
    (a name, a call or an attribute is refused), with bounds: 200 characters, exponents up to
    100, results up to 1e100 in magnitude. A malformed expression is an invalid action; an
    arithmetic error (a division by zero, a bound) is a result, "error: ...".

    >>> calculate("(1914 - 1889) * 2"), calculate("7 / 2"), calculate("1 / 0")
    ('50', '3.5', 'error: division by zero')
    """

    name = "calc"
    description = "evaluate an arithmetic expression (+ - * / // % ** and parentheses)"
    argument = "expression"
    argument_description = "the expression, e.g. (1914 - 1889) * 2"

    def parse(self, content: str) -> str:
        """The expression, if it parses as arithmetic within the bounds."""
        _parse_expression(content)
        return content

    def run(self, key: str, context: ToolContext) -> ToolResult:
        """The expression's value as text, or "error: ..."."""
        return ToolResult(output=calculate(key))


def _parse_expression(text: str) -> ast.expr:
    """The expression's syntax tree, with only arithmetic nodes.

    Raises:
        ToolArgumentError: too long, not an expression, or a node that is not arithmetic.
    """
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(
            f"calc: an expression of {len(text)} characters (at most {_MAX_EXPRESSION_CHARS})"
        )
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError) as err:
        why = err.msg if isinstance(err, SyntaxError) else str(err)
        raise ToolArgumentError(f"calc: not an arithmetic expression ({why})") from None
    for node in ast.walk(tree):
        allowed = (
            isinstance(node, ast.BinOp | ast.UnaryOp)
            or type(node) in _BINARY
            or type(node) in _UNARY
            or (isinstance(node, ast.Constant) and type(node.value) in (int, float))
        )
        if not allowed:
            raise ToolArgumentError(f"calc: {type(node).__name__} is not arithmetic")
    return tree


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text (an integral float without ".0").

    Raises:
        ToolArgumentError: the expression is not arithmetic (see `CalculatorTool`).
    """
    try:
        value = _evaluate(_parse_expression(expression))
    except ZeroDivisionError:
        return "error: division by zero"
    except (ArithmeticError, _TooLarge) as err:
        return f"error: {err}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.12g}"


class _TooLarge(Exception):
    """A number past the calculator's bounds."""


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant):
        assert isinstance(node.value, int | float)  # _parse_expression admits nothing else
        value: int | float = node.value
    elif isinstance(node, ast.UnaryOp):
        value = _UNARY[type(node.op)](_evaluate(node.operand))
    else:
        assert isinstance(node, ast.BinOp)  # _parse_expression admits nothing else
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise _TooLarge(f"an exponent over {_MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)
    if isinstance(value, complex) or not math.isfinite(value) or abs(value) > _MAX_MAGNITUDE:
        raise _TooLarge(f"a result past {_MAX_MAGNITUDE:g}, or not a real number")
    return value


def check_tools(extra: Sequence[Tool]) -> tuple[Tool, ...]:
    """An env's tools: search, then `extra`, checked (`Tool`s, valid and unique names).

    Raises:
        EnvConfigError: a tool is not a `Tool`, has a bad or repeated name (search's
            included) or a negative cost.
    """
    tools = (SearchTool(), *extra)
    names: list[str] = []
    for tool in tools:
        if not isinstance(tool, Tool):
            raise EnvConfigError(f"{tool!r:.80} is not an envs.Tool (subclass it)")
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in _RESERVED:
            raise EnvConfigError(
                f"tool {type(tool).__name__} has the name {name!r}: a tool's name is its text "
                f"tag, lower-case letters, digits and _ (at most 32), and not one of "
                f"{sorted(_RESERVED)}"
            )
        if name in names:
            raise EnvConfigError(f"two tools are named {name!r}")
        if not isinstance(tool.cost, int) or tool.cost < 0:
            raise EnvConfigError(f"tool {name!r} has cost {tool.cost!r}: an integer >= 0")
        names.append(name)
    return tools


def call_as_text(call: Any, tools: Mapping[str, Tool]) -> tuple[str, str]:
    """A structured action as the text action it stands for, or why it is invalid.

    Returns:
        (text, reason): the text action (`<tag> argument </tag>`) and "", or "" and the reason
        the call is invalid (an unknown tool, arguments that are not a JSON object, a missing,
        extra or non-string argument, or an argument holding a protocol tag).
    """
    name = call.name if isinstance(call, ToolCall) else call.get("name")
    arguments = call.arguments if isinstance(call, ToolCall) else call.get("arguments", {})
    if name == ANSWER:
        argument = ANSWER
    elif isinstance(name, str) and name in tools:
        argument = tools[name].argument
    else:
        known = ", ".join([*tools, ANSWER])
        return _invalid(f"unknown tool {name!r:.60} (the tools are {known})")
    if isinstance(arguments, str):
        if len(arguments) > MAX_ACTION_CHARS:
            return _invalid(
                f"arguments of {len(arguments)} characters (at most {MAX_ACTION_CHARS})"
            )
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as err:
            return _invalid(f"{name}: the arguments are not JSON ({err})")
    if not isinstance(arguments, Mapping):
        return _invalid(f"{name}: the arguments are a {type(arguments).__name__}, not an object")
    value = arguments.get(argument)
    if not isinstance(value, str) or set(arguments) != {argument}:
        given = sorted(map(str, arguments))
        return _invalid(f"{name} takes one string argument {argument!r}, got {given}")
    tags = {f"<{t}>" for t in (*tools, ANSWER, "think", "information")}
    tags |= {"</" + t[1:] for t in tags}
    for tag in sorted(tags):
        if tag in value:
            return _invalid(f"{name}: the argument holds the tag {tag}")
    return f"<{name}>{value}</{name}>", ""


def _invalid(reason: str) -> tuple[str, str]:
    """No text, and the reason: bounded and in the charset (it quotes what the caller sent)."""
    return "", to_charset(reason[:_MAX_REASON_CHARS])


def tool_spec(tool: Tool) -> str:
    """The `MODULE:CLASS` spec that `load_tool` builds this tool's class from.

    >>> tool_spec(CalculatorTool())
    'envs.tools:CalculatorTool'
    """
    return f"{type(tool).__module__}:{type(tool).__qualname__}"


def check_spec(spec: str) -> tuple[str, str, str]:
    """`spec` split as `MODULE`, ":", `CLASS`.

    Raises:
        EnvConfigError: `spec` is not a `MODULE:CLASS` string.
    """
    module_name, sep, class_name = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module_name or not class_name:
        raise EnvConfigError(
            f"tool {spec!r:.80}: expected MODULE:CLASS, e.g. envs.tools:CalculatorTool"
        )
    return module_name, sep, class_name


def load_tool(spec: str) -> Tool:
    """The tool named by `MODULE:CLASS` (`--tool`, `SearchQAConfig.tools`), built bare.

    >>> load_tool("envs.tools:CalculatorTool").name
    'calc'

    Raises:
        EnvConfigError: `spec` is not `MODULE:CLASS`, the module or class cannot be found, or
            the class is not a `Tool` that builds with no arguments.
    """
    module_name, _, class_name = check_spec(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvConfigError(f"tool {spec}: cannot import {module_name} ({err})") from None
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, Tool):
        raise EnvConfigError(f"tool {spec}: {module_name} has no Tool subclass {class_name}")
    try:
        return cls()
    except TypeError as err:
        raise EnvConfigError(f"tool {spec}: {class_name}() fails ({err})") from None
