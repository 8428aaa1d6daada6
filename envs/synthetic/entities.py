"""The entities of a synthetic world and the typed relations between them.

Relations, by subject kind (each names one other entity by id):

| kind       | relations                                                                  |
|------------|----------------------------------------------------------------------------|
| person     | birth_city, father, mother, spouse, employer, university, lived_in         |
| film       | director, star                                                             |
| book       | author                                                                     |
| company    | founder, hq                                                                |
| university | city                                                                       |
| city       | country                                                                    |
| country    | capital                                                                    |

`lived_in` is never asked about: it puts a second city in a person's paragraph, so that
reading, not pattern-matching "the city in the paragraph", finds the birthplace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from envs.errors import EnvConfigError
from envs.synthetic.config import WorldConfig
from envs.synthetic.dice import Dice
from envs.synthetic.names import NameMaker

__all__ = ["Entity", "EntityKind", "build_entities"]

EntityKind = Literal["person", "city", "country", "film", "book", "company", "university"]

_OCCUPATIONS = (
    "engineer", "physician", "teacher", "architect", "painter", "composer", "chemist", "lawyer",
    "journalist", "botanist", "economist", "sculptor", "pilot", "historian", "mathematician",
)  # fmt: skip
_LATEST_ROLE_BIRTH_YEAR = 1975  # directors, actors, authors and founders are adults by 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Entity:
    """One entity of a world.

    Attributes:
        entity_id: unique in the world, e.g. "person-0007".
        kind: person, city, country, film, book, company or university.
        name: the invented name; also the title of the entity's paragraph.
        year: born / released / published / founded (0 for cities and countries).
        gender: "m" or "f" for people, "" otherwise.
        occupation: people only.
        relations: (relation, entity id) pairs; see the module docstring.
    """

    entity_id: str
    kind: EntityKind
    name: str
    year: int = 0
    gender: str = ""
    occupation: str = ""
    relations: tuple[tuple[str, str], ...] = ()

    def get(self, relation: str) -> str | None:
        """The id of the entity this one relates to by `relation`, or None."""
        for rel, target in self.relations:
            if rel == relation:
                return target
        return None


@dataclass
class _Draft:
    entity_id: str
    kind: EntityKind
    name: str
    year: int = 0
    gender: str = ""
    occupation: str = ""
    relations: dict[str, str] = field(default_factory=dict)

    def freeze(self) -> Entity:
        return Entity(
            entity_id=self.entity_id,
            kind=self.kind,
            name=self.name,
            year=self.year,
            gender=self.gender,
            occupation=self.occupation,
            relations=tuple(self.relations.items()),
        )


class _Builder:
    def __init__(self, dice: Dice, config: WorldConfig, names: NameMaker) -> None:
        self.dice = dice
        self.config = config
        self.names = names
        self.drafts: dict[EntityKind, list[_Draft]] = {}

    def add(self, kind: EntityKind, name: str, **fields: object) -> _Draft:
        drafts = self.drafts.setdefault(kind, [])
        draft = _Draft(entity_id=f"{kind}-{len(drafts):04d}", kind=kind, name=name, **fields)  # type: ignore[arg-type]
        drafts.append(draft)
        return draft

    def places(self) -> None:
        cfg, d = self.config, self.dice
        countries = [self.add("country", self.names.country()) for _ in range(cfg.n_countries)]
        for i in range(cfg.n_cities):
            country = countries[i] if i < len(countries) else d.pick(countries)
            city = self.add("city", self.names.place(), relations={"country": country.entity_id})
            if i < len(countries):
                country.relations["capital"] = city.entity_id

    def person(self, gender: str, family: str, year: int) -> _Draft:
        return self.add("person", self.names.person(gender, family), year=year, gender=gender)

    def people(self) -> None:
        d, n = self.dice, self.config.n_people
        count = 0

        def room() -> bool:
            return count < n

        def marry(a: _Draft, b: _Draft) -> None:
            a.relations["spouse"], b.relations["spouse"] = b.entity_id, a.entity_id

        def child_of(father: _Draft, mother: _Draft, family: str) -> _Draft:
            child = self.person(d.pick(("m", "f")), family, father.year + d.between(22, 38))
            child.relations["father"], child.relations["mother"] = (
                father.entity_id,
                mother.entity_id,
            )
            return child

        while room():
            family = self.names.family_name()
            grandfather = self.person("m", family, d.between(1880, 1920))
            count += 1
            if not room():
                break
            grandmother = self.person(
                "f", self.names.family_name(), grandfather.year + d.between(-4, 4)
            )
            count += 1
            marry(grandfather, grandmother)
            for _ in range(d.between(1, 3)):
                if not room():
                    break
                child = child_of(grandfather, grandmother, family)
                count += 1
                if not room() or not d.chance(0.75):
                    continue
                other = "f" if child.gender == "m" else "m"
                spouse = self.person(other, self.names.family_name(), child.year + d.between(-4, 4))
                count += 1
                marry(child, spouse)
                father, mother = (child, spouse) if child.gender == "m" else (spouse, child)
                line = family if child.gender == "m" else spouse.name.split(" ", 1)[1]
                for _ in range(d.between(1, 2)):
                    if not room():
                        break
                    child_of(father, mother, line)
                    count += 1

    def works(self) -> None:
        cfg, d = self.config, self.dice
        people = self.drafts["person"]
        cities = self.drafts["city"]
        eligible = d.shuffled([p for p in people if p.year <= _LATEST_ROLE_BIRTH_YEAR])
        n_dir, n_act, n_aut = -(-cfg.n_films // 3), -(-cfg.n_films // 2), -(-cfg.n_books // 2)
        if len(eligible) < cfg.n_roles:
            raise EnvConfigError(
                f"only {len(eligible)} people are old enough for the {cfg.n_roles} roles of "
                "films, books and companies; raise WorldConfig.n_people"
            )
        directors, rest = eligible[:n_dir], eligible[n_dir:]
        actors, rest = rest[:n_act], rest[n_act:]
        authors, rest = rest[:n_aut], rest[n_aut:]
        founders = rest[: cfg.n_companies]
        for group, occupation in (
            (directors, "film director"),
            (actors, "actor"),
            (authors, "novelist"),
            (founders, "entrepreneur"),
        ):
            for person in group:
                person.occupation = (
                    occupation if occupation != "actor" or person.gender == "m" else "actress"
                )
        for person in people:
            if not person.occupation:
                person.occupation = d.pick(_OCCUPATIONS)
        for i in range(cfg.n_films):
            director, star = directors[i % len(directors)], actors[i % len(actors)]
            year = max(director.year, star.year) + d.between(25, 48)
            self.add(
                "film",
                self.names.film(),
                year=year,
                relations={"director": director.entity_id, "star": star.entity_id},
            )
        for i in range(cfg.n_books):
            author = authors[i % len(authors)]
            self.add("book", self.names.book(), year=author.year + d.between(25, 50),
                     relations={"author": author.entity_id})  # fmt: skip
        for founder in founders:
            self.add(
                "company",
                self.names.company(),
                year=founder.year + d.between(24, 45),
                relations={"founder": founder.entity_id, "hq": d.pick(cities).entity_id},
            )
        for _ in range(cfg.n_universities):
            self.add("university", self.names.university(), year=d.between(1450, 1950),
                     relations={"city": d.pick(cities).entity_id})  # fmt: skip

    def lives(self) -> None:
        d = self.dice
        cities = self.drafts["city"]
        companies = self.drafts["company"]
        universities = self.drafts["university"]
        founders = {c.relations["founder"] for c in companies}
        for person in self.drafts["person"]:
            birth = d.pick(cities)
            person.relations["birth_city"] = birth.entity_id
            if person.entity_id not in founders and d.chance(0.6):
                person.relations["employer"] = d.pick(companies).entity_id
            if d.chance(0.6):
                person.relations["university"] = d.pick(universities).entity_id
            if d.chance(0.5):
                person.relations["lived_in"] = d.pick(
                    [c for c in cities if c is not birth]
                ).entity_id


def build_entities(dice: Dice, config: WorldConfig, names: NameMaker) -> tuple[Entity, ...]:
    """Draw every entity and relation of a world.

    Args:
        dice: the random source.
        config: sizes.
        names: the world's name maker (shared with the distractor writer, so names stay unique).

    Raises:
        EnvConfigError: the config leaves too few adults for the roles it needs.
    """
    builder = _Builder(dice, config, names)
    builder.places()
    builder.people()
    builder.works()
    builder.lives()
    order: tuple[EntityKind, ...] = (
        "country",
        "city",
        "person",
        "film",
        "book",
        "company",
        "university",
    )
    return tuple(draft.freeze() for kind in order for draft in builder.drafts.get(kind, []))
