"""Alias of ``llm_gym.lm.loading`` (its home since the layout of issue 38): models and
tokenizers that load offline. New code imports from ``llm_gym.lm``."""

from llm_gym.lm.loading import (
    DEFAULT_MODEL_NAME,
    cache_root,
    load_default_model,
    load_gpt2_tokenizer,
    load_model,
    model_folder,
    tiny_model,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "cache_root",
    "load_default_model",
    "load_gpt2_tokenizer",
    "load_model",
    "model_folder",
    "tiny_model",
]
