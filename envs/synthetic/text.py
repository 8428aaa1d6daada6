"""Wikipedia-like paragraphs for a world's entities, plus distractor paragraphs.

Each entity gets one paragraph titled with its name. Its first sentence merges the key facts
("The Burning Thorn is a 1987 film directed by Maththaer Tedailbeirk and starring ..."); later
sentences add family, work, study and a second city (a distractor). Every sentence picks one
of several templates, so the same relation reads differently across paragraphs.

`render_documents` also returns where each fact is stated, `(entity id, relation) -> doc id`,
where relation "year" is the entity's year. Questions are asked only about stated facts, so
capping `sentences_per_doc` removes questions instead of making them unanswerable.

Distractor paragraphs (festivals, prizes, conferences, ships) mention the world's people,
works and places in other roles, and state no fact that a question asks about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from envs.synthetic.config import WorldConfig
from envs.synthetic.dice import Dice
from envs.synthetic.entities import Entity
from envs.synthetic.names import NameMaker
from retrieval.base import Document

__all__ = ["render_documents"]

Facts = dict[tuple[str, str], str]


@dataclass(frozen=True, slots=True)
class _Sentence:
    text: str
    facts: tuple[str, ...]  # relations of the paragraph's entity that the sentence states


def _join(names: Sequence[str]) -> str:
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


class _Writer:
    def __init__(self, entities: Sequence[Entity], dice: Dice) -> None:
        self.by_id: Mapping[str, Entity] = {e.entity_id: e for e in entities}
        self.dice = dice
        self.works: dict[str, list[tuple[str, Entity]]] = {}  # person id -> (role, work)
        for e in entities:
            for rel in ("director", "star", "author", "founder"):
                target = e.get(rel)
                if target is not None:
                    self.works.setdefault(target, []).append((rel, e))

    def name(self, entity_id: str) -> str:
        return self.by_id[entity_id].name

    def pick(self, templates: Sequence[str], **values: object) -> str:
        return self.dice.pick(templates).format(**values)

    def person(self, p: Entity) -> list[_Sentence]:
        he, his = ("he", "his") if p.gender == "m" else ("she", "her")
        He, His = he.capitalize(), his.capitalize()
        child = "son" if p.gender == "m" else "daughter"
        city = self.name(p.get("birth_city") or "")
        occ = p.occupation
        article = "an" if occ[0] in "aeiou" else "a"
        out = [
            _Sentence(
                self.pick(
                    (
                        "{n} (born {y} in {c}) is {a} {o}.",
                        "{n} is {a} {o} who was born in {c} in {y}.",
                        "Born in {c} in {y}, {n} became {a} {o}.",
                        "{n} was born in {y} in {c} and worked as {a} {o}.",
                    ),
                    n=p.name,
                    y=p.year,
                    c=city,
                    a=article,
                    o=occ,
                ),
                ("birth_city", "year"),
            )
        ]
        father, mother = p.get("father"), p.get("mother")
        if father and mother:
            out.append(
                _Sentence(
                    self.pick(
                        (
                            "{H} father is {f} and {h} mother is {m}.",
                            "{P} is the {ch} of {f} and his wife {m}.",
                        ),
                        H=His,
                        h=his,
                        P=He,
                        ch=child,
                        f=self.name(father),
                        m=self.name(mother),
                    ),
                    ("father", "mother"),
                )
            )
        spouse, employer = p.get("spouse"), p.get("employer")
        if spouse and employer:
            s, co = self.name(spouse), self.name(employer)
            text = self.pick(
                (
                    "{P} is married to {s} and works for {co}.",
                    "{P} works for {co} and is married to {s}.",
                    "{A} {o} at {co}, {p} is married to {s}.",
                ),
                P=He, p=he, s=s, co=co, A=article.capitalize(), o=occ,
            )  # fmt: skip
            out.append(_Sentence(text, ("spouse", "employer")))
        elif spouse:
            text = self.pick(
                ("{P} is married to {s}.", "{P} married {s}."), P=He, s=self.name(spouse)
            )
            out.append(_Sentence(text, ("spouse",)))
        elif employer:
            text = self.pick(
                ("{P} works for {co}.", "{P} is employed by {co}."), P=He, co=self.name(employer)
            )
            out.append(_Sentence(text, ("employer",)))
        university, lived = p.get("university"), p.get("lived_in")
        if university and lived:
            text = self.pick(
                (
                    "{P} studied at {u} and later lived in {c}.",
                    "After studying at {u}, {p} moved to {c}.",
                ),
                P=He, p=he, u=self.name(university), c=self.name(lived),
            )  # fmt: skip
            out.append(_Sentence(text, ("university",)))
        elif university:
            text = self.pick(
                ("{P} studied at {u}.", "{P} is a graduate of {u}."), P=He, u=self.name(university)
            )
            out.append(_Sentence(text, ("university",)))
        elif lived:
            out.append(_Sentence(f"{He} later lived in {self.name(lived)}.", ()))
        works = self.works.get(p.entity_id, [])
        if works:
            verb = {
                "director": "directed",
                "star": "starred in",
                "author": "wrote",
                "founder": "founded",
            }
            role = works[0][0]
            titles = [w.name for r, w in works if r == role]
            out.append(_Sentence(f"{He} {verb[role]} {_join(titles)}.", ()))
        return out

    def film(self, f: Entity) -> list[_Sentence]:
        d, s = self.name(f.get("director") or ""), self.name(f.get("star") or "")
        key = self.pick(
            (
                "{t} is a {y} film directed by {d} and starring {s}.",
                "{t} is a film released in {y}, directed by {d}, with {s} in the lead role.",
                "Directed by {d}, {t} ({y}) stars {s}.",
            ),
            t=f.name, y=f.year, d=d, s=s,
        )  # fmt: skip
        cities = self.dice.sample(self._cities(), 2)
        extra = f"It was filmed in {cities[0]} and premiered in {cities[1]}."
        return [_Sentence(key, ("director", "star", "year")), _Sentence(extra, ())]

    def book(self, b: Entity) -> list[_Sentence]:
        a = self.name(b.get("author") or "")
        key = self.pick(
            (
                "{t} is a {y} novel by {a}.",
                "{t} is a novel written by {a} and published in {y}.",
                "Published in {y}, {t} is a novel by {a}.",
            ),
            t=b.name, y=b.year, a=a,
        )  # fmt: skip
        extra = f"The story is set in {self.dice.pick(self._cities())}."
        return [_Sentence(key, ("author", "year")), _Sentence(extra, ())]

    def company(self, c: Entity) -> list[_Sentence]:
        founder, hq = self.name(c.get("founder") or ""), self.name(c.get("hq") or "")
        key = self.pick(
            (
                "{n} is a company founded by {f} in {y}, headquartered in {h}.",
                "Founded in {y} by {f}, {n} has its headquarters in {h}.",
                "{n} was founded in {y} by {f}; its headquarters are in {h}.",
            ),
            n=c.name, f=founder, y=c.year, h=hq,
        )  # fmt: skip
        others = [x for x in self._cities() if x != hq]
        offices = self.dice.sample(others, 2)
        return [
            _Sentence(key, ("founder", "hq", "year")),
            _Sentence(f"It has offices in {offices[0]} and {offices[1]}.", ()),
        ]

    def university(self, u: Entity) -> list[_Sentence]:
        city = self.name(u.get("city") or "")
        key = self.pick(
            (
                "{n} is a university in {c}, founded in {y}.",
                "Founded in {y}, {n} is located in {c}.",
                "{n} was established in {y} in the city of {c}.",
            ),
            n=u.name, c=city, y=u.year,
        )  # fmt: skip
        return [_Sentence(key, ("city", "year"))]

    def city(self, c: Entity) -> list[_Sentence]:
        country = self.by_id[c.get("country") or ""]
        key = self.pick(
            (
                "{c} is a city in {k}.",
                "{c} is a town in the country of {k}.",
                "The city of {c} lies in {k}.",
            ),
            c=c.name, k=country.name,
        )  # fmt: skip
        out = [_Sentence(key, ("country",))]
        if country.get("capital") == c.entity_id:
            out.append(_Sentence(f"It is the capital of {country.name}.", ()))
        return out

    def country(self, k: Entity) -> list[_Sentence]:
        capital = self.name(k.get("capital") or "")
        key = self.pick(
            (
                "{k} is a country whose capital is {c}.",
                "The capital of {k} is {c}.",
                "{k} is a country with {c} as its capital.",
            ),
            k=k.name, c=capital,
        )  # fmt: skip
        others = [
            e.name
            for e in self.by_id.values()
            if e.get("country") == k.entity_id and e.name != capital
        ]
        out = [_Sentence(key, ("capital",))]
        if others:
            out.append(_Sentence(f"Other cities in {k.name} include {_join(others[:3])}.", ()))
        return out

    def _cities(self) -> list[str]:
        return [e.name for e in self.by_id.values() if e.kind == "city"]


def _distractors(writer: _Writer, n: int, names: NameMaker) -> list[tuple[str, str]]:
    """(title, text) of `n` paragraphs that mention names in other roles."""
    d = writer.dice
    by_kind: dict[str, list[Entity]] = {}
    for e in writer.by_id.values():
        by_kind.setdefault(e.kind, []).append(e)
    people, cities = by_kind["person"], by_kind["city"]
    out: list[tuple[str, str]] = []
    for i in range(n):
        kind = i % 4
        year = d.between(1950, 2020)
        if kind == 0:
            film = d.pick(by_kind["film"])
            director = film.get("director")
            host, juror = d.sample([p for p in people if p.entity_id != director], 2)
            stem = names.event()
            title = f"{year} {stem} Film Festival"
            text = (
                f"The {year} {stem} Film Festival was held in {d.pick(cities).name}. {host.name} "
                f"presented {film.name}, and {juror.name} chaired the jury."
            )
        elif kind == 1:
            book = d.pick(by_kind["book"])
            author = book.get("author")
            translator = d.pick([p for p in people if p.entity_id != author])
            stem = names.event()
            title = f"{stem} Prize"
            text = (
                f"The {stem} Prize was awarded in {year} to {translator.name} for a translation "
                f"of {book.name}. The ceremony took place in {d.pick(cities).name}."
            )
        elif kind == 2:
            university = d.pick(by_kind["university"])
            speakers = d.sample(people, 3)
            stem = names.event()
            title = f"{year} {stem} Conference"
            text = (
                f"The {year} {stem} Conference took place at {university.name} in "
                f"{writer.name(university.get('city') or '')}. Speakers included "
                f"{_join([p.name for p in speakers])}."
            )
        else:
            city = d.pick(cities)
            company = d.pick(by_kind["company"])
            built = d.pick([c for c in cities if c is not city])
            title = f"{city.name} (ship)"
            if any(t == title for t, _ in out):
                title = f"{city.name} ({year} ship)"
            text = (
                f"The {city.name} was a cargo ship built in {year} in {built.name} and named after "
                f"the city of {city.name}. It was owned by {company.name}."
            )
        out.append((title, text))
    return out


def render_documents(
    entities: Sequence[Entity], dice: Dice, config: WorldConfig, names: NameMaker
) -> tuple[list[Document], Facts]:
    """Write one paragraph per entity and `config.n_distractors` distractors.

    Returns:
        The documents (entity paragraphs first, in entity order; ids "doc-00000", ...), and
        where each fact is stated: `(entity id, relation) -> doc id` ("year" for the year).
    """
    writer = _Writer(entities, dice)
    documents: list[Document] = []
    facts: Facts = {}
    for entity in entities:
        doc_id = f"doc-{len(documents):05d}"
        sentences = getattr(writer, entity.kind)(entity)[: config.sentences_per_doc]
        for sentence in sentences:
            for relation in sentence.facts:
                facts[(entity.entity_id, relation)] = doc_id
        text = " ".join(s.text for s in sentences)
        documents.append(Document(doc_id=doc_id, title=entity.name, text=text))
    for title, text in _distractors(writer, config.n_distractors, names):
        documents.append(Document(doc_id=f"doc-{len(documents):05d}", title=title, text=text))
    return documents, facts
