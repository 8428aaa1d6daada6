"""`WorldConfig`: the size and difficulty knobs of a synthetic world."""

from __future__ import annotations

from dataclasses import dataclass

from envs.errors import EnvConfigError

__all__ = ["WorldConfig"]


@dataclass(frozen=True, kw_only=True)
class WorldConfig:
    """How big and how hard a synthetic world is.

    The defaults build a world of about 300 entity paragraphs, 30 distractors and 400 questions
    in a fraction of a second.
    """

    n_countries: int = 8
    """Countries; each gets a capital among the cities."""
    n_cities: int = 32
    """Cities (at least two per country, so that not every city is a capital)."""
    n_people: int = 160
    """People, in three-generation families (parents, spouses, children)."""
    n_films: int = 40
    """Films, each with a director and a lead actor."""
    n_books: int = 30
    """Novels, each with an author."""
    n_companies: int = 20
    """Companies, each with a founder and a headquarters city."""
    n_universities: int = 10
    """Universities, each in a city."""
    n_distractors: int = 30
    """Extra paragraphs (festivals, prizes, conferences, ships) that mention the world's names
    in other roles."""
    sentences_per_doc: int = 4
    """At most this many sentences per entity paragraph. The first sentence merges the key
    facts; 1 gives the short observations a tiny policy needs. Facts that do not fit are not
    stated, and no question asks about them."""
    name_similarity: float = 0.0
    """Probability that a new place, company or family name is a one-syllable variant of an
    existing one (look-alike names)."""
    max_hops: int = 4
    """Only ask questions of at most this many hops (2 to 4)."""
    question_kinds: tuple[str, ...] = ()
    """Only these question kinds (see `envs.synthetic.QUESTION_KINDS`); empty means all."""
    questions_per_kind: int = 25
    """At most this many questions of each kind."""

    def __post_init__(self) -> None:
        for name in (
            "n_countries", "n_cities", "n_people", "n_films", "n_books", "n_companies",
            "n_universities", "sentences_per_doc", "questions_per_kind",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise EnvConfigError(f"WorldConfig.{name}={getattr(self, name)}: must be >= 1")
        if self.n_distractors < 0:
            raise EnvConfigError(f"WorldConfig.n_distractors={self.n_distractors}: must be >= 0")
        if self.n_countries < 2:
            raise EnvConfigError(f"WorldConfig.n_countries={self.n_countries}: must be >= 2")
        if self.n_cities < 2 * self.n_countries:
            raise EnvConfigError(
                f"WorldConfig.n_cities={self.n_cities}: need at least two per country "
                f"({2 * self.n_countries}), so that not every city is a capital"
            )
        if not 0.0 <= self.name_similarity <= 0.9:
            raise EnvConfigError(
                f"WorldConfig.name_similarity={self.name_similarity}: must be in [0, 0.9]"
            )
        if not 2 <= self.max_hops <= 4:
            raise EnvConfigError(f"WorldConfig.max_hops={self.max_hops}: must be 2, 3 or 4")
        if self.n_people < 2 * self.n_roles:
            raise EnvConfigError(
                f"WorldConfig.n_people={self.n_people}: the films, books and companies need "
                f"{self.n_roles} directors, actors, authors and founders; use at least "
                f"{2 * self.n_roles} people (only adults can hold a role)"
            )

    @property
    def n_roles(self) -> int:
        """People needed as directors, lead actors, authors and founders."""
        return (
            -(-self.n_films // 3) + -(-self.n_films // 2) + -(-self.n_books // 2) + self.n_companies
        )
