"""``ChatEnv``'s constructor arguments, checked before anything is built.

Each bad argument gets an error that names it, what was expected and what came.

>>> observation_keys_for("tokens", None, tools=["python"], tokenizer=object())
('tokens', 'policy_mask')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_gym.chat.templates import resolve_chat_template
from llm_gym.spaces import INPUT_MODES

__all__ = ["MASK_KEY", "check_chat_settings", "observation_keys_for", "offer_tools"]

MASK_KEY = "policy_mask"  # observation key: 1 on the prompt tokens the policy sampled


def observation_keys_for(
    input_mode: str,
    observation_keys: Sequence[str] | None,
    tools: Sequence[Any] | None,
    tokenizer: Any,
) -> tuple[str, ...]:
    """The observation's keys: ``observation_keys`` or ``(input_mode,)``, plus the policy
    mask with tools in tokens mode (a multi-turn trainer needs it)."""
    if input_mode not in INPUT_MODES:
        raise ValueError(f"input_mode must be one of {INPUT_MODES}, got {input_mode!r}")
    if isinstance(observation_keys, str):
        raise TypeError(
            f"observation_keys must be a tuple of input modes, e.g. ({observation_keys!r},), "
            f"got the str {observation_keys!r}"
        )
    keys = tuple(observation_keys) if observation_keys is not None else (input_mode,)
    for key in keys:
        if key not in (*INPUT_MODES, MASK_KEY):
            raise ValueError(
                f"observation_keys must be among {(*INPUT_MODES, MASK_KEY)}, got {key!r}"
            )
    if MASK_KEY in keys and "tokens" not in keys:
        raise ValueError(f"observation key {MASK_KEY!r} marks tokens: add 'tokens', got {keys}")
    if tools and "tokens" in keys and MASK_KEY not in keys:
        keys = (*keys, MASK_KEY)  # a multi-turn trainer needs it
    if tokenizer is None and any(key != "history" for key in keys):
        mode = next(key for key in keys if key != "history")
        raise ValueError(
            f"input_mode {mode!r} needs tokenizer= (a transformers tokenizer, to render "
            "the chat template and tokenize), got tokenizer=None"
        )
    return keys


def check_chat_settings(
    *,
    input_mode: str,
    max_turns: int | None,
    assistant_prefix: str,
    query: str | None,
    max_text_length: int,
    max_tool_calls: int,
    render_mode: str | None,
    render_modes: Sequence[str],
) -> None:
    """The other settings' types and ranges."""
    if max_turns is not None and (
        isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
    ):
        raise ValueError(f"max_turns must be None or an int >= 1, got {max_turns!r}")
    if not isinstance(assistant_prefix, str):
        raise TypeError(f"assistant_prefix must be a str, got {type(assistant_prefix).__name__}")
    if assistant_prefix and input_mode == "history":
        raise ValueError(
            "assistant_prefix needs input_mode 'text' or 'tokens' (a history observation "
            f"cannot hold a started assistant turn), got input_mode='history' and "
            f"assistant_prefix={assistant_prefix!r}"
        )
    if query is not None and not isinstance(query, str):
        raise TypeError(f"query must be a str or None, got {type(query).__name__}")
    if isinstance(max_text_length, bool) or not isinstance(max_text_length, int):
        raise TypeError(f"max_text_length must be an int, got {type(max_text_length).__name__}")
    if max_text_length < 1:
        raise ValueError(f"max_text_length must be >= 1, got {max_text_length}")
    if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int):
        raise TypeError(f"max_tool_calls must be an int, got {type(max_tool_calls).__name__}")
    if max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
    if render_mode is not None and render_mode not in render_modes:
        raise ValueError(f"render_mode must be one of {render_modes}, got {render_mode!r}")


def offer_tools(
    toolbox: Any,
    system_prompt: str | None,
    template_kwargs: dict[str, Any],
    tokenizer: Any,
    rendered_here: bool,
) -> str | None:
    """Show the tools to the model; the system prompt after that.

    A template that renders ``tools=`` gets them in ``template_kwargs`` when the env renders
    the prompt (``rendered_here``); otherwise (and for history observations, which a policy
    renders itself) a block appended to the system prompt lists them.
    """
    if rendered_here:
        name = template_kwargs.get("chat_template_name")
        template = resolve_chat_template(tokenizer, name, template_kwargs.get("chat_template"))
        if "tools" in template:
            template_kwargs["tools"] = toolbox.schemas
            return system_prompt
    block = toolbox.system_prompt()
    return block if not system_prompt else f"{system_prompt}\n\n{block}"
