"""The embedded default task: a seeded synthetic multi-hop world (docs/design.md §4)."""

from envs.synthetic.config import WorldConfig
from envs.synthetic.entities import Entity, EntityKind
from envs.synthetic.questions import (
    QUESTION_KINDS,
    Decomposition,
    QuestionKind,
    QuestionType,
    SubQuestion,
)
from envs.synthetic.world import World, WorldSplit

__all__ = [
    "QUESTION_KINDS",
    "Decomposition",
    "Entity",
    "EntityKind",
    "QuestionKind",
    "QuestionType",
    "SubQuestion",
    "World",
    "WorldConfig",
    "WorldSplit",
]
