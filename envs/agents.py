"""Scripted agents for the synthetic world, and a runner that plays them through an env.

`OracleAgent` follows a question's decomposition with queries that the retriever actually
answers (it re-queries when the needed paragraph is not among the hits), and with noise rate
ε issues a wrong query before a hop (then recovers) or gives a wrong final answer: the kind of
demonstrations a supervised warm start needs. `NaiveAgent` searches the question once and
answers with the most frequent capitalised name it was shown; its low score is the test that
the world needs multi-hop retrieval. Both act through the env API only (observation and info).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from tqdm.auto import tqdm

from envs.base import ScriptedPolicy
from envs.errors import EnvConfigError
from envs.synthetic.dice import Dice
from envs.synthetic.questions import Decomposition, SubQuestion
from envs.synthetic.world import World

__all__ = [
    "EpisodeResult",
    "NaiveAgent",
    "OracleAgent",
    "most_frequent_name",
    "run_agent",
    "run_episode",
]


class OracleAgent:
    """Answers a synthetic world's questions by following their decompositions.

    Args:
        world: the world whose questions the env asks.
        epsilon: noise rate. Before each hop, with probability ε, a wrong query (another
            entity's name, or the subject's name cut short) comes first; and with probability
            ε the final answer is another entity's name.
        seed: seeds the noise; draws depend on (seed, task id) only, not on episode order.
        max_queries_per_hop: tries per hop (the hop query, then the bare subject name) before
            moving on without the paragraph.

    >>> world = World.generate(0)
    >>> agent = OracleAgent(world)
    >>> task = world.tasks[0]
    >>> agent.reset("", {"task_id": task.task_id, "retrieved_doc_ids": []})
    >>> agent.act("", {"turn_idx": 0, "max_turns": 8, "retrieved_doc_ids": []})
    '<search> The Hollow Window director </search>'
    """

    def __init__(
        self, world: World, *, epsilon: float = 0.0, seed: int = 0, max_queries_per_hop: int = 2
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise EnvConfigError(f"epsilon={epsilon}: must be in [0, 1]")
        if max_queries_per_hop < 1:
            raise EnvConfigError(f"max_queries_per_hop={max_queries_per_hop}: must be >= 1")
        self.world = world
        self.epsilon = epsilon
        self.seed = seed
        self.max_queries_per_hop = max_queries_per_hop
        self._plan: Decomposition | None = None
        self._dice = Dice(seed)
        self._hop = 0
        self._tries = 0
        self._noised: set[int] = set()
        self._pending: str | None = None  # what the last action was: "hop", "noise" or None
        self._n_seen = 0

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode on `info["task_id"]`.

        Raises:
            KeyError: the task is not one of the world's questions.
        """
        self._plan = self.world.decomposition(info["task_id"])
        self._dice = Dice(self.seed).spawn(info["task_id"])
        self._hop = 0
        self._tries = 0
        self._noised = set()
        self._pending = None
        self._n_seen = len(info.get("retrieved_doc_ids", ()))

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        """The next action: a hop's query, a noisy query, a re-query, or the answer."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("OracleAgent.act before reset")
        shown = info.get("retrieved_doc_ids", [])
        new_ids, self._n_seen = shown[self._n_seen :], len(shown)
        if self._pending == "hop":
            self._tries += 1
            if plan.steps[self._hop].doc_id in new_ids or self._tries >= self.max_queries_per_hop:
                self._hop, self._tries = self._hop + 1, 0
        self._pending = None
        turns_left = info["max_turns"] - info["turn_idx"]
        if self._hop >= len(plan.steps) or turns_left <= 1:
            return f"<answer> {self._final_answer(plan)} </answer>"
        step = plan.steps[self._hop]
        if self._tries == 0 and self._hop not in self._noised and turns_left > 2:
            self._noised.add(self._hop)
            if self._dice.chance(self.epsilon):
                self._pending = "noise"
                return f"<search> {self._wrong_query(step)} </search>"
        self._pending = "hop"
        query = step.query if self._tries == 0 else step.subject
        return f"<search> {query} </search>"

    def _wrong_query(self, step: SubQuestion) -> str:
        keyword = step.query[len(step.subject) :].strip()
        if self._dice.chance(0.5) and " " in step.subject:
            return f"{step.subject.split(' ')[0]} {keyword}"  # the name cut short
        kind = self.world.entity(step.subject_id).kind
        others = [e.name for e in self.world.entities_of(kind) if e.entity_id != step.subject_id]
        return f"{self._dice.pick(others)} {keyword}"

    def _final_answer(self, plan: Decomposition) -> str:
        if self._dice.chance(self.epsilon):
            kind = self.world.entity(plan.answer_id).kind
            others = [e.name for e in self.world.entities_of(kind) if e.entity_id != plan.answer_id]
            return self._dice.pick(others)
        return plan.answer


_NAME = re.compile(r"[A-Z][\w'’-]*(?:\s+(?:of\s+(?:the\s+)?|the\s+)?[A-Z][\w'’-]*)*")
_NOT_NAMES = frozenset(
    ("Doc", "Title", "A", "An", "The", "He", "She", "It", "His", "Her", "Its", "Born", "No",
     "Published", "Founded", "Directed", "Other", "After", "Speakers")
)  # fmt: skip


def most_frequent_name(text: str, *, exclude: str = "") -> str | None:
    """The capitalised name that occurs most often in `text` (first seen wins a tie).

    Names that occur in `exclude` (the question), and single capitalised function words
    ("The", "He", "Doc", ...), do not count.

    >>> most_frequent_name("Ann Vole met Bo Li. Bo Li left. Title: Acme", exclude="Ann Vole?")
    'Bo Li'
    """
    exclude = exclude.lower()
    names = [m.group(0) for m in _NAME.finditer(text)]
    counts = Counter(n for n in names if n not in _NOT_NAMES and n.lower() not in exclude)
    return counts.most_common(1)[0][0] if counts else None


class NaiveAgent:
    """Searches the question once, then answers the most frequent capitalised name it saw.

    >>> agent = NaiveAgent()
    >>> agent.reset("", {"question": "Who founded Acme?"})
    >>> agent.act("", {})
    '<search> Who founded Acme? </search>'
    >>> agent.act("<information>Doc 1(Title: Acme) Acme was founded by Ann Vole.</information>", {})
    '<answer> Ann Vole </answer>'
    """

    def __init__(self) -> None:
        self._question = ""
        self._searched = False

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode; the question comes from `info["question"]`."""
        self._question = str(info.get("question", ""))
        self._searched = False

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        """Search the question first; then answer."""
        if not self._searched:
            self._searched = True
            return f"<search> {self._question} </search>"
        name = most_frequent_name(observation, exclude=self._question) or "unknown"
        return f"<answer> {name} </answer>"


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeResult:
    """The outcome of one episode played by a scripted agent."""

    task_id: str
    question_type: str
    n_hops: int | None
    reward: float
    em: float
    sub_em: float
    f1: float
    answered: bool
    n_turns: int
    n_tool_calls: int
    actions: tuple[str, ...]


def run_episode(env: gym.Env[str, str], agent: ScriptedPolicy, task_id: str) -> EpisodeResult:
    """Play one episode of `agent` on task `task_id` through the env API."""
    observation, info = env.reset(options={"task_id": task_id})
    agent.reset(observation, info)
    reset_info = info
    actions = []
    reward = 0.0
    while True:
        action = agent.act(observation, info)
        actions.append(action)
        observation, step_reward, terminated, truncated, info = env.step(action)
        reward += float(step_reward)
        if terminated or truncated:
            break
    return EpisodeResult(
        task_id=task_id,
        question_type=reset_info["question_type"],
        n_hops=reset_info["n_hops"],
        reward=reward,
        em=float(info.get("em", 0.0)),
        sub_em=float(info.get("sub_em", 0.0)),
        f1=float(info.get("f1", 0.0)),
        answered="answer" in info,
        n_turns=info["turn_idx"],
        n_tool_calls=info["n_tool_calls"],
        actions=tuple(actions),
    )


def run_agent(
    env: gym.Env[str, str],
    agent: ScriptedPolicy,
    task_ids: Sequence[str],
    *,
    progress: bool = False,
    desc: str = "episodes",
) -> list[EpisodeResult]:
    """Play one episode per task id, in order.

    Args:
        env: the env (its task set must hold every id).
        agent: the agent.
        task_ids: the questions to play.
        progress: draw a tqdm bar on stderr.
        desc: the bar's label.
    """
    return [
        run_episode(env, agent, task_id)
        for task_id in tqdm(task_ids, desc=desc, disable=not progress, leave=False)
    ]
