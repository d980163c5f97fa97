"""``Policy``: what every driver calls to act in llm_gym's envs, whatever its backend, and
``Action``: the assistant's turn as a chat env's step takes it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llm_gym.chat.containers import Response

__all__ = ["Policy"]

# The assistant's turn as a chat env's step takes it (ChatEnv's Action Space): a ``Response``
# (what the policies return), its text, its 1-D ``int64`` token ids, or a dict with a ``"text"``
# key (and optional ``tokens``, ``log_probs``, ``version``).
Action = Response | str | np.ndarray | Mapping[str, Any]


@runtime_checkable
class Policy(Protocol):
    """Observations in, the assistant's turns out, sampled ids kept (token-in/token-out).

    Called with one env's observation dict, it returns one ``Response``; with a vector env's
    batched observation (each key a tuple or array of N entries) it returns N ``Response``s.
    ``TransformersPolicy`` (generate mode) and ``SamplerPolicy`` (any ``Sampler``) are
    policies; so is any callable with this shape (a scripted policy in tests).
    """

    def __call__(self, obs: Mapping[str, Any]) -> Response | Sequence[Response]: ...
