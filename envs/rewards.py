"""Answer scoring with the SQuAD / Search-R1 / FlashRAG normalisation, and the env's rewards.

Only the generated answer is scored: `extract_answer` reads the first action of the policy's
own text, so the example `<answer> Beijing </answer>` in the prompt can never be scored (Search-R1's
`extract_solution` scores the prompt and response together and needs two answer tags for that
reason; see docs/design.md §2).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from envs.protocol import parse_action
from envs.tasks import as_gold_answers

__all__ = [
    "AnswerScores",
    "RewardKind",
    "exact_match",
    "extract_answer",
    "format_reward",
    "normalize_answer",
    "reward_for_answer",
    "score_answer",
    "sub_exact_match",
    "token_f1",
]

RewardKind = Literal["em", "f1", "f1_threshold", "format"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# FlashRAG's F1 rule: a yes/no/noanswer on either side scores only an exact agreement
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop a/an/the, collapse whitespace (SQuAD order).

    >>> normalize_answer("  The  Eiffel-Tower! ")
    'eiffeltower'
    >>> normalize_answer("An Apple a day")
    'apple day'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


Golds = str | Sequence[str]
"""Gold answers: a sequence of aliases, or one answer as a bare string (never split)."""


def _normalized(golden_answers: Golds) -> list[str]:
    return [normalize_answer(g) for g in as_gold_answers(golden_answers)]


def _exact(pred: str, golds: Sequence[str]) -> float:
    return float(pred in golds)


def _sub_exact(pred: str, golds: Sequence[str]) -> float:
    # an empty gold ("The") matches only an empty prediction, so sub-EM is never below EM
    return float(any(gold in pred if gold else not pred for gold in golds))


def _f1(pred: str, golds: Sequence[str]) -> float:
    pred_tokens = pred.split()
    best = 0.0
    for gold in golds:
        if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
            continue
        gold_tokens = gold.split()
        n_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if n_same == 0:
            continue
        precision, recall = n_same / len(pred_tokens), n_same / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(prediction: str, golden_answers: Golds) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0.

    >>> exact_match("the Beatles", ["Beatles", "The Fab Four"])
    1.0
    >>> exact_match("Beatles band", ["Beatles"])
    0.0
    >>> exact_match("Paris", "Paris"), exact_match("P", "Paris")  # a string is one answer
    (1.0, 0.0)
    """
    return _exact(normalize_answer(prediction), _normalized(golden_answers))


def sub_exact_match(prediction: str, golden_answers: Golds) -> float:
    """1.0 if any normalised gold answer occurs inside the normalised prediction, else 0.0.

    A gold answer that normalises to "" (e.g. "The") matches only a prediction that normalises
    to "" too (as EM does), unlike FlashRAG's, where it would match every prediction. So
    sub-EM is never below EM.

    >>> sub_exact_match("it was the Beatles band", ["Beatles"])
    1.0
    >>> sub_exact_match("The The", "The"), sub_exact_match("anything", "The")
    (1.0, 0.0)
    >>> sub_exact_match("Beatles", ["The Beatles band"])
    0.0
    """
    return _sub_exact(normalize_answer(prediction), _normalized(golden_answers))


def token_f1(prediction: str, golden_answers: Golds) -> float:
    """Token-level F1 of the normalised strings, the best over the gold answers (FlashRAG).

    If either side normalises to yes/no/noanswer, the pair scores only if both are equal.

    >>> token_f1("Paris France", ["Paris"])
    0.6666666666666666
    >>> token_f1("no", ["no way"])
    0.0
    """
    return _f1(normalize_answer(prediction), _normalized(golden_answers))


def extract_answer(action: str) -> str | None:
    """The answer of an action text, or None if its first action is not a valid answer.

    Only the action's own text is read, up to its first `</search>` or `</answer>`.

    >>> extract_answer("<think>It is Paris.</think><answer> Paris </answer>")
    'Paris'
    >>> extract_answer("<search> capital of France </search><answer> Paris </answer>") is None
    True
    """
    parsed = parse_action(action)
    return parsed.content if parsed.kind == "answer" else None


@dataclass(frozen=True, slots=True)
class AnswerScores:
    """The three scores of one answer against its gold answers."""

    em: float
    sub_em: float
    f1: float


def score_answer(prediction: str, golden_answers: Golds) -> AnswerScores:
    """EM, sub-EM and token F1 of one prediction.

    >>> score_answer("Paris", ["Paris", "City of Light"])
    AnswerScores(em=1.0, sub_em=1.0, f1=1.0)
    """
    pred = normalize_answer(prediction)
    golds = _normalized(golden_answers)
    return AnswerScores(em=_exact(pred, golds), sub_em=_sub_exact(pred, golds), f1=_f1(pred, golds))


def format_reward(*, answered: bool, correct: bool, valid_format: bool) -> float:
    """Tree-GRPO's format-shaped reward (`qa_em_format`, docs/design.md §2).

    Correct: 1.0 (0.8 with a format error). Wrong or no answer: 0.2 (0.1 for a wrong answer with
    a format error, 0.0 for no answer with one). Here "format error" means the episode held at
    least one invalid action.

    >>> format_reward(answered=True, correct=True, valid_format=False)
    0.8
    """
    if answered and correct:
        return 1.0 if valid_format else 0.8
    if answered:
        return 0.2 if valid_format else 0.1
    return 0.2 if valid_format else 0.0


def reward_for_answer(
    kind: RewardKind, scores: AnswerScores, *, f1_threshold: float, valid_format: bool
) -> float:
    """The env's reward for an answer under reward `kind`.

    >>> s = AnswerScores(em=0.0, sub_em=1.0, f1=0.5)
    >>> [reward_for_answer(k, s, f1_threshold=0.3, valid_format=True)
    ...  for k in ("em", "f1", "f1_threshold", "format")]
    [0.0, 0.5, 1.0, 0.2]
    """
    if kind == "em":
        return scores.em
    if kind == "f1":
        return scores.f1
    if kind == "f1_threshold":
        return float(scores.f1 >= f1_threshold)
    return format_reward(answered=True, correct=scores.em == 1.0, valid_format=valid_format)
