"""Evaluate an agent on a task set: episodes through the env, then metrics per group.

`evaluate(agent, env_factory, tasks)` plays one episode per task, `batch_size` at a time (a
finished episode's slot is refilled at once; a `ConcurrentAgent`'s episodes each send their
next turn as soon as their reply is back, with no lockstep per turn), and returns a `Report`:
every episode's record (its turns, answer and scores) and the metrics overall, per dataset, per
question type and per hop count.

Metrics (see docs/benchmarks.md):

- `em`, `sub_em`, `f1`: the env's scores of the episode's answer (`envs.rewards`: SQuAD
  normalisation, best over gold answers and aliases); an episode with no answer scores 0.
- `answered`: share of episodes that ended with an answer.
- `valid_action_rate`: valid actions / all actions (an invalid action is anything that is not a
  well-formed search or answer).
- `searches`, `turns`, `tokens`: per question, means; tokens are generated tokens only.
- `recall`: share of a task's supporting documents that some search retrieved, averaged over
  the tasks that name supporting documents (`n_recall`); needs an index whose ids match the
  tasks' (built by `tracerl corpus`, or the synthetic world).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envs.tasks import QATask, as_gold_answers
from harness.policies.base import PolicyBackend, SamplingParams
from harness.rollout.agent import Agent, AgentAction, ConcurrentAgent, PolicyAgent
from harness.rollout.episodes import question_kind

__all__ = [
    "SCHEMA_VERSION",
    "EpisodeRecord",
    "Metrics",
    "PolicyEval",
    "Report",
    "TurnLog",
    "aggregate",
    "evaluate",
    "evaluate_backend",
    "evaluate_policy_dir",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnLog:
    """One action and what the env said back."""

    action: str
    observation: str
    kind: str
    """`search`, `answer` or `invalid`."""
    valid: bool
    n_tokens: int
    finish_reason: str
    n_prompt_tokens: int | None = None
    """The prompt's tokens, when an endpoint said (its `usage`)."""
    latency_s: float | None = None
    """The request's seconds, for agents behind an endpoint (`tracerl bench compare`)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (the endpoint's figures only when there are some)."""
        out: dict[str, Any] = {
            "action": self.action,
            "observation": self.observation,
            "kind": self.kind,
            "valid": self.valid,
            "n_tokens": self.n_tokens,
            "finish_reason": self.finish_reason,
        }
        if self.n_prompt_tokens is not None:
            out["n_prompt_tokens"] = self.n_prompt_tokens
        if self.latency_s is not None:
            out["latency_s"] = round(self.latency_s, 4)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeRecord:
    """One evaluated question: the trajectory and its scores."""

    task_id: str
    dataset: str
    question: str
    golden_answers: tuple[str, ...]
    question_type: str
    n_hops: int | None
    answer: str | None
    """The parsed answer, or None if the episode ended without one."""
    em: float
    sub_em: float
    f1: float
    end: str
    """`answer`, `max_turns` (truncated by the env), `context` (the model's context ran out) or
    `error` (the endpoint's replies stayed malformed after its retries)."""
    cause: str | None = None
    """Why an `error` episode ended (the endpoint's malformed or oversized reply)."""
    n_tool_calls: int
    n_tokens: int
    retrieved_doc_ids: tuple[str, ...]
    supporting_doc_ids: tuple[str, ...]
    turns: tuple[TurnLog, ...]

    @property
    def n_turns(self) -> int:
        """Actions taken."""
        return len(self.turns)

    @property
    def n_valid(self) -> int:
        """Valid actions taken."""
        return sum(t.valid for t in self.turns)

    @property
    def recall(self) -> float | None:
        """Share of supporting documents retrieved; None when the task names none."""
        if not self.supporting_doc_ids:
            return None
        retrieved = set(self.retrieved_doc_ids)
        return sum(d in retrieved for d in self.supporting_doc_ids) / len(self.supporting_doc_ids)

    def to_json(self) -> dict[str, Any]:
        """The trajectories.jsonl line."""
        return {
            "task_id": self.task_id,
            "dataset": self.dataset,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "question_type": self.question_type,
            "n_hops": self.n_hops,
            "answer": self.answer,
            "em": self.em,
            "sub_em": self.sub_em,
            "f1": self.f1,
            "end": self.end,
            **({"cause": self.cause} if self.cause is not None else {}),
            "n_turns": self.n_turns,
            "n_valid": self.n_valid,
            "n_tool_calls": self.n_tool_calls,
            "n_tokens": self.n_tokens,
            "recall": self.recall,
            "retrieved_doc_ids": list(self.retrieved_doc_ids),
            "supporting_doc_ids": list(self.supporting_doc_ids),
            "turns": [t.to_json() for t in self.turns],
        }

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> EpisodeRecord:
        """Inverse of `to_json`."""
        return cls(
            task_id=record["task_id"],
            dataset=record["dataset"],
            question=record["question"],
            golden_answers=as_gold_answers(record["golden_answers"]),
            question_type=record["question_type"],
            n_hops=record["n_hops"],
            answer=record["answer"],
            em=record["em"],
            sub_em=record["sub_em"],
            f1=record["f1"],
            end=record["end"],
            cause=record.get("cause"),
            n_tool_calls=record["n_tool_calls"],
            n_tokens=record["n_tokens"],
            retrieved_doc_ids=tuple(record["retrieved_doc_ids"]),
            supporting_doc_ids=tuple(record["supporting_doc_ids"]),
            turns=tuple(TurnLog(**t) for t in record["turns"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """Aggregate metrics of a group of episodes (all means are per question)."""

    n: int
    em: float
    sub_em: float
    f1: float
    answered: float
    valid_action_rate: float
    searches: float
    turns: float
    tokens: float
    recall: float | None
    """Mean over the `n_recall` episodes whose task names supporting documents."""
    n_recall: int
    searches_hist: dict[int, int] = field(default_factory=dict)
    """Number of searches -> number of questions."""
    ends: dict[str, int] = field(default_factory=dict)
    """How episodes ended -> count."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (histogram keys become strings, as JSON requires)."""
        return {
            "n": self.n,
            "em": self.em,
            "sub_em": self.sub_em,
            "f1": self.f1,
            "answered": self.answered,
            "valid_action_rate": self.valid_action_rate,
            "searches": self.searches,
            "turns": self.turns,
            "tokens": self.tokens,
            "recall": self.recall,
            "n_recall": self.n_recall,
            "searches_hist": {str(k): v for k, v in sorted(self.searches_hist.items())},
            "ends": dict(sorted(self.ends.items())),
        }


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.fsum(values) / len(values) if values else 0.0


def aggregate(records: Sequence[EpisodeRecord]) -> Metrics:
    """Metrics of a group of episodes.

    Raises:
        ValueError: `records` is empty.
    """
    if not records:
        raise ValueError("cannot aggregate zero episodes")
    n_actions = sum(r.n_turns for r in records)
    recalls = [r.recall for r in records if r.recall is not None]
    return Metrics(
        n=len(records),
        em=_mean(r.em for r in records),
        sub_em=_mean(r.sub_em for r in records),
        f1=_mean(r.f1 for r in records),
        answered=_mean(float(r.answer is not None) for r in records),
        valid_action_rate=sum(r.n_valid for r in records) / n_actions if n_actions else 0.0,
        searches=_mean(r.n_tool_calls for r in records),
        turns=_mean(r.n_turns for r in records),
        tokens=_mean(r.n_tokens for r in records),
        recall=_mean(recalls) if recalls else None,
        n_recall=len(recalls),
        searches_hist=dict(Counter(r.n_tool_calls for r in records)),
        ends=dict(Counter(r.end for r in records)),
    )


def _group(
    records: Sequence[EpisodeRecord], key: Callable[[EpisodeRecord], str]
) -> dict[str, Metrics]:
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    return {name: aggregate(groups[name]) for name in sorted(groups)}


def _type_key(record: EpisodeRecord) -> str:
    return f"{record.dataset}/{record.question_type or '-'}"


def _hops_key(record: EpisodeRecord) -> str:
    return f"{record.dataset}/{record.n_hops if record.n_hops is not None else '?'}-hop"


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The result of one evaluation: episodes, metrics, and what is needed to reproduce it."""

    agent: str
    episodes: tuple[EpisodeRecord, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    """Reproducibility: dataset hashes, index manifest, agent and env settings, seed, ..."""

    @property
    def overall(self) -> Metrics:
        """Metrics over every episode."""
        return aggregate(self.episodes)

    @property
    def by_dataset(self) -> dict[str, Metrics]:
        """Metrics per dataset."""
        return _group(self.episodes, lambda r: r.dataset)

    @property
    def by_type(self) -> dict[str, Metrics]:
        """Metrics per `dataset/question_type`."""
        return _group(self.episodes, _type_key)

    @property
    def by_hops(self) -> dict[str, Metrics]:
        """Metrics per `dataset/N-hop`."""
        return _group(self.episodes, _hops_key)

    def to_json(self) -> dict[str, Any]:
        """report.json (trajectories go to their own file)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "agent": self.agent,
            "meta": self.meta,
            "overall": self.overall.to_json(),
            "by_dataset": {k: v.to_json() for k, v in self.by_dataset.items()},
            "by_type": {k: v.to_json() for k, v in self.by_type.items()},
            "by_hops": {k: v.to_json() for k, v in self.by_hops.items()},
        }


# --- the episode loop --------------------------------------------------------------------------


@dataclass
class _Running:
    """One episode in flight."""

    env: Any
    task: QATask
    state: Any
    observation: str
    info: dict[str, Any]
    turns: list[TurnLog] = field(default_factory=list)
    n_tokens: int = 0
    cause: str | None = None


def evaluate(
    agent: Agent,
    env_factory: Callable[[], Any],
    tasks: Iterable[QATask],
    *,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = False,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
) -> Report:
    """Play one episode per task and score it.

    Args:
        agent: the agent.
        env_factory: builds an env whose task set holds every task (e.g.
            `lambda: SearchQAEnv(tasks, retriever, max_turns=4, top_k=3)`); `batch_size` envs
            are built and reused.
        tasks: the tasks to evaluate, in order.
        batch_size: episodes in flight at once (one model batch, or concurrent HTTP requests).
        seed: passed to every `env.reset`.
        progress: draw a tqdm bar with the running EM.
        on_episode: called with each finished episode (e.g. to stream trajectories).

    Returns:
        The report; `meta` holds the agent's settings, the seed and the counts.

    Raises:
        ValueError: `batch_size` < 1 or no tasks.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be >= 1")
    queue = list(tasks)
    if not queue:
        raise ValueError("no tasks to evaluate")
    n_total = len(queue)
    task_ids = [t.task_id for t in queue]
    queue.reverse()  # pop() from the end takes tasks in order
    envs = [env_factory() for _ in range(min(batch_size, n_total))]
    free = list(reversed(envs))
    done: list[EpisodeRecord] = []
    bar = _progress_bar(n_total, agent.name) if progress else None

    def admit() -> list[_Running]:
        admitted = []
        while queue and free:
            task = queue.pop()
            env = free.pop()
            prompt, info = env.reset(seed=seed, options={"task_id": task.task_id})
            admitted.append(
                _Running(
                    env=env, task=task, state=agent.start(prompt, info), observation="", info=info
                )
            )
        return admitted

    def finish(episode: _Running, end: str) -> None:
        record = _record(episode, end)
        done.append(record)
        free.append(episode.env)
        if on_episode is not None:
            on_episode(record)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(em=f"{_mean(r.em for r in done):.3f}", refresh=False)

    if isinstance(agent, ConcurrentAgent):
        # no lockstep: an episode is stepped and sends its next turn as soon as its action is
        # back; a finished episode's slot takes the next task at once
        pending: dict[Any, _Running] = {}

        def send(episodes: Iterable[_Running]) -> None:
            for episode in episodes:
                pending[agent.submit(episode.state, episode.observation, episode.info)] = episode

        try:
            send(admit())
            while pending:
                ready = []
                for handle, action in agent.wait(list(pending)):
                    episode = pending.pop(handle)
                    end = _step(episode, action)
                    if end is None:
                        ready.append(episode)
                    else:
                        finish(episode, end)
                send([*ready, *admit()])
        finally:
            agent.close()
    else:
        running = admit()
        while running:
            actions = agent.act(
                [r.state for r in running],
                [r.observation for r in running],
                [r.info for r in running],
            )
            if len(actions) != len(running):
                raise RuntimeError(
                    f"agent {agent.name!r} returned {len(actions)} actions for "
                    f"{len(running)} episodes"
                )
            still: list[_Running] = []
            for episode, action in zip(running, actions, strict=True):
                end = _step(episode, action)
                if end is None:
                    still.append(episode)
                else:
                    finish(episode, end)
            running = [*still, *admit()]
    if bar is not None:
        bar.close()
    position = {task_id: i for i, task_id in enumerate(task_ids)}
    return Report(
        agent=agent.name,
        episodes=tuple(sorted(done, key=lambda r: position[r.task_id])),  # task order
        meta={"agent": agent.settings(), "seed": seed, "batch_size": batch_size},
    )


def _step(episode: _Running, action: AgentAction) -> str | None:
    """Apply one action; return how the episode ended, or None if it goes on."""
    episode.n_tokens += action.n_tokens
    if action.finish_reason in ("context", "error"):
        episode.cause = action.cause
        return action.finish_reason
    step = action.text if action.call is None else action.call
    observation, _, terminated, truncated, info = episode.env.step(step)
    episode.turns.append(
        TurnLog(
            action=action.text,
            observation=observation,
            kind=str(info["action_kind"]),
            valid=bool(info["valid_action"]),
            n_tokens=action.n_tokens,
            finish_reason=action.finish_reason,
            n_prompt_tokens=action.n_prompt_tokens,
            latency_s=action.latency_s,
        )
    )
    episode.observation, episode.info = observation, info
    if terminated:
        return "answer"
    if truncated:
        return "max_turns"
    return None


def _record(episode: _Running, end: str) -> EpisodeRecord:
    info, task = episode.info, episode.task
    answered = end == "answer"
    return EpisodeRecord(
        task_id=task.task_id,
        dataset=task.dataset,
        question=task.question,
        golden_answers=task.golden_answers,
        question_type=task.question_type,
        n_hops=task.n_hops,
        answer=info.get("answer") if answered else None,
        em=float(info.get("em", 0.0)) if answered else 0.0,
        sub_em=float(info.get("sub_em", 0.0)) if answered else 0.0,
        f1=float(info.get("f1", 0.0)) if answered else 0.0,
        end=end,
        cause=episode.cause,
        n_tool_calls=int(info.get("n_tool_calls", 0)),
        n_tokens=episode.n_tokens,
        retrieved_doc_ids=tuple(info.get("retrieved_doc_ids", ())),
        supporting_doc_ids=task.supporting_doc_ids,
        turns=tuple(episode.turns),
    )


def _progress_bar(total: int, name: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"bench {name}", unit="q", dynamic_ncols=True)


def evaluate_backend(
    backend: PolicyBackend,
    tokenizer: Any,
    env_factory: Callable[[], Any],
    tasks: Iterable[QATask],
    *,
    name: str,
    max_context_tokens: int,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> Report:
    """Evaluate a policy backend: a trainer's live policy, or a directory loaded from disk.

    The one evaluator of a local policy: the training curve (`EvalConfig`), the demo's
    before/after table, the experiments and `tracerl bench` all play their episodes through
    `evaluate`, here or with an agent of their own. Sampling draws from one seeded stream
    per evaluation (each batch's seed derived from `seed` and the batch's number), never from
    the backend's own generator: a trainer's rollout stream is left as it was, and a saved
    policy, reloaded and evaluated with the same tasks, seed and batch size, plays the very
    episodes its live copy played.

    Args:
        backend: The policy.
        tokenizer: Its tokenizer.
        env_factory: See `evaluate`.
        tasks: The questions (repeat a task to sample it several times).
        name: The label in reports.
        max_context_tokens: The model's context: an episode that would outgrow it stops.
        temperature: 1 samples the policy's own distribution; 0 is greedy.
        max_new_tokens: Cap per action.
        seed: Seeds the sampling stream and every `env.reset`.
        batch_size: Episodes in flight at once (one model batch).
        progress: Draw a tqdm bar.
        settings: Extra fields for the report's `meta` (the policy's path).
    """
    agent = PolicyAgent(
        name,
        backend,
        tokenizer,
        SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed),
        max_context_tokens=max_context_tokens,
        settings=settings,
    )
    return evaluate(agent, env_factory, tasks, batch_size=batch_size, seed=seed, progress=progress)


def evaluate_policy_dir(
    policy_dir: Path,
    env_factory: Callable[[], Any],
    tasks: Iterable[QATask],
    *,
    name: str,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = False,
) -> Report:
    """Evaluate a local transformers policy directory (a tiny policy, or a trained one).

    `evaluate_backend` over the directory's model and tokenizer: two policies evaluated with
    the same `seed` draw from the same stream, the comparison the demo and the experiments
    make.

    Args:
        policy_dir: A transformers causal-LM directory with its tokenizer.
        env_factory: See `evaluate`.
        tasks: The questions (repeat a task to sample it several times).
        name: The label in reports.
        temperature: 1 samples the policy's own distribution; 0 is greedy.
        max_new_tokens: Cap per action.
        seed: Seeds the sampling stream and every `env.reset`.
        batch_size: Episodes in flight at once (one model batch).
        progress: Draw a tqdm bar.
    """
    from harness.policies.transformers_backend import TransformersBackend

    backend = TransformersBackend(policy_dir, batch_size=batch_size)
    return evaluate_backend(
        backend,
        backend.tokenizer,
        env_factory,
        tasks,
        name=name,
        max_context_tokens=int(backend.model.config.max_position_embeddings),
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        batch_size=batch_size,
        progress=progress,
        settings={"policy": str(policy_dir)},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyEval:
    """Exact match of a policy on a set of questions, overall and by question kind.

    Attributes:
        em: Mean EM over every episode.
        em_by_kind: Mean EM per `question_kind`.
        n_by_kind: Episodes per kind.
        mixed: Share of questions whose samples got both outcomes (0 with one sample each).
        n_episodes: Episodes played.
        n_samples: Episodes per question.
        temperature: Sampling temperature (0 = greedy).
        searches_per_episode: Mean tool calls.
        answered: Share of episodes that ended with an answer.
        generated_tokens_per_s: Policy tokens per second of wall time (generation plus env).
    """

    em: float
    em_by_kind: dict[str, float]
    n_by_kind: dict[str, int]
    mixed: float
    n_episodes: int
    n_samples: int
    temperature: float
    searches_per_episode: float
    answered: float
    generated_tokens_per_s: float

    @classmethod
    def of_report(cls, report: Report, *, temperature: float, wall_s: float) -> PolicyEval:
        """The summary of `report`, an evaluation at `temperature` that took `wall_s`."""
        episodes = report.episodes
        if not episodes:
            raise ValueError("an empty report has no summary")
        by_kind: dict[str, list[float]] = defaultdict(list)
        by_task: dict[str, list[float]] = defaultdict(list)
        for e in episodes:
            by_kind[question_kind(e.question_type, e.n_hops)].append(e.em)
            by_task[e.task_id].append(e.em)
        n, overall = len(episodes), report.overall
        return cls(
            em=overall.em,
            em_by_kind={k: _mean(v) for k, v in sorted(by_kind.items())},
            n_by_kind={k: len(v) for k, v in sorted(by_kind.items())},
            mixed=_mean(0.0 < sum(v) < len(v) for v in by_task.values()),
            n_episodes=n,
            n_samples=n // len(by_task),
            temperature=temperature,
            searches_per_episode=overall.searches,
            answered=overall.answered,
            generated_tokens_per_s=sum(e.n_tokens for e in episodes) / max(wall_s, 1e-9),
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> PolicyEval:
        """Inverse of `to_json`."""
        return cls(**record)
