"""What the TransformersPolicy tests share: chat observations and an independent oracle."""

import numpy as np
import torch

from llm_gym import ChatEnv

__all__ = ["QUERIES", "SYSTEM", "chat_obs", "oracle_log_probs"]

SYSTEM = "You are a helpful assistant."
QUERIES = ["What is 2+2?", "Name a colour of the sky on a clear day, in one word please."]


def oracle_log_probs(model, prompt_ids, response_ids):
    """log π(response | prompt) from one plain, unpadded forward pass: log_softmax + gather."""
    ids = torch.as_tensor(np.concatenate([prompt_ids, response_ids]))[None]
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    log_probs = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return log_probs[len(prompt_ids) - 1 :].numpy()


def chat_obs(*queries, tokenizer=None, history_only=True):
    """A batched observation of [system, user] conversations, with their prompt tokens."""
    keys = ("history",) if history_only else ("history", "text", "tokens")
    envs = [
        ChatEnv(tokenizer=tokenizer, system_prompt=SYSTEM, observation_keys=keys) for _ in queries
    ]
    observations = [
        env.reset(options={"query": q})[0] for env, q in zip(envs, queries, strict=True)
    ]
    return {key: tuple(o[key] for o in observations) for key in keys}
