"""The language-model tensor work every other package shares, in torch alone.

Left padding and positions (``padding``), per-token log-probs of a forward pass
(``log_probs``), and generation settings and EOS lengths (``generation``). Nothing here knows
of envs, chats or policies: tensors in, tensors out, on the device of the tensors given.

>>> import torch
>>> from llm_gym.lm import left_pad, position_ids
>>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0, device=torch.device("cpu"))
>>> ids.tolist(), position_ids(mask).tolist()
([[5, 6, 7], [0, 0, 8]], [[0, 1, 2], [0, 0, 0]])
"""

from llm_gym.lm.generation import first_eos_lengths, first_id, generation_settings
from llm_gym.lm.log_probs import (
    forward_logits,
    gather_log_probs,
    has_prefix,
    keeps_logits,
    log_probs_of,
    next_token_log_probs,
    token_log_probs,
)
from llm_gym.lm.padding import left_pad, position_ids

__all__ = [
    "first_eos_lengths",
    "first_id",
    "forward_logits",
    "gather_log_probs",
    "generation_settings",
    "has_prefix",
    "keeps_logits",
    "left_pad",
    "log_probs_of",
    "next_token_log_probs",
    "position_ids",
    "token_log_probs",
]
