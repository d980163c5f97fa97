"""Shared fixtures: real tokenizers and models, loaded once per test session."""

import os
from pathlib import Path

import pytest

# The real GSM8K files sit in ../shared beside the clone; the package reads the same variable.
_SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
if _SHARED_GSM8K.is_dir():
    os.environ.setdefault("LLM_GYM_GSM8K_PATH", str(_SHARED_GSM8K))
GSM8K_PATH = Path(os.environ.get("LLM_GYM_GSM8K_PATH", _SHARED_GSM8K))


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from llm_gym.models import load_gpt2_tokenizer

    return load_gpt2_tokenizer()


@pytest.fixture(scope="session")
def default_model():
    """SmolLM2-135M-Instruct and its tokenizer (converted from the GGUF once, then cached)."""
    from llm_gym.models import load_default_model

    return load_default_model()


@pytest.fixture(scope="session")
def smollm2_tokenizer(default_model):
    return default_model[1]
