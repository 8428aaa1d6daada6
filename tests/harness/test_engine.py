"""The tree-rollout engine: forks continue from the anchor's exact tokens and env state, the
budget the driver meters is what the engine generated, and loss masks cover actions only.

Most tests use a scripted token-level policy (a fake `PolicyBackend` over a character
tokenizer), so every expected token is known; the last ones run the tiny random transformer.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import numpy as np
import pytest

from envs import QATask, SearchQAEnv, TaskSet
from harness.policies import Completion, PolicyBackend, SamplingParams, TransformersBackend
from harness.rollout.engine import RolloutError, TreeRolloutEngine
from harness.rollout.episodes import EpisodeCodec
from retrieval.base import Document, Hit
from trace_alloc import BudgetLimit, RolloutRequest, RolloutTree, make_allocator, tree_advantages
from trace_alloc.tree import forest_stats

# --- fakes ------------------------------------------------------------------------------------


class CharTokenizer:
    """One token per character (id = code point + 3); 1 is bos."""

    bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) + 3 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 3) for i in ids if i >= 3)


class WordRetriever:
    """Ranks documents by shared words; deterministic."""

    index_id = "words-1"

    def __init__(self, documents: Sequence[Document]) -> None:
        self.documents = list(documents)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        out = []
        for query in queries:
            words = set(re.findall(r"\w+", query.lower()))
            scored = sorted(
                (
                    (-len(words & set(re.findall(r"\w+", f"{d.title} {d.text}".lower()))), i, d)
                    for i, d in enumerate(self.documents)
                ),
                key=lambda t: (t[0], t[1]),
            )
            out.append(
                [
                    Hit(doc_id=d.doc_id, title=d.title, text=d.text, score=-s)
                    for s, _, d in scored[:k]
                ]
            )
        return out


DOCS = [
    Document(doc_id="d1", title="Acme", text="Acme was founded by Ann Vole."),
    Document(doc_id="d2", title="Ann Vole", text="Ann Vole was born in Lyon."),
    Document(doc_id="d3", title="Bolt", text="Bolt was founded by Bo Li."),
    Document(doc_id="d4", title="Bo Li", text="Bo Li was born in Oslo."),
]
TASKS = TaskSet(
    [
        QATask(
            task_id="acme", question="Where was the founder of Acme born?", golden_answers=("Lyon",)
        ),
        QATask(
            task_id="bolt", question="Where was the founder of Bolt born?", golden_answers=("Oslo",)
        ),
        QATask(
            task_id="hard", question="Where was the founder of Zed born?", golden_answers=("Rome",)
        ),
    ]
)


TEMPLATE = "Question: {question}\n"


class ScriptedPolicy:
    """Searches the question's company, then its founder, then answers the last city it read.

    With probability `p_wrong` (drawn per prefix from the call's seed) a turn searches or
    answers something wrong, so groups get mixed outcomes. Records every prefix it is given.
    """

    def __init__(self, tokenizer: CharTokenizer, p_wrong: float = 0.4) -> None:
        self.tokenizer = tokenizer
        self.p_wrong = p_wrong
        self.calls: list[list[tuple[int, ...]]] = []

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        self.calls.append([tuple(p) for p in prefixes])
        rng = np.random.default_rng(sampling.seed)
        out = []
        for prefix in prefixes:
            wrong = rng.random() < self.p_wrong
            text = self.tokenizer.decode(prefix)
            action = self._act(text, wrong)
            ids = tuple(self.tokenizer.encode(action))
            out.append(
                Completion(
                    token_ids=ids,
                    text=action,
                    logprobs=tuple(-0.5 for _ in ids),
                    finish_reason="stop",
                )
            )
        return out

    @staticmethod
    def _act(text: str, wrong: bool) -> str:
        n_info = text.count("<information>")
        if n_info == 0:
            company = re.search(r"founder of (\w+)", text).group(1)
            return f"<search> {'Nothing' if wrong else company} founder </search>"
        if n_info == 1:
            founder = re.findall(r"founded by ([\w ]+?)\.", text)
            return f"<search> {founder[-1] if founder and not wrong else 'Nobody'} born </search>"
        cities = re.findall(r"born in (\w+)", text)
        return f"<answer> {'Paris' if wrong or not cities else cities[-1]} </answer>"


class FixedPredictor:
    """p = 0.5 everywhere; counts updates."""

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        return np.full(len(histories), 0.5)

    def update(self, histories: Sequence[str], targets: np.ndarray) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def make_engine(
    p_wrong: float = 0.4,
    *,
    max_total_tokens: int | None = None,
    seed: int = 0,
    retriever=None,
    batch_tool_calls: bool = True,
    latency=None,
    lockstep: bool | None = None,
):
    """The scripted policy's engine; with `latency`, behind `ConcurrentScripted`."""
    tokenizer = CharTokenizer()
    if latency is None:
        policy = ScriptedPolicy(tokenizer, p_wrong)
    else:
        policy = ConcurrentScripted(tokenizer, p_wrong, latency)
    retriever = WordRetriever(DOCS) if retriever is None else retriever
    env = SearchQAEnv(TASKS, retriever, max_turns=4, top_k=1, prompt_template=TEMPLATE)
    engine = TreeRolloutEngine(
        policy,
        env,
        EpisodeCodec(tokenizer),
        sampling=SamplingParams(max_new_tokens=40),
        max_total_tokens=max_total_tokens,
        seed=seed,
        batch_tool_calls=batch_tool_calls,
        lockstep=lockstep,
    )
    return engine, policy, tokenizer


def path_tokens(tree: RolloutTree, node_id: int) -> list[int]:
    """Prompt, then every action and observation on the path to `node_id`."""
    ids = list(tree.prompt_token_ids)
    for nid in tree.path(node_id)[1:]:
        turn = tree.nodes[nid].turn
        ids += [*turn.action_token_ids, *turn.observation_token_ids]
    return ids


# --- the Executor contract ---------------------------------------------------------------------


def test_engine_is_a_policy_backend_client_and_returns_n_rollouts_per_request():
    engine, policy, _ = make_engine()
    assert isinstance(policy, PolicyBackend)
    prompts = engine.start(["acme", "bolt"])
    trees = [RolloutTree.from_prompt(p) for p in prompts]
    out = engine(
        trees,
        [
            RolloutRequest(tree_index=0, node_id=0, n=3),
            RolloutRequest(tree_index=1, node_id=0, n=2),
        ],
    )
    assert [len(group) for group in out] == [3, 2]
    # one generate call per turn, each batched across both prompts' episodes
    assert len(policy.calls[0]) == 5
    for rollout in out[0]:
        assert rollout.turns[-1].info["end"] in ("answer", "max_turns")
        assert rollout.reward in (0.0, 1.0)
    # the trees were not touched
    assert all(len(t.nodes) == 1 for t in trees)


def test_prompt_tokens_are_bos_plus_the_env_prompt_and_roots_are_parked():
    engine, _, tokenizer = make_engine()
    (prompt,) = engine.start(["acme"])
    env_prompt = SearchQAEnv(TASKS, WordRetriever(DOCS), prompt_template=TEMPLATE).reset(
        options={"task_id": "acme"}
    )[0]
    assert list(prompt.token_ids) == [1, *tokenizer.encode(env_prompt)]
    assert prompt.text == "Where was the founder of Acme born?"
    assert prompt.snapshot_id is not None and engine.n_parked == 1


def test_a_rollouts_tokens_are_exactly_what_the_policy_saw_and_generated():
    engine, policy, tokenizer = make_engine(p_wrong=0.0)
    prompts = engine.start(["acme"])
    tree = RolloutTree.from_prompt(prompts[0])
    (rollouts,) = engine(trees=[tree], requests=[RolloutRequest(tree_index=0, node_id=0, n=1)])
    leaf = tree.add_rollout(0, rollouts[0])
    assert tree.nodes[leaf].reward == 1.0  # the scripted policy answers Lyon
    # every generate call saw the path so far, token for token
    for depth, call in enumerate(policy.calls, start=0):
        node = tree.path(leaf)[depth]
        assert list(call[0]) == path_tokens(tree, node)
    # observations were encoded once from the env's text, never re-tokenised from a decode
    search = tree.nodes[1].turn
    assert search.observation_text.startswith("\n<information>")
    assert list(search.observation_token_ids) == tokenizer.encode(search.observation_text)
    assert [tree.nodes[n].turn.n_tool_calls for n in tree.path(leaf)[1:]] == [1, 1, 0]


# --- forks -------------------------------------------------------------------------------------


def test_a_continuation_starts_from_the_anchors_exact_prefix_and_env_state():
    engine, policy, _ = make_engine(p_wrong=0.0)
    prompts = engine.start(["acme"])
    tree = RolloutTree.from_prompt(prompts[0])
    (root_runs,) = engine([tree], [RolloutRequest(tree_index=0, node_id=0, n=1)])
    tree.add_rollout(0, root_runs[0])
    anchor = 1  # after the first search
    n_calls = len(policy.calls)
    (forks,) = engine([tree], [RolloutRequest(tree_index=0, node_id=anchor, n=3)])
    first_call = policy.calls[n_calls]
    assert len(first_call) == 3
    assert all(list(prefix) == path_tokens(tree, anchor) for prefix in first_call)
    for rollout in forks:
        leaf = tree.add_rollout(anchor, rollout)
        # the env went on from turn 1 (its search history came along): two more turns, answer
        assert [tree.nodes[n].turn.info["turn_idx"] for n in tree.path(leaf)[1:]] == [1, 2, 3]
        assert tree.nodes[leaf].reward == 1.0
        # the forked leaf's full sequence begins with the anchor's path, token for token
        seq = [t for seg in tree.segments(leaf) for t in seg.token_ids]
        assert seq[: len(path_tokens(tree, anchor))] == path_tokens(tree, anchor)


def test_turn_snapshots_are_parked_for_non_final_turns_only():
    engine, _, _ = make_engine(p_wrong=0.0)
    prompts = engine.start(["acme"])
    tree = RolloutTree.from_prompt(prompts[0])
    (runs,) = engine([tree], [RolloutRequest(tree_index=0, node_id=0, n=2)])
    for r in runs:
        tree.add_rollout(0, r)
    for node in tree.nodes[1:]:
        if node.is_leaf:
            assert node.turn.snapshot_id is None
        else:
            parked = engine.parked(node.turn.snapshot_id)
            assert parked.token_ids == path_tokens(tree, node.node_id)
            assert not parked.done


def test_an_unknown_anchor_is_a_typed_error_and_the_store_is_per_step():
    engine, _, _ = make_engine()
    prompts = engine.start(["acme"])
    tree = RolloutTree.from_prompt(prompts[0])
    engine.start(["bolt"])  # a new step clears the old store
    with pytest.raises(RolloutError, match="no parked episode"):
        engine([tree], [RolloutRequest(tree_index=0, node_id=0, n=1)])
    with pytest.raises(RolloutError, match="duplicate"):
        engine.start(["acme", "acme"])


def test_an_episode_that_runs_out_of_context_ends_as_an_unanswered_leaf():
    engine, _, _ = make_engine(p_wrong=0.0, max_total_tokens=220)
    prompts = engine.start(["acme"])
    tree = RolloutTree.from_prompt(prompts[0])
    (runs,) = engine([tree], [RolloutRequest(tree_index=0, node_id=0, n=1)])
    last = runs[0].turns[-1]
    assert last.info["end"] == "context" and runs[0].reward == 0.0
    with pytest.raises(RolloutError, match="no room"):
        make_engine(max_total_tokens=60)[0].start(["acme"])


# --- with the driver: budget and masks ----------------------------------------------------------


def test_trace_spends_an_exact_leaf_budget_with_prefix_forks_and_meters_three_currencies():
    engine, _, _ = make_engine(p_wrong=0.4, seed=3)
    result = _trace_step(engine)
    assert result.spent.n_leaves == 18 and result.carry == 0
    assert sum(t.n_leaves for t in result.trees) == 18
    stats = forest_stats(result.trees)
    assert stats.n_prefix_anchors > 0
    assert {w.stage for w in result.waves} >= {"roots", "prefixes"}
    # the driver's token meter is exactly what the policy generated
    assert result.spent.n_tokens == engine.stats.n_generated_tokens
    searches = sum(
        n.turn.info["action_kind"] == "search" for t in result.trees for n in t.nodes[1:]
    )
    assert result.spent.n_tool_calls == searches
    assert engine.n_parked == 0  # the store is cleared after the step


def test_token_budget_carries_the_overshoot_into_the_next_step():
    engine, _, _ = make_engine(p_wrong=0.4)
    budget = BudgetLimit(currency="tokens", per_step=400)
    rng = np.random.default_rng(0)
    first = engine.run_step(
        make_allocator("uniform", group_size=2),
        ["acme", "bolt", "hard"],
        budget=budget,
        rng=rng,
        tokens_per_leaf=100.0,
    )
    assert first.spent.n_tokens >= 400 - first.tokens_per_leaf
    assert first.carry == first.spent.n_tokens - 400
    second = engine.run_step(
        make_allocator("uniform", group_size=2),
        ["acme", "bolt", "hard"],
        budget=budget,
        rng=rng,
        carry=first.carry,
        tokens_per_leaf=first.tokens_per_leaf,
    )
    total = first.spent.n_tokens + second.spent.n_tokens
    assert total - 2 * 400 == second.carry  # aggregate equal budget, up to the last carry


def test_advantage_tokens_mask_everything_but_actions():
    engine, _, tokenizer = make_engine(p_wrong=0.5, seed=1)
    result = engine.run_step(
        make_allocator("trace", continuations_per_rollout=1, explore_frac=0.0),
        ["acme", "bolt"],
        budget=BudgetLimit(currency="leaves", per_step=8),
        rng=np.random.default_rng(1),
        predictor=FixedPredictor(),
    )
    trees = [result.trees[i] for i in result.train_indices]
    for adv in tree_advantages(trees, "tree_grpo"):
        tok = adv.to_tokens(trees[adv.tree_index])
        text_on = tokenizer.decode(tok.token_ids[tok.action_mask].tolist())
        text_off = tokenizer.decode(tok.token_ids[~tok.action_mask].tolist())
        assert "<information>" not in text_on and "Question" not in text_on
        assert text_on.count("</search>") + text_on.count("</answer>") >= 1
        assert np.all(tok.advantages[~tok.action_mask] == 0)
        assert np.all(tok.logprobs[tok.action_mask] == -0.5)
        assert "Where was the founder" in text_off


def test_same_seed_same_trees():
    def run():
        engine, _, _ = make_engine(p_wrong=0.4, seed=7)
        result = engine.run_step(
            make_allocator("trace", continuations_per_rollout=1, explore_frac=0.0),
            ["acme", "bolt", "hard"],
            budget=BudgetLimit(currency="leaves", per_step=12),
            rng=np.random.default_rng(2),
            predictor=FixedPredictor(),
        )
        return [t.to_json() for t in result.trees]

    assert run() == run()


# --- batched tool calls and faults -------------------------------------------------------------


class CountingRetriever(WordRetriever):
    """Records the query lists it is called with; fails on queries holding `fail_on`."""

    def __init__(self, documents, fail_on: str | None = None) -> None:
        super().__init__(documents)
        self.calls: list[list[str]] = []
        self.fail_on = fail_on

    def search(self, queries, k):
        self.calls.append(list(queries))
        if self.fail_on is not None and any(self.fail_on in q for q in queries):
            from retrieval.errors import RetrievalError

            raise RetrievalError("the server is gone (after its retries)")
        return super().search(queries, k)


def _trace_step(engine, per_step: int = 18):
    return engine.run_step(
        # two roots per prompt at least (not the default four), so 18 leaves open all three;
        # forks in every tree, settled or not (the flip floor has its own tests in trace_alloc)
        make_allocator(
            "trace",
            continuations_per_rollout=2,
            explore_frac=0.0,
            min_per_prompt=2,
            min_flip_prob=0.0,
            prefix_prior=None,
        ),
        ["acme", "bolt", "hard"],
        budget=BudgetLimit(currency="leaves", per_step=per_step),
        rng=np.random.default_rng(0),
        predictor=FixedPredictor(),
    )


def test_a_turns_searches_go_in_one_batched_call_and_change_no_tree():
    from retrieval.cache import CachedRetriever

    inner = CountingRetriever(DOCS)
    batched, policy, _ = make_engine(seed=3, retriever=CachedRetriever(inner))
    result = _trace_step(batched)
    serial_inner = CountingRetriever(DOCS)
    serial, _, _ = make_engine(
        seed=3, retriever=CachedRetriever(serial_inner), batch_tool_calls=False
    )
    reference = _trace_step(serial)
    # the fork law and the exact budget hold either way: the same trees, the same spend
    assert [t.to_json() for t in result.trees] == [t.to_json() for t in reference.trees]
    assert result.spent == reference.spent and result.spent.n_leaves == 18
    # one retrieval request per generate call that had searches, however many episodes searched
    assert len(inner.calls) <= len(policy.calls) < len(serial_inner.calls)
    assert max(len(c) for c in inner.calls) > 1
    assert all(len(c) == 1 for c in serial_inner.calls)


def test_a_retrieval_failure_ends_that_episode_as_failed_and_the_step_goes_on():
    from harness.training.metrics_log import rollout_metrics
    from retrieval.cache import CachedRetriever

    # every search for Bolt fails, batched or alone: those episodes fail, the others finish
    retriever = CachedRetriever(CountingRetriever(DOCS, fail_on="bolt"))
    engine, _, _ = make_engine(p_wrong=0.0, seed=3, retriever=retriever)
    result = _trace_step(engine)
    assert result.spent.n_leaves == 18  # the budget is still spent exactly
    by_prompt = {t.prompt_id: t for t in result.trees}
    ends = {
        pid: {t.nodes[leaf].turn.info["end"] for leaf in t.leaves()}
        for pid, t in by_prompt.items()
        if t.n_leaves
    }
    assert ends["bolt"] == {"failed"}
    assert "failed" not in ends["acme"]
    assert all(by_prompt["bolt"].nodes[leaf].reward == 0.0 for leaf in by_prompt["bolt"].leaves())
    assert rollout_metrics(result)["rollout/failed_episodes"] == by_prompt["bolt"].n_leaves > 0


# --- without lockstep: a backend that runs requests concurrently -------------------------------


class ConcurrentScripted(ScriptedPolicy):
    """`ScriptedPolicy` behind `submit`/`wait`, on a virtual clock (a `ConcurrentPolicyBackend`).

    A request takes `latency(company, turn)` ticks (1 unless listed); `wait` moves the clock
    to the first finish among the handles and returns every request finished by then.
    `generate` (the lockstep path) takes as long as the slowest prefix of its batch. `finished`
    logs (tick, company, turn) per completed action.
    """

    timeout_s = None

    def __init__(self, tokenizer: CharTokenizer, p_wrong: float, latency) -> None:
        super().__init__(tokenizer, p_wrong)
        self.latency = latency
        self.now = 0
        self.finished: list[tuple[int, str, int]] = []
        self._due: dict[int, tuple[int, Completion, tuple[str, int]]] = {}
        self._handles = itertools.count()

    def _key(self, prefix: Sequence[int]) -> tuple[str, int]:
        text = self.tokenizer.decode(prefix)
        return re.search(r"founder of (\w+)", text).group(1), text.count("<information>")

    def generate(self, prefixes, sampling):
        self.now += max(self.latency(*self._key(p)) for p in prefixes)
        self.finished += [(self.now, *self._key(p)) for p in prefixes]
        return super().generate(prefixes, sampling)

    def submit(self, prefixes, sampling):
        completions = super().generate(prefixes, sampling)
        handles = []
        for prefix, completion in zip(prefixes, completions, strict=True):
            handles.append(next(self._handles))
            due = self.now + self.latency(*self._key(prefix))
            self._due[handles[-1]] = (due, completion, self._key(prefix))
        return handles

    def wait(self, handles):
        self.now = max(self.now, min(self._due[h][0] for h in handles))
        done = [h for h in handles if self._due[h][0] <= self.now]
        out = []
        for h in done:
            _, completion, key = self._due.pop(h)
            self.finished.append((self.now, *key))
            out.append((h, completion))
        return out


def test_without_lockstep_a_slow_action_holds_up_only_its_own_episode():
    # Acme's first action and Bolt's last take 10 ticks, every other action 1
    slow = {("Acme", 0): 10, ("Bolt", 2): 10}
    ticks = {}
    for lockstep in (True, None):
        engine, policy, _ = make_engine(
            0.0, latency=lambda c, t: slow.get((c, t), 1), lockstep=lockstep
        )
        prompts = engine.start(["acme", "bolt"])
        trees = [RolloutTree.from_prompt(p) for p in prompts]
        requests = [RolloutRequest(tree_index=i, node_id=0, n=1) for i in range(2)]
        runs = engine(trees, requests)
        assert [r[0].reward for r in runs] == [1.0, 1.0]  # both answered right, 3 turns each
        assert [len(r[0].turns) for r in runs] == [3, 3]
        ticks[lockstep] = policy.now
        order = [(company, turn) for _, company, turn in policy.finished]
    assert engine.lockstep is False  # the default with a concurrent backend
    # concurrent: Bolt played two turns while Acme's first action was being generated
    assert order.index(("Bolt", 1)) < order.index(("Acme", 0))
    # lockstep waits for the slowest action of every turn: 10 + 1 + 10; concurrent: 10 + 1 + 1
    assert ticks == {True: 21, None: 12}


def test_without_lockstep_trace_keeps_the_exact_budget_and_the_fork_law():
    # latencies that differ by prefix, so episodes finish in an order unlike their turn order
    engine, policy, _ = make_engine(
        0.4, seed=3, latency=lambda company, turn: 1 + (len(company) * 7 + turn * 3) % 5
    )
    result = _trace_step(engine)
    assert engine.lockstep is False
    assert result.spent.n_leaves == 18 and result.carry == 0
    assert sum(t.n_leaves for t in result.trees) == 18
    assert forest_stats(result.trees).n_prefix_anchors > 0
    assert result.spent.n_tokens == engine.stats.n_generated_tokens
    seen = {prefix for call in policy.calls for prefix in call}
    for tree in result.trees:
        for leaf in tree.leaves():
            path = tree.path(leaf)
            for depth, node in enumerate(path[1:]):
                # every action was generated from exactly its path's tokens, and the env went
                # on from its parent's state (the turn index counts the path)
                assert tuple(path_tokens(tree, path[depth])) in seen
                assert tree.nodes[node].turn.info["turn_idx"] == depth + 1
    assert engine.n_parked == 0


def test_lockstep_off_needs_a_concurrent_backend():
    with pytest.raises(ValueError, match="lockstep=False needs a backend"):
        make_engine(lockstep=False)
    assert make_engine()[0].lockstep is True
    assert make_engine(latency=lambda c, t: 1, lockstep=True)[0].lockstep is True


# --- the tiny random transformer ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    from harness.tiny_policy.model import ModelConfig, build_model
    from harness.tiny_policy.tokenizer import train_tokenizer

    texts = [d.title + " " + d.text for d in DOCS] * 10 + [t.question for t in TASKS] * 10
    tokenizer = train_tokenizer(texts, vocab_size=300)
    model = build_model(
        ModelConfig(hidden_size=32, n_layers=1, head_dim=16, n_kv_heads=1, intermediate_size=64),
        tokenizer,
    ).eval()
    return tokenizer, model


class Recording:
    """Wraps a backend and records the prefixes of every call."""

    def __init__(self, inner: PolicyBackend) -> None:
        self.inner = inner
        self.calls: list[list[tuple[int, ...]]] = []

    def generate(self, prefixes, sampling):
        self.calls.append([tuple(p) for p in prefixes])
        return self.inner.generate(prefixes, sampling)


def test_tiny_model_forks_continue_from_the_anchor_prefix(tiny):
    tokenizer, model = tiny
    backend = Recording(TransformersBackend(model, tokenizer))
    env = SearchQAEnv(
        TASKS, WordRetriever(DOCS), max_turns=3, top_k=1, prompt_template="Q: {question}\n"
    )
    engine = TreeRolloutEngine(
        backend, env, EpisodeCodec(tokenizer), sampling=SamplingParams(max_new_tokens=12), seed=0
    )
    prompts = engine.start(["acme", "bolt"])
    trees = [RolloutTree.from_prompt(p) for p in prompts]
    out = engine(
        trees,
        [
            RolloutRequest(tree_index=0, node_id=0, n=2),
            RolloutRequest(tree_index=1, node_id=0, n=1),
        ],
    )
    for tree, group in zip(trees, out, strict=True):
        for rollout in group:
            tree.add_rollout(0, rollout)
    # a random model mostly emits invalid actions: episodes run to the turn limit
    anchor = next(n.node_id for n in trees[0].nodes[1:] if not n.is_leaf)
    before = len(backend.calls)
    (forks,) = engine(trees, [RolloutRequest(tree_index=0, node_id=anchor, n=2)])
    assert all(list(p) == path_tokens(trees[0], anchor) for p in backend.calls[before])
    for rollout in forks:
        leaf = trees[0].add_rollout(anchor, rollout)
        for turn in rollout.turns:
            assert len(turn.action_logprobs) == len(turn.action_token_ids)
            assert all(lp <= 0 for lp in turn.action_logprobs)
        adv = next(a for a in tree_advantages(trees, "grpo") if a.leaf_id == leaf)
        tok = adv.to_tokens(trees[0])
        n_actions = sum(
            len(trees[0].nodes[n].turn.action_token_ids) for n in trees[0].path(leaf)[1:]
        )
        assert int(tok.action_mask.sum()) == n_actions


def test_tiny_model_run_step_meters_what_the_backend_generated(tiny):
    tokenizer, model = tiny
    env = SearchQAEnv(
        TASKS, WordRetriever(DOCS), max_turns=3, top_k=1, prompt_template="Q: {question}\n"
    )
    engine = TreeRolloutEngine(
        TransformersBackend(model, tokenizer),
        env,
        EpisodeCodec(tokenizer),
        sampling=SamplingParams(max_new_tokens=8),
        seed=0,
    )
    result = engine.run_step(
        make_allocator("random_tree", roots_per_prompt=2, expansions_per_iteration=1),
        ["acme", "bolt", "hard"],
        budget=BudgetLimit(currency="leaves", per_step=12),
        rng=np.random.default_rng(0),
    )
    assert result.spent.n_leaves == 12
    assert result.spent.n_tokens == engine.stats.n_generated_tokens > 0
    assert result.spent.n_tool_calls == sum(
        n.turn.info["action_kind"] == "search" for t in result.trees for n in t.nodes[1:]
    )


def test_failed_leaves_are_left_out_of_training_and_counted():
    from harness.rollout.engine import failed_leaves, leaves_to_train
    from retrieval.cache import CachedRetriever

    # wrong first searches ("Nothing founder") hit a retriever fault: those episodes fail,
    # next to leaves of the same prompts that finished (right or wrong)
    retriever = CachedRetriever(CountingRetriever(DOCS, fail_on="nothing"))
    engine, _, _ = make_engine(p_wrong=0.4, seed=3, retriever=retriever)
    trees = _trace_step(engine, per_step=24).trees
    failed = [failed_leaves(t) for t in trees]
    assert sum(map(len, failed)) > 0
    assert any(f and len(f) < t.n_leaves for f, t in zip(failed, trees, strict=True))
    leaves, n_excluded = leaves_to_train(trees, "tree_grpo")
    assert n_excluded == sum(map(len, failed))
    assert leaves and all(a.leaf_id not in failed[a.tree_index] for a in leaves)
    # the trained leaves' advantages are those of the trees as if the failures never happened
    reference = tree_advantages(trees, "tree_grpo", exclude=failed)
    by_leaf = {(a.tree_index, a.leaf_id): a.advantages.tolist() for a in reference}
    assert all(a.advantages.tolist() == by_leaf[(a.tree_index, a.leaf_id)] for a in leaves)
