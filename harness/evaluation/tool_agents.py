"""Agents for the bench's other two protocols: native tool calls (`tools`) and ReAct (`react`).

Both talk to an OpenAI-compatible endpoint and act on the env through structured actions
(`envs.ToolCall`), so the env, its scoring and its budget are the ones the text protocols use.
Both are `EndpointAgent`s (`harness.evaluation.agents`), so evaluation schedules them
continuously: each episode sends its next request the moment its reply is back, seeded by the
run's seed, the question and the turn.

- `ToolCallAgent` (`--protocol tools`): the env's tools go out in the request's `tools` (the
  OpenAI function-calling schema: `search` with a `query` argument, and any other tool); each
  entry of a reply's `tool_calls` becomes one env action, in order, and each observation goes
  back as a `role: tool` message with the call's id. The final answer is a plain reply: an
  assistant message without tool calls (a leading `<think>…</think>` block is dropped).
  Several calls in one reply are several env steps, each counted in the budget and the turn
  limit; malformed arguments are the env's invalid-action observation, sent back the same way.
- `ReActAgent` (`--protocol react`): ReAct's text format (Yao et al., 2023): `Thought n:`,
  `Action n: Search[query]` or `Finish[answer]`, `Observation n:`, after a few-shot prompt.
  `completions` sends one transcript (base models); `chat` sends the prompt as the first user
  message and each observation as the next (instruct models).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envs.tools import ANSWER, SearchTool, Tool, ToolCall
from harness.errors import EndpointRejected
from harness.evaluation.agents import (
    EndpointAgent,
    EndpointState,
    TranscriptState,
    reply_action,
    submit_transcript,
)
from harness.policies.base import SamplingParams
from harness.policies.openai_compat import OpenAICompatClient, ReplyFuture, TextCompletion
from harness.rollout.agent import AgentAction

__all__ = [
    "REACT_EXAMPLES",
    "TOOLS_SYSTEM_PROMPT",
    "ReActAgent",
    "ToolCallAgent",
    "parse_react",
    "react_prompt",
]

TOOLS_SYSTEM_PROMPT = (
    "Answer the user's question. Use the tools to look things up: search returns the top "
    "documents for a query, and you may call tools several times, several at once. When you "
    "know the answer, reply with the answer alone, in a few words, without calling a tool."
)
"""The system message of `--protocol tools`."""

_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


def _render(call: ToolCall) -> str:
    """A call as the trajectory shows it: `search({"query": "..."})`."""
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return f"{call.name}({arguments})"


class _ToolAgent(EndpointAgent):
    """What both agents share: the env's tools, listed in the report."""

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        tools: Sequence[Tool] = (SearchTool(),),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, client, sampling, settings=settings)
        self.tools = tuple(tools)

    def settings(self) -> dict[str, Any]:
        """Endpoint (without the API key), tools and sampling."""
        return {**super().settings(), "tools": [tool.name for tool in self.tools]}


@dataclass(kw_only=True)
class _ChatState(EndpointState):
    messages: list[dict[str, Any]]
    queue: list[ToolCall] = field(default_factory=list)
    """Calls of the last reply not yet stepped."""
    pending: str | None = None
    """The id of the call whose observation comes next."""


class ToolCallAgent(_ToolAgent):
    """A chat model that calls the env's tools natively (`--protocol tools`; module doc).

    Args:
        name: the label in reports.
        client: the endpoint client.
        sampling: generation settings (its stop strings are dropped: no text tags here).
        tools: the env's tools, offered in every request.
        system_prompt: the system message.
        settings: extra fields for the report.
    """

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        tools: Sequence[Tool] = (SearchTool(),),
        system_prompt: str = TOOLS_SYSTEM_PROMPT,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, client, replace(sampling, stop=()), tools=tools, settings=settings)
        self.system_prompt = system_prompt
        self.schemas = [tool.function_schema() for tool in self.tools]

    def settings(self) -> dict[str, Any]:
        """The shared settings, the protocol and the system prompt."""
        return {**super().settings(), "protocol": "tools", "system_prompt": self.system_prompt}

    def start(self, prompt: str, info: Mapping[str, Any]) -> _ChatState:
        """The conversation: the system message, then the question as the user's."""
        return _ChatState(
            messages=[
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": str(info["question"])},
            ],
            task_id=str(info.get("task_id", "")),
        )

    def _send(
        self, state: _ChatState, observation: str, info: Mapping[str, Any]
    ) -> ReplyFuture[TextCompletion | EndpointRejected] | AgentAction:
        """Answer the last call's result; step the reply's next call, or ask the model."""
        if state.pending is not None:
            state.messages.append(
                {"role": "tool", "tool_call_id": state.pending, "content": observation.strip()}
            )
            state.pending = None
        if state.queue:  # a call of the last reply: no request needed
            call = self._pop_call(state)
            return AgentAction(text=_render(call), call=call, finish_reason="stop")
        return self.client.submit_chat(
            state.messages, self._sampling_for(state), tools=self.schemas
        )

    def _reply_action(self, state: _ChatState, reply: TextCompletion) -> AgentAction:
        """Record the reply; its first call, or its text as the answer."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in reply.tool_calls
            ]
        state.messages.append(message)
        if reply.tool_calls:
            state.queue = [
                ToolCall(name=c.name, arguments=c.arguments, call_id=c.call_id)
                for c in reply.tool_calls
            ]
            call = self._pop_call(state)
            return reply_action(reply, _render(call), call)
        answer = _THINK.sub("", reply.text).strip()
        return reply_action(reply, reply.text, ToolCall(name=ANSWER, arguments={ANSWER: answer}))

    @staticmethod
    def _pop_call(state: _ChatState) -> ToolCall:
        """The next queued call; its observation answers it by id."""
        call = state.queue.pop(0)
        state.pending = call.call_id
        return call


# --- ReAct -------------------------------------------------------------------------------------

REACT_EXAMPLES = """Question: Which city was the founder of Halvorsen Shipping born in?
Thought 1: I need to find who founded Halvorsen Shipping, then where that person was born.
Action 1: Search[Halvorsen Shipping founder]
Observation 1: Doc 1(Title: Halvorsen Shipping) Halvorsen Shipping is a Norwegian ferry \
company founded in 1921 by Ingrid Halvorsen.
Thought 2: Halvorsen Shipping was founded by Ingrid Halvorsen. Now I need her birthplace.
Action 2: Search[Ingrid Halvorsen born]
Observation 2: Doc 1(Title: Ingrid Halvorsen) Ingrid Halvorsen (1889-1960) was a shipowner \
born in Bergen, Norway.
Thought 3: Ingrid Halvorsen was born in Bergen, so the answer is Bergen.
Action 3: Finish[Bergen]

Question: Are the rivers Avenmore and Tollbeck in the same country?
Thought 1: I need the country of each river.
Action 1: Search[Avenmore river]
Observation 1: Doc 1(Title: Avenmore) The Avenmore is a river in the west of Ireland.
Thought 2: The Avenmore is in Ireland. Now the Tollbeck.
Action 2: Search[Tollbeck river]
Observation 2: Doc 1(Title: Tollbeck) The Tollbeck is a short river in Cumbria, England.
Thought 3: The Avenmore is in Ireland and the Tollbeck in England, so they are not.
Action 3: Finish[no]
"""
"""ReAct's few-shot examples (made-up facts, in the format of the paper's HotpotQA prompt)."""


def react_prompt(question: str, tools: Sequence[Tool] = (SearchTool(),)) -> str:
    """ReAct's prompt: the instruction, one action line per tool, the examples, the question.

    >>> react_prompt("Who founded Acme?").splitlines()[-2:]
    ['Question: Who founded Acme?', 'Thought 1:']
    """
    lines = [
        f"({k}) {_react_name(tool)}[{tool.argument}], which can {tool.description}."
        for k, tool in enumerate(tools, start=1)
    ]
    lines.append(f"({len(lines) + 1}) Finish[answer], which returns the answer and ends the task.")
    return (
        "Solve a question answering task with interleaving Thought, Action, Observation steps. "
        "Thought can reason about the current situation, and Action can be of these types:\n"
        + "\n".join(lines)
        + "\nHere are some examples.\n"
        + REACT_EXAMPLES
        + f"\nQuestion: {question.strip()}\nThought 1:"
    )


def _react_name(tool: Tool) -> str:
    return tool.name.capitalize()


def parse_react(text: str, tools: Sequence[Tool] = (SearchTool(),)) -> ToolCall | None:
    """The first `Name[argument]` action of a ReAct reply, as a tool call (None: no action).

    The argument runs to the first `]` after `[` (ReAct's own rule).

    >>> parse_react("I should look. Action 1: Search[Acme founder]\\nObservation")
    ToolCall(name='search', arguments={'query': 'Acme founder'}, call_id='')
    >>> parse_react("Action 2: Finish[Ann Vole]").arguments
    {'answer': 'Ann Vole'}
    >>> parse_react("I am not sure.") is None
    True
    """
    best: tuple[int, str, str] | None = None  # (position, tool name, argument name)
    for name, argument, label in [
        *((t.name, t.argument, _react_name(t)) for t in tools),
        (ANSWER, ANSWER, "Finish"),
    ]:
        at = text.find(label + "[")
        if at != -1 and (best is None or at < best[0]):
            best = (at, name, argument)
    if best is None:
        return None
    at, name, argument = best
    start = text.index("[", at) + 1
    end = text.find("]", start)
    if end == -1:
        return None
    return ToolCall(name=name, arguments={argument: text[start:end].strip()})


_TAGGED = re.compile(r"^<(\w+)>(.*)</\1>$", re.DOTALL)


def _react_observation(observation: str, info: Mapping[str, Any]) -> str:
    """The env's observation in ReAct's words: the documents without their tags."""
    if info.get("action_kind") == "invalid":
        return "Invalid action. Valid actions are the ones listed above, e.g. Finish[answer]."
    text = observation.strip()
    tagged = _TAGGED.match(text)
    return " ".join((tagged.group(2) if tagged else text).split())


class ReActAgent(_ToolAgent):
    """A model playing ReAct's text format over an OpenAI-compatible endpoint (module doc).

    Args:
        name: the label in reports.
        client: the endpoint client.
        sampling: generation settings (stop strings become ReAct's: "\\nObservation").
        api: `completions` (one transcript; base models) or `chat` (instruct models).
        tools: the env's tools, each offered as `Name[argument]`.
        settings: extra fields for the report.
    """

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        api: Literal["completions", "chat"] = "completions",
        tools: Sequence[Tool] = (SearchTool(),),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        react_sampling = replace(sampling, stop=("\nObservation",))
        super().__init__(name, client, react_sampling, tools=tools, settings=settings)
        self.api = api

    def settings(self) -> dict[str, Any]:
        """The shared settings, the protocol and the API kind."""
        return {**super().settings(), "protocol": "react", "api": self.api}

    def start(self, prompt: str, info: Mapping[str, Any]) -> TranscriptState:
        """ReAct's few-shot prompt for the question (the env's own prompt is not used)."""
        text = react_prompt(str(info["question"]), self.tools)
        return TranscriptState(
            transcript=text,
            messages=[{"role": "user", "content": text}],
            task_id=str(info.get("task_id", "")),
        )

    def _send(
        self, state: TranscriptState, observation: str, info: Mapping[str, Any]
    ) -> ReplyFuture[TextCompletion | EndpointRejected]:
        """Append the observation as `Observation n:`; continue the transcript."""
        n = state.n_calls  # replies so far: a failed one ended the episode
        if n:
            text = f"\nObservation {n}: {_react_observation(observation, info)}\n"
            step = f"Thought {n + 1}:"
            state.add("user", text + step, message=text.strip() + "\n" + step)
        return submit_transcript(self.client, self.api, state, self._sampling_for(state))

    def _reply_action(self, state: TranscriptState, reply: TextCompletion) -> AgentAction:
        """The reply's text, appended; its first action as a tool call."""
        text = reply.text.removesuffix("\nObservation")  # vLLM keeps the stop string
        state.add("assistant", text)
        return reply_action(reply, text, parse_react(text, self.tools))
