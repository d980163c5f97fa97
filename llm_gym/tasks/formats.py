"""System prompts that ask for each answer format, shared by every task.

A task's system prompt is its own description followed by the format's instruction, so
that the answer the reward looks for (``llm_gym.rewards.answers``) is the one the prompt asks
for. ``"tags"`` is TorchRL's wording.

>>> print(system_prompt("The user gives a sum.", "boxed"))
A conversation between User and Assistant. The user gives a sum.
The assistant reasons step by step, then puts the final answer within \\boxed{}.
"""

from __future__ import annotations

from llm_gym.rewards.answers import ANSWER_FORMATS, check_answer_format

__all__ = ["ANSWER_FORMATS", "FORMAT_INSTRUCTIONS", "system_prompt"]

FORMAT_INSTRUCTIONS = {
    "tags": (
        "The assistant first thinks about the reasoning process in the mind and then "
        "provides the user with the answer.\nThe reasoning process and answer are enclosed "
        "within <think></think> and <answer></answer> tags, respectively,\ni.e., "
        "<think>reasoning process here</think> <answer>answer here</answer>."
    ),
    "boxed": "The assistant reasons step by step, then puts the final answer within \\boxed{}.",
    "hash": (
        "The assistant reasons step by step, then writes the final answer alone on the last "
        "line, after '#### '."
    ),
    "last_number": (
        "The assistant reasons briefly, then ends the response with the final answer as a number."
    ),
}


def system_prompt(description: str, answer_format: str, answer_hint: str = "") -> str:
    """``description`` (what the user asks), then how to answer in ``answer_format``.

    ``answer_hint`` follows the instruction, e.g. "The answer should be a number."
    """
    check_answer_format(answer_format)
    parts = [f"A conversation between User and Assistant. {description}"]
    parts.append(FORMAT_INSTRUCTIONS[answer_format])
    if answer_hint:
        parts.append(answer_hint)
    return "\n".join(parts) if answer_format != "tags" else _tags_prompt(parts)


def _tags_prompt(parts: list[str]) -> str:
    # TorchRL's prompts put the hint on the tags line: "... answer here</answer>. The answer
    # should be a number."
    head, instruction, *hint = parts
    return f"{head}\n{instruction}" + (f" {hint[0]}" if hint else "")
