"""`init_model`: build (or reuse) the tiny warm-started policy of a run directory.

Steps, all seeded: generate the target world and the extra demonstration worlds; play the noisy
oracle through the env on them; train the tokenizer on those texts; warm-start a small Qwen3 on
the demonstrations, picking the checkpoint whose dev sampled EM on hard questions is closest to
the middle of the target band; evaluate it on the target world's held-out questions; write a
standard transformers directory plus `tiny_policy.json`.

Layout under `run_dir/tiny_policy/`:

- `tokenizer/`: the tokenizer and `cache.json` (its hash); reused when the hash matches;
- `policy/`: config.json, model.safetensors, tokenizer files, and `tiny_policy.json` (the
  config, its hash, the split, the warm-start log and the evaluations); reused when the
  config hash matches.

Both are written to a temporary directory first and renamed into place, so an interrupted run
never leaves a half-written cache behind.

The default recipe's warm start is also shipped with the package (`SHIPPED_DIR`): building it takes
longer than all of `make run` on 2 cores (benchmarks/RESULTS.md, "Tiny policy"). When the config
hash of the request matches the shipped record, `init_model` copies the shipped files into the run
directory instead of training; `force=True` (`tracerl init-model --force`) always rebuilds from
scratch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs import SearchQAEnv, World
from envs.tasks import QATask
from harness.policies.policy_protocol import PolicyProtocol
from harness.rollout.episodes import EpisodeCodec
from harness.rollout.evaluation import PolicyEval, evaluate_backend
from harness.tiny_policy.config import TinyPolicyConfig
from retrieval.bm25 import BM25Retriever

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "ARTIFACTS_FILE",
    "SCHEMA_VERSION",
    "SHIPPED_DIR",
    "PolicyArtifacts",
    "init_model",
    "is_hard",
    "load_artifacts",
    "unseen_questions",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ARTIFACTS_FILE = "tiny_policy.json"
_SPLITS = ("train", "dev", "test", "test_entities")
SHIPPED_DIR = Path(__file__).with_name("warm_start")
"""The default recipe's warm start, as `init_model(TinyPolicyConfig())` built it (README,
"The shipped warm start", says how)."""


def is_hard(task: QATask) -> bool:
    """The kinds RL should improve on: 3- and 4-hop bridges, comparisons, inference."""
    return task.question_type != "bridge" or (task.n_hops or 0) >= 3


@dataclass(frozen=True, kw_only=True)
class PolicyArtifacts:
    """What `init_model` produced, and everything a trainer needs to use it.

    Attributes:
        policy_dir: A standard transformers directory (model and tokenizer): load it with
            `TransformersBackend(policy_dir)`, `VLLMBackend(policy_dir)` or
            `AutoModelForCausalLM.from_pretrained(policy_dir)`.
        config: The config it was built from (world, env settings, model, warm start).
        config_hash: `config.config_hash`, the cache key.
        split: Task ids of the target world's train / dev / test / test_entities questions.
        sft: The warm start's summary: steps, wall time, throughput, parameters, the selected
            step and its dev EM, the dev curve and the loss log.
        evals: Final evaluations, by name: "heldout_greedy" and "heldout_sampled" (T=1,
            `n_samples` per question) on the target world's held-out questions (test +
            test_entities), and "unseen_sampled" on questions of a world never trained on;
            each carries its EM by question kind.
        reused: True when this call found the policy in the cache (or took the shipped one).
        shipped: True when this call copied the shipped warm start (`SHIPPED_DIR`).
    """

    policy_dir: Path
    config: TinyPolicyConfig
    config_hash: str
    split: dict[str, tuple[str, ...]]
    sft: dict[str, Any]
    evals: dict[str, PolicyEval]
    reused: bool = False
    shipped: bool = False

    @property
    def tokenizer_dir(self) -> Path:
        """The tokenizer lives beside the weights."""
        return self.policy_dir

    @property
    def env_settings(self) -> dict[str, Any]:
        """max_turns, top_k, max_doc_chars and prompt_template, as `SearchQAEnv` takes them."""
        env = self.config.env
        return {
            "max_turns": env.max_turns,
            "top_k": env.top_k,
            "max_doc_chars": env.max_doc_chars,
            "prompt_template": env.prompt_template,
        }

    def world(self) -> World:
        """The target world, regenerated from its seed and config (well under a second)."""
        return World.generate(self.config.world_seed, self.config.world)

    def make_env(self, world: World | None = None) -> SearchQAEnv:
        """A `SearchQAEnv` over every question of the target world, with the policy's settings.

        Reset it with `options={"task_id": id}` for ids from `split`.
        """
        world = world or self.world()
        return self.config.env.make_env(world.tasks, BM25Retriever.build(world.documents))

    def load_tokenizer(self) -> PreTrainedTokenizerFast:
        """The policy's tokenizer."""
        from harness.tiny_policy.tokenizer import load_tokenizer

        return load_tokenizer(self.tokenizer_dir)

    def to_json(self) -> dict[str, Any]:
        """The `tiny_policy.json` record (paths are not stored: the file sits in policy_dir)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "config": self.config.to_json(),
            "config_hash": self.config_hash,
            "split": {k: list(v) for k, v in self.split.items()},
            "sft": self.sft,
            "evals": {k: v.to_json() for k, v in self.evals.items()},
        }

    @classmethod
    def from_json(cls, record: dict[str, Any], policy_dir: Path) -> PolicyArtifacts:
        """Inverse of `to_json`.

        Raises:
            ValueError: for another schema version.
        """
        if record.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"{policy_dir / ARTIFACTS_FILE} has schema_version "
                f"{record.get('schema_version')!r}, not {SCHEMA_VERSION}; rebuild it with "
                "`tracerl init-model --force`"
            )
        return cls(
            policy_dir=policy_dir,
            config=TinyPolicyConfig.from_json(record["config"]),
            config_hash=record["config_hash"],
            split={k: tuple(v) for k, v in record["split"].items()},
            sft=record["sft"],
            evals={k: PolicyEval.from_json(v) for k, v in record["evals"].items()},
        )


def load_artifacts(run_dir: str | Path) -> PolicyArtifacts:
    """Read the policy `init_model` left in `run_dir`.

    Raises:
        FileNotFoundError: no policy there (run `tracerl init-model` first).
    """
    policy_dir = Path(run_dir) / "tiny_policy" / "policy"
    path = policy_dir / ARTIFACTS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no tiny policy at {policy_dir}; build one with `tracerl init-model --run-dir "
            f"{run_dir}`"
        )
    return PolicyArtifacts.from_json(json.loads(path.read_text()), policy_dir)


def _reuse(config: TinyPolicyConfig, policy_dir: Path) -> PolicyArtifacts | None:
    """The policy cached in `policy_dir`, else the shipped warm start, for this config hash."""
    cached = _read_cached(policy_dir, config.config_hash)
    if cached is not None:
        log.info("reusing the cached tiny policy at %s (config %s)", policy_dir, cached.config_hash)
        return cached
    if _read_record(SHIPPED_DIR, config.config_hash) is None:
        return None
    tmp = _fresh_tmp(policy_dir)
    shutil.copytree(SHIPPED_DIR, tmp, dirs_exist_ok=True)
    _replace_dir(tmp, policy_dir)
    log.info(
        "using the shipped warm start (config %s); `tracerl init-model --force` "
        "rebuilds it from scratch",
        config.config_hash,
    )
    shipped = _read_cached(policy_dir, config.config_hash)
    assert shipped is not None  # just copied, hash checked
    return dataclasses.replace(shipped, shipped=True)


def _sft_record(result: Any, chosen: Any, *, n_demos: int, n_tokens: int) -> dict[str, Any]:
    """The warm start's record in `tiny_policy.json` (`SFTResult` and the chosen checkpoint)."""
    return {
        "n_params": result.n_params,
        "n_demos": n_demos,
        "n_demo_tokens": n_tokens,
        "n_steps": result.n_steps,
        "wall_s": round(result.wall_s, 1),
        "tokens_per_s": round(result.tokens_per_s),
        "stopped_early": result.stopped_early,
        "selected_step": chosen.step,
        "selected_dev_em": chosen.dev_em,
        "selected_unseen_em": chosen.reading_em,
        "dev_curve": [
            {"step": c.step, "dev_em": c.dev_em, "unseen_em": c.reading_em}
            for c in result.checkpoints
        ],
        "log": list(result.log),
    }


def init_model(
    config: TinyPolicyConfig | None = None,
    run_dir: str | Path = "runs/demo",
    *,
    force: bool = False,
    progress: bool = False,
) -> PolicyArtifacts:
    """Build the warm-started tiny policy in `run_dir`, or reuse the one already there.

    Args:
        config: The recipe (defaults: `TinyPolicyConfig()`).
        run_dir: The run directory; the policy goes to `run_dir/tiny_policy/policy`.
        force: Rebuild from scratch, even when a policy with the same config hash is cached
            in `run_dir` or shipped with the package.
        progress: Draw progress bars (demos, warm start, evaluation) on stderr.

    Returns:
        The artifacts; `reused` says whether the cache answered, `shipped` whether the shipped
        warm start did.
    """
    config = config or TinyPolicyConfig()
    root = Path(run_dir) / "tiny_policy"
    policy_dir = root / "policy"
    if not force and (reused := _reuse(config, policy_dir)) is not None:
        return reused

    import torch

    from harness.policies.transformers_backend import TransformersBackend
    from harness.tiny_policy.demos import collect_demos, encode_demo
    from harness.tiny_policy.model import build_model, count_parameters, save_policy
    from harness.tiny_policy.sft import select_checkpoint, train_sft

    started = time.perf_counter()
    world = World.generate(config.world_seed, config.world)
    split = world.split()
    split_ids = {name: getattr(split, name).ids for name in _SPLITS}
    demos = _demonstrations(config, world, list(split.train), collect_demos, progress)
    tokenizer = _tokenizer(config, root / "tokenizer", [d.text for d in demos], force)
    codec = EpisodeCodec(tokenizer)
    encoded = [encode_demo(d, codec, lm_weight=config.sft.lm_weight) for d in demos]
    n_tokens = sum(len(e.token_ids) for e in encoded)
    model = build_model(config.model, tokenizer)
    log.info(
        "tiny policy: %s parameters, %d demonstrations (%.0f tokens each on average), "
        "up to %d steps of batch %d",
        f"{count_parameters(model):,}",
        len(encoded),
        n_tokens / len(encoded),
        config.sft.max_steps,
        config.sft.batch_size,
    )
    target_env = partial(config.env.make_env, world.tasks, BM25Retriever.build(world.documents))
    unseen, unseen_ids = unseen_questions(config, config.eval.n_unseen_questions)
    unseen_env = partial(config.env.make_env, unseen.tasks, BM25Retriever.build(unseen.documents))

    unseen_tasks = [unseen.tasks[i] for i in unseen_ids]

    def evaluate(
        m: Any,
        make_env: Callable[[], SearchQAEnv],
        tasks: Sequence[QATask],
        temperature: float,
        n: int,
    ) -> PolicyEval:
        start = time.perf_counter()
        report = evaluate_backend(
            TransformersBackend(m, tokenizer, batch_size=128),
            tokenizer,
            make_env,
            [t for t in tasks for _ in range(n)],
            name="warm start",
            max_context_tokens=config.model.max_positions,
            temperature=temperature,
            max_new_tokens=config.eval.max_action_tokens,
            seed=config.eval.seed,
            batch_size=128,
        )
        return PolicyEval.of_report(
            report, temperature=temperature, wall_s=time.perf_counter() - start
        )

    if config.eval.select_on == "target_dev":
        dev_env, dev_tasks = target_env, list(split.dev)
        n_dev = config.eval.n_dev_samples
    else:
        dev_env, dev_tasks, n_dev = unseen_env, unseen_tasks, 1
    if not dev_tasks:
        raise ValueError(
            f"no dev questions to select a checkpoint on ({config.eval.select_on}); "
            "use a larger world or --policy.eval.select-on unseen_world"
        )

    reading = unseen_tasks[: config.eval.n_reading_questions]
    result = train_sft(
        model,
        encoded,
        config.sft,
        pad_id=tokenizer.pad_token_id,
        evaluate=lambda m: evaluate(m, dev_env, dev_tasks, 1.0, n_dev).em,
        evaluate_reading=(
            (lambda m: evaluate(m, unseen_env, reading, 1.0, 1).em) if reading else None
        ),
        progress=progress,
    )
    chosen = select_checkpoint(result.checkpoints, config.sft.band)
    model.load_state_dict(chosen.state)
    model.eval()
    log.info(
        "selected warm-start step %d (dev sampled EM %.3f, unseen-world EM %s)",
        chosen.step,
        chosen.dev_em,
        chosen.reading_em,
    )

    heldout = [world.tasks[i] for i in (*split_ids["test"], *split_ids["test_entities"])]
    n = config.eval.n_samples
    evals = {
        "heldout_greedy": evaluate(model, target_env, heldout, 0.0, 1),
        "heldout_sampled": evaluate(model, target_env, heldout, 1.0, n),
        "unseen_sampled": evaluate(model, unseen_env, unseen_tasks, 1.0, n),
    }
    for name, value in evals.items():
        log.info("%s: EM %.3f %s", name, value.em, _rounded(value.em_by_kind))

    sft = _sft_record(result, chosen, n_demos=len(encoded), n_tokens=n_tokens)
    sft["n_threads"] = torch.get_num_threads()
    sft["total_wall_s"] = round(time.perf_counter() - started, 1)
    artifacts = PolicyArtifacts(
        policy_dir=policy_dir,
        config=config,
        config_hash=config.config_hash,
        split=split_ids,
        sft=sft,
        evals=evals,
    )
    tmp = _fresh_tmp(policy_dir)
    save_policy(model, tokenizer, tmp)
    (tmp / ARTIFACTS_FILE).write_text(json.dumps(artifacts.to_json(), indent=1) + "\n")
    PolicyProtocol.of(config.env, world_seed=config.world_seed, world=config.world).write(tmp)
    _replace_dir(tmp, policy_dir)
    log.info("wrote the tiny policy to %s in %.0f s", policy_dir, sft["total_wall_s"])
    return artifacts


def _read_record(policy_dir: Path, config_hash: str) -> dict[str, Any] | None:
    """The `tiny_policy.json` record in `policy_dir` if it was built from `config_hash`."""
    path = policy_dir / ARTIFACTS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        log.warning("ignoring an unreadable %s", path)
        return None
    if record.get("config_hash") != config_hash or record.get("schema_version") != SCHEMA_VERSION:
        return None
    return record


def _read_cached(policy_dir: Path, config_hash: str) -> PolicyArtifacts | None:
    record = _read_record(policy_dir, config_hash)
    if record is None:
        if (policy_dir / ARTIFACTS_FILE).is_file():
            log.info("the tiny policy at %s was built from another config: rebuilding", policy_dir)
        return None
    return dataclasses.replace(PolicyArtifacts.from_json(record, policy_dir), reused=True)


def _demonstrations(
    config: TinyPolicyConfig,
    world: World,
    train: Sequence[QATask],
    collect: Any,
    progress: bool,
) -> list[Any]:
    """Target-world training questions (noisy variants) plus every question of extra worlds."""
    from tqdm.auto import tqdm

    demos_config = config.demos
    demos = collect(
        world,
        train,
        config.env,
        epsilon=demos_config.epsilon,
        n_variants=demos_config.target_variants,
        seed=demos_config.seed,
    )
    seeds = range(
        demos_config.first_world_seed, demos_config.first_world_seed + demos_config.n_worlds
    )
    for seed in tqdm(seeds, desc="demo worlds", disable=not progress, leave=False):
        if seed in (config.world_seed, config.eval.dev_world_seed):
            raise ValueError(
                f"demo world seed {seed} is the target or dev world's: move "
                "demos.first_world_seed so that the extra worlds stay distinct"
            )
        extra = World.generate(seed, config.world)
        demos += collect(
            extra, list(extra.tasks), config.env, epsilon=demos_config.epsilon, seed=seed
        )
    return demos


def _tokenizer(
    config: TinyPolicyConfig, directory: Path, texts: Sequence[str], force: bool
) -> PreTrainedTokenizerFast:
    from harness.tiny_policy.tokenizer import load_tokenizer, train_tokenizer

    key_file = directory / "cache.json"
    if not force and key_file.is_file():
        key = json.loads(key_file.read_text()).get("tokenizer_hash")
        if key == config.tokenizer_hash:
            log.info("reusing the cached tokenizer at %s", directory)
            return load_tokenizer(directory)
    # A sample of whole episodes covers every template and plenty of invented names.
    sample = random.Random(config.demos.seed).sample(list(texts), min(len(texts), 4000))
    tokenizer = train_tokenizer(sample, vocab_size=config.vocab_size)
    tmp = _fresh_tmp(directory)
    tokenizer.save_pretrained(tmp)
    (tmp / "cache.json").write_text(json.dumps({"tokenizer_hash": config.tokenizer_hash}) + "\n")
    _replace_dir(tmp, directory)
    return load_tokenizer(directory)


def unseen_questions(config: TinyPolicyConfig, n: int) -> tuple[World, list[str]]:
    """The world never used for training (`eval.dev_world_seed`) and `n` of its question ids.

    The ids are a seeded shuffle over every kind (the world lists its questions kind by kind),
    so any `n` covers the kinds in proportion.
    """
    unseen = World.generate(config.eval.dev_world_seed, config.world)
    ids = list(unseen.tasks.ids)
    random.Random(config.eval.seed).shuffle(ids)
    return unseen, ids[:n]


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


def _fresh_tmp(directory: Path) -> Path:
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _replace_dir(tmp: Path, directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    tmp.rename(directory)
