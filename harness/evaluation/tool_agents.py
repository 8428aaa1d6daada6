"""Agents for the bench's other two protocols: native tool calls (`tools`) and ReAct (`react`).

Both talk to an OpenAI-compatible endpoint and act on the env through structured actions
(`envs.ToolCall`), so the env, its scoring and its budget are the ones the text protocols use.

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
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from envs.tools import ANSWER, SearchTool, Tool, ToolCall
from harness.evaluation.agents import (
    AgentAction,
    call_sampling,
    check_endpoint,
    failed_reply,
    reply_tokens,
)
from harness.policies.base import SamplingParams
from harness.policies.openai_compat import OpenAICompatClient, TextCompletion

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


class _HTTPBase:
    """What both agents share: the client, sampling, tools and report settings."""

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        tools: Sequence[Tool] = (SearchTool(),),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self._name = name
        self.client = client
        self.sampling = sampling
        self.tools = tuple(tools)
        self._settings = dict(settings or {})
        self._n_calls = 0

    @property
    def name(self) -> str:
        """The label in reports."""
        return self._name

    def settings(self) -> dict[str, Any]:
        """Endpoint (without the API key), protocol, tools and sampling."""
        endpoint = asdict(self.client.config)
        endpoint.pop("api_key", None)
        out = asdict(self.sampling)
        out["stop"] = list(self.sampling.stop)
        return {
            **self._settings,
            "backend": "openai-compatible",
            "endpoint": endpoint,
            "tools": [tool.name for tool in self.tools],
            "sampling": out,
        }

    def check_endpoint(self) -> None:
        """Fail before the run if the endpoint is down or does not serve this model.

        Raises:
            EndpointError: the endpoint does not answer.
            EndpointRejected: it refuses the key, or does not list the model.
        """
        check_endpoint(self.client)

    def _next_sampling(self) -> SamplingParams:
        self._n_calls += 1
        return call_sampling(self.sampling, self._n_calls)


@dataclass
class _ChatState:
    messages: list[dict[str, Any]]
    queue: list[ToolCall] = field(default_factory=list)
    """Calls of the last reply not yet stepped."""
    pending: str | None = None
    """The id of the call whose observation comes next."""


class ToolCallAgent(_HTTPBase):
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
            ]
        )

    def act(
        self,
        states: Sequence[_ChatState],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """Answer the last call's result; step the reply's next call, or ask the model.

        Raises:
            EndpointError: the endpoint did not answer within its retries.
            EndpointRejected: the endpoint refused a request (other than for its context).
        """
        actions: list[AgentAction | None] = [None] * len(states)
        ask: list[int] = []
        for i, (state, obs) in enumerate(zip(states, observations, strict=True)):
            if state.pending is not None:
                state.messages.append(
                    {"role": "tool", "tool_call_id": state.pending, "content": obs.strip()}
                )
                state.pending = None
            if state.queue:
                actions[i] = self._next_call(state, n_tokens=0, finish_reason="stop")
            else:
                ask.append(i)
        if ask:
            replies = self.client.chat_each(
                [states[i].messages for i in ask], self._next_sampling(), tools=self.schemas
            )
            for i, reply in zip(ask, replies, strict=True):
                if not isinstance(reply, TextCompletion):
                    actions[i] = failed_reply(reply)
                    continue
                actions[i] = self._take(states[i], reply)
        return [a for a in actions if a is not None]

    def _take(self, state: _ChatState, reply: TextCompletion) -> AgentAction:
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
        n_tokens = reply_tokens(reply)
        if reply.tool_calls:
            state.queue = [
                ToolCall(name=c.name, arguments=c.arguments, call_id=c.call_id)
                for c in reply.tool_calls
            ]
            return self._next_call(state, n_tokens=n_tokens, finish_reason=reply.finish_reason)
        answer = _THINK.sub("", reply.text).strip()
        call = ToolCall(name=ANSWER, arguments={ANSWER: answer})
        return AgentAction(
            text=reply.text, call=call, n_tokens=n_tokens, finish_reason=reply.finish_reason
        )

    def _next_call(self, state: _ChatState, *, n_tokens: int, finish_reason: Any) -> AgentAction:
        call = state.queue.pop(0)
        state.pending = call.call_id
        return AgentAction(
            text=_render(call), call=call, n_tokens=n_tokens, finish_reason=finish_reason
        )


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


@dataclass
class _ReActState:
    transcript: str
    messages: list[dict[str, str]]
    n: int = 0


class ReActAgent(_HTTPBase):
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

    def start(self, prompt: str, info: Mapping[str, Any]) -> _ReActState:
        """ReAct's few-shot prompt for the question (the env's own prompt is not used)."""
        text = react_prompt(str(info["question"]), self.tools)
        return _ReActState(transcript=text, messages=[{"role": "user", "content": text}])

    def act(
        self,
        states: Sequence[_ReActState],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """Append each observation as `Observation n:`; continue every transcript at once.

        Raises:
            EndpointError: the endpoint did not answer within its retries.
            EndpointRejected: the endpoint refused a request (other than for its context).
        """
        for state, obs, info in zip(states, observations, infos, strict=True):
            if state.n:
                text = f"\nObservation {state.n}: {_react_observation(obs, info)}\n"
                step = f"Thought {state.n + 1}:"
                state.transcript += text + step
                state.messages.append({"role": "user", "content": text.strip() + "\n" + step})
        sampling = self._next_sampling()
        if self.api == "chat":
            replies = self.client.chat_each([s.messages for s in states], sampling)
        else:
            replies = self.client.complete_each([s.transcript for s in states], sampling)
        actions = []
        for state, reply in zip(states, replies, strict=True):
            if not isinstance(reply, TextCompletion):
                actions.append(failed_reply(reply))
                continue
            state.n += 1
            text = reply.text.removesuffix("\nObservation")  # vLLM keeps the stop string
            state.transcript += text
            state.messages.append({"role": "assistant", "content": text})
            call = parse_react(text, self.tools)
            actions.append(
                AgentAction(
                    text=text,
                    call=call,
                    n_tokens=reply_tokens(reply),
                    finish_reason=reply.finish_reason,
                )
            )
        return actions
