"""Built-in chat templates with ``{% generation %}`` markers, and how one is chosen.

transformers computes an assistant-token mask only for templates that wrap the assistant's
text in ``{% generation %}...{% endgeneration %}``. Few hub templates do, so llm_gym ships its
own for the common formats (as TorchRL does). The marked span is the assistant's content plus
its end-of-turn token: the policy must learn to stop, and the role header is not its output.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from llm_gym.checks import check_choice, check_str

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "CHATML_TEMPLATE",
    "QWEN_TEMPLATE",
    "LLAMA_TEMPLATE",
    "CHAT_TEMPLATES",
    "has_generation_markers",
    "get_chat_template",
    "resolve_chat_template",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2.5: ChatML plus the default system prompt Qwen inserts when none is given.
QWEN_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}" + CHATML_TEMPLATE
)

LLAMA_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

CHAT_TEMPLATES: dict[str, str] = {
    "chatml_format": CHATML_TEMPLATE,
    "chatml": CHATML_TEMPLATE,
    "qwen": QWEN_TEMPLATE,
    "llama": LLAMA_TEMPLATE,
}

_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(template: str | None) -> bool:
    """Whether ``template`` marks assistant text with ``{% generation %}``."""
    return bool(template) and _GENERATION_RE.search(template) is not None


def get_chat_template(name: str) -> str:
    """Return the built-in template called ``name`` (``chatml_format``, ``qwen`` or ``llama``)."""
    return CHAT_TEMPLATES[check_choice("chat_template_name", name, sorted(CHAT_TEMPLATES))]


def resolve_chat_template(
    tokenizer: PreTrainedTokenizerBase | None = None,
    chat_template_name: str | None = None,
    chat_template: str | None = None,
) -> str:
    """Choose the template to render with.

    Order: an explicit ``chat_template``; a built-in by ``chat_template_name``; the tokenizer's
    own template when it already has generation markers; the built-in for the tokenizer's
    model family, guessed from its name as TorchRL does; the tokenizer's own template
    (assistant masks then come from character offsets) unless it is ChatML; ChatML.
    """
    if chat_template is not None:
        return check_str("chat_template", chat_template)
    if chat_template_name is not None:
        return get_chat_template(chat_template_name)
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and has_generation_markers(own):
        return own
    name = str(getattr(tokenizer, "name_or_path", "") or "").lower()
    family = next((family for family in ("qwen", "llama") if family in name), None)
    if family is not None:
        return CHAT_TEMPLATES[family]
    if isinstance(own, str) and own and "<|im_start|>" not in own:
        return own
    return CHATML_TEMPLATE
