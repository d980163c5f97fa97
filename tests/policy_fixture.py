"""What the policy tests share: chat observations, an independent oracle, a scripted policy."""

import numpy as np
import torch

from llm_gym import ChatEnv
from llm_gym.chat import Response

__all__ = ["QUERIES", "SYSTEM", "chat_obs", "oracle_log_probs", "scripted_policy"]

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


def scripted_policy(tok, answer):
    """A sampler whose responses are ``answer(i, prompt_text)`` for each sub-env ``i`` of a
    tokens observation, each ended by the end-of-sequence token."""

    def policy(batch):
        texts = [answer(i, tok.decode(p)) for i, p in enumerate(batch["tokens"])]
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        return [Response(t, np.array(i)) for t, i in zip(texts, ids, strict=True)]

    return policy
