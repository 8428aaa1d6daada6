"""Fakes and builders shared by the OpenRLHF-integration tests (not a test module)."""

from __future__ import annotations

import random
import re

from harness.openrlhf.experience import experiences_from_leaves
from trace_alloc import Prompt, Rollout, RolloutTree, Turn, tree_advantages

PROMPT = (1, 2, 3)


def turn(actions, observations=(), logprobs=None, finish="stop"):
    return Turn(
        action_text="a",
        action_token_ids=tuple(actions),
        action_logprobs=tuple(-0.1 * (i + 1) for i in range(len(actions)))
        if logprobs is None
        else tuple(logprobs),
        observation_token_ids=tuple(observations),
        info={"finish_reason": finish},
    )


def small_tree() -> RolloutTree:
    """Root rollout (search, answer) rewarded 1, a fork after the search rewarded 0, and a
    second root rollout rewarded 0."""
    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q?", token_ids=PROMPT))
    tree.add_rollout(
        0, Rollout(turns=(turn((10, 11), (20, 21, 22)), turn((12, 13))), reward=1.0)
    )  # nodes 1, 2
    tree.add_rollout(1, Rollout(turns=(turn((14,), finish="length"),), reward=0.0))  # node 3
    tree.add_rollout(0, Rollout(turns=(turn((15, 16)),), reward=0.0))  # node 4
    return tree


def convert(trees, mode="tree_grpo", max_len=64):
    leaves = tree_advantages(trees, mode)
    exps = experiences_from_leaves(
        trees,
        leaves,
        max_len=max_len,
        prompts=[f"p{i}" for i in range(len(trees))],
        labels=[f"l{i}" for i in range(len(trees))],
    )
    return leaves, exps


# --- a RolloutRayActor-shaped engine --------------------------------------------------------


def vllm_output(token_ids, text, *, logprobs, finish_reason, stop_reason):
    """A real `vllm.RequestOutput` with one completion, as `RolloutRayActor.generate` returns."""
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    completion = CompletionOutput(
        index=0,
        text=text,
        token_ids=list(token_ids),
        cumulative_logprob=float(sum(logprobs)),
        logprobs=[{t: Logprob(logprob=lp)} for t, lp in zip(token_ids, logprobs, strict=True)],
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return RequestOutput(
        request_id="fake",
        prompt=None,
        prompt_token_ids=None,
        prompt_logprobs=None,
        outputs=[completion],
        finished=True,
    )


class EchoPolicy:
    """Answers any prefix with up to 3 pseudo-random tokens drawn from the request's seed.

    Text is the ids joined by spaces, then "</answer>" (a stop string) or "<eos>" (the model's
    end token), per `ending`; `ending="abort"` aborts every request.
    """

    def __init__(self, ending: str = "stop") -> None:
        self.ending = ending

    def __call__(self, prompt_token_ids, sampling_params):
        rng = random.Random(sampling_params.seed)
        n = min(3, sampling_params.max_tokens)
        ids = [rng.randrange(10, 60) for _ in range(n)]
        text = " ".join(map(str, ids))
        if n < 3:
            finish, stop = "length", None
        elif self.ending == "eos":
            finish, stop, text = "stop", None, text + "<eos>"
        elif self.ending == "abort":
            finish, stop = "abort", None
        else:
            finish, stop, text = "stop", "</answer>", text + "</answer>"
        logprobs = [-0.5 * (i + 1) for i in range(n)]
        return vllm_output(ids, text, logprobs=logprobs, finish_reason=finish, stop_reason=stop)


class SlowPolicy(EchoPolicy):
    """`EchoPolicy` that first blocks its engine for `delay_s` (a hung engine)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def __call__(self, prompt_token_ids, sampling_params):
        import time

        time.sleep(self.delay_s)
        return super().__call__(prompt_token_ids, sampling_params)


class ScriptedSearchPolicy:
    """A Search-R1 agent over the toy world, on a real tokenizer.

    Turn 1 searches the question's company, turn 2 the founder it read, turn 3 answers the
    city it read, or, with probability `p_wrong` (from the request's seed), a wrong city.
    """

    def __init__(self, tokenizer_dir: str, p_wrong: float = 0.5) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.p_wrong = p_wrong
        self._tokenizer = None

    def action(self, text: str, wrong: bool) -> str:
        seen = text.count("<information>")
        last = text.rsplit("<information>", 1)[-1]  # the latest search results, best first
        if seen == 0:
            company = re.findall(r"founder of (\w+)", text)[-1]
            return f"<search> {company} </search>"
        if seen == 1:
            founders = re.findall(r"founded by ([A-Z]\w+ [A-Z]\w+)", last)
            return f"<search> {founders[0] if founders else 'nobody'} </search>"
        cities = re.findall(r"born in (\w+)", last)
        city = "Paris" if wrong or not cities else cities[0]
        return f"<answer> {city} </answer>"

    def __call__(self, prompt_token_ids, sampling_params):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        text = self._tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        wrong = random.Random(sampling_params.seed).random() < self.p_wrong
        action = self.action(text, wrong)
        ids = self._tokenizer.encode(action, add_special_tokens=False)
        finish, stop = "stop", action.split()[-1]
        if len(ids) > sampling_params.max_tokens:
            ids, finish, stop = ids[: sampling_params.max_tokens], "length", None
            action = self._tokenizer.decode(ids)
        logprobs = [-0.1] * len(ids)
        return vllm_output(ids, action, logprobs=logprobs, finish_reason=finish, stop_reason=stop)


class FakeEngine:
    """`RolloutRayActor`-shaped: `async generate(prompt_token_ids, sampling_params)` returns a
    `vllm.RequestOutput`. Its policy is swappable, so one pair of Ray workers (slow to start:
    each imports vLLM) serves every test. Records every prompt."""

    def __init__(self) -> None:
        self.policy = EchoPolicy()
        self.prompts: list[list[int]] = []
        self.n_prefix_cache_resets = 0

    def set_policy(self, policy) -> None:
        self.policy = policy

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        self.prompts.append(list(prompt_token_ids))
        return self.policy(prompt_token_ids, sampling_params)

    def seen(self) -> list[list[int]]:
        return self.prompts


class HungEngine:
    """A `RolloutRayActor`-shaped engine that has stopped answering: `generate` and `sleep`
    never return (`wake_up`, sent before the hang, still does). Records the calls it got."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def wake_up(self, tags=None):
        self.calls.append("wake_up")

    async def sleep(self, level: int = 1):
        import asyncio

        self.calls.append("sleep")
        await asyncio.Event().wait()

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        import asyncio

        self.calls.append("generate")
        await asyncio.Event().wait()

    def seen(self) -> list[str]:
        return list(self.calls)
