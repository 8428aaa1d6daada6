"""The agent evaluation plays, and `PolicyAgent`: a local policy backend behind it.

An `Agent` plays many episodes at once, through the env API only. `start` opens an episode from
the env's prompt and returns the agent's own state for it; `act` takes the states of the running
episodes with their newest observations and returns one `AgentAction` each, in one batch, so a
local model decodes the episodes together. A `ConcurrentAgent` instead sends each episode's turn
as soon as its previous reply is back (the endpoint agents of `harness.evaluation`).

`PolicyAgent` is any `PolicyBackend` plus its tokenizer. Its transcript is token ids, encoded by
`EpisodeCodec` (BOS + prompt, each observation tokenised once and appended), so the generated
tokens are never re-tokenised and evaluation sees the token layout training does. It lives here,
beside the rollout engine, because the trainer's held-out curve plays it too
(`harness.rollout.evaluation.evaluate_backend`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from envs.tools import ToolCall
from harness.policies.base import STOP_STRINGS, PolicyBackend, SamplingParams
from harness.rollout.episodes import EpisodeCodec

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "Agent",
    "AgentAction",
    "ConcurrentAgent",
    "FinishReason",
    "PolicyAgent",
    "call_sampling",
    "sampling_json",
]

FinishReason = Literal["stop", "length", "eos", "context", "error", "scripted"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentAction:
    """One action and what it cost."""

    text: str
    """The action text handed to `env.step` (for a `call`, how the trajectory shows it)."""
    n_tokens: int = 0
    """Tokens generated for it (0 for scripted agents)."""
    finish_reason: FinishReason = "scripted"
    """How generation ended; `context` means the transcript outgrew the model's context, and
    the episode is stopped there (the action text is then empty); `error` means the endpoint's
    replies stayed malformed after the retries, and only that episode is stopped."""
    call: ToolCall | None = None
    """A structured action (a native tool call) handed to `env.step` instead of `text`."""
    cause: str | None = None
    """Why an `error` action ended its episode (the trajectory keeps it)."""
    n_prompt_tokens: int | None = None
    """The prompt's tokens, when the endpoint says (`usage`)."""
    latency_s: float | None = None
    """Seconds the endpoint took for it, for agents behind one."""


@runtime_checkable
class Agent(Protocol):
    """Plays episodes through the env API only (prompt in, action text out)."""

    @property
    def name(self) -> str:
        """A short label for reports (`oracle`, `Qwen3-8B@http`, ...)."""
        ...

    def settings(self) -> dict[str, Any]:
        """Everything that fixes the agent's behaviour, JSON-safe, for the report."""
        ...

    def start(self, prompt: str, info: Mapping[str, Any]) -> Any:
        """Open an episode; returns the agent's state for it (owned by the agent)."""
        ...

    def act(
        self,
        states: Sequence[Any],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """One action per running episode; `observations[i]` is "" right after `start`."""
        ...


@runtime_checkable
class ConcurrentAgent(Agent, Protocol):
    """An agent whose episodes each send their next turn the moment their reply is back.

    Evaluation then keeps `batch_size` episodes in flight with no lockstep per turn (as the
    rollout engine does for a `ConcurrentPolicyBackend`): a slow reply, or a retried request,
    holds up only its own episode.
    """

    def submit(self, state: Any, observation: str, info: Mapping[str, Any]) -> Hashable:
        """Start one episode's next action; returns a handle for `wait`."""
        ...

    def wait(self, handles: Sequence[Hashable]) -> list[tuple[Hashable, AgentAction]]:
        """Block until at least one of `handles` is done; return every one that is."""
        ...

    def close(self) -> None:
        """Cancel what is in flight and release the connections."""
        ...


@dataclass
class _TokenState:
    ids: list[int]


class PolicyAgent:
    """A model behind any `PolicyBackend`, with its tokenizer.

    Args:
        name: the label in reports.
        backend: the engine (`TransformersBackend`, `VLLMBackend`, `OpenAICompatBackend`).
        tokenizer: the model's tokenizer.
        sampling: generation settings; its stop strings must end actions (`</search>`,
            `</answer>`).
        chat_template: wrap the prompt as a user message in the tokenizer's chat template
            (instruct models); False feeds the prompt as plain text (base and tiny models).
        max_context_tokens: the model's context; an episode whose transcript plus
            `max_new_tokens` no longer fits is stopped (`finish_reason="context"`).
        settings: extra fields for the report (model path, backend options).
    """

    def __init__(
        self,
        name: str,
        backend: PolicyBackend,
        tokenizer: PreTrainedTokenizerBase,
        sampling: SamplingParams,
        *,
        chat_template: bool = False,
        max_context_tokens: int = 4096,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        if not set(STOP_STRINGS) <= set(sampling.stop):
            raise ValueError(f"sampling.stop={sampling.stop} must include {STOP_STRINGS}")
        self._name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self.codec = EpisodeCodec(tokenizer)
        self.sampling = sampling
        self.chat_template = chat_template
        self.max_context_tokens = max_context_tokens
        self._settings = dict(settings or {})
        self._n_calls = 0

    @property
    def name(self) -> str:
        """The label in reports."""
        return self._name

    def settings(self) -> dict[str, Any]:
        """Backend, sampling and prompt handling."""
        return {
            **self._settings,
            "sampling": sampling_json(self.sampling),
            "chat_template": self.chat_template,
            "max_context_tokens": self.max_context_tokens,
        }

    def start(self, prompt: str, info: Mapping[str, Any]) -> _TokenState:
        """Tokenise the prompt: through the chat template when asked, else as training does."""
        if self.chat_template:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding
                ids = ids["input_ids"]
            return _TokenState(ids=[int(t) for t in ids])
        return _TokenState(ids=self.codec.encode_prompt(prompt))

    def act(
        self,
        states: Sequence[_TokenState],
        observations: Sequence[str],
        infos: Sequence[Mapping[str, Any]],
    ) -> list[AgentAction]:
        """Append each observation's tokens, then continue every transcript in one batch."""
        actions: list[AgentAction | None] = [None] * len(states)
        todo: list[int] = []
        for i, (state, obs) in enumerate(zip(states, observations, strict=True)):
            if obs:
                state.ids.extend(self.codec.encode_text(obs))
            if len(state.ids) + self.sampling.max_new_tokens > self.max_context_tokens:
                actions[i] = AgentAction(text="", finish_reason="context")
            else:
                todo.append(i)
        if todo:
            self._n_calls += 1
            completions = self.backend.generate(
                [states[i].ids for i in todo], call_sampling(self.sampling, self._n_calls)
            )
            for i, completion in zip(todo, completions, strict=True):
                states[i].ids.extend(completion.token_ids)
                actions[i] = AgentAction(
                    text=completion.text,
                    n_tokens=completion.n_tokens,
                    finish_reason=completion.finish_reason,
                )
        return [a for a in actions if a is not None]


def call_sampling(sampling: SamplingParams, call: int) -> SamplingParams:
    """`sampling` for an agent's `call`-th batch: a seed of its own, derived from the run's.

    A backend seeded with one value on every call draws the same random numbers for the same
    batch position on every turn, so a T > 0 run would not sample independently (it moved
    the shipped warm start's EM well beyond sampling noise). None stays None.
    """
    if sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed * 1_000_003 + call) % 2**63)


def sampling_json(sampling: SamplingParams) -> dict[str, Any]:
    """`sampling` as the report's agent settings show it (JSON-safe)."""
    out = asdict(sampling)
    out["stop"] = list(sampling.stop)
    return out
