"""A tool of your own next to search: unit conversion, with the built-in calculator beside it.

`ConvertTool` is a complete `envs.Tool`: a name (its text tag `<convert>`), a description and
an argument (which make its prompt line and its OpenAI function schema), a parser that turns
a malformed argument into an invalid action, an executor, and the default observation
(`<result>…</result>`). A scripted agent then answers "How many kilometres long is the Acme
road?" by searching, converting and answering, once with text actions and once with
structured calls (`envs.ToolCall`, what a native tool-calling model sends); a fork and a
snapshot that went through JSON replay the conversion from the episode's history.

Run: `python examples/custom_tool.py` (under a second on CPU). The same tool on the command
line: `tracerl bench --tool examples.custom_tool:ConvertTool ...`.
"""

from __future__ import annotations

import re

from envs import QATask, SearchQAEnv, Tool, ToolCall, snapshot_from_json
from envs.errors import ToolArgumentError
from envs.tools import CalculatorTool, ToolContext, ToolResult
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever

_FACTORS = {("mi", "km"): 1.609344, ("km", "mi"): 1 / 1.609344, ("ft", "m"): 0.3048}
_QUANTITY = re.compile(r"(-?\d+(?:\.\d+)?)\s*(\w+)\s+(?:in|to)\s+(\w+)")


class ConvertTool(Tool):
    """Converts a length between units: `5 mi in km`."""

    name = "convert"
    description = "convert a length between units (mi, km, ft, m), e.g. 5 mi in km"
    argument = "quantity"
    argument_description = "a number, its unit, 'in', the target unit"
    cost = 1  # one tool call in the budget, as a search

    def parse(self, content: str) -> str:
        """Refuse what is not `NUMBER UNIT in UNIT` with a known pair (an invalid action)."""
        match = _QUANTITY.fullmatch(content)
        if match is None or (match.group(2), match.group(3)) not in _FACTORS:
            raise ToolArgumentError(f"convert: expected e.g. '5 mi in km', got {content!r:.60}")
        return content

    def run(self, key: str, context: ToolContext) -> ToolResult:
        """The converted length, to three decimals."""
        match = _QUANTITY.fullmatch(key)
        assert match is not None  # parse admitted it
        value, source, target = float(match.group(1)), match.group(2), match.group(3)
        return ToolResult(output=f"{value * _FACTORS[source, target]:.3f} {target}")


DOCS = [
    Document(doc_id="d1", title="Acme road", text="The Acme road is 5 mi long."),
    Document(doc_id="d2", title="Bolt road", text="The Bolt road is 12 mi long."),
]
TASKS = [
    QATask(
        task_id="acme",
        question="How many kilometres long is the Acme road?",
        golden_answers=("8.047 km",),
    )
]


def make_env() -> SearchQAEnv:
    """An env over the two documents, with the converter and the calculator next to search."""
    tools = [ConvertTool(), CalculatorTool()]
    return SearchQAEnv(TASKS, BM25Retriever.build(DOCS), max_turns=4, top_k=1, tools=tools)


def main() -> dict[str, object]:
    """Play the episode both ways, fork and restore it; returns what the run showed."""
    env = make_env()
    prompt, _ = env.reset(seed=0)
    print(prompt.splitlines()[1])  # the tool's own line in the prompt
    found, *_ = env.step("<search> Acme road length </search>")
    miles = re.search(r"(\d+) mi", found).group(1)  # type: ignore[union-attr]
    converted, *_ = env.step(f"<convert> {miles} mi in km </convert>")
    print(f"converted: {converted.strip()}")
    snap = env.snapshot().to_json()  # the conversion's result is kept inside
    branch = env.fork()[0]
    answer = converted.strip().removeprefix("<result>").removesuffix("</result>")
    text_reward = env.step(f"<answer> {answer} </answer>")[1]

    by_calls = make_env()
    by_calls.reset(seed=0)
    by_calls.step(ToolCall(name="search", arguments={"query": "Acme road length"}))
    by_calls.step(ToolCall(name="convert", arguments='{"quantity": "5 mi in km"}'))
    bad, *_ = by_calls.step(ToolCall(name="convert", arguments={"quantity": "5 parsecs"}))
    call_reward = by_calls.step(ToolCall(name="answer", arguments={"answer": answer}))[1]

    restored = make_env()
    restored.restore(snapshot_from_json(snap))  # type: ignore[arg-type]
    replayed = restored.step("<convert> 5 mi in km </convert>")[0]
    forked = branch.step("<calc> 8.047 * 2 </calc>")[0]
    print(f"rewards: text {text_reward}, tool calls {call_reward}; a bad call: {bad.strip()[:60]}")
    print(f"replayed from the snapshot: {replayed.strip()}; the fork computes: {forked.strip()}")
    return {
        "converted": converted,
        "rewards": (text_reward, call_reward),
        "bad": bad,
        "replayed": replayed,
        "forked": forked,
        "schema": ConvertTool().function_schema(),
    }


if __name__ == "__main__":
    main()
