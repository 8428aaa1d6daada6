"""`SearchQAEnv`: a multi-turn search/QA environment whose state can be forked at any turn.

The env follows the Search-R1 protocol (`envs.protocol`). Its whole mutable state is one
immutable `_Episode` value whose history is a persistent linked list of turns, so `fork` is
O(1) in the history length: a fork shares the episode value, the task set, the retriever and
the space template, and owns nothing that another env can change. `snapshot` turns the same
state into a JSON-serialisable `EnvSnapshot`.

Fork law (docs/design.md §3): for any reachable state and any action sequence, stepping a fork, or
an env restored from a snapshot (even one that went through JSON), gives the same observations,
rewards, flags and infos as stepping the original.

Retrieval inside an episode is deterministic: results are kept per normalised query in the
episode's own history (and so in its snapshots), and a repeated query is answered from there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Self, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Text

from envs.errors import (
    ActionTypeError,
    EnvConfigError,
    EpisodeStateError,
    RetrievalFailedError,
    SnapshotError,
    SnapshotMismatchError,
    ToolArgumentError,
    UnknownTaskError,
)
from envs.protocol import (
    CHARSET,
    DEFAULT_PROMPT_TEMPLATE,
    MAX_CONTENT_CHARS,
    MAX_TEXT_CHARS,
    PROTOCOLS,
    ActionKind,
    ParsedAction,
    Protocol,
    format_prompt,
    invalid_action_message,
    parse_action,
    parse_action_search_r1,
)
from envs.rewards import RewardKind, format_reward, reward_for_answer, score_answer
from envs.snapshot import (
    SCHEMA_VERSION,
    EnvSnapshot,
    TurnRecord,
    canonical_text,
    check_hits,
    check_snapshot_schema,
    task_fingerprint,
)
from envs.spaces import EnvText
from envs.tasks import QATask, TaskSet
from envs.tools import (
    Tool,
    ToolCall,
    ToolContext,
    ToolResult,
    call_as_text,
    check_spec,
    check_tools,
    load_tool,
    tool_spec,
)
from retrieval.base import Hit, Retriever
from retrieval.deadline import deadline

__all__ = ["SearchQAConfig", "SearchQAEnv"]

log = logging.getLogger(__name__)

_REWARD_KINDS = ("em", "f1", "f1_threshold", "format")
_MAX_TITLE_CHARS = 200
# per-document framing: "Doc NN(Title: " + title + ") " + "…" + "\n"
_DOC_OVERHEAD = 24 + _MAX_TITLE_CHARS
_INFO_OVERHEAD = 64
# the bit generators a snapshot may name (never a free getattr on untrusted JSON)
_BIT_GENERATORS: dict[str, type[np.random.BitGenerator]] = {
    "PCG64": np.random.PCG64,
    "PCG64DXSM": np.random.PCG64DXSM,
    "MT19937": np.random.MT19937,
    "Philox": np.random.Philox,
    "SFC64": np.random.SFC64,
}
_U32, _U64, _U128 = 1 << 32, 1 << 64, 1 << 128
_SPARE = {"has_uint32": (None, 2), "uinteger": (None, _U32)}  # a buffered half of a draw
_PCG = {"state": {"state": (None, _U128), "inc": (None, _U128)}, **_SPARE}
# each generator's state, field by field: (None, bound) an int in [0, bound), (n, bound) a list
# of n of them. numpy checks none of these ranges: an MT19937 `pos` past 624 is accepted, and the
# next draw reads outside the key and kills the process.
_RNG_FIELDS: dict[str, dict[str, Any]] = {
    "PCG64": _PCG,
    "PCG64DXSM": _PCG,
    "MT19937": {"state": {"key": (624, _U32), "pos": (None, 625)}},
    "Philox": {
        "state": {"counter": (4, _U64), "key": (2, _U64)},
        "buffer": (4, _U64),
        "buffer_pos": (None, 5),
        **_SPARE,
    },
    "SFC64": {"state": {"state": (4, _U64)}, **_SPARE},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchQAConfig:
    """Everything that fixes an env's dynamics besides its tasks and retriever.

    Attributes:
        max_turns: actions per episode; the episode is truncated after the last one unless it
            was an answer. Must be at least 2 (a search, then an answer).
        top_k: documents per search.
        reward: "em" (1/0), "f1" (token F1), "f1_threshold" (1 if F1 >= `f1_threshold`) or
            "format" (Tree-GRPO's format-shaped reward, `envs.rewards.format_reward`).
        f1_threshold: used by the "f1_threshold" reward.
        prompt_template: the prompt, with a literal `{question}` placeholder.
        max_doc_chars: each document's text is cut to this many characters in observations
            (the trace-rl protocol; the search-r1 protocol never cuts).
        protocol: "trace-rl" (ours) or "search-r1" (Search-R1's observation text, invalid-action
            message and action parsing, byte for byte; see `envs.protocol`).
        retrieval_deadline_s: the most one step may spend on retrieval, every retry of a
            remote retriever included (`retrieval.deadline`); past it the step raises
            `RetrievalFailedError` and the env is unchanged. None: only the retriever's own
            timeouts and retries bound it (4 x 30 s by default for `HTTPRetriever`).
        on_other_index: what `restore` does with a snapshot taken on another index: "warn"
            (cached queries replay from the snapshot, new ones use this env's index) or
            "error" (`SnapshotMismatchError`: the snapshot belongs to another corpus, e.g.
            another generated world). A restore policy, not dynamics: snapshots omit it.
        tools: the tools next to search, as `MODULE:CLASS` specs (`--tool`), loaded by
            `make_env` (`envs.tools.load_tool`: importable classes that build with no
            arguments); an env built with `Tool` objects records their classes' specs here.
    """

    max_turns: int = 4
    top_k: int = 3
    reward: RewardKind = "em"
    f1_threshold: float = 0.3
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    max_doc_chars: int = 2_000
    protocol: Protocol = "trace-rl"
    retrieval_deadline_s: float | None = 10.0  # a hung server costs a step 10 s, not 120 s
    on_other_index: Literal["warn", "error"] = "warn"
    tools: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_turns < 2:
            raise EnvConfigError(f"max_turns={self.max_turns}: must be >= 2 (search, answer)")
        if self.top_k < 1:
            raise EnvConfigError(f"top_k={self.top_k}: must be >= 1")
        if self.reward not in _REWARD_KINDS:
            raise EnvConfigError(f"reward={self.reward!r}: choose one of {_REWARD_KINDS}")
        if not 0.0 <= self.f1_threshold <= 1.0:
            raise EnvConfigError(f"f1_threshold={self.f1_threshold}: must be in [0, 1]")
        if "{question}" not in self.prompt_template:
            raise EnvConfigError("prompt_template has no {question} placeholder")
        if self.max_doc_chars < 1:
            raise EnvConfigError(f"max_doc_chars={self.max_doc_chars}: must be >= 1")
        if self.retrieval_deadline_s is not None and not self.retrieval_deadline_s > 0:
            raise EnvConfigError(
                f"retrieval_deadline_s={self.retrieval_deadline_s}: must be > 0 s, or None"
            )
        if self.protocol not in PROTOCOLS:
            raise EnvConfigError(f"protocol={self.protocol!r}: choose one of {PROTOCOLS}")
        if self.on_other_index not in ("warn", "error"):
            raise EnvConfigError(f"on_other_index={self.on_other_index!r}: choose warn or error")
        object.__setattr__(self, "tools", tuple(self.tools))  # a list from JSON or a caller
        for spec in self.tools:  # loaded by make_env: an env built from objects has them
            check_spec(spec)
        if self.tools and self.protocol == "search-r1":
            raise EnvConfigError(
                f"tools={self.tools}: the search-r1 protocol reproduces Search-R1, which has "
                "only search; use the trace-rl protocol for other tools"
            )
        if self.protocol == "search-r1":
            return  # documents are never cut, so no size bound applies (see envs.protocol)
        longest = self.top_k * (self.max_doc_chars + _DOC_OVERHEAD) + _INFO_OVERHEAD
        if longest > MAX_TEXT_CHARS:
            raise EnvConfigError(
                f"top_k={self.top_k} documents of max_doc_chars={self.max_doc_chars} could make "
                f"a {longest}-character observation, over the space's {MAX_TEXT_CHARS}; "
                f"lower max_doc_chars to {self.max_doc_chars_limit(self.top_k)} or less"
            )

    def make_env(
        self, tasks: TaskSet | Sequence[QATask], retriever: Retriever, **overrides: Any
    ) -> SearchQAEnv:
        """A `SearchQAEnv` with these settings (`overrides`: fields to change, or `tools`).

        >>> from retrieval.base import Document
        >>> from retrieval.bm25 import BM25Retriever
        >>> index = BM25Retriever.build([Document(doc_id="d1", title="Acme", text="Ann.")])
        >>> tasks = [QATask(task_id="q1", question="Who?", golden_answers=("Ann",))]
        >>> SearchQAConfig(max_turns=6).make_env(tasks, index, top_k=1).config.top_k
        1
        """
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        return SearchQAEnv(tasks, retriever, **{**fields, **overrides})

    @staticmethod
    def max_doc_chars_limit(top_k: int) -> int:
        """The largest `max_doc_chars` whose observations fit the text space at this top_k."""
        return (MAX_TEXT_CHARS - _INFO_OVERHEAD) // top_k - _DOC_OVERHEAD

    @property
    def prompt_sha256(self) -> str:
        """Hash of the prompt template (what snapshots record instead of the text)."""
        return hashlib.sha256(self.prompt_template.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class _Turn:
    """One node of the persistent history: a turn and a link to the one before."""

    kind: ActionKind
    content: str
    hits: tuple[Hit, ...]
    query_key: str  # the tool's key (a search's normalised query), "" for an answer or invalid
    parent: _Turn | None
    output: str = ""  # a tool's text result (ToolResult.output)


@dataclass(frozen=True, slots=True)
class _Episode:
    """All mutable state of an env, as one immutable value (replaced, never changed)."""

    task: QATask
    index_id: str
    last: _Turn | None
    n_turns: int
    n_tool_calls: int
    n_invalid: int
    retrieved_doc_ids: tuple[str, ...]
    terminated: bool
    truncated: bool


@dataclass(frozen=True, slots=True)
class _Shared:
    """What every fork of an env shares: read-only by contract."""

    config: SearchQAConfig
    tasks: TaskSet
    retriever: Retriever
    space_template: Text
    tools: Mapping[str, Tool]


class SearchQAEnv(gym.Env[str, str]):
    """Multi-turn search/QA over a task set and a retriever, with snapshot, restore and fork.

    Args:
        tasks: the questions; `reset` picks one (see `reset`).
        retriever: anything meeting `retrieval.Retriever`; it must be deterministic.
        max_turns: actions per episode (`SearchQAConfig.max_turns`).
        top_k: documents per search.
        reward: "em", "f1", "f1_threshold" or "format".
        f1_threshold: threshold of the "f1_threshold" reward.
        prompt_template: prompt with a `{question}` placeholder (Search-R1's by default).
        max_doc_chars: cut each document's text to this many characters; None takes the
            largest value whose observations fit the text space.
        protocol: "trace-rl" or "search-r1" (`SearchQAConfig.protocol`).
        retrieval_deadline_s: the most one step may spend on retrieval (default 10 s; None: no
            overall bound); `SearchQAConfig.retrieval_deadline_s`.
        on_other_index: "warn" or "error" on restoring a snapshot taken on another index
            (`SearchQAConfig.on_other_index`).
        tools: the tools next to search (`envs.Tool` objects, or `MODULE:CLASS` specs); search
            is always the first. Each adds a line to the prompt; snapshots name them.

    Raises:
        EnvConfigError: an argument is out of range, or `tasks` is empty.

    Observations and actions are strings (`gymnasium.spaces.Text`); `step` also takes a
    structured action, an `envs.ToolCall` or a dict `{"name": ..., "arguments": ...}`, read
    as the text action with the tool's tag. `info` on reset and on every step holds
    "task_id", "golden_answers", "question_type", "n_hops", "turn_idx", "max_turns",
    "n_tool_calls" (the tools' costs so far: one per search), "tool_cost" (this action's),
    "retrieved_doc_ids" (every document shown so far, in order), "valid_action" and
    "action_kind" (None on reset; a tool's name, "answer" or "invalid"). Reset adds
    "question"; an answer adds "answer", "em", "sub_em" and "f1".

    >>> from retrieval.base import Document
    >>> from retrieval.bm25 import BM25Retriever
    >>> docs = [Document(doc_id="d1", title="Acme", text="Acme was founded by Ann Vole.")]
    >>> tasks = TaskSet([QATask(task_id="q1", question="Who founded Acme?",
    ...                         golden_answers=("Ann Vole",))])
    >>> env = SearchQAEnv(tasks, BM25Retriever.build(docs))
    >>> prompt, info = env.reset(seed=0)
    >>> obs, *_ = env.step("<search> Acme founder </search>")
    >>> obs
    '\\n<information>Doc 1(Title: Acme) Acme was founded by Ann Vole.</information>\\n'
    >>> branch = env.fork()[0]
    >>> branch.step("<answer> Ann Vole </answer>")[1:3], env.step("<answer> Bob </answer>")[1:3]
    ((1.0, True), (0.0, True))
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's API)

    def __init__(
        self,
        tasks: TaskSet | Sequence[QATask],
        retriever: Retriever,
        *,
        max_turns: int = 4,
        top_k: int = 3,
        reward: RewardKind = "em",
        f1_threshold: float = 0.3,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        max_doc_chars: int | None = 2_000,
        protocol: Protocol = "trace-rl",
        retrieval_deadline_s: float | None = 10.0,
        on_other_index: Literal["warn", "error"] = "warn",
        tools: Sequence[Tool | str] = (),
    ) -> None:
        if not isinstance(tasks, TaskSet):
            tasks = TaskSet(tasks)
        if len(tasks) == 0:
            raise EnvConfigError("the task set is empty: an env needs at least one task")
        extra = [load_tool(t) if isinstance(t, str) else t for t in tools]
        checked = check_tools(extra)
        config = SearchQAConfig(
            max_turns=max_turns,
            top_k=top_k,
            reward=reward,
            f1_threshold=f1_threshold,
            prompt_template=prompt_template,
            max_doc_chars=(
                SearchQAConfig.max_doc_chars_limit(top_k)
                if max_doc_chars is None
                else max_doc_chars
            ),
            protocol=protocol,
            retrieval_deadline_s=retrieval_deadline_s,
            on_other_index=on_other_index,
            tools=tuple(tool_spec(tool) for tool in checked[1:]),
        )
        # Text builds a per-character index (costly per env); forks copy this template instead.
        template = EnvText(MAX_TEXT_CHARS, min_length=0, charset=CHARSET)
        self._shared = _Shared(
            config=config,
            tasks=tasks,
            retriever=retriever,
            space_template=template,
            tools={tool.name: tool for tool in checked},
        )
        self._episode: _Episode | None = None
        self._space: Text | None = None
        self._rng_pending: dict[str, Any] | None = None

    # -- read-only views -------------------------------------------------------------------

    @property
    def config(self) -> SearchQAConfig:
        """The env's configuration."""
        return self._shared.config

    @property
    def tasks(self) -> TaskSet:
        """The task set (shared with every fork)."""
        return self._shared.tasks

    @property
    def retriever(self) -> Retriever:
        """The retriever (shared with every fork)."""
        return self._shared.retriever

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools (shared with every fork), in order."""
        return tuple(self._shared.tools.values())

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools' names (their text tags), in order."""
        return tuple(self._shared.tools)

    @property
    def task(self) -> QATask | None:
        """The current episode's task, or None before the first `reset`."""
        return None if self._episode is None else self._episode.task

    @property
    def episode_over(self) -> bool:
        """True when there is no running episode (never reset, answered, or truncated)."""
        ep = self._episode
        return ep is None or ep.terminated or ep.truncated

    @property
    def history(self) -> tuple[TurnRecord, ...]:
        """The episode's turns so far, oldest first (O(turns))."""
        turns: list[TurnRecord] = []
        node = None if self._episode is None else self._episode.last
        while node is not None:
            turns.append(
                TurnRecord(kind=node.kind, content=node.content, hits=node.hits, output=node.output)
            )
            node = node.parent
        return tuple(reversed(turns))

    # -- spaces and randomness: lazily per env, so forks stay O(1) ----------------------------

    def _text_space(self) -> Text:
        if self._space is None:
            # a shallow copy shares the read-only charset tables; its sampling RNG is created
            # on first use, so no two envs share one
            self._space = copy.copy(self._shared.space_template)
        return self._space

    @property  # type: ignore[override]
    def action_space(self) -> Text:
        """`Text(MAX_TEXT_CHARS, charset=CHARSET)`; `step` accepts any string anyway."""
        return self._text_space()

    @action_space.setter
    def action_space(self, space: Text) -> None:
        self._space = space

    @property  # type: ignore[override]
    def observation_space(self) -> Text:
        """`Text(MAX_TEXT_CHARS, charset=CHARSET)`: every prompt and observation is in it."""
        return self._text_space()

    @observation_space.setter
    def observation_space(self, space: Text) -> None:
        self._space = space

    @property
    def np_random(self) -> np.random.Generator:
        """The env's generator (Gymnasium's), rebuilt lazily in forks and restored envs."""
        if self._np_random is None and self._rng_pending is not None:
            state = self._rng_pending
            bit_generator = _BIT_GENERATORS[state["bit_generator"]]()
            bit_generator.state = state
            self._np_random = np.random.Generator(bit_generator)
            self._rng_pending = None
        rng: np.random.Generator = gym.Env.np_random.fget(self)  # type: ignore[attr-defined]
        return rng

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self._rng_pending = None
        gym.Env.np_random.fset(self, value)  # type: ignore[attr-defined]

    def _rng_state(self) -> dict[str, Any]:
        """The generator's state as plain JSON values (no numpy arrays).

        An unseeded env draws its seed now, so copies agree.
        """
        if self._rng_pending is not None:
            return self._rng_pending
        plain: dict[str, Any] = _plain(self.np_random.bit_generator.state)
        return plain

    # -- the Gymnasium API -----------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode and return (prompt, info).

        Args:
            seed: seeds `np_random` (as every Gymnasium env).
            options: {"task_id": id} picks the task; without it, a task is drawn uniformly
                with `np_random`.

        Raises:
            UnknownTaskError: `task_id` is not in the task set.
            EnvConfigError: an unknown option, or a prompt longer than the text space.
        """
        options = options or {}
        unknown = set(options) - {"task_id"}
        if unknown:
            raise EnvConfigError(
                f"unknown reset options {sorted(unknown)}; the only one is 'task_id'"
            )
        tasks = self._shared.tasks
        task_id = options.get("task_id")
        # (TaskSet looks tasks up by id too: `__contains__` takes a str)
        if "task_id" in options and (not isinstance(task_id, str) or task_id not in tasks):  # type: ignore[comparison-overlap]
            raise UnknownTaskError(
                f"task_id {task_id!r} is not in this env's task set of {len(tasks)} tasks "
                f"(first ids: {list(tasks.ids[:3])})"
            )
        index_id = self._index_id()  # may need a server: ask before anything changes
        super().reset(seed=seed)  # only once the options are known to be good
        if seed is not None:
            self._rng_pending = None
        if isinstance(task_id, str):
            task = tasks[task_id]
        else:
            task = tasks[int(self.np_random.integers(len(tasks)))]
        config = self._shared.config
        prompt = _tools_preamble(self._shared.tools) + format_prompt(
            config.prompt_template, task.question, exact=config.protocol == "search-r1"
        )
        if len(prompt) > MAX_TEXT_CHARS:
            raise EnvConfigError(
                f"task {task.task_id!r} makes a {len(prompt)}-character prompt, over the text "
                f"space's {MAX_TEXT_CHARS}"
            )
        self._episode = _Episode(
            task=task,
            index_id=index_id,
            last=None,
            n_turns=0,
            n_tool_calls=0,
            n_invalid=0,
            retrieved_doc_ids=(),
            terminated=False,
            truncated=False,
        )
        info = self._info(self._episode, kind=None, valid=True)
        info["question"] = task.question
        return prompt, info

    def step(
        self, action: str | ToolCall | Mapping[str, Any]
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one action: a tool call (a search), an answer, or anything else (invalid).

        Args:
            action: an action text, or a structured action (an `envs.ToolCall`, or a dict
                with "name" and "arguments"), which is read as the text action with the
                tool's tag around its argument (`envs.tools.call_as_text`); a call that
                names no tool or has malformed arguments is an invalid action.

        Returns:
            (observation, reward, terminated, truncated, info). An answer terminates the
            episode; the `max_turns`-th action that is not an answer truncates it.

        Raises:
            ActionTypeError: `action` is neither a string nor a structured action.
            EpisodeStateError: no episode is running.
            RetrievalFailedError: the retriever failed; the env is unchanged, retry at will.
        """
        if not isinstance(action, str | ToolCall | Mapping):
            raise ActionTypeError(
                f"an action must be a str or an envs.ToolCall, got {type(action).__name__}"
            )
        ep = self._episode
        if ep is None:
            raise EpisodeStateError("step() before reset(): call reset() first")
        if ep.terminated or ep.truncated:
            how = "answered" if ep.terminated else f"truncated after {ep.n_turns} turns"
            raise EpisodeStateError(
                f"the episode on task {ep.task.task_id!r} is over ({how}); call reset()"
            )
        config = self._shared.config
        exact = config.protocol == "search-r1"
        parsed = self._parse_any(action)
        reward = 0.0
        extra: dict[str, Any] = {}
        n_tool_calls, n_invalid, doc_ids = ep.n_tool_calls, ep.n_invalid, ep.retrieved_doc_ids
        if parsed.kind == "answer":
            scores = score_answer(parsed.content, ep.task.golden_answers)
            reward = reward_for_answer(
                config.reward, scores, f1_threshold=config.f1_threshold, valid_format=n_invalid == 0
            )
            turn = _Turn("answer", parsed.content, (), "", ep.last)
            observation = ""
            extra = {
                "answer": parsed.content,
                "em": scores.em,
                "sub_em": scores.sub_em,
                "f1": scores.f1,
            }
        elif parsed.kind == "invalid":
            turn = _Turn("invalid", parsed.reason, (), "", ep.last)
            reason = None if exact else parsed.reason
            observation = invalid_action_message(reason, tuple(self._shared.tools))
            n_invalid += 1
        else:
            tool = self._shared.tools[parsed.kind]
            key = parsed.query  # the tool's key, set by _parse_any
            cached = _cached(ep.last, parsed.kind, key)
            if cached is None:
                result = tool.run(key, self._tool_context())
            else:
                result = ToolResult(output=cached.output, hits=cached.hits)
            turn = _Turn(parsed.kind, parsed.content, result.hits, key, ep.last, result.output)
            observation = tool.observe(result, self._tool_context())
            n_tool_calls += tool.cost
            doc_ids = doc_ids + tuple(hit.doc_id for hit in result.hits)
        terminated = parsed.kind == "answer"
        truncated = not terminated and ep.n_turns + 1 >= config.max_turns
        if truncated and config.reward == "format":
            reward = format_reward(answered=False, correct=False, valid_format=n_invalid == 0)
        self._episode = ep = _Episode(
            task=ep.task,
            index_id=ep.index_id,
            last=turn,
            n_turns=ep.n_turns + 1,
            n_tool_calls=n_tool_calls,
            n_invalid=n_invalid,
            retrieved_doc_ids=doc_ids,
            terminated=terminated,
            truncated=truncated,
        )
        info = self._info(ep, kind=parsed.kind, valid=parsed.kind != "invalid")
        info.update(extra)
        return observation, reward, terminated, truncated, info

    def _parse_any(self, action: str | ToolCall | Mapping[str, Any]) -> ParsedAction:
        """A text or structured action as a turn: its kind, content and the tool's key."""
        if not isinstance(action, str):
            text, reason = call_as_text(action, self._shared.tools)
            if reason:
                return ParsedAction("invalid", "", reason, 0)
            action = text
        # surrogate pairs joined as JSON joins them: a snapshot restores exactly this action
        return _parse(self._shared.config, canonical_text(action), self._shared.tools)

    def _tool_context(self) -> ToolContext:
        config = self._shared.config
        return ToolContext(
            retrieve=self._search, protocol=config.protocol, max_doc_chars=config.max_doc_chars
        )

    def _search(self, query: str) -> tuple[Hit, ...]:
        k = self._shared.config.top_k
        try:
            with deadline(self._shared.config.retrieval_deadline_s):
                results = self._shared.retriever.search([query], k)
        except Exception as err:  # any retriever failure becomes one typed error
            raise RetrievalFailedError(
                f"the retriever failed on query {query[:200]!r} (k={k}): {err!r}. The env is "
                f"unchanged; {_advice(err)}"
            ) from err
        try:
            if not isinstance(results, list) or len(results) != 1:
                raise ValueError(f"{type(results).__name__} is not a list of one result list")
            # an observation shows at most max_doc_chars (< MAX_TEXT_CHARS) of a text, so the
            # cut changes no observation and keeps every snapshot within restore's limits
            return check_hits([_canonical(_cut(hit)) for hit in results[0]], top_k=k)
        except (TypeError, ValueError) as err:
            raise RetrievalFailedError(
                f"the retriever broke its contract on query {query[:200]!r}: expected one list "
                f"of at most {k} Hit objects ({err}), got {results!r:.300}"
            ) from None

    def _index_id(self) -> str:
        """The retriever's index id; a remote retriever's failure becomes a typed error."""
        try:
            with deadline(self._shared.config.retrieval_deadline_s):
                return self._shared.retriever.index_id
        except Exception as err:  # e.g. RetrieverUnavailable before /health ever answered
            raise RetrievalFailedError(
                f"the retriever cannot tell its index id: {err!r}. The env is unchanged; "
                f"{_advice(err)}"
            ) from err

    def _info(self, ep: _Episode, *, kind: ActionKind | None, valid: bool) -> dict[str, Any]:
        task = ep.task
        tool = None if kind is None else self._shared.tools.get(kind)
        return {
            "task_id": task.task_id,
            "golden_answers": list(task.golden_answers),
            "question_type": task.question_type,
            "n_hops": task.n_hops,
            "turn_idx": ep.n_turns,
            "max_turns": self._shared.config.max_turns,
            "n_tool_calls": ep.n_tool_calls,
            "retrieved_doc_ids": list(ep.retrieved_doc_ids),
            "valid_action": valid,
            "action_kind": kind,
            # this action's cost in the budget's tool-call currency (BudgetMeter counts it)
            "tool_cost": 0 if tool is None else tool.cost,
        }

    # -- fork, snapshot, restore -----------------------------------------------------------

    def fork(self, n: int = 1) -> list[Self]:
        """`n` independent copies of this env at its current state, in O(1) each.

        A fork shares the task set, the retriever and the (immutable) episode history with
        this env, and owns its random generator (a copy of this one's state) and its spaces.
        Subclasses that add mutable attributes must override `fork`.

        Raises:
            ValueError: `n` < 1.
        """
        if n < 1:
            raise ValueError(f"fork(n={n}): n must be >= 1")
        rng_state = self._rng_state()
        forks = []
        for _ in range(n):
            clone = object.__new__(type(self))
            clone._shared = self._shared
            clone._episode = self._episode
            clone._space = None
            clone._rng_pending = rng_state
            clone._np_random = None
            clone._np_random_seed = self._np_random_seed
            clone.spec = self.spec
            clone.render_mode = self.render_mode
            forks.append(clone)
        return forks

    def snapshot(self) -> EnvSnapshot:
        """The env's whole state as an immutable, JSON-serialisable value."""
        config = self._shared.config
        ep = self._episode
        return EnvSnapshot(
            env=type(self).__name__,
            max_turns=config.max_turns,
            top_k=config.top_k,
            reward=config.reward,
            f1_threshold=config.f1_threshold,
            max_doc_chars=config.max_doc_chars,
            prompt_sha256=config.prompt_sha256,
            protocol=config.protocol,
            tools=self.tool_names,
            task_id=None if ep is None else ep.task.task_id,
            task_sha256=None
            if ep is None
            else task_fingerprint(ep.task.question, ep.task.golden_answers),
            index_id=self._index_id() if ep is None else ep.index_id,
            turns=self.history,
            rng_state=json.dumps(self._rng_state()),
        )

    def restore(self, snap: EnvSnapshot) -> None:
        """Put this env in the state `snap` describes.

        The snapshot must come from an env of the same class and configuration, and its task
        must be in this env's task set. Cached retrieval results come from the snapshot, so a
        restored episode replays its queries exactly even if this env's retriever differs
        (a different index id is logged as a warning).

        Raises:
            SnapshotError: the snapshot does not fit this env; `err.field` names the field.
        """
        if not isinstance(snap, EnvSnapshot):
            raise SnapshotError(
                f"{type(self).__name__}.restore needs an EnvSnapshot, got {type(snap).__name__} "
                "(restore a wrapper chain with envs.restore(env, snap))",
                field="kind",
            )
        check_snapshot_schema(snap)  # types and sizes first: what follows may rely on them
        if snap.schema_version != SCHEMA_VERSION:
            raise SnapshotError(
                f"snapshot schema_version {snap.schema_version} is not {SCHEMA_VERSION}",
                field="schema_version",
            )
        config = self._shared.config
        expected = {
            "env": type(self).__name__,
            "max_turns": config.max_turns,
            "top_k": config.top_k,
            "reward": config.reward,
            "f1_threshold": config.f1_threshold,
            "max_doc_chars": config.max_doc_chars,
            "prompt_sha256": config.prompt_sha256,
            "protocol": config.protocol,
            "tools": self.tool_names,
        }
        for name, value in expected.items():
            if getattr(snap, name) != value:
                raise SnapshotError(
                    f"snapshot field {name!r} is {getattr(snap, name)!r} but this env has "
                    f"{value!r}; restore into an env configured like the one that took it",
                    field=name,
                )
        if snap.task_id is None and snap.turns:
            raise SnapshotError("snapshot has turns but no task_id", field="task_id")
        episode = None if snap.task_id is None else self._episode_from(snap)
        generator = None if snap.rng_state is None else _generator_from(snap.rng_state)
        if episode is not None:
            self._check_index(episode.index_id)
        # everything is checked: only now does the env change
        self._episode = episode
        self._rng_pending = None
        self._np_random = generator
        # Gymnasium's "seed unknown" (-1) for a generator set directly; None seeds on first use
        self._np_random_seed = None if generator is None else -1

    def _check_index(self, index_id: str) -> None:
        strict = self._shared.config.on_other_index == "error"
        try:
            current = self._index_id()
        except RetrievalFailedError:
            if strict:  # the index cannot be checked, so the snapshot cannot be admitted
                raise
            return  # a lenient restore never needs the retriever
        if index_id != current and strict:
            raise SnapshotMismatchError(
                f"snapshot field 'index_id' is {index_id!r} but this env searches index "
                f"{current!r}: the episode belongs to another corpus; restore it into an env "
                "over the index it was taken on",
                field="index_id",
            )
        if index_id != current:
            log.warning(
                "restoring an episode recorded on index %s into an env whose retriever has "
                "index %s: cached queries replay from the snapshot, new ones use the new index",
                index_id,
                current,
            )

    def _episode_from(self, snap: EnvSnapshot) -> _Episode:
        assert snap.task_id is not None
        config = self._shared.config
        # TaskSet looks tasks up by id too: `__contains__` takes a str
        if snap.task_id not in self._shared.tasks:  # type: ignore[comparison-overlap]
            raise SnapshotMismatchError(
                f"snapshot field 'task_id' is {snap.task_id!r}, which is not in this env's task "
                "set; restore into an env built on the same tasks",
                field="task_id",
            )
        task = self._shared.tasks[snap.task_id]
        fingerprint = task_fingerprint(task.question, task.golden_answers)
        if snap.task_sha256 is not None and snap.task_sha256 != fingerprint:
            raise SnapshotMismatchError(
                f"snapshot field 'task_sha256': this env's task {snap.task_id!r} asks "
                f"{task.question[:80]!r} with other gold answers or another question than the "
                "snapshot's (task ids repeat across synthetic worlds and datasets); restore it "
                "into an env over the tasks it was taken on",
                field="task_sha256",
            )
        if len(snap.turns) > config.max_turns:
            raise SnapshotError(
                f"snapshot has {len(snap.turns)} turns, more than max_turns={config.max_turns}",
                field="turns",
            )
        last: _Turn | None = None
        n_tool_calls = n_invalid = 0
        doc_ids: list[str] = []
        tools = self._shared.tools
        for i, record in enumerate(snap.turns):
            if record.kind not in (*tools, "answer", "invalid"):
                raise SnapshotError(
                    f"snapshot turn {i} is a {record.kind!r:.40}, which is none of this env's "
                    f"tools {sorted(tools)}, an answer or an invalid action",
                    field="turns",
                )
            if record.kind == "answer" and i != len(snap.turns) - 1:
                raise SnapshotError(
                    f"snapshot turn {i} is an answer but is not the last", field="turns"
                )
            if record.kind not in tools and (record.hits or record.output):
                raise SnapshotError(
                    f"snapshot turn {i} ({record.kind}) has a tool's result", field="turns"
                )
            key = ""
            if record.kind != "invalid":
                # the content must be what this env's parser would have taken from an action
                action = f"<{record.kind}>{record.content}</{record.kind}>"
                parsed = _parse(config, action, tools)
                if parsed.kind != record.kind or parsed.content != record.content:
                    reason = parsed.reason or "it is not stripped"
                    raise SnapshotError(
                        f"snapshot turn {i} holds a {record.kind} that no action gives ({reason})",
                        field="turns",
                    )
                key = parsed.query
                if record.kind == "search" and not key and record.hits:
                    raise SnapshotError(f"snapshot turn {i} has hits for no query", field="turns")
            last = _Turn(record.kind, record.content, tuple(record.hits), key, last, record.output)
            n_tool_calls += tools[record.kind].cost if record.kind in tools else 0
            n_invalid += record.kind == "invalid"
            doc_ids.extend(hit.doc_id for hit in record.hits)
        terminated = bool(snap.turns) and snap.turns[-1].kind == "answer"
        return _Episode(
            task=task,
            index_id=snap.index_id,
            last=last,
            n_turns=len(snap.turns),
            n_tool_calls=n_tool_calls,
            n_invalid=n_invalid,
            retrieved_doc_ids=tuple(doc_ids),
            terminated=terminated,
            truncated=not terminated and len(snap.turns) >= self._shared.config.max_turns,
        )


def _parse(config: SearchQAConfig, action: str, tools: Mapping[str, Tool]) -> ParsedAction:
    """The action as this env's protocol reads it; a tool call checked by its tool.

    A tool call's `query` is the tool's key (a search's normalised query).
    """
    if config.protocol == "search-r1":
        parsed = parse_action_search_r1(action)
    else:
        parsed = parse_action(action, tuple(tools))
    tool = tools.get(parsed.kind)
    if tool is None:
        return parsed
    try:
        content = tool.parse(parsed.content)
    except ToolArgumentError as err:
        return ParsedAction("invalid", "", str(err), parsed.end)
    return ParsedAction(parsed.kind, content, "", parsed.end, tool.key(content))


def _tools_preamble(tools: Mapping[str, Tool]) -> str:
    """The prompt's lines on tools other than search ("" for search alone: Search-R1's)."""
    others = [tool.prompt_line() for name, tool in tools.items() if name != "search"]
    if not others:
        return ""
    return "Besides searching, you can use these tools:\n" + "\n".join(others) + "\n"


def _cut(hit: Hit) -> Hit:
    """The hit with its title and text cut to `MAX_TEXT_CHARS` (a non-Hit is left to fail)."""
    if not isinstance(hit, Hit) or max(len(hit.title), len(hit.text)) <= MAX_TEXT_CHARS:
        return hit
    return replace(hit, title=hit.title[:MAX_TEXT_CHARS], text=hit.text[:MAX_TEXT_CHARS])


def _canonical(hit: Hit) -> Hit:
    """The hit with its strings as a snapshot's JSON gives them back (`canonical_text`)."""
    if not isinstance(hit, Hit) or not all(
        isinstance(v, str) for v in (hit.doc_id, hit.title, hit.text)
    ):
        return hit  # left to check_hits to refuse
    doc_id, title, text = (canonical_text(v) for v in (hit.doc_id, hit.title, hit.text))
    if (doc_id, title, text) == (hit.doc_id, hit.title, hit.text):
        return hit
    return replace(hit, doc_id=doc_id, title=title, text=text)


def _cached(node: _Turn | None, kind: str, key: str) -> _Turn | None:
    """The latest earlier call of this tool with this key (a search's normalised query)."""
    while node is not None:
        if node.query_key == key and node.kind == kind:
            return node
        node = node.parent
    return None


def _advice(err: BaseException) -> str:
    """What to do about a retriever's error: only an outage is worth retrying."""
    if isinstance(err, TypeError):  # the retriever's own code, not a limit a query can break
        return (
            "the retriever's own code raised TypeError (a bug in it, or a call it does not "
            "take), so retrying cannot help: the traceback above shows where"
        )
    if isinstance(err, ValueError):  # RequestRejected (a 4xx) is a ValueError
        return (
            "the retriever refused this query, so retrying cannot help: check that its limits "
            f"(e.g. a server's max_query_chars) allow queries of {MAX_CONTENT_CHARS} characters"
        )
    return "retry the step once the retriever is back"


def _plain(value: Any) -> Any:
    """A bit generator's state with its numpy arrays as lists of ints (JSON-ready)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [int(x) for x in value.tolist()]
    return value


def _check_fields(value: Any, spec: dict[str, Any], where: str) -> None:
    """Check `value` against one of `_RNG_FIELDS`' specs: exactly its keys, each in range."""
    if not isinstance(value, dict) or set(value) != set(spec):
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise ValueError(f"{where} holds {keys}, expected the keys {sorted(spec)}")
    for name, want in spec.items():
        got = value[name]
        if isinstance(want, dict):
            _check_fields(got, want, f"{where}.{name}")
            continue
        length, bound = want
        items = [got] if length is None else got if isinstance(got, list) else None
        if items is None or (length is not None and len(items) != length):
            raise ValueError(f"{where}.{name} must be a list of {length} integers")
        for item in items:
            if type(item) is not int or not 0 <= item < bound:
                raise ValueError(
                    f"{where}.{name} holds {item!r:.40}, not an integer in [0, {bound})"
                )


def _check_usable(name: str, state: dict[str, Any]) -> None:
    """Refuse the in-range states a generator cannot use, as its own documentation names them.

    numpy sets them without a word, and the stream is then 0 forever: `integers(n)` (the task
    draw of `reset`) rejects every draw and loops without end, holding the GIL, deaf to
    SIGINT. MT19937's recurrence reads the top bit of `key[0]` and all of `key[1:]` (19,937
    bits), and numpy's seeding sets that top bit so they are never all zero; a PCG increment
    is odd (numpy's seeding makes it `2 * stream + 1`), and an even one can stand still
    (state 0, increment 0). Philox (a counter through a cipher) and SFC64 (with its counter
    word) have no such state.

    Raises:
        ValueError: naming the field (`MT19937.state.key`, `PCG64.state.inc`).
    """
    if name == "MT19937":
        key = state["state"]["key"]
        if key[0] >> 31 == 0 and not any(key[1:]):
            raise ValueError(
                "MT19937.state.key is zero in every bit the generator's recurrence reads (the "
                "top bit of key[0] and all of key[1:]): it would give 0 forever (numpy's "
                "seeding never makes such a key)"
            )
    elif name in ("PCG64", "PCG64DXSM"):
        inc = state["state"]["inc"]
        if inc % 2 == 0:
            raise ValueError(
                f"{name}.state.inc is even ({str(inc)[:40]}): a PCG increment is odd (numpy's "
                "seeding makes it 2 * stream + 1), and an even one can repeat one value forever"
            )


_STREAM_PROBE = 2 * 624 + 8  # past an MT19937 key refill, whatever its position


def _check_stream(name: str, bit_generator: np.random.BitGenerator) -> None:
    """A last guard: refuse a state whose next raw draws are all one value (drawn from a copy).

    Raises:
        ValueError: naming the generator; a healthy state repeats one 64-bit value this
            often with probability about 2^-80000.
    """
    probe = type(bit_generator)()
    probe.state = bit_generator.state
    raw = probe.random_raw(_STREAM_PROBE)
    if bool((raw == raw[0]).all()):
        raise ValueError(
            f"{name}.state gives {int(raw[0])} for {_STREAM_PROBE} draws running: a degenerate "
            "state, which would make every bounded draw loop forever"
        )


def _generator_from(text: str) -> np.random.Generator:
    """The generator a snapshot's `rng_state` describes, every field checked before use.

    Raises:
        SnapshotError: not JSON, an unknown bit generator, a field missing, extra, of the
            wrong type or out of range (an MT19937 position past its key would crash a draw),
            or a state the generator cannot use (`_check_usable`: a draw would never return);
            the message names the field.
    """
    try:
        state = json.loads(text)
        name = state["bit_generator"] if isinstance(state, dict) else None
        if name not in _RNG_FIELDS:
            raise ValueError(f"bit_generator {name!r:.40}: expected one of {sorted(_RNG_FIELDS)}")
        _check_fields(
            {k: v for k, v in state.items() if k != "bit_generator"}, _RNG_FIELDS[name], name
        )
        _check_usable(name, state)
        bit_generator = _BIT_GENERATORS[name]()
        bit_generator.state = state
        _check_stream(name, bit_generator)
    except Exception as err:  # json and numpy raise Value/Type/Key/Overflow/RecursionError
        raise SnapshotError(
            f"snapshot rng_state is not a bit-generator state: {err!s:.300}", field="rng_state"
        ) from None
    return np.random.Generator(bit_generator)
