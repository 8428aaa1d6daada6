from __future__ import annotations

import pytest

from envs.rewards import (
    exact_match,
    extract_answer,
    format_reward,
    normalize_answer,
    score_answer,
    sub_exact_match,
    token_f1,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Beatles", "beatles"),
        ("  A  tale of  an apple.", "tale of apple"),
        ("U.S.A.", "usa"),
        ("theatre", "theatre"),  # only whole-word articles go
        ("Ann-Marie's", "annmaries"),
        ("", ""),
    ],
)
def test_normalize_answer_follows_squad(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_against_any_alias():
    assert exact_match("the bo li", ["Li Bo", "Bo Li"]) == 1.0
    assert exact_match("Bo", ["Bo Li"]) == 0.0
    assert exact_match("", ["the"]) == 1.0  # both normalise to "": SQuAD's behaviour


def test_sub_exact_match():
    assert sub_exact_match("It was Bo Li, surely", ["Bo Li"]) == 1.0
    assert sub_exact_match("Bo", ["Bo Li"]) == 0.0
    assert sub_exact_match("anything", ["The"]) == 0.0  # an empty gold matches nothing


@pytest.mark.parametrize(
    ("pred", "golds", "f1"),
    [
        ("Bo Li", ["Bo Li"], 1.0),
        ("Bo", ["Bo Li"], 2 * 1.0 * 0.5 / 1.5),
        ("Bo Li Wang", ["Bo Li"], 2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)),
        ("Paris", ["Lyon"], 0.0),
        ("yes", ["yes"], 1.0),
        ("yes", ["yes sir"], 0.0),  # FlashRAG's yes/no/noanswer rule
        ("no answer", ["noanswer"], 0.0),
        ("the cat the cat", ["cat"], 2 * 0.5 * 1.0 / 1.5),
        ("x", ["nope", "x y"], 2 * 1.0 * 0.5 / 1.5),  # best over golds
    ],
)
def test_token_f1_known_cases(pred, golds, f1):
    assert token_f1(pred, golds) == pytest.approx(f1)


def test_extract_answer_scores_only_the_first_action_of_the_generated_text():
    assert extract_answer("<answer> Lyon </answer>") == "Lyon"
    assert extract_answer("<search> q </search> <answer> Lyon </answer>") is None
    assert extract_answer("no tags") is None


def test_score_answer_bundles_the_three_scores():
    scores = score_answer("Bo Li Wang", ["Bo Li"])
    assert (scores.em, scores.sub_em) == (0.0, 1.0)
    assert 0 < scores.f1 < 1


def test_format_reward_table():
    assert format_reward(answered=True, correct=True, valid_format=True) == 1.0
    assert format_reward(answered=True, correct=True, valid_format=False) == 0.8
    assert format_reward(answered=True, correct=False, valid_format=True) == 0.2
    assert format_reward(answered=True, correct=False, valid_format=False) == 0.1
    assert format_reward(answered=False, correct=False, valid_format=True) == 0.2
    assert format_reward(answered=False, correct=False, valid_format=False) == 0.0
