"""What the gateway tests share: a sampling policy over the default model, a gateway in front
of it on loopback, and an OpenAI SDK client of it."""

import openai
import pytest

from llm_gym.agents import Gateway
from llm_gym.policies import TransformersPolicy

__all__ = ["QUESTION", "client", "gateway", "policy"]

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def policy(smol):
    model, tokenizer = smol
    kwargs = {"max_new_tokens": 12, "do_sample": True, "temperature": 1.0}
    return TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)


@pytest.fixture(scope="module")
def gateway(policy, smol):
    with Gateway(policy, smol[1], model_name="policy") as gateway:
        yield gateway


def client(gateway, key="agent", **options):
    """The official SDK on the gateway, its API key ``key`` (the caller's own)."""
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, **options)
