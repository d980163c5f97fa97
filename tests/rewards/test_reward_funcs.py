"""GSM8K reward functions: robustness on hostile output, the TRL reward functions, errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_rewards import ADD, JANET

import llm_gym.rewards as rewards
from llm_gym.rewards import (
    MODES,
    GSM8KReward,
    extract_answer,
    extract_ground_truth,
    extract_tags,
    gsm8k_reward_func,
    normalize_number,
    score_gsm8k,
)

# --- property tests: the parser never raises --------------------------------------------

FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "####", " ", "\\boxed{", "{", "}", "\n"]
    + ["-", "+", ".", ",", "$", "%", "0", "1", "18", "3.50", "1,234"]
)
TEXT = st.one_of(st.text(), st.lists(st.one_of(FRAGMENTS, st.text(max_size=3))).map("".join))


@settings(max_examples=300, deadline=None)
@given(response=TEXT, answer=TEXT, mode=st.sampled_from(MODES))
def test_score_never_raises(response, answer, mode):
    score = score_gsm8k(response, answer, mode=mode)
    assert score.reward == score.reward_right
    assert score.reward in (0.0, 0.1, 1.0)
    assert score.success is (score.reward == 1.0)
    assert score.reward_answer == (0.0 if score.reward == 0.0 else 1.0)
    assert score.reward_think in (0.0, 1.0)


@settings(max_examples=300, deadline=None)
@given(text=TEXT, mode=st.sampled_from(MODES))
def test_extraction_never_raises(text, mode):
    found = extract_answer(text, mode)
    assert found is None or (found and found == found.strip() and found in text)
    think, answer = extract_tags(text)
    assert think == think.strip() and answer == answer.strip()
    assert isinstance(normalize_number(text), str)
    assert isinstance(extract_ground_truth(text), str)


# --- TRL reward function -----------------------------------------------------------------


def test_reward_func_with_string_completions():
    completions = [
        "<think>9*2=18</think><answer>18</answer>",
        "<think>9*2=19</think><answer>19</answer>",
        "I think it is 18",
        "<think>48/2=24, 48+24=72</think><answer>72</answer>",
    ]
    answers = [JANET, JANET, JANET, ADD]
    assert gsm8k_reward_func(["p"] * 4, completions, answers) == [1.0, 0.1, 0.0, 1.0]


def test_reward_func_as_trl_calls_it():
    # TRL: f(prompts=..., completions=..., completion_ids=..., **dataset_columns,
    # trainer_state=..., and in recent versions log_extra / log_metric).
    prompts = [[{"role": "user", "content": "How much does Janet make?"}]] * 3
    completions = [
        [{"role": "assistant", "content": "<think>9*2</think><answer>$18</answer>"}],
        [{"role": "assistant", "content": "<answer>16</answer>"}],
        [{"role": "assistant", "content": "eighteen"}],
    ]
    result = gsm8k_reward_func(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2], [3], [4]],
        answer=[JANET] * 3,
        question=["How much does Janet make?"] * 3,
        trainer_state=object(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
    )
    assert result == [1.0, 0.1, 0.0]
    assert all(type(r) is float for r in result)


def test_reward_func_takes_last_assistant_message():
    tool_turns = [
        {"role": "assistant", "content": "<answer>9</answer>", "tool_calls": []},
        {"role": "tool", "content": "<answer>18</answer>"},
        {"role": "assistant", "content": "<think>checked</think><answer>18</answer>"},
    ]
    no_role = [{"content": "<answer>18</answer>"}]  # TRL's own docs omit the role
    no_content = [{"role": "assistant", "content": None}]
    text_parts = [{"type": "text", "text": "<answer>18"}, {"type": "text", "text": "</answer>"}]
    parts_content = [{"role": "assistant", "content": text_parts}]
    result = gsm8k_reward_func(None, [tool_turns, no_role, no_content, parts_content], [JANET] * 4)
    assert result == [1.0, 1.0, 0.0, 1.0]


def test_reward_func_with_bare_answers():
    assert gsm8k_reward_func(None, ["<answer>18</answer>", "<answer>7</answer>"], ["18", "8"]) == [
        1.0,
        0.1,
    ]


def test_as_reward_func_carries_settings_and_name():
    func = GSM8KReward(mode="boxed", correct_reward=2.0).as_reward_func()
    assert func.__name__ == "gsm8k_boxed_reward"
    assert func(prompts=None, completions=[r"\boxed{18}", "18"], answer=[JANET] * 2) == [2.0, 0.0]


# --- errors ------------------------------------------------------------------------------


def test_unknown_mode_raises():
    expected = "mode must be one of 'tags', 'hash', 'boxed', 'last_number'; got 'xml'"
    with pytest.raises(ValueError, match=expected):
        extract_answer("x", mode="xml")
    with pytest.raises(ValueError, match=expected):
        score_gsm8k("x", JANET, mode="xml")
    with pytest.raises(ValueError, match="mode must be one of .*; got None"):
        GSM8KReward(mode=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: score_gsm8k(42, JANET), "response must be a str, got int: 42"),
        (lambda: score_gsm8k(b"<answer>18</answer>", JANET), "response must be a str, got bytes"),
        (lambda: score_gsm8k("18", None), "answer must be a str, got NoneType: None"),
        (lambda: extract_answer(None), "text must be a str, got NoneType"),
        (lambda: extract_tags(["<answer>1</answer>"]), "text must be a str, got list"),
        (lambda: normalize_number(18), "s must be a str, got int: 18"),
        (lambda: extract_ground_truth(18), "answer_field must be a str, got int"),
        (lambda: score_gsm8k("x", JANET, correct_reward="1"), "correct_reward must be an int"),
        (
            lambda: GSM8KReward(format_reward=True),
            "format_reward must be an int or float, got bool",
        ),
    ],
)
def test_type_errors_name_the_argument(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_non_finite_reward_raises():
    with pytest.raises(ValueError, match="correct_reward must be finite, got nan"):
        GSM8KReward(correct_reward=math.nan)
    with pytest.raises(ValueError, match="format_reward must be finite, got inf"):
        score_gsm8k("x", JANET, format_reward=math.inf)


def test_reward_func_errors():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        gsm8k_reward_func(None, ["a", "b"], [JANET])
    with pytest.raises(TypeError, match="answer must be a list, got str"):
        gsm8k_reward_func(None, ["<answer>18</answer>"], JANET)
    with pytest.raises(TypeError, match="completions must be a list, got str"):
        gsm8k_reward_func(None, "<answer>18</answer>", [JANET])
    with pytest.raises(TypeError, match="completion must be a str or a list of message dicts"):
        gsm8k_reward_func(None, [18], [JANET])
    with pytest.raises(ValueError, match=r"assistant message, got roles \['user', 'tool'\]"):
        gsm8k_reward_func(None, [[{"role": "user"}, {"role": "tool"}]], [JANET])
    with pytest.raises(TypeError, match="answer must be a str, got int"):
        gsm8k_reward_func(None, ["18"], [18])


def test_public_api():
    assert set(rewards.__all__) >= {
        "MODES",
        "GSM8KReward",
        "GSM8KScore",
        "extract_answer",
        "extract_ground_truth",
        "extract_tags",
        "gsm8k_reward_func",
        "normalize_number",
        "score_gsm8k",
        "CountdownReward",
        "countdown_reward_func",
        "MATHReward",
        "math_reward_func",
        "ANSWER_FORMATS",
    }
    assert all(hasattr(rewards, name) for name in rewards.__all__)
