"""Question kinds of a synthetic world, with gold answers and decompositions.

Three families, as in HotpotQA, 2WikiMultihopQA and MuSiQue:

- **bridge** (2 to 4 hops): follow a chain of relations from a named entity ("In which country
  was the director of The Burning Thorn born?": film → director → birth city → country);
- **comparison** (2 hops): look up one year for each of two entities and compare ("Who was born
  first, A or B?");
- **inference** (2 hops): compose family and work relations into one the corpus never states
  ("Who is the paternal grandfather of A?": father of the father).

Each question has a `Decomposition`: one `SubQuestion` per hop with the search query an expert
would issue (the subject's name plus a relation word), the intermediate answer and the
document that states it. Questions are only asked about facts some paragraph states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from envs.synthetic.dice import Dice
from envs.synthetic.entities import Entity, EntityKind
from envs.tasks import Paragraph, QATask
from retrieval.base import Document

__all__ = [
    "QUESTION_KINDS",
    "Decomposition",
    "QuestionKind",
    "QuestionType",
    "SubQuestion",
    "make_questions",
]

QuestionType = Literal["bridge", "comparison", "inference"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuestionKind:
    """A template family of questions.

    Attributes:
        name: the kind's id, e.g. "film_director_birthplace".
        question_type: "bridge", "comparison" or "inference".
        subject_kind: the kind of the named entity (both entities for a comparison).
        path: relations followed from the subject; ("year",) for a comparison.
        templates: question phrasings, with {0} (and {1} for comparisons).
    """

    name: str
    question_type: QuestionType
    subject_kind: EntityKind
    path: tuple[str, ...]
    templates: tuple[str, ...]

    @property
    def n_hops(self) -> int:
        """Reasoning hops: the chain length, or 2 for a comparison (one lookup per entity)."""
        return 2 if self.question_type == "comparison" else len(self.path)


def _kind(
    name: str, qtype: QuestionType, subject: EntityKind, path: str, *templates: str
) -> QuestionKind:
    return QuestionKind(
        name=name,
        question_type=qtype,
        subject_kind=subject,
        path=tuple(path.split()),
        templates=templates,
    )


QUESTION_KINDS: dict[str, QuestionKind] = {
    k.name: k
    for k in (
        _kind("film_director_birthplace", "bridge", "film", "director birth_city",
              "Where was the director of {0} born?", "In which city was the director of {0} born?"),
        _kind("film_star_birthplace", "bridge", "film", "star birth_city",
              "Where was the star of {0} born?", "In which city was the lead actor of {0} born?"),
        _kind("book_author_birthplace", "bridge", "book", "author birth_city",
              "Where was the author of {0} born?", "In which city was the author of {0} born?"),
        _kind("person_birth_country", "bridge", "person", "birth_city country",
              "In which country was {0} born?", "What country was {0} born in?"),
        _kind("city_country_capital", "bridge", "city", "country capital",
              "What is the capital of the country where {0} is located?",
              "Which city is the capital of the country that {0} is in?"),
        _kind("company_founder_university", "bridge", "company", "founder university",
              "Which university did the founder of {0} attend?",
              "Where did the founder of {0} study?"),
        _kind("university_country", "bridge", "university", "city country",
              "In which country is {0} located?", "Which country is {0} in?"),
        _kind("film_director_birth_country", "bridge", "film", "director birth_city country",
              "In which country was the director of {0} born?",
              "What is the country of birth of the director of {0}?"),
        _kind("book_author_birth_country", "bridge", "book", "author birth_city country",
              "In which country was the author of {0} born?",
              "What is the country of birth of the author of {0}?"),
        _kind("company_hq_capital", "bridge", "company", "hq country capital",
              "What is the capital of the country where {0} has its headquarters?",
              "Which city is the capital of the country in which {0} is headquartered?"),
        _kind("film_director_birth_capital", "bridge", "film",
              "director birth_city country capital",
              "What is the capital of the country where the director of {0} was born?"),
        _kind("book_author_university_country", "bridge", "book",
              "author university city country",
              "In which country is the university attended by the author of {0}?"),
        _kind("people_born_first", "comparison", "person", "year",
              "Who was born first, {0} or {1}?", "Which of {0} and {1} was born earlier?"),
        _kind("films_released_first", "comparison", "film", "year",
              "Which film came out first, {0} or {1}?", "Which film is older, {0} or {1}?"),
        _kind("companies_founded_first", "comparison", "company", "year",
              "Which company was founded first, {0} or {1}?",
              "Which company is older, {0} or {1}?"),
        _kind("paternal_grandfather", "inference", "person", "father father",
              "Who is the paternal grandfather of {0}?"),
        _kind("spouse_employer", "inference", "person", "spouse employer",
              "Which company does the spouse of {0} work for?",
              "Who is the employer of the spouse of {0}?"),
        _kind("father_in_law", "inference", "person", "spouse father",
              "Who is the father-in-law of {0}?"),
    )
}  # fmt: skip
"""Every question kind, by name."""

_KEYWORDS = {
    "director": "director",
    "star": "star",
    "author": "author",
    "birth_city": "born",
    "country": "country",
    "capital": "capital",
    "founder": "founder",
    "university": "studied",
    "hq": "headquarters",
    "city": "located",
    "father": "father",
    "spouse": "married",
    "employer": "works for",
}
_YEAR_KEYWORDS = {"person": "born", "film": "released", "book": "published", "company": "founded"}


@dataclass(frozen=True, slots=True, kw_only=True)
class SubQuestion:
    """One hop of a decomposition.

    Attributes:
        subject: the name the hop starts from.
        subject_id: its entity id.
        relation: the relation followed ("year" for a comparison's lookup).
        query: the search query an expert issues for this hop.
        answer: the intermediate answer (a name, or a year for a comparison).
        answer_id: the answer's entity id ("" for a year).
        doc_id: the document that states the fact.
    """

    subject: str
    subject_id: str
    relation: str
    query: str
    answer: str
    answer_id: str
    doc_id: str

    def to_json(self) -> dict[str, str]:
        """A JSON-safe dict."""
        return {
            "subject": self.subject,
            "subject_id": self.subject_id,
            "relation": self.relation,
            "query": self.query,
            "answer": self.answer,
            "answer_id": self.answer_id,
            "doc_id": self.doc_id,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Decomposition:
    """How a question is answered: its hops, in order, and the final answer."""

    kind: str
    steps: tuple[SubQuestion, ...]
    answer: str
    answer_id: str

    @property
    def subject_id(self) -> str:
        """The entity the question is about (the first named one)."""
        return self.steps[0].subject_id

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "kind": self.kind,
            "steps": [s.to_json() for s in self.steps],
            "answer": self.answer,
            "answer_id": self.answer_id,
        }


class _Asker:
    def __init__(
        self,
        entities: Sequence[Entity],
        documents: Sequence[Document],
        facts: Mapping[tuple[str, str], str],
    ) -> None:
        self.by_id = {e.entity_id: e for e in entities}
        self.by_kind: dict[str, list[Entity]] = {}
        for e in entities:
            self.by_kind.setdefault(e.kind, []).append(e)
        self.docs = {d.doc_id: d for d in documents}
        self.facts = facts

    def hop(self, subject: Entity, relation: str) -> SubQuestion | None:
        doc_id = self.facts.get((subject.entity_id, relation))
        if doc_id is None:
            return None
        if relation == "year":
            keyword = _YEAR_KEYWORDS[subject.kind]
            answer, answer_id = str(subject.year), ""
        else:
            target = subject.get(relation)
            if target is None:
                return None
            keyword = _KEYWORDS[relation]
            answer, answer_id = self.by_id[target].name, target
        return SubQuestion(
            subject=subject.name,
            subject_id=subject.entity_id,
            relation=relation,
            query=f"{subject.name} {keyword}",
            answer=answer,
            answer_id=answer_id,
            doc_id=doc_id,
        )

    def chain(self, kind: QuestionKind, subject: Entity) -> Decomposition | None:
        steps = []
        seen = {subject.entity_id}
        node = subject
        for relation in kind.path:
            step = self.hop(node, relation)
            if step is None or step.answer_id in seen:
                return None  # unstated fact, or a cycle (a capital asked about itself)
            seen.add(step.answer_id)
            steps.append(step)
            node = self.by_id[step.answer_id]
        return Decomposition(
            kind=kind.name, steps=tuple(steps), answer=node.name, answer_id=node.entity_id
        )

    def comparison(self, kind: QuestionKind, a: Entity, b: Entity) -> Decomposition | None:
        if a.year == b.year:
            return None
        step_a, step_b = self.hop(a, "year"), self.hop(b, "year")
        if step_a is None or step_b is None:
            return None
        first = a if a.year < b.year else b
        return Decomposition(
            kind=kind.name, steps=(step_a, step_b), answer=first.name, answer_id=first.entity_id
        )

    def task(
        self, kind: QuestionKind, decomposition: Decomposition, question: str, index: int
    ) -> QATask:
        doc_ids = tuple(dict.fromkeys(step.doc_id for step in decomposition.steps))
        return QATask(
            task_id=f"{kind.name}-{index:03d}",
            question=question,
            golden_answers=(decomposition.answer,),
            question_type=kind.question_type,
            n_hops=kind.n_hops,
            supporting_doc_ids=doc_ids,
            paragraphs=tuple(
                Paragraph(
                    title=self.docs[d].title, text=self.docs[d].text, is_supporting=True, doc_id=d
                )
                for d in doc_ids
            ),
            dataset="synthetic",
        )


def make_questions(
    kinds: Sequence[QuestionKind],
    entities: Sequence[Entity],
    documents: Sequence[Document],
    facts: Mapping[tuple[str, str], str],
    dice: Dice,
    *,
    per_kind: int,
) -> list[tuple[QATask, Decomposition]]:
    """Ask up to `per_kind` questions of each kind, about stated facts only.

    Returns:
        (task, decomposition) pairs, kind by kind; task ids are "<kind>-<nnn>".
    """
    asker = _Asker(entities, documents, facts)
    out: list[tuple[QATask, Decomposition]] = []
    for kind in kinds:
        kd = dice.spawn(kind.name)
        subjects = kd.shuffled(asker.by_kind.get(kind.subject_kind, []))
        found: list[tuple[str, Decomposition]] = []
        if kind.question_type == "comparison":
            for a, b in zip(subjects[0::2], subjects[1::2], strict=False):
                decomposition = asker.comparison(kind, a, b)
                if decomposition is not None:
                    found.append((kd.pick(kind.templates).format(a.name, b.name), decomposition))
                if len(found) == per_kind:
                    break
        else:
            for subject in subjects:
                decomposition = asker.chain(kind, subject)
                if decomposition is not None:
                    found.append((kd.pick(kind.templates).format(subject.name), decomposition))
                if len(found) == per_kind:
                    break
        for i, (question, decomposition) in enumerate(found):
            out.append((asker.task(kind, decomposition, question, i), decomposition))
    return out
