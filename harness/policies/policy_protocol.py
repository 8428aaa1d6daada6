"""A policy's protocol: the environment it was trained in, written beside its weights.

Whatever writes a policy (the warm start, `tracerl train`, the demo) writes `policy_protocol.json`
into the policy folder; `tracerl bench` and the OpenRLHF launcher read it and play that
environment unless a flag overrides a field (docs/decisions.md, "A policy carries its protocol").

The file (`schema_version` 1):

- `protocol`: "trace-rl" or "search-r1". It fixes both the action format (`<search>`/`<answer>`
  tags, parsed by `envs.protocol`) and the observation text (`<information>` blocks);
- `prompt_template`, `top_k`, `max_turns`, `max_doc_chars`: the `SearchQAEnv` settings;
- `world_seed` and `world` (a `WorldConfig` as JSON): the synthetic world trained on, or null.

A folder without the file but with a `tiny_policy.json` (a warm start written before the file
existed) is read from that record. A folder with neither (a Search-R1 checkpoint, any hub model)
has no protocol: the caller keeps its own defaults.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.protocol import PROTOCOLS, Protocol
from envs.search_qa import SearchQAConfig
from envs.synthetic.config import WorldConfig

__all__ = [
    "ENV_FIELDS",
    "PROTOCOL_FILE",
    "PolicyProtocol",
    "PolicyProtocolError",
    "env_fields",
    "read_policy_protocol",
]

PROTOCOL_FILE = "policy_protocol.json"
SCHEMA_VERSION = 1
_TINY_POLICY_RECORD = "tiny_policy.json"  # harness.tiny_policy.pipeline.ARTIFACTS_FILE
ENV_FIELDS = ("protocol", "prompt_template", "top_k", "max_turns", "max_doc_chars")
"""The fields a `SearchQAEnv` takes, in the order differences are listed."""


def env_fields(env: SearchQAConfig) -> dict[str, Any]:
    """The settings of `env` a policy is trained for (`ENV_FIELDS`), by name."""
    return {name: getattr(env, name) for name in ENV_FIELDS}


class PolicyProtocolError(ValueError):
    """A `policy_protocol.json` that cannot be read (names the file)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyProtocol:
    """The environment a policy was trained in."""

    protocol: Protocol = "trace-rl"
    prompt_template: str
    top_k: int
    max_turns: int
    max_doc_chars: int
    world_seed: int | None = None
    world: WorldConfig | None = None

    @classmethod
    def of(
        cls, env: SearchQAConfig, *, world_seed: int | None, world: WorldConfig | None
    ) -> PolicyProtocol:
        """The protocol of a policy trained in `env` (and in `world`, if synthetic)."""
        return cls(**env_fields(env), world_seed=world_seed, world=world)

    def env_kwargs(self) -> dict[str, Any]:
        """The `SearchQAEnv` keyword arguments."""
        return {name: getattr(self, name) for name in ENV_FIELDS}

    def differences(self, played: dict[str, Any]) -> list[str]:
        """`name: policy X, played Y` for each env setting (or world field) `played` changes.

        `played` holds env settings by `ENV_FIELDS` name and, optionally, `world` (a
        `WorldConfig`); a key it lacks is not compared.
        """
        out = [
            f"{name}: policy {getattr(self, name)!r}, played {played[name]!r}"
            for name in ENV_FIELDS
            if name in played and played[name] != getattr(self, name)
        ]
        world = played.get("world")
        if self.world is not None and world is not None:
            out += [
                f"world.{f.name}: policy {getattr(self.world, f.name)!r}, "
                f"played {getattr(world, f.name)!r}"
                for f in dataclasses.fields(WorldConfig)
                if getattr(self.world, f.name) != getattr(world, f.name)
            ]
        return out

    def to_json(self) -> dict[str, Any]:
        """The file's record."""
        record = {"schema_version": SCHEMA_VERSION, **self.env_kwargs()}
        record["world_seed"] = self.world_seed
        record["world"] = None if self.world is None else _world_json(self.world)
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> PolicyProtocol:
        """Inverse of `to_json` (`ValueError`, `KeyError`, `TypeError` on a bad record)."""
        if record.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {record.get('schema_version')!r}, not 1")
        protocol = record["protocol"]
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r}: not one of {PROTOCOLS}")
        world = record.get("world")
        return cls(
            protocol=protocol,
            prompt_template=str(record["prompt_template"]),
            top_k=int(record["top_k"]),
            max_turns=int(record["max_turns"]),
            max_doc_chars=int(record["max_doc_chars"]),
            world_seed=None if record.get("world_seed") is None else int(record["world_seed"]),
            world=None if world is None else _world_from_json(world),
        )

    def write(self, policy_dir: str | Path) -> Path:
        """Write `policy_protocol.json` into `policy_dir` (atomically); returns its path."""
        path = Path(policy_dir) / PROTOCOL_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def read_policy_protocol(policy_dir: str | Path) -> PolicyProtocol | None:
    """The protocol `policy_dir` carries, or None (a folder without one, e.g. Search-R1's).

    Raises:
        PolicyProtocolError: the file is there but unreadable (names it and why).
    """
    folder = Path(policy_dir)
    path = folder / PROTOCOL_FILE
    try:
        if path.is_file():
            return PolicyProtocol.from_json(json.loads(path.read_text(encoding="utf-8")))
        legacy = folder / _TINY_POLICY_RECORD
        if legacy.is_file():
            path = legacy
            config = json.loads(legacy.read_text(encoding="utf-8"))["config"]
            return PolicyProtocol(
                **config["env"],
                world_seed=int(config["world_seed"]),
                world=_world_from_json(config["world"]),
            )
    except (ValueError, KeyError, TypeError) as err:
        raise PolicyProtocolError(
            f"{path}: not a policy protocol ({type(err).__name__}: {err})"
        ) from None
    return None


def _world_json(world: WorldConfig) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(world).items()}


def _world_from_json(record: dict[str, Any]) -> WorldConfig:
    fixed: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return WorldConfig(**fixed)
