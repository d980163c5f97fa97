"""GSM8K answer scoring, as TorchRL's ``GSM8KRewardParser`` does it (tag extraction, answer
normalization, 1.0 / 0.1 / 0.0), with no env needed and in every format of
``llm_gym.rewards.answers``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.checks import check_str
from llm_gym.rewards.answers import (
    MODES,
    AnswerReward,
    AnswerScore,
    extract_answer,
    extract_tags,
    trl_rows,
)

__all__ = [
    "MODES",
    "GSM8KReward",
    "GSM8KScore",
    "extract_answer",
    "extract_ground_truth",
    "extract_tags",
    "gsm8k_reward_func",
    "normalize_number",
    "score_gsm8k",
]

GSM8KScore = AnswerScore  # TorchRL's reward parts, the same for every task


def extract_ground_truth(answer_field: str) -> str:
    """Return what follows ``#### `` in a GSM8K ``answer`` field, stripped.

    A field without ``#### `` is taken to be an already-extracted answer such as ``"18"``,
    which is how many GRPO recipes preprocess the dataset.

    >>> extract_ground_truth("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\\n#### 18")
    '18'
    >>> extract_ground_truth(" 18 ")
    '18'
    """
    check_str("answer_field", answer_field)
    return answer_field.rpartition("#### ")[2].strip()


def normalize_number(s: str) -> str:
    """Normalize an answer for comparison exactly as TorchRL's ``normalize_answer`` does.

    Strip whitespace, drop ``,`` ``$`` ``%``, drop trailing dots, then drop a decimal's
    trailing zeros. The strip comes first, so ``"$ 5"`` keeps its inner space.

    >>> [normalize_number(s) for s in ["1,234", "$120", "120.00", "3.14", "100%", "7."]]
    ['1234', '120', '120', '3.14', '100', '7']
    """
    check_str("s", s)
    s = s.strip().replace(",", "").replace("$", "").replace("%", "").rstrip(".")
    if "." in s:  # only a decimal may lose zeros: "100" must stay "100"
        s = s.rstrip("0").rstrip(".")
    return s


def score_gsm8k(
    response: str,
    answer: str,
    *,
    mode: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
) -> GSM8KScore:
    """Score a model response against a GSM8K answer field (or a bare answer): ``score_answer``
    with ``normalize_number`` equality as the grade.

    >>> score = score_gsm8k("<think>a</think><answer>$1,800.00</answer>", "#### 1800")
    >>> score.reward, score.reward_answer, score.reward_think, score.success
    (1.0, 1.0, 1.0, True)
    """
    return GSM8KReward(mode, correct_reward, format_reward)(response, answer)


@dataclass(frozen=True)
class GSM8KReward(AnswerReward):
    """GSM8K scoring settings, validated once, for an env to call per response.

    >>> reward = GSM8KReward(mode="boxed", correct_reward=2.0)
    >>> reward(r"so \\boxed{18}", "#### 18").reward
    2.0
    >>> reward.as_reward_func()(prompts=["q"], completions=["\\\\boxed{3}"], answer=["4"])
    [0.1]
    """

    def __call__(self, response: str, answer: str) -> GSM8KScore:
        check_str("answer", answer)
        truth = normalize_number(extract_ground_truth(answer))
        return self.score(response, lambda predicted: normalize_number(predicted) == truth)

    def as_reward_func(self) -> Callable[..., list[float]]:
        """A TRL ``reward_funcs`` entry with these settings (TRL logs it by ``__name__``)."""

        def reward_func(prompts: Any, completions: Sequence[Any], answer: Sequence[str], **_: Any):
            return [self(text, a).reward for text, a in trl_rows(completions, answer=answer)]

        reward_func.__name__ = reward_func.__qualname__ = f"gsm8k_{self.mode}_reward"
        return reward_func


def gsm8k_reward_func(
    prompts: Sequence[object] | None,
    completions: Sequence[Any],
    answer: Sequence[str],
    **kwargs: object,
) -> list[float]:
    """GSM8K reward for TRL's ``GRPOTrainer(reward_funcs=[gsm8k_reward_func])``.

    TRL calls it as ``f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
    **dataset_columns)``, so the dataset's ``answer`` column arrives by name and the rest is
    ignored. A completion is a string, or a list of messages whose last assistant
    ``content`` is scored. Default settings: tags mode, 1.0 / 0.1 / 0.0.

    >>> done = [{"role": "assistant", "content": "<answer>18</answer>"}]
    >>> gsm8k_reward_func(prompts=[[]], completions=[done], answer=["#### 18"], trainer_state=None)
    [1.0]
    """
    return _DEFAULT_FUNC(prompts, completions, answer, **kwargs)


_DEFAULT_FUNC = GSM8KReward().as_reward_func()
