"""Agents for evaluation beyond a local policy: scripted agents and OpenAI-compatible endpoints.

Every agent follows `harness.rollout.agent.Agent` (start an episode from the env's prompt, then
one action per running episode in one batch); `PolicyAgent`, a local `PolicyBackend`, lives
there too, since the trainer's held-out curve plays it. Here:

- `ScriptedAgent`: wraps any object with `reset(prompt, info)` / `act(observation, info)` (the
  envs package's `OracleAgent` and `NaiveAgent`, and `DecompositionOracle` below).
- `HTTPAgent`: any OpenAI-compatible endpoint through `OpenAICompatClient`, with the transcript
  as text (`/v1/completions`) or as chat messages (`/v1/chat/completions`, for hosted APIs).
  It is an `EndpointAgent`, as are `harness.evaluation.tool_agents`' `ToolCallAgent` and
  `ReActAgent`: a `ConcurrentAgent` whose `submit` sends one episode's turn at once and whose
  `wait` collects whichever replies are back, so evaluation keeps every slot busy instead of
  waiting for the slowest episode of a turn.

Generation stops at `</search>` or `</answer>`; an agent reports the tokens it generated for
every action, so evaluation can count them.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import re
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from envs.base import ScriptedPolicy
from envs.qa_datasets import DecompositionStep, LoadedDataset
from envs.tools import ToolCall
from harness.errors import ContextLengthExceeded, EndpointRejected, MalformedReply
from harness.policies.base import SamplingParams
from harness.policies.openai_compat import OpenAICompatClient, ReplyFuture, TextCompletion
from harness.rollout.agent import AgentAction, call_sampling, sampling_json

__all__ = [
    "DecompositionOracle",
    "EndpointAgent",
    "HTTPAgent",
    "OraclePlan",
    "ScriptedAgent",
    "TranscriptState",
    "check_endpoint",
    "close_open_tag",
    "failed_reply",
    "oracle_plans",
    "reply_action",
    "reply_tokens",
    "submit_transcript",
]

log = logging.getLogger(__name__)

# --- scripted ----------------------------------------------------------------------------------


class ScriptedAgent:
    """Batches any scripted per-episode policy: one fresh instance per episode.

    Args:
        name: the label in reports.
        factory: builds the per-episode policy (`lambda: NaiveAgent()`).
        settings: what the report records about it.
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[], ScriptedPolicy],
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self._name = name
        self._factory = factory
        self._settings = {"backend": "scripted", "agent": name, **(settings or {})}

    @property
    def name(self) -> str:
        """The label in reports."""
        return self._name

    def settings(self) -> dict[str, Any]:
        """The scripted policy's name and parameters."""
        return dict(self._settings)

    def start(self, prompt: str, info: Mapping[str, Any]) -> ScriptedPolicy:
        """A fresh policy instance, reset on the prompt."""
        policy = self._factory()
        policy.reset(prompt, info)
        return policy

    def act(
        self,
        states: Sequence[ScriptedPolicy],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """Each policy's next action."""
        return [
            AgentAction(text=policy.act(obs, info))
            for policy, obs, info in zip(states, observations, infos, strict=True)
        ]


@dataclass(frozen=True, slots=True, kw_only=True)
class OraclePlan:
    """What an oracle does on one task: these searches, then this answer."""

    queries: tuple[str, ...]
    answer: str


_STEP_REF = re.compile(r"#(\d+)")


def _musique_query(question: str, answers: Sequence[str]) -> str:
    """A MuSiQue sub-question as a search query: `#k` becomes step k's answer, `>>` a space.

    >>> _musique_query("#1 >> capital", ["Mountrail County"])
    'Mountrail County capital'
    """

    def answer_of(match: re.Match[str]) -> str:
        k = int(match.group(1)) - 1
        return answers[k] if 0 <= k < len(answers) else match.group(0)

    return " ".join(_STEP_REF.sub(answer_of, question).replace(">>", " ").split())


def _plan_from_steps(steps: Sequence[DecompositionStep], answer: str) -> OraclePlan:
    answers = [s.answer for s in steps]
    return OraclePlan(
        queries=tuple(_musique_query(s.question, answers[:i]) for i, s in enumerate(steps)),
        answer=answer,
    )


def oracle_plans(dataset: LoadedDataset) -> dict[str, OraclePlan]:
    """An oracle plan per task: the dataset's decomposition, else its supporting titles.

    MuSiQue (and the synthetic world's export) give a decomposition: one search per hop with
    the earlier hops' answers filled in. HotpotQA, 2Wiki and PopQA give supporting paragraphs:
    one search per supporting title. Tasks with neither get no search. The answer is the first
    gold answer.
    """
    plans = {}
    for task in dataset.tasks:
        steps = dataset.decompositions.get(task.task_id)
        if steps:
            plans[task.task_id] = _plan_from_steps(steps, task.golden_answers[0])
            continue
        titles = tuple(dict.fromkeys(p.title for p in task.paragraphs if p.is_supporting))
        plans[task.task_id] = OraclePlan(queries=titles, answer=task.golden_answers[0])
    return plans


@dataclass
class DecompositionOracle:
    """A scripted oracle for real datasets: search each planned query, then give the answer.

    It knows the gold answer, so its EM is 1 unless it runs out of turns; what it measures is
    the harness itself and how well the retriever finds the supporting paragraphs for ideal
    queries (retrieval recall). It keeps one turn for the answer, so a 4-hop plan under
    `max_turns=4` searches three hops.
    """

    plans: Mapping[str, OraclePlan]
    _queue: list[str] = field(default_factory=list)
    _answer: str = ""

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Look up the task's plan."""
        plan = self.plans[info["task_id"]]
        max_searches = max(int(info.get("max_turns", len(plan.queries) + 1)) - 1, 0)
        self._queue = list(plan.queries[:max_searches])
        self._answer = plan.answer

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        """The next planned search, or the answer."""
        if self._queue:
            return f"<think>Next hop.</think><search> {self._queue.pop(0)} </search>"
        return f"<think>I know it.</think><answer> {self._answer} </answer>"


# --- HTTP (OpenAI-compatible) ------------------------------------------------------------------

_OPENERS = (("<search>", "</search>"), ("<answer>", "</answer>"))


def close_open_tag(text: str) -> str:
    """Restore a closing tag that an API cut off as a stop string.

    The OpenAI API removes the stop string from the text and (unlike vLLM) does not say which
    one matched. The last opened `<search>` or `<answer>` without its closing tag tells.

    >>> close_open_tag("<think>hm</think><search> Acme founder ")
    '<think>hm</think><search> Acme founder </search>'
    >>> close_open_tag("<answer> Paris </answer>")
    '<answer> Paris </answer>'
    """
    best_at, closer = -1, ""
    for opener, end in _OPENERS:
        at = text.rfind(opener)
        if at > best_at and text.find(end, at) == -1:
            best_at, closer = at, end
    return text + closer if closer else text


@dataclass(kw_only=True)
class EndpointState:
    """What every episode of an `EndpointAgent` keeps: its question and its requests so far."""

    task_id: str
    """The question's id (with the turn, it seeds the episode's requests)."""
    n_calls: int = 0
    """Requests sent for this episode."""


class EndpointAgent(abc.ABC):
    """What the agents behind an OpenAI-compatible endpoint share; a `ConcurrentAgent`.

    `submit` sends one episode's next request at once (or hands back an action it needs no
    request for, as the next queued tool call), `wait` collects whichever are back, and `act`
    is both for a batch. A subclass says how a turn goes out (`_send`) and what a reply makes
    (`_reply_action`); a refused or malformed reply becomes `failed_reply`'s action.

    Args:
        name: the label in reports.
        client: the endpoint client (concurrency, retries, timeouts and size caps live there).
        sampling: generation settings.
        settings: extra fields for the report.
    """

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self._name = name
        self.client = client
        self.sampling = sampling
        self._settings = dict(settings or {})
        self._in_flight: dict[Hashable, EndpointState] = {}

    @property
    def name(self) -> str:
        """The label in reports."""
        return self._name

    def settings(self) -> dict[str, Any]:
        """Endpoint (without the API key) and sampling; subclasses add their own."""
        endpoint = asdict(self.client.config)
        endpoint.pop("api_key", None)
        return {
            **self._settings,
            "backend": "openai-compatible",
            "endpoint": endpoint,
            "sampling": sampling_json(self.sampling),
        }

    def check_endpoint(self) -> None:
        """Fail before the run if the endpoint is down or does not serve this model.

        Raises:
            EndpointError: the endpoint does not answer.
            EndpointRejected: it refuses the key, or does not list the model.
        """
        check_endpoint(self.client)

    def submit(self, state: EndpointState, observation: str, info: Mapping[str, Any]) -> Hashable:
        """Take the observation into the episode and send its next request now."""
        sent = self._send(state, observation, info)
        future: concurrent.futures.Future[Any]
        if isinstance(sent, AgentAction):  # no request needed: already done
            future = concurrent.futures.Future()
            future.set_result(sent)
        else:
            future = sent
        self._in_flight[future] = state
        return future

    def wait(self, handles: Sequence[Hashable]) -> list[tuple[Hashable, AgentAction]]:
        """Block until at least one reply is back; each finished episode's action.

        Raises:
            EndpointError: a request did not get through within its retries.
            EndpointRejected: the endpoint refused a request for a reason that is not the
                episode's own (a bad key, an unknown model).
        """
        futures: list[Any] = list(handles)
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
        return [(f, self._collect(f)) for f in done]

    def act(
        self,
        states: Sequence[EndpointState],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """Send every running episode's next request at once; each one's action.

        An episode whose prompt the endpoint refuses as too long for the model's context ends
        there (`finish_reason="context"`), as does one whose replies stay malformed after the
        retries or pass the size cap (`"error"`, with its cause); any other refusal is raised.

        Raises:
            EndpointError: the endpoint did not answer within its retries.
            EndpointRejected: the endpoint refused a request for another reason.
        """
        futures: list[Any] = [
            self.submit(state, obs, info)
            for state, obs, info in zip(states, observations, infos, strict=True)
        ]
        concurrent.futures.wait(futures)
        return [self._collect(f) for f in futures]

    def close(self) -> None:
        """Cancel the requests in flight; close the client's connections."""
        self._in_flight.clear()
        self.client.close()

    def _sampling_for(self, state: EndpointState) -> SamplingParams:
        """The episode's next request's sampling.

        Its seed comes from the run's, the question and the turn, so a sampled run draws the
        same numbers whatever order the replies come back in (and on `--resume`).
        """
        state.n_calls += 1
        return call_sampling(
            self.sampling, zlib.crc32(f"{state.task_id}\0{state.n_calls}".encode())
        )

    def _collect(self, future: concurrent.futures.Future[Any]) -> AgentAction:
        state = self._in_flight.pop(future)
        result = future.result()
        if isinstance(result, AgentAction):
            return result
        if not isinstance(result, TextCompletion):
            return failed_reply(result)
        return self._reply_action(state, result)

    @abc.abstractmethod
    def start(self, prompt: str, info: Mapping[str, Any]) -> Any:
        """A new episode's state (an `EndpointState`) from the env's prompt and info."""

    @abc.abstractmethod
    def _send(
        self, state: Any, observation: str, info: Mapping[str, Any]
    ) -> ReplyFuture[TextCompletion | EndpointRejected] | AgentAction:
        """Take in the observation; send the next request, or return an action needing none."""

    @abc.abstractmethod
    def _reply_action(self, state: Any, reply: TextCompletion) -> AgentAction:
        """The action a reply gives, recorded in the episode's state."""


@dataclass(kw_only=True)
class TranscriptState(EndpointState):
    """An episode as one text transcript (completions) and as the same turns in chat messages."""

    transcript: str
    messages: list[dict[str, str]]

    def add(
        self, role: Literal["user", "assistant"], text: str, message: str | None = None
    ) -> None:
        """Append `text` to the transcript and as a `role` message (`message` if it differs)."""
        self.transcript += text
        self.messages.append({"role": role, "content": text if message is None else message})


def submit_transcript(
    client: OpenAICompatClient,
    api: Literal["completions", "chat"],
    state: TranscriptState,
    sampling: SamplingParams,
) -> ReplyFuture[TextCompletion | EndpointRejected]:
    """Send the episode so far: its messages to a chat API, its transcript to a completions one."""
    if api == "chat":
        return client.submit_chat(state.messages, sampling)
    return client.submit_complete(state.transcript, sampling)


class HTTPAgent(EndpointAgent):
    """A model behind an OpenAI-compatible endpoint; every running episode has a request out.

    Args:
        name: the label in reports.
        client: the endpoint client (concurrency, retries, timeouts and size caps live there).
        sampling: generation settings (stop strings `</search>`, `</answer>`).
        api: `completions` sends the whole transcript as one text prompt (Search-R1's protocol:
            observations are part of the model's own stream); `chat` sends a conversation
            (prompt and observations as user turns, actions as assistant turns), for chat-only
            hosted APIs.
        prompt_wrapper: turns the prompt into the text sent (a chat template applied
            client-side for `completions`); None sends it as it is.
        settings: extra fields for the report.
    """

    def __init__(
        self,
        name: str,
        client: OpenAICompatClient,
        sampling: SamplingParams,
        *,
        api: Literal["completions", "chat"] = "completions",
        prompt_wrapper: Callable[[str], str] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(name, client, sampling, settings=settings)
        self.prompt_wrapper = prompt_wrapper
        self.api = api

    def settings(self) -> dict[str, Any]:
        """Endpoint (without the API key), API kind and sampling."""
        return {
            **super().settings(),
            "api": self.api,
            "chat_template": self.prompt_wrapper is not None,
        }

    def start(self, prompt: str, info: Mapping[str, Any]) -> TranscriptState:
        """The transcript starts with the prompt."""
        text = prompt if self.prompt_wrapper is None else self.prompt_wrapper(prompt)
        return TranscriptState(
            transcript=text,
            messages=[{"role": "user", "content": prompt}],
            task_id=str(info.get("task_id", "")),
        )

    def _send(
        self, state: TranscriptState, observation: str, info: Mapping[str, Any]
    ) -> ReplyFuture[TextCompletion | EndpointRejected]:
        """Append the observation; send the episode's transcript."""
        if observation:
            state.add("user", observation)
        return submit_transcript(self.client, self.api, state, self._sampling_for(state))

    def _reply_action(self, state: TranscriptState, reply: TextCompletion) -> AgentAction:
        """The reply's action text, appended to the episode's transcript."""
        text = _action_text(reply)
        state.add("assistant", text)
        return reply_action(reply, text)


def check_endpoint(client: OpenAICompatClient) -> None:
    """Fail before a run if the endpoint is down or does not serve the client's model.

    Raises:
        EndpointError: the endpoint does not answer.
        EndpointRejected: it refuses the key, or does not list the model.
    """
    served = client.models()
    if served is None:
        log.info("%s has no /models; the model name is checked by the first request",
                 client.config.api_root)  # fmt: skip
        return
    if client.config.model not in served:
        raise EndpointRejected(
            f"{client.config.api_root} does not serve model {client.config.model!r}; it serves "
            f"{', '.join(served) or 'nothing'} (pass one of them to --model)"
        )


def failed_reply(error: EndpointRejected) -> AgentAction:
    """The action that ends the one episode whose request failed, or the error raised.

    A prompt that outgrew the model's context ends its episode (`context`), as do replies
    that stayed malformed after the retries or passed the size cap (`error`, with its cause);
    any other refusal ends the run.

    Raises:
        EndpointRejected: the endpoint refused the request for another reason.
    """
    if isinstance(error, ContextLengthExceeded):  # this episode outgrew the model
        return AgentAction(text="", finish_reason="context")
    if isinstance(error, MalformedReply):  # this episode only; the run goes on
        log.warning("an episode ends without an answer: %s", error)
        return AgentAction(text="", finish_reason="error", cause=str(error))
    raise error


def reply_action(reply: TextCompletion, text: str, call: ToolCall | None = None) -> AgentAction:
    """The action a reply gives (`text`, or a structured `call`), with what the reply cost."""
    return AgentAction(
        text=text,
        call=call,
        n_tokens=reply_tokens(reply),
        finish_reason=reply.finish_reason,
        n_prompt_tokens=reply.n_prompt_tokens,
        latency_s=reply.latency_s,
    )


def reply_tokens(reply: TextCompletion) -> int:
    """The tokens a reply generated: its `usage`, else its token ids, else 0."""
    if reply.n_completion_tokens is not None:
        return reply.n_completion_tokens
    return len(reply.token_ids) if reply.token_ids is not None else 0


def _action_text(reply: TextCompletion) -> str:
    if reply.finish_reason == "stop" and reply.stop is None:
        return close_open_tag(reply.text)  # a stop string the API cut off, if any
    return reply.text
