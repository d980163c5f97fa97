"""Chat data model: the ``Conversation`` record of an episode and the ``PromptBuilder`` that
extends it, ``History``, chat templates, policy containers, batched tokenizing (``TokenCodec``)."""

from llm_gym.chat.codec import END_OF_TURN, TokenCodec
from llm_gym.chat.containers import ChatHistory, LogProbs, Masks, Response, Text, Tokens
from llm_gym.chat.conversation import Conversation, PromptBuilder, TokenPrefixError
from llm_gym.chat.history import History, Message
from llm_gym.chat.templates import (
    CHAT_TEMPLATES,
    CHATML_TEMPLATE,
    LLAMA_TEMPLATE,
    QWEN_TEMPLATE,
    get_chat_template,
    resolve_chat_template,
)

__all__ = [
    "Conversation",
    "PromptBuilder",
    "TokenPrefixError",
    "History",
    "Message",
    "Response",
    "Text",
    "Tokens",
    "Masks",
    "LogProbs",
    "ChatHistory",
    "CHAT_TEMPLATES",
    "CHATML_TEMPLATE",
    "QWEN_TEMPLATE",
    "LLAMA_TEMPLATE",
    "get_chat_template",
    "resolve_chat_template",
    "END_OF_TURN",
    "TokenCodec",
]
