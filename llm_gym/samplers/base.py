"""``Sampler`` and ``Scorer``: the protocols every generation backend implements (one file
each: ``TransformersSampler``, ``OpenAISampler``, ``VLLMSampler``), per-request
``SamplingSettings`` (``with_settings``), ``check_sampler`` and the token-id checks they share.
Sampled ids are used as sampled, never re-tokenized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llm_gym.chat.containers import LogProbs, Masks, Response, Tokens
from llm_gym.checks import ArgumentTypeError

__all__ = [
    "FINISH_REASONS",
    "LogProbOutput",
    "ConfigurableSampler",
    "Sample",
    "Sampler",
    "SamplingSettings",
    "Scorer",
    "check_sampler",
    "check_scorer",
    "check_token_batch",
    "check_token_ids",
    "is_scorer",
    "response_log_probs",
]

# Why sampling stopped: an end-of-sequence token ("stop") or the token budget ("length").
FINISH_REASONS = ("stop", "length")

# A response a scorer scores given its prompt: a ``Response`` (its exact tokens are scored),
# its text, or its 1-D ``int64`` token ids.
ScoredResponse = Response | str | np.ndarray


@dataclass(frozen=True)
class Sample:
    """One sampled response: ``tokens`` (``int64``, as sampled, the end-of-sequence token
    included when one was produced), ``log_probs`` (``float32``, one per token, from the
    model's raw logits; None from a sampler told not to compute them), ``finish_reason``
    (``"stop"`` iff the last token is an end-of-sequence token, else ``"length"``) and
    ``version`` (the policy version that sampled it; None where unknown)."""

    tokens: np.ndarray
    log_probs: np.ndarray | None
    finish_reason: str
    version: int | None = None


@runtime_checkable
class Sampler(Protocol):
    """Anything that samples responses to prompt token ids (token-in, token-out)."""

    version: int | None

    def sample(self, prompts: Sequence[np.ndarray]) -> list[Sample]:
        """One ``Sample`` per prompt (``k`` consecutive ones per prompt for ``k`` samples)."""
        ...


@dataclass(frozen=True)
class SamplingSettings:
    """Settings one request may change on a sampler (None: the sampler's own). Hashable, so
    that calls with equal settings can share a batch (``BatchingSampler``).

    ``temperature`` 0 is greedy; ``max_new_tokens`` is the token budget of each response;
    ``seed`` makes the call's draws reproducible (its own generator state, the global one
    kept)."""

    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None

    def overrides(self) -> dict[str, Any]:
        """The settings given, as ``with_settings`` keywords."""
        return {k: v for k, v in vars(self).items() if v is not None}

    def given(self) -> bool:
        """Whether any setting differs from the sampler's own."""
        return bool(self.overrides())


@runtime_checkable
class ConfigurableSampler(Sampler, Protocol):
    """A ``Sampler`` whose settings one call may change: ``with_settings`` returns a sampler
    like it (sharing its model or server, starting at its ``version``) with the given
    ``SamplingSettings`` fields changed; the sampler itself is left as it was."""

    def with_settings(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> Sampler:
        """A configured copy (None: keep this sampler's setting)."""
        ...


def check_sampler(sampler: object, name: str = "sampler") -> Sampler:
    """``sampler`` if it has ``sample(prompts) -> list[Sample]``, else a ``TypeError`` that
    names ``name``, what was expected and what came.

    >>> check_sampler("gpt2", "judge")
    Traceback (most recent call last):
    ...
    TypeError: judge must be a Sampler with sample(prompts) -> list[Sample] (llm_gym.samplers: \
TransformersSampler, VLLMSampler, OpenAISampler, or a TransformersPolicy), got str
    """
    if not callable(getattr(sampler, "sample", None)):
        raise TypeError(
            f"{name} must be a Sampler with sample(prompts) -> list[Sample] (llm_gym.samplers: "
            "TransformersSampler, VLLMSampler, OpenAISampler, or a TransformersPolicy), got "
            f"{type(sampler).__name__}"
        )
    return sampler  # type: ignore[return-value]


@dataclass
class LogProbOutput:
    """What a scorer's call returns for one conversation (or a batch with ``pad_output``).

    - ``input_ids``: the token ids that were scored, ``(T,)``; ``(B, T)`` left-padded.
    - ``log_probs``: ``full[t] = log π(input_ids[t] | input_ids[:t])`` (0.0 at the first token
      and padding, as ``llm_gym.lm`` says); ``prompt`` and ``response`` split ``full`` where
      the response starts (None if unknown or padded).
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
    """Anything that scores responses: token-level ``score`` and the observation-level call
    (``generate = False``), which the wrappers and rollouts use (see ``is_scorer``). A scorer
    may have ``input_mode`` (the observation key it reads) and ``pad_output`` (must be False).
    """

    generate: bool

    def __call__(
        self,
        obs: Mapping[str, Any],
        responses: ScoredResponse | Sequence[ScoredResponse] | None = None,
        *,
        response_only: bool = False,
    ) -> LogProbOutput | list[LogProbOutput]:
        """One ``LogProbOutput`` per conversation of ``obs`` (+ ``responses``); with
        ``response_only`` only ``log_probs.response`` need be set."""
        ...

    def score(
        self, prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """``float32`` log-probs of each response's tokens given its prompt."""
        ...


def is_scorer(model: object) -> bool:
    """Whether the wrappers can call ``model`` as a scorer: callable with ``generate`` False (a
    transformers model is not: its ``generate`` is a method)."""
    return callable(model) and getattr(model, "generate", None) is False


def check_scorer(model: object, argument: str) -> Scorer:
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
    scorer: Scorer,
    obs: Mapping[str, Any],
    responses: list[ScoredResponse],
    *,
    batched: bool,
    assistant_only: bool = True,
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


def check_token_ids(name: str, value: object, vocab_size: int | None = None) -> np.ndarray:
    """``value`` as a 1-D ``int64`` array of token ids, each in ``[0, vocab_size)`` when given.

    >>> check_token_ids("p", [5, 9], vocab_size=8)
    Traceback (most recent call last):
    ...
    ValueError: p: token ids must lie in [0, 8) (the model's vocabulary), got ids from 5 to 9
    """
    array = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if array is None or array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        got = type(value).__name__
        if array is not None:
            got = f"array of dtype {array.dtype} and shape {array.shape}"
        elif isinstance(value, (list, tuple)) and value:
            got = f"{got} of {type(value[0]).__name__}"
        raise ArgumentTypeError(f"{name} must be a 1-D int64 array of token ids, got {got}")
    array = array.astype(np.int64, copy=False)
    if vocab_size is not None and array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(
            f"{name}: token ids must lie in [0, {vocab_size}) (the model's vocabulary), got ids "
            f"from {int(array.min())} to {int(array.max())}"
        )
    return array


def check_token_batch(
    name: str, values: object, vocab_size: int | None = None, *, min_length: int = 0
) -> list[np.ndarray]:
    """``values`` (a list or tuple of token-id sequences) as a list of ``check_token_ids``
    arrays of at least ``min_length`` tokens each."""
    if not isinstance(values, (list, tuple)):
        raise ArgumentTypeError(
            f"{name} must be a list of 1-D int64 arrays of token ids (one per sequence), got "
            f"{type(values).__name__}"
        )
    arrays = [check_token_ids(f"{name}[{i}]", v, vocab_size) for i, v in enumerate(values)]
    for i, array in enumerate(arrays):
        if len(array) < min_length:
            raise ValueError(
                f"{name}[{i}] must hold at least {min_length} token(s), got {len(array)}"
            )
    return arrays
