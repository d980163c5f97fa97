"""The transformers generation backend: ``model.generate`` with the log-probs of the sampled
tokens under the raw logits, and its settings checked before any generation. The policy over it
is ``llm_gym.policies.TransformersPolicy`` (a ``Sampler`` and a ``Scorer``); TorchRL's
``RolloutFromModel`` generates through it too. The vLLM and OpenAI-compatible backends are
``vllm`` and ``openai`` beside this file."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from llm_gym.checks import check_int
from llm_gym.lm.tensors import gather_log_probs

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "generate_with_log_probs", "generation_settings"]

DEFAULT_MAX_NEW_TOKENS = 256
_GENERATE_ALIASES = {"max_tokens": "max_new_tokens", "n": "num_return_sequences"}
_RESERVED = {
    "return_dict_in_generate": "the policy always asks for a dict output",
    "output_logits": "the policy reads raw logits itself (set return_log_probs instead)",
    "output_scores": "log-probs come from raw logits, not processed scores",
    "output_attentions": "the policy returns Responses, not model internals",
    "output_hidden_states": "the policy returns Responses, not model internals",
    "stop_strings": "a response's length is read from its EOS token; a stop string leaves none",
}


def generation_settings(
    model: PreTrainedModel,
    generate_kwargs: Mapping[str, Any] | None,
    num_samples: int | None,
    generate: bool,
) -> tuple[dict[str, Any], int | None]:
    """Checked ``generate`` kwargs (aliases resolved) and the number of samples per prompt.

    Unknown keys, aliases given twice and settings that would break the log-probs fail here,
    with a message naming the key, not deep inside ``model.generate``.
    """
    if generate_kwargs is not None and not isinstance(generate_kwargs, Mapping):
        raise TypeError(
            f"generate_kwargs must be a dict or None, got {type(generate_kwargs).__name__}"
        )
    kwargs: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in (generate_kwargs or {}).items():
        name = _GENERATE_ALIASES.get(key, key)
        if name in kwargs:
            raise ValueError(
                f"generate_kwargs gives both {given_as[name]!r} and {key!r}, which set {name!r}"
            )
        kwargs[name], given_as[name] = value, key
    unknown = sorted(set(kwargs) - _valid_keys())
    if unknown:
        raise ValueError(
            f"generate_kwargs has unknown keys {unknown}: expected GenerationConfig attributes "
            f"or the aliases {sorted(_GENERATE_ALIASES)}"
        )
    for key, why in _RESERVED.items():
        if key in kwargs:
            raise ValueError(f"generate_kwargs may not set {key!r}: {why}")
    for key in ("max_new_tokens", "min_new_tokens", "max_length"):
        if kwargs.get(key) is not None:
            check_int(f"generate_kwargs[{key!r}]", kwargs[key], 1)
    if kwargs.get("num_beams", 1) != 1:
        raise ValueError(
            f"generate_kwargs['num_beams'] must be 1, got {kwargs['num_beams']}: beam search "
            "reorders sequences, so per-step logits no longer give each sequence's log-probs"
        )
    num_samples = check_int("num_samples", num_samples, 1, optional=True)
    if num_samples is not None and not generate:
        raise ValueError("num_samples applies to generate mode, got it with generate=False")
    n = kwargs.pop("num_return_sequences", None)
    if not generate:  # the kwargs are kept for get_new_version(generate=True)
        return kwargs, None
    if n is not None and num_samples is not None and n != num_samples:
        raise ValueError(f"num_samples={num_samples} differs from generate_kwargs n={n}")
    if num_samples is None and n is not None and n > 1:
        num_samples = n
    if num_samples is not None:
        do_sample = kwargs.get("do_sample", model.generation_config.do_sample)
        if num_samples > 1 and not do_sample:
            raise ValueError(
                f"num_samples={num_samples} needs sampling: set generate_kwargs['do_sample']=True "
                "(greedy decoding gives the same response every time)"
            )
        kwargs["num_return_sequences"] = num_samples
    if "max_length" not in kwargs and model.generation_config.max_new_tokens is None:
        kwargs.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    return kwargs, num_samples


@functools.cache
def _valid_keys() -> frozenset[str]:
    # transformers is imported on first use: this layer is torch-only at import time.
    from transformers import GenerationConfig

    return frozenset(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"}


def generate_with_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    log_probs: bool = True,
    **generate_kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model.generate`` from left-padded prompts ``(B, L)``: the new tokens ``(B, N)`` and
    float32 log π of each under the raw logits, before temperature, top-k/top-p or penalties
    (None with ``log_probs=False``, which keeps no logits)."""
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        return_dict_in_generate=True,
        output_logits=log_probs,
        **generate_kwargs,
    )
    new = out.sequences[:, input_ids.shape[1] :]
    if not log_probs:
        return new, None
    # One gather per step: log-softmax over a stacked (B, N, V) tensor would copy the logits.
    log_probs = torch.empty(new.shape, dtype=torch.float32, device=new.device)
    for step, logits in enumerate(out.logits):
        log_probs[:, step] = gather_log_probs(logits, new[:, step])
    return new, log_probs
