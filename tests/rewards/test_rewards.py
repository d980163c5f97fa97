"""Tests for llm_gym.rewards: GSM8K scoring as TorchRL's GSM8KRewardParser does it."""

from __future__ import annotations

import dataclasses

import pytest

from llm_gym.rewards import (
    GSM8KReward,
    GSM8KScore,
    extract_answer,
    extract_ground_truth,
    extract_tags,
    normalize_number,
    score_gsm8k,
)

# The first GSM8K test problem's answer field, as the dataset stores it.
JANET = (
    "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
    "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n"
    "#### 18"
)
ADD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"


def parts(score: GSM8KScore) -> tuple[float, float, float, float, bool]:
    return (
        score.reward_answer,
        score.reward_think,
        score.reward_right,
        score.reward,
        score.success,
    )


# --- tag extraction (TorchRL's extract_tags) ---------------------------------------------


def test_extract_tags_well_formed():
    assert extract_tags("<think>some reasoning</think> <answer>42</answer>") == (
        "some reasoning",
        "42",
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        # Characters that made TorchRL's old XML parser fail and score 0.
        ("<think>a < b & c</think><answer>7</answer>", ("a < b & c", "7")),
        ("<think>x</think><answer>1 & 2 < 3</answer>", ("x", "1 & 2 < 3")),
        # Unclosed, stray and mismatched tags.
        ("<think>unclosed <answer>7</answer>", ("", "7")),
        ("</think><answer>7</answer></think>", ("", "7")),
        ("<think><b>bold</think></b><answer>3</answer>", ("<b>bold", "3")),
        ("<think>ok</think><answer>7", ("ok", "")),
        # Missing think, reversed order, several answers (the first wins).
        ("<answer>7</answer>", ("", "7")),
        ("<answer>7</answer><think>late</think>", ("late", "7")),
        ("<think>a</think><answer>1</answer><answer>2</answer>", ("a", "1")),
        # Multi-line content (DOTALL) is stripped; a chat end token does not matter.
        ("<think>\nline1\nline2\n</think>\n<answer>\n 42 \n</answer>", ("line1\nline2", "42")),
        ("<think>r</think><answer>5</answer><|im_end|>", ("r", "5")),
        # Tags are case-sensitive, as in TorchRL.
        ("<THINK>r</THINK><ANSWER>5</ANSWER>", ("", "")),
        ("", ("", "")),
    ],
)
def test_extract_tags_malformed_markup(text, expected):
    assert extract_tags(text) == expected


# --- normalization -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("1,234", "1234"),
        ("$120", "120"),
        ("120.00", "120"),
        ("120.0", "120"),
        ("3.14", "3.14"),
        ("3.140", "3.14"),
        ("100%", "100"),
        ("100", "100"),  # no decimal point: the zeros stay
        ("120.", "120"),
        ("  42 \n", "42"),
        ("-5", "-5"),
        ("-5.50", "-5.5"),
        ("$1,800.00", "1800"),
        ("0.0", "0"),
        ("", ""),
        ("$ 5", " 5"),  # TorchRL strips before removing "$", so the inner space stays
        ("+5", "+5"),  # and does not drop a plus sign
    ],
)
def test_normalize_number(raw, expected):
    assert normalize_number(raw) == expected


# --- ground truth ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, expected",
    [(JANET, "18"), (ADD, "72"), ("#### 1,000", "1,000"), ("#### -3", "-3"), (" 18 ", "18")],
)
def test_extract_ground_truth(field, expected):
    assert extract_ground_truth(field) == expected


# --- scoring (TorchRL's reward parts) ----------------------------------------------------


def test_correct_answer_scores_one_with_all_parts():
    score = score_gsm8k("<think>16-3-4=9, 9*2=18</think> <answer>18</answer>", JANET)
    assert parts(score) == (1.0, 1.0, 1.0, 1.0, True)
    assert score.as_dict() == {
        "reward_answer": 1.0,
        "reward_think": 1.0,
        "reward_right": 1.0,
        "reward": 1.0,
        "success": True,
    }
    *floats, success = score.as_dict().values()
    assert all(type(v) is float for v in floats)
    assert type(score.success) is bool


def test_wrong_answer_scores_format_reward():
    score = score_gsm8k("<think>16-3-4=9</think><answer>9</answer>", JANET)
    assert parts(score) == (1.0, 1.0, 0.1, 0.1, False)


def test_missing_answer_scores_zero():
    assert parts(score_gsm8k("<think>hmm</think> I give up", JANET)) == (0.0, 1.0, 0.0, 0.0, False)
    assert parts(score_gsm8k("18", JANET)) == (0.0, 0.0, 0.0, 0.0, False)
    # Blank content is no answer (TorchRL: bool of the stripped text).
    assert parts(score_gsm8k("<answer>  </answer>", JANET)) == (0.0, 0.0, 0.0, 0.0, False)


def test_answer_without_think():
    assert parts(score_gsm8k("<answer>18</answer>", JANET)) == (1.0, 0.0, 1.0, 1.0, True)


@pytest.mark.parametrize(
    "predicted, truth",
    [
        ("1,234", "1234"),
        ("1234", "1,234"),
        ("$120", "120"),
        ("120.00", "120"),
        ("3.14", "3.14"),
        ("3.140", "3.14"),
        ("100%", "100"),
        ("-5", "-5"),
        ("-5.0", "-5"),
        (" 72. ", "72"),
    ],
)
def test_equivalent_answers_are_correct(predicted, truth):
    score = score_gsm8k(f"<answer>{predicted}</answer>", f"#### {truth}")
    assert (score.reward, score.success) == (1.0, True)


@pytest.mark.parametrize(
    "predicted, truth",
    [("3.14", "3"), ("-5", "5"), ("18 eggs", "18"), ("The answer is 18", "18"), ("1e3", "1000")],
)
def test_different_answers_are_wrong(predicted, truth):
    # Tags mode compares the whole normalized content, so trailing text makes it wrong.
    score = score_gsm8k(f"<answer>{predicted}</answer>", f"#### {truth}")
    assert (score.reward, score.success) == (0.1, False)


def test_custom_reward_values():
    right = score_gsm8k("<answer>18</answer>", JANET, correct_reward=2.0, format_reward=0.5)
    wrong = score_gsm8k("<answer>17</answer>", JANET, correct_reward=2.0, format_reward=0.5)
    none = score_gsm8k("no tags", JANET, correct_reward=2.0, format_reward=0.5)
    assert (right.reward, right.reward_right, right.success) == (2.0, 2.0, True)
    assert (wrong.reward, wrong.reward_right, wrong.success) == (0.5, 0.5, False)
    assert (none.reward, none.reward_answer) == (0.0, 0.0)
    assert score_gsm8k("<answer>17</answer>", JANET, format_reward=0).reward == 0.0
    assert score_gsm8k("<answer>18</answer>", JANET, correct_reward=-1).reward == -1.0


def test_score_is_frozen():
    score = score_gsm8k("<answer>18</answer>", JANET)
    with pytest.raises(dataclasses.FrozenInstanceError):
        score.reward = 5.0  # type: ignore[misc]


# --- extraction modes beyond TorchRL -----------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("9 * 2 = 18\n#### 18", "18"),
        ("#### 5 first, then on reflection\n#### 18", "18"),
        ("####18", "18"),
        ("#### -7", "-7"),
        ("#### $1,800.50", "1,800.50"),
        ("#### 18 eggs", "18"),
        ("#### none", None),
        ("no hashes 42", None),
    ],
)
def test_hash_mode(text, expected):
    assert extract_answer(text, mode="hash") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{18}.", "18"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{{{a}{b}}}", "{{a}{b}}"),
        (r"first \boxed{1} then \boxed{2}", "2"),
        (r"\boxed{1} then an unclosed \boxed{2", "1"),
        (r"\boxed { 18 }", "18"),
        (r"\boxed{}", None),
        (r"\boxed{1{2}", None),
        ("boxed{18}", None),
    ],
)
def test_boxed_mode(text, expected):
    assert extract_answer(text, mode="boxed") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She makes 9 * 2 = 18 dollars.", "18"),
        ("total: 1,234.5 units", "1,234.5"),
        ("it drops to -3 degrees", "-3"),
        ("from 5-3", "3"),
        ("x = -.5", "-.5"),
        ("costs $1,800.", "1,800"),
        ("100% sure", "100"),
        ("no digits at all", None),
    ],
)
def test_last_number_mode(text, expected):
    assert extract_answer(text, mode="last_number") == expected


@pytest.mark.parametrize(
    "mode, response, reward",
    [
        ("hash", "9 * 2 = 18\n#### 18", 1.0),
        ("hash", "#### 17", 0.1),
        ("hash", "18", 0.0),
        ("boxed", r"<think>x</think> \boxed{18}", 1.0),
        ("boxed", r"\boxed{\$18}", 0.1),  # no LaTeX cleanup: "\$18" normalizes to "\18"
        ("last_number", "She makes $18 every day.", 1.0),
        ("last_number", "She makes 18 dollars, not 17.", 0.1),
        ("last_number", "eighteen", 0.0),
        ("tags", "#### 18", 0.0),
    ],
)
def test_modes_score_the_same_way(mode, response, reward):
    score = score_gsm8k(response, JANET, mode=mode)
    assert score.reward == reward
    assert score.success is (reward == 1.0)
    assert score.reward_answer == (0.0 if reward == 0.0 else 1.0)


def test_think_is_checked_in_every_mode():
    for mode, response in [("hash", "#### 18"), ("boxed", r"\boxed{18}"), ("last_number", "18")]:
        assert score_gsm8k(response, JANET, mode=mode).reward_think == 0.0
        with_think = score_gsm8k("<think>r</think>" + response, JANET, mode=mode)
        assert parts(with_think) == (1.0, 1.0, 1.0, 1.0, True)


def test_gsm8k_reward_class_matches_function():
    reward = GSM8KReward(mode="last_number", correct_reward=3.0, format_reward=0.25)
    for response in ["it is 18", "it is 17", "none"]:
        assert reward(response, JANET) == score_gsm8k(
            response, JANET, mode="last_number", correct_reward=3.0, format_reward=0.25
        )
    assert repr(reward) == "GSM8KReward(mode='last_number', correct_reward=3.0, format_reward=0.25)"
