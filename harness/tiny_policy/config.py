"""Configuration of the tiny policy: world, env, tokenizer, model, demos, warm start, evaluation.

Every field has a default chosen from measurements (docs/tiny_policy.md). The whole config is
hashed (`TinyPolicyConfig.config_hash`): a run directory holding a policy built from the same
hash is reused as is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from envs.search_qa import SearchQAConfig
from envs.synthetic.config import WorldConfig

__all__ = [
    "ENV_RECIPE_FIELDS",
    "RECIPE_VERSION",
    "DemonstrationConfig",
    "InitModelArgs",
    "ModelConfig",
    "SFTConfig",
    "TinyPolicyConfig",
    "WarmStartEvalConfig",
    "default_world_config",
    "env_record",
    "tiny_env_config",
]

RECIPE_VERSION = 2
"""Bumped when the code changes what a config builds, so old caches are not reused."""


ENV_RECIPE_FIELDS = ("max_turns", "top_k", "max_doc_chars", "prompt_template")
"""The env settings the recipe has always recorded. The other `SearchQAConfig` fields enter a
config's record (and hash) only when set away from their defaults, so the hash of a recipe
written before the env settings were one type (the shipped warm start's) is unchanged."""


def tiny_env_config() -> SearchQAConfig:
    """The env a tiny policy is trained for (and that RL must use unchanged).

    8 turns leave room for a 4-hop question, one wrong query and a re-query; 2 documents of
    240 characters keep observations short (docs/tiny_policy.md); a from-scratch policy needs
    no instructions, and every prompt token costs training time.
    """
    return SearchQAConfig(
        max_turns=8, top_k=2, max_doc_chars=240, prompt_template="Question: {question}\n"
    )


def env_record(env: SearchQAConfig) -> dict[str, Any]:
    """`env` as a recipe records it: `ENV_RECIPE_FIELDS`, plus any other field not at its default.

    >>> env_record(tiny_env_config())["max_turns"], "reward" in env_record(tiny_env_config())
    (8, False)
    >>> env_record(SearchQAConfig(reward="f1"))["reward"]
    'f1'
    """
    default = SearchQAConfig()
    return {
        f.name: getattr(env, f.name)
        for f in fields(SearchQAConfig)
        if f.name in ENV_RECIPE_FIELDS or getattr(env, f.name) != getattr(default, f.name)
    }


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the tiny Qwen3 policy.

    The default (hidden 192, 3 layers, about 1.8M parameters with a 2k vocabulary) comes from
    docs/tiny_policy.md ("The feasibility study"): at equal wall time on 2 cores it took twice
    the optimizer steps of a 3.9M model and reached a far lower loss.
    """

    hidden_size: int = 192
    n_layers: int = 3
    head_dim: int = 32
    n_kv_heads: int = 2
    """Grouped-query attention: fewer key/value heads than query heads."""
    intermediate_size: int = 576
    max_positions: int = 2048
    """Longest episode (prompt, actions and observations) in tokens."""
    seed: int = 0
    """Seeds the random initialisation."""

    def __post_init__(self) -> None:
        sizes = {
            "hidden_size": self.hidden_size,
            "n_layers": self.n_layers,
            "head_dim": self.head_dim,
            "n_kv_heads": self.n_kv_heads,
            "intermediate_size": self.intermediate_size,
            "max_positions": self.max_positions,
        }
        for name, value in sizes.items():
            if value < 1:  # 0 failed 27 s later, as a division by zero
                raise ValueError(f"{name}={value}: must be >= 1")
        if self.hidden_size % self.head_dim:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not a multiple of head_dim={self.head_dim}"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads do not split into {self.n_kv_heads} groups"
            )

    @property
    def n_heads(self) -> int:
        """Query heads."""
        return self.hidden_size // self.head_dim


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Settings of the supervised warm start (defaults: docs/tiny_policy.md)."""

    max_steps: int = 3600
    """Optimizer steps at most; the cosine schedule spans them (training stops early once the
    dev EM passes the band)."""
    batch_size: int = 16
    lr: float = 2e-3
    warmup_steps: int = 50
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lm_weight: float = 0.1
    """Loss weight on prompt and observation tokens (0 masks them out entirely)."""
    lm_sample_rate: float = 0.25
    """Share of prompt/observation positions scored per step, at weight lm_weight / rate: the
    same loss in expectation for a quarter of the output-layer compute on them."""
    eval_every: int = 150
    """Steps between dev evaluations (and kept checkpoints)."""
    eval_from: int = 1800
    """First step with a dev evaluation (earlier checkpoints are far below any useful band)."""
    band: tuple[float, float] = (0.3, 0.6)
    """Target dev sampled EM for the shipped checkpoint: RL needs both outcomes. Among the
    checkpoints in the band, the one with the best unseen-world EM is kept."""
    stop_above: float = 0.75
    """Training stops once dev sampled EM passes this (reading keeps improving past the band's
    top, so training goes on a little beyond it)."""
    max_time_s: float | None = None
    """Wall-clock cap on training (None: none). Steps are the budget; this is a safety net."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.batch_size < 1:
            raise ValueError(f"max_steps={self.max_steps}, batch_size={self.batch_size}: need >= 1")
        lo, hi = self.band
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"band={self.band}: need 0 <= low <= high <= 1")
        if self.stop_above < hi:
            raise ValueError(f"stop_above={self.stop_above} is below the band's top {hi}")
        if not 0 < self.lm_sample_rate <= 1:
            raise ValueError(f"lm_sample_rate={self.lm_sample_rate}: must be in (0, 1]")
        if self.eval_every < 1:
            raise ValueError(f"eval_every={self.eval_every}: must be >= 1")


@dataclass(frozen=True, kw_only=True)
class DemonstrationConfig:
    """Which demonstrations the warm start sees."""

    n_worlds: int = 40
    """Extra generated worlds (fresh names, same templates) whose every question is shown once:
    with them the policy learns to read names from observations instead of memorising one
    world (docs/tiny_policy.md)."""
    first_world_seed: int = 1000
    """Seeds of the extra worlds are first_world_seed, first_world_seed + 1, ..."""
    target_variants: int = 1
    """Noisy episodes per training question of the target world."""
    epsilon: float = 0.3
    """The oracle's noise rate: a wrong query before a hop, or a wrong answer (both masked)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_worlds < 0 or self.target_variants < 0:
            raise ValueError("n_worlds and target_variants must be >= 0")
        if not 0 <= self.epsilon <= 1:
            raise ValueError(f"epsilon={self.epsilon}: must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class WarmStartEvalConfig:
    """How checkpoints are picked and the result is measured."""

    select_on: Literal["target_dev", "unseen_world"] = "target_dev"
    """Dev questions for checkpoint selection: every question of the target world's dev split
    (what RL will be judged on), or questions of an unseen world (reading only: no fact of
    that world was ever trained on)."""
    n_dev_samples: int = 4
    """T=1 samples per target dev question at each checkpoint (the split is small)."""
    n_reading_questions: int = 96
    """Unseen-world questions (one T=1 sample each) scored at each checkpoint to pick the one
    that reads best (0: none)."""
    dev_world_seed: int = 999
    """The unseen world: never shown in training; reported as `unseen_sampled`."""
    n_unseen_questions: int = 160
    """Questions of the unseen world (all kinds, `n_samples` T=1 samples each)."""
    n_samples: int = 4
    """T=1 samples per held-out question in the final evaluation."""
    max_action_tokens: int = 48
    """Cap on one action's tokens (the oracle's longest is about 20)."""
    seed: int = 0


def default_world_config() -> WorldConfig:
    """The target world: one-sentence paragraphs and up to 40 questions per kind.

    One sentence per paragraph keeps observations short, the main lever on SFT steps and on
    the policy learning to copy names from what it reads (docs/tiny_policy.md); the world
    then asks 2-hop, 3-hop and 4-hop bridges and comparisons (no inference kinds: their facts
    need a second sentence), which spreads difficulty across kinds. 40 questions per kind
    give 365 questions, 79 of them held out.
    """
    return WorldConfig(sentences_per_doc=1, questions_per_kind=40)


@dataclass(frozen=True, kw_only=True)
class TinyPolicyConfig:
    """Everything `init_model` builds from; its hash names the cache."""

    world_seed: int = 0
    """The target world (the one RL trains and is evaluated on)."""
    world: WorldConfig = field(default_factory=default_world_config)
    env: SearchQAConfig = field(default_factory=tiny_env_config)
    """The env the policy is trained for; its record is `env_record`'s."""
    vocab_size: int = 2048
    """Byte-level BPE vocabulary, tags and special tokens included."""
    model: ModelConfig = field(default_factory=ModelConfig)
    demos: DemonstrationConfig = field(default_factory=DemonstrationConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: WarmStartEvalConfig = field(default_factory=WarmStartEvalConfig)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (tuples become lists; the env as `env_record` writes it)."""
        return json.loads(json.dumps({**asdict(self), "env": env_record(self.env)}))

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> TinyPolicyConfig:
        """Inverse of `to_json`."""
        world = dict(record["world"])
        world["question_kinds"] = tuple(world.get("question_kinds", ()))
        sft = dict(record["sft"])
        sft["betas"], sft["band"] = tuple(sft["betas"]), tuple(sft["band"])
        return cls(
            world_seed=record["world_seed"],
            world=WorldConfig(**world),
            env=SearchQAConfig(**record["env"]),
            vocab_size=record["vocab_size"],
            model=ModelConfig(**record["model"]),
            demos=DemonstrationConfig(**record["demos"]),
            sft=SFTConfig(**sft),
            eval=WarmStartEvalConfig(**record["eval"]),
        )

    @property
    def config_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of the config and `RECIPE_VERSION`."""
        payload = json.dumps({"recipe": RECIPE_VERSION, **self.to_json()}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def tokenizer_hash(self) -> str:
        """Hash of what the tokenizer depends on (world, env, demos, vocabulary size)."""
        record = self.to_json()
        keys = ("world_seed", "world", "env", "vocab_size", "demos")
        payload = json.dumps(
            {"recipe": RECIPE_VERSION, **{k: record[k] for k in keys}}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class InitModelArgs:
    """`tracerl init-model`: build (or reuse) the warm-started tiny policy of a run directory."""

    run_dir: Path = Path("runs/demo")
    """The policy goes to RUN_DIR/tiny_policy/policy (a standard transformers directory)."""
    force: bool = False
    """Rebuild from scratch (its time: benchmarks/RESULTS.md, "Tiny policy"), even if a policy
    built from the same config is cached there or shipped with the package."""
    progress: bool = True
    """Draw progress bars on stderr."""
    policy: TinyPolicyConfig = field(default_factory=TinyPolicyConfig)
    """The recipe; every field is part of the cache key."""
