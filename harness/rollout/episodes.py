"""Playing a token-level policy through search/QA environments, many episodes at once.

An episode's text is never re-tokenised: the prompt and each observation are encoded once, as
they arrive, and each action is the backend's own token ids. So the sequence a trainer scores is
exactly the one the policy sampled, and the supervised warm start (which builds its
demonstrations with the same `EpisodeCodec`) sees the same token layout as RL.

The pieces are meant to be reused by the tree-rollout engine:

- `EpisodeCodec` turns env text into token ids (one rule for prompts, one for observations);
- `LiveEpisode` is one running episode (env + token stream) that can `fork` at a turn boundary;
- `advance` plays one turn of every live episode with one batched `generate` call;
- `run_episodes` plays whole episodes (OpenRLHF's held-out experiences; evaluations with
  metrics go through `harness.evaluation.evaluate_backend`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from tqdm.auto import tqdm

from envs import RetrievalFailedError, SearchQAEnv
from envs import fork as fork_env
from envs.protocol import parse_action
from harness.policies.base import Completion, PolicyBackend, SamplingParams
from retrieval.cache import CachedRetriever
from retrieval.deadline import deadline, deadline_at
from retrieval.errors import RetrieverUnavailable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "Episode",
    "EpisodeCodec",
    "LiveEpisode",
    "PlayedTurn",
    "advance",
    "apply_turn",
    "prefetch_searches",
    "question_kind",
    "ready_for_turn",
    "run_episodes",
    "start_episodes",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpisodeCodec:
    """How env text becomes token ids: the prompt gets the bos token, observations nothing.

    Every piece is encoded on its own (`add_special_tokens=False`), so the token stream of an
    episode is the concatenation of its pieces' encodings, whoever produced them.
    """

    tokenizer: PreTrainedTokenizerBase

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of an episode's prompt, after the bos token if the tokenizer has one."""
        bos = self.tokenizer.bos_token_id
        return ([] if bos is None else [bos]) + self.encode_text(prompt)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of an action or observation text, with no special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def observation_after(self, completion: Completion, observation: str) -> str:
        """The part of `observation` that the action's last tokens have not already written.

        Stop strings are matched on text, but a token can run past one: Qwen3's tokenizer holds
        `>\n\n` as a single token, so an action ending in `</search>\n\n` keeps that token in
        its ids while its text is cut at `</search>`. Search-R1's observation starts with
        `\n\n<information>`, and appended whole it would put four newlines in the context where
        Search-R1 (which re-tokenises the text) has two. The characters the action's tokens
        spelled past its text and the observation begins with are dropped from the observation,
        so the context reads as Search-R1's text.

        Args:
            completion: The action as generated (its ids, and its text cut at the stop string).
            observation: The env's answer to it.

        Returns:
            The observation to encode and append.
        """
        if completion.finish_reason != "stop" or not observation:
            return observation
        spelled = self.tokenizer.decode(list(completion.token_ids))
        if not spelled.startswith(completion.text):
            return observation  # the text was not cut from these tokens' decoding
        overhang = spelled[len(completion.text) :]
        n = next(
            (i for i, (a, b) in enumerate(zip(overhang, observation, strict=False)) if a != b),
            min(len(overhang), len(observation)),
        )  # characters both start with
        return observation[n:]


def question_kind(question_type: str, n_hops: int | None) -> str:
    """The label results are grouped by: bridges by hop count, other types by name.

    >>> question_kind("bridge", 3), question_kind("comparison", 2)
    ('bridge-3hop', 'comparison')
    """
    if question_type == "bridge" and n_hops is not None:
        return f"bridge-{n_hops}hop"
    return question_type or "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class Episode:
    """A finished episode: its whole token stream, what the policy generated, and the outcome.

    Attributes:
        task_id: The question.
        kind: `question_kind` of the question.
        token_ids: Prompt, actions and observations, in order.
        action_mask: True on the tokens the policy generated (the only ones a loss may touch).
        logprobs: The backend's log-prob for each generated token, 0.0 elsewhere.
        reward: Sum of the env's rewards.
        em: Exact match of the final answer (0.0 when it never answered).
        answered: Whether it ended with an answer (rather than a turn or length limit).
        n_turns: Actions taken.
        n_tool_calls: Searches made.
        failed: Why the episode was cut by a fault ("retrieval": the retriever failed after
            its retries), or "" for an episode that ran its course.
    """

    task_id: str
    kind: str
    token_ids: tuple[int, ...]
    action_mask: tuple[bool, ...]
    logprobs: tuple[float, ...]
    reward: float
    em: float
    answered: bool
    n_turns: int
    n_tool_calls: int
    failed: str = ""

    @property
    def n_generated_tokens(self) -> int:
        """Tokens the policy generated in this episode."""
        return sum(self.action_mask)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlayedTurn:
    """One turn as `advance` played it: what the policy generated and what the env answered.

    The tree-rollout engine (`harness.rollout.engine`) turns these into `trace_alloc.Turn` nodes.
    """

    completion: Completion
    observation: str
    """The env's answer as appended ("" when the step ended the episode), less any characters
    the action's last token already spelled (`EpisodeCodec.observation_after`)."""
    observation_ids: tuple[int, ...]
    """Its token ids as appended to the stream (empty when the step ended the episode)."""
    reward: float
    info: dict[str, Any]
    """The env's info after the step."""


@dataclass(slots=True, kw_only=True)
class LiveEpisode:
    """One running episode: its env and the token stream so far."""

    env: gym.Env[str, str]
    task_id: str
    kind: str
    token_ids: list[int]
    action_mask: list[bool]
    logprobs: list[float]
    info: dict[str, Any]
    reward: float = 0.0
    done: bool = False
    turn_starts: list[int] = field(default_factory=list)
    """Index in `token_ids` where each action starts (the prefixes a tree may branch at)."""
    turns: list[PlayedTurn] = field(default_factory=list)
    """Every turn played so far, in order (forks share the records, which are immutable)."""

    def fork(self, n: int = 1) -> list[LiveEpisode]:
        """`n` independent copies at the current turn boundary (envs forked, lists copied)."""
        return [
            dataclasses.replace(
                self,
                env=env,
                token_ids=list(self.token_ids),
                action_mask=list(self.action_mask),
                logprobs=list(self.logprobs),
                info=dict(self.info),
                turn_starts=list(self.turn_starts),
                turns=list(self.turns),
            )
            for env in fork_env(self.env, n)
        ]

    def finish(self) -> Episode:
        """The finished record (call once `done`)."""
        return Episode(
            task_id=self.task_id,
            kind=self.kind,
            token_ids=tuple(self.token_ids),
            action_mask=tuple(self.action_mask),
            logprobs=tuple(self.logprobs),
            reward=self.reward,
            em=float(self.info.get("em", 0.0)),
            answered="answer" in self.info,
            n_turns=int(self.info.get("turn_idx", len(self.turn_starts))),
            n_tool_calls=int(self.info.get("n_tool_calls", 0)),
            failed=str(self.info.get("failed", "")),
        )


def start_episodes(
    env: gym.Env[str, str], task_ids: Sequence[str], codec: EpisodeCodec
) -> list[LiveEpisode]:
    """Reset one fork of `env` per task id (repeat an id to sample it several times).

    Args:
        env: A forkable search/QA env (or wrapper stack) whose task set holds every id.
        task_ids: The questions, one episode each.
        codec: Encodes the prompts.
    """
    episodes = []
    for task_id, episode_env in zip(task_ids, fork_env(env, len(task_ids)), strict=True):
        prompt, info = episode_env.reset(options={"task_id": task_id})
        ids = codec.encode_prompt(prompt)
        episodes.append(
            LiveEpisode(
                env=episode_env,
                task_id=task_id,
                kind=question_kind(info.get("question_type", ""), info.get("n_hops")),
                token_ids=ids,
                action_mask=[False] * len(ids),
                logprobs=[0.0] * len(ids),
                info=info,
            )
        )
    return episodes


def prefetch_searches(
    envs: Sequence[gym.Env[str, str]], actions: Sequence[str]
) -> dict[int, RetrievalFailedError]:
    """Send every search among `actions` to its env's retriever in one batched call.

    The envs then find the results in their retriever's cache when they step, so a turn of N
    searching episodes costs one retrieval request instead of N (Search-R1 batches a turn's
    queries the same way), and a remote server's micro-batcher sees them together. Only
    retrievers wrapped in a `CachedRetriever` (what `make_retriever` builds) can keep the
    results; others are left to the envs. All batched calls of the turn share one deadline,
    the envs' `retrieval_deadline_s` (`retrieval.deadline`). A batch that fails because the
    server is unavailable or the deadline ran out ends its episodes as failed, so a hung server
    costs the turn that deadline once, not once per searching episode; a batch that fails for
    another reason (a query the server refuses) leaves each env to ask on its own.

    Args:
        envs: The episodes' envs (any wrapper stack over a `SearchQAEnv`), in step order.
        actions: The action each env is about to take.

    Returns:
        For each env (by index) whose batched call found the server unavailable or ran out of
        time, the error its step would raise: such an env is not stepped (asking again would
        spend the deadline again).
    """
    groups: dict[tuple[int, int], tuple[CachedRetriever, list[int], list[str]]] = {}
    deadlines: list[float] = []
    for i, (env, action) in enumerate(zip(envs, actions, strict=True)):
        base = env.unwrapped
        parsed = parse_action(action)
        if not isinstance(base, SearchQAEnv) or parsed.kind != "search":
            continue
        retriever = base.retriever
        if isinstance(retriever, CachedRetriever):
            group = groups.setdefault((id(retriever), base.config.top_k), (retriever, [], []))
            group[1].append(i)
            group[2].append(parsed.content)
            if base.config.retrieval_deadline_s is not None:
                deadlines.append(base.config.retrieval_deadline_s)
    failed: dict[int, RetrievalFailedError] = {}
    with deadline(min(deadlines, default=None)):
        for (_, k), (retriever, indices, queries) in groups.items():
            distinct = list(dict.fromkeys(queries))
            try:
                retriever.search(distinct, k)
            except Exception as err:
                log.warning("a batch of %d queries failed: %r", len(distinct), err)
                if not _ends_the_turn(err):  # e.g. one query refused: the others may pass alone
                    continue
                error = RetrievalFailedError(
                    f"the turn's batched search of {len(distinct)} queries failed: {err!r}"
                )
                error.__cause__ = err
                failed.update(dict.fromkeys(indices, error))
    return failed


def _ends_the_turn(err: Exception) -> bool:
    """Whether a failed batch means its queries would fail alone too: no server, or no time."""
    end = deadline_at()
    return isinstance(err, RetrieverUnavailable) or (end is not None and time.monotonic() >= end)


def advance(
    backend: PolicyBackend,
    episodes: Sequence[LiveEpisode],
    codec: EpisodeCodec,
    sampling: SamplingParams,
    *,
    max_total_tokens: int | None = None,
    batch_tool_calls: bool = True,
) -> int:
    """Play one turn of every live episode: one batched `generate`, then one env step each.

    The action's token ids are appended as generated; the observation is encoded and appended
    unless the step ended the episode. A retrieval that still fails after the retriever's own
    retries ends that episode only: it is marked `info["failed"] = "retrieval"`, gets no reward
    for the turn, and the others go on (a fault ends an episode, not the job).

    Args:
        backend: The policy.
        episodes: Episodes; finished ones are skipped.
        codec: Encodes the observations.
        sampling: Sampling settings for this turn (stop strings end an action).
        max_total_tokens: An episode that would not fit this many tokens after its next
            observation and one more action of `sampling.max_new_tokens` ends unanswered,
            without that observation (and one whose prompt alone is too long never starts).
        batch_tool_calls: Send the turn's searches in one batched retrieval call first
            (`prefetch_searches`); False makes one request per searching episode.

    Returns:
        Tokens generated in this turn.
    """
    live = ready_for_turn(episodes, sampling, max_total_tokens)
    if not live:
        return 0
    completions = backend.generate([e.token_ids for e in live], sampling)
    return apply_turn(
        live,
        completions,
        codec,
        sampling,
        max_total_tokens=max_total_tokens,
        batch_tool_calls=batch_tool_calls,
    )


def ready_for_turn(
    episodes: Sequence[LiveEpisode], sampling: SamplingParams, max_total_tokens: int | None
) -> list[LiveEpisode]:
    """The episodes that play another turn; one without room for an action ends here."""
    live = [e for e in episodes if not e.done]
    if max_total_tokens is not None:
        for e in live:
            if len(e.token_ids) + sampling.max_new_tokens > max_total_tokens:
                e.done = True
        live = [e for e in live if not e.done]
    return live


def apply_turn(
    live: Sequence[LiveEpisode],
    completions: Sequence[Completion],
    codec: EpisodeCodec,
    sampling: SamplingParams,
    *,
    max_total_tokens: int | None = None,
    batch_tool_calls: bool = True,
) -> int:
    """Append each episode's generated action and step its env: the second half of `advance`.

    Args, errors and the return value as `advance`'s; `completions[i]` continues `live[i]`.
    """
    failed = (
        prefetch_searches([e.env for e in live], [c.text for c in completions])
        if batch_tool_calls
        else {}
    )
    n_generated = 0
    for i, (e, completion) in enumerate(zip(live, completions, strict=True)):
        n = completion.n_tokens
        n_generated += n
        e.turn_starts.append(len(e.token_ids))
        e.token_ids.extend(completion.token_ids)
        e.action_mask.extend([True] * n)
        e.logprobs.extend(completion.logprobs or [0.0] * n)
        try:
            if i in failed:
                raise failed[i]
            observation, reward, terminated, truncated, info = e.env.step(completion.text)
        except RetrievalFailedError as err:
            if i not in failed:  # a failed batch was logged once, by prefetch_searches
                log.warning("episode of task %r ends as failed: %s", e.task_id, err)
            observation, reward, terminated, truncated = "", 0.0, False, True
            info = {**e.info, "failed": "retrieval", "valid_action": True}
        e.reward += float(reward)
        e.info = info
        if not (terminated or truncated):
            observation = codec.observation_after(completion, observation)
        obs_ids = [] if terminated or truncated else codec.encode_text(observation)
        # No room for this observation and another action: the episode ends unanswered here,
        # so no sequence ever outgrows the model's context.
        overflow = max_total_tokens is not None and (
            len(e.token_ids) + len(obs_ids) + sampling.max_new_tokens > max_total_tokens
        )
        if terminated or truncated or overflow:
            e.done = True
            observation, obs_ids = "", []
        e.token_ids.extend(obs_ids)
        e.action_mask.extend([False] * len(obs_ids))
        e.logprobs.extend([0.0] * len(obs_ids))
        e.turns.append(
            PlayedTurn(
                completion=completion,
                observation=observation,
                observation_ids=tuple(obs_ids),
                reward=float(reward),
                info=info,
            )
        )
    return n_generated


def run_episodes(
    backend: PolicyBackend,
    env: gym.Env[str, str],
    task_ids: Sequence[str],
    codec: EpisodeCodec,
    *,
    sampling: SamplingParams,
    seed: int = 0,
    max_total_tokens: int | None = None,
    progress: bool = False,
) -> list[Episode]:
    """Play one episode per task id to the end, all turns batched across episodes.

    Args:
        backend: The policy.
        env: A forkable env over the tasks (it is forked, never stepped itself).
        task_ids: One episode each, in order (repeat an id to sample it several times).
        codec: Encodes prompts and observations.
        sampling: Sampling settings; its seed is replaced by one derived from `seed` and the
            turn, so that turns do not reuse the same random numbers.
        seed: Seeds every turn's sampling.
        max_total_tokens: See `advance`.
        progress: Draw a tqdm bar of finished episodes on stderr.

    Returns:
        The finished episodes, in the order of `task_ids`.
    """
    episodes = start_episodes(env, task_ids, codec)
    with tqdm(total=len(episodes), desc="episodes", disable=not progress, leave=False) as bar:
        turn = 0
        while not all(e.done for e in episodes):
            turn_sampling = dataclasses.replace(sampling, seed=seed * 1_000 + turn)
            advance(backend, episodes, codec, turn_sampling, max_total_tokens=max_total_tokens)
            bar.update(sum(e.done for e in episodes) - bar.n)
            turn += 1
    return [e.finish() for e in episodes]
