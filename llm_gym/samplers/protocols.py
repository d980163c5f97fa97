"""The sampler and scorer protocols: how envs' token ids become responses, and how wrappers,
rollouts and trainers get the log-probs of given responses.

A sampler takes prompt token ids and returns, per prompt, the new token ids exactly as sampled
(never re-tokenized from text), their log-probs, why sampling stopped and the policy version
that sampled them::

    sampler.sample(prompts: Sequence[np.ndarray]) -> list[Sample]

Every backend (transformers here; vLLM and OpenAI-compatible servers beside it) is one file
that implements it.

A scorer maps a prompt observation (or a vector env's batch of them) and the responses to
score to one ``LogProbOutput`` per response::

    scorer(obs, responses, response_only=True) -> LogProbOutput | list[LogProbOutput]

``TransformersPolicy(..., generate=False)`` is one; ``llm_gym.distributed.RayLogProbModel``
is another. ``response_only=True`` asks for the response's log-probs alone
(``log_probs.response``; ``prompt`` and ``full`` may then be None), which skips the
vocabulary projection over the prompt. A scorer says it scores with ``generate = False``
(a policy in generate mode has the same call but samples instead), and may have
``input_mode`` (the observation key it reads) and ``pad_output`` (must be False here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llm_gym.chat.containers import LogProbs, Masks, Tokens

__all__ = [
    "FINISH_REASONS",
    "LogProbOutput",
    "Sample",
    "Sampler",
    "Scorer",
    "check_scorer",
    "is_scorer",
    "response_log_probs",
]

# Why sampling stopped: an end-of-sequence token ("stop") or the token budget ("length").
FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Sample:
    """One sampled response: ``tokens`` (``int64``, as sampled, the end-of-sequence token
    included when one was produced), ``log_probs`` (``float32``, one per token, from the
    model's raw logits), ``finish_reason`` (one of ``FINISH_REASONS``) and ``version`` (the
    policy version that sampled it; None where unknown)."""

    tokens: np.ndarray
    log_probs: np.ndarray
    finish_reason: str
    version: int | None = None


@runtime_checkable
class Sampler(Protocol):
    """Anything that samples responses to prompt token ids (token-in, token-out)."""

    version: int | None

    def sample(self, prompts: Sequence[np.ndarray]) -> list[Sample]: ...


@dataclass
class LogProbOutput:
    """What a scorer returns for one conversation (or a whole batch with ``pad_output``).

    - ``input_ids``: the token ids that were scored, ``(T,)``; ``(B, T)`` left-padded.
    - ``log_probs``: ``full[t] = log π(input_ids[t] | input_ids[:t])``; the first token has no
      prefix and gets 0.0 (TorchRL's and vLLM's convention), as does padding. ``prompt`` and
      ``response`` split ``full`` where the response starts (None if unknown or padded).
    - ``masks``: ``all_attention_mask`` (True on real tokens) and ``all_assistant_mask`` (True
      on the assistant's tokens; None when the input does not say which they are).
    - ``tokens``: prompt/response/full ids (unpadded output only; None with ``pad_output``).
    """

    input_ids: np.ndarray
    log_probs: LogProbs
    masks: Masks
    tokens: Tokens | None = None


@runtime_checkable
class Scorer(Protocol):
    """Anything that scores responses: ``generate = False`` and this call."""

    generate: bool

    def __call__(
        self, obs: Any, responses: Any = None, *, response_only: bool = False
    ) -> LogProbOutput | list[LogProbOutput]: ...


def is_scorer(model: Any) -> bool:
    """Whether ``model`` follows the scorer protocol (a transformers model does not: its
    ``generate`` is a method, not False)."""
    return isinstance(model, Scorer) and model.generate is False


def check_scorer(model: Any, argument: str) -> Scorer:
    """``model`` if it can score responses one output per conversation, else a ``ValueError``
    that names ``argument``, what was expected and what came."""
    if not is_scorer(model):
        generate = getattr(model, "generate", None)
        mode = "generate mode" if generate is True else "not a scorer"
        raise ValueError(
            f"{argument} must score responses: a TransformersPolicy with generate=False (use "
            f"policy.get_new_version(generate=False)) or a RayLogProbModel; got "
            f"{type(model).__name__} in {mode}"
        )
    if getattr(model, "pad_output", False):
        raise ValueError(
            f"{argument} must return one unpadded output per conversation (pad_output=False), "
            "got pad_output=True"
        )
    return model


def response_log_probs(
    scorer: Scorer, obs: Any, responses: list[Any], *, batched: bool, assistant_only: bool = True
) -> list[np.ndarray]:
    """``float32`` log-probs of each response given its prompt, in one call of ``scorer``.

    ``obs`` is one observation (``responses`` then holds one response) or a vector env's
    batch. ``assistant_only``: the response's tokens only (asked for with
    ``response_only=True``); else every token of prompt plus response.
    """
    outputs = scorer(obs, responses if batched else responses[0], response_only=assistant_only)
    outputs = outputs if batched else [outputs]
    if len(outputs) != len(responses):
        raise ValueError(
            f"the scorer returned {len(outputs)} outputs for {len(responses)} responses: "
            "expected one LogProbOutput per response"
        )
    result = []
    for out in outputs:
        log_probs = out.log_probs.response if assistant_only else out.log_probs.full
        result.append(np.asarray(log_probs, dtype=np.float32))
    return result
