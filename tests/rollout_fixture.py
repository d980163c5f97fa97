"""What the RolloutFromModel tests share: a tiny vocabulary, batches, rewards and plain
forward passes to compare against."""

import numpy as np
import pytest
import torch

from llm_gym.lm.loading import tiny_model
from llm_gym.wrappers.controllers import ConstantKLController

VOCAB = 32
EOS = PAD = VOCAB - 1  # tiny_model's default: bos = eos = pad = the last id, far from 50256
M = 6


def length_reward(input_ids, attention_mask):
    """Scores a sequence by its number of real tokens, so the tests can tell what it saw."""
    return attention_mask.sum(-1).float()


class RecordingController(ConstantKLController):
    """A constant coefficient that keeps the KL rewards each update was given."""

    def update(self, kl_values):
        self.seen = list(kl_values)
        return super().update(kl_values)


def constant_reward(score):
    return lambda input_ids, attention_mask: torch.full((input_ids.shape[0],), score)


def make_batch():
    """Three right-padded rows: prompt + reference label, prompts of 4, 3 and 2 tokens."""
    input_ids = torch.tensor(
        [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, PAD, PAD], [11, 12, 13, PAD, PAD, PAD]]
    )
    attention_mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "prompt_rindex": [4, 3, 2]}


def plain_log_probs(model, prompt, response):
    """log π(response | prompt) from one unpadded forward pass."""
    ids = torch.as_tensor(np.concatenate([prompt, response]))[None]
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    log_probs = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return log_probs[len(prompt) - 1 :]


def rows(out):
    """Per row: the number of real steps (the response length)."""
    return out["mask"].sum(1).tolist()


@pytest.fixture(scope="module")
def model():
    """The policy: a tiny random LM over ``VOCAB`` tokens."""
    return tiny_model(vocab_size=VOCAB)


@pytest.fixture(scope="module")
def ref_model():
    """The reference: another tiny random LM (seed 1)."""
    return tiny_model(vocab_size=VOCAB, seed=1)
