"""``llm-gym check-template``: whether a chat template keeps earlier turns' tokens when a turn
is added (``llm_gym.chat.prefix_check``), said in one line."""

from __future__ import annotations

import argparse
from typing import Any

from llm_gym.cli._args import usage_error
from llm_gym.options import number

__all__ = ["add_check_template", "check_template"]

# What a folder holds a tokenizer in (transformers' fast and slow tokenizers).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def add_check_template(commands: Any) -> None:
    """``llm-gym check-template``'s parser."""
    parser = commands.add_parser(
        "check-template",
        help="say whether a chat template keeps earlier turns' tokens when a turn is added",
        description="Play a scripted game of several turns through the env's prompt builder "
        "with a model's chat template and say whether each prompt begins with the previous "
        "one and the tokens sampled, token for token, as a multi-turn training run needs "
        "(it stops with TokenPrefixError otherwise). Exit 0 if it does, 1 if not.",
    )
    add = parser.add_argument
    add("--model", default="default",
        help="'default' (SmolLM2-135M-Instruct) or a local model folder: its tokenizer and the "
        "template llm_gym picks for it (default: %(default)s)")  # fmt: skip
    add("--chat-template", default=None, metavar="NAME_OR_FILE",
        # %(default).0s: an empty default's mark, so that argparse adds no "(default: None)".
        help="a built-in template (chatml, qwen, llama) or a Jinja file to check instead "
        "(default: the model's)%(default).0s")  # fmt: skip
    add(
        "--system-prompt",
        default=None,
        help="start the game with this system message (some templates move it; default: none)",
    )
    add("--turns", type=number(int, 1), default=4,
        help="assistant turns to play, at most 4 (default: %(default)s)")  # fmt: skip


def check_template(args: argparse.Namespace) -> int:
    """Check the template ``args`` name and say so in one line; 0 if it keeps, 1 if not."""
    from pathlib import Path

    from llm_gym.chat.templates import CHAT_TEMPLATES

    template, name = args.chat_template, None
    if args.turns > 4:
        return usage_error(f"--turns must be 1 to 4 (the scripted game's), got {args.turns}")
    if template is not None and template in CHAT_TEMPLATES:
        template, name = None, template
    elif template is not None:
        try:
            template = Path(template).read_text()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            return usage_error(
                f"--chat-template {args.chat_template!r} is neither a built-in template "
                f"({', '.join(sorted(CHAT_TEMPLATES))}) nor a readable file: {reason}"
            )
    folder = Path(args.model).expanduser()
    if not folder.is_dir() and args.model in ("default", "SmolLM2-135M-Instruct"):
        from llm_gym.lm.loading import model_folder  # torch's import: the default model only

        folder = model_folder(args.model)
    if not folder.is_dir():
        return usage_error(
            f"--model {args.model!r} is not a folder: pass 'default' or a local folder saved "
            "with save_pretrained"
        )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return usage_error(
            f"--model {args.model!r}: not a model folder (no tokenizer: none of "
            f"{', '.join(TOKENIZER_FILES)}); pass 'default' or a folder saved with "
            "save_pretrained (model and tokenizer)"
        )
    # Only now the heavy imports: every bad argument above is told in well under a second.
    from transformers import AutoTokenizer

    from llm_gym.chat.prefix_check import check_prefix

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        found = check_prefix(
            tokenizer, chat_template=template, chat_template_name=name, turns=args.turns,
            system_prompt=args.system_prompt,
        )  # fmt: skip
    except (OSError, ValueError) as error:
        return usage_error(error)
    which = f"{args.chat_template} template" if args.chat_template else _picked(args, tokenizer)
    if found.keeps:
        print(f"{which} keeps earlier turns' tokens over {found.turns} turns")
        return 0
    print(f"{which} changes earlier turns' tokens when turn {found.turn + 1} is added: "
          f"{found.detail}")  # fmt: skip
    return 1


def _picked(args: argparse.Namespace, tokenizer: Any) -> str:
    # Which template llm_gym renders the model's prompts with, and why (resolve_chat_template).
    from llm_gym.chat.templates import CHAT_TEMPLATES, resolve_chat_template

    own = getattr(tokenizer, "chat_template", None)
    picked = resolve_chat_template(tokenizer)
    if isinstance(own, str) and picked == own:
        return f"{args.model}'s template"
    name = next((n for n, text in CHAT_TEMPLATES.items() if text == picked), "other")
    said = "has no chat template" if not own else "has a template llm_gym does not render with"
    return f"{args.model} {said}: llm_gym's {name} built-in, which renders its prompts,"
