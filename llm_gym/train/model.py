"""The model a run trains and the frozen reference its KL terms compare against: loaded by
name (or a checkpoint's weights, or a given object), with LoRA's adapters and activation
checkpointing as the config asks."""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.lm.loading import load_model
from llm_gym.lm.lora import AdapterDisabled, is_lora, load_lora, unwrapped, with_lora
from llm_gym.policies import TransformersPolicy
from llm_gym.run.budget import check_run
from llm_gym.run.setup import dtype_name, reference_scorer
from llm_gym.train.config import GRPOConfig
from llm_gym.train.sharding import Processes
from llm_gym.train.update import PRECISION_WEIGHTS, resolve_precision

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.samplers import Scorer

__all__ = [
    "CallersModel",
    "check_given_model",
    "check_objects_run",
    "check_memory",
    "training_precision",
    "enable_checkpointing",
    "frozen_reference",
    "trained_model",
]


def check_given_model(config: GRPOConfig, model: Any, tokenizer: Any, world: int) -> None:
    """What a library run's ``model`` and ``tokenizer`` objects (None: not given) allow with
    ``config`` across ``world`` processes: a trainable torch model in float32 or bfloat16
    and its tokenizer, together, in a new run of one process."""
    if (model is None) != (tokenizer is None):
        given, missing = ("model", "tokenizer") if tokenizer is None else ("tokenizer", "model")
        raise ValueError(
            f"{given} was given without its {missing}: pass a model object and its "
            "tokenizer together, or neither (config.model names the model)"
        )
    if model is None:
        return
    import torch
    from transformers import PreTrainedTokenizerBase

    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module (a transformers or peft model), got "
            f"{type(model).__name__}"
        )
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise TypeError(
            f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "model has no parameter that requires grad, so nothing would train: "
            "unfreeze it (model.requires_grad_(True)) or give a peft model with adapters"
        )
    weights = next(model.parameters()).dtype
    if weights == torch.float16:  # no loss scaling here: its gradients would underflow
        raise ValueError(
            "model holds float16 weights, which train only with loss scaling (not "
            "done here): give it in bfloat16 or float32 (model.to(torch.bfloat16))"
        )
    # Weights below float32 sample, score and train in their own dtype.
    if weights != torch.float32 and config.dtype not in ("auto", str(weights)[6:]):
        raise ValueError(
            f"dtype={config.dtype!r} asks another dtype than the model's {weights}, "
            "which samples and scores in its own: pass dtype='auto' or cast the "
            "model (model.float() for float32)"
        )
    check_objects_run(config, world)


def check_objects_run(config: GRPOConfig, world: int) -> None:
    """What a run given a model or env object is: a new run (nothing to resume into) of one
    process, ``world`` being the run's."""
    if config.resume:
        raise ValueError(
            "resume reloads a run from its folder by name; a model or env object cannot "
            "be resumed into: resume with GRPOTrainer(resumed_config(out))"
        )
    if world > 1:
        raise ValueError(
            f"a run across {world} processes does not go with a model or env object yet: "
            "run it in one process"
        )


def training_precision(
    config: GRPOConfig, given: PreTrainedModel | None, processes: Processes
) -> tuple[torch.device, str, torch.dtype]:
    """Where and in what a run trains, resolved once: the device, the update's precision
    (``config.precision`` with "auto" resolved) and the trained weights' dtype. A ``given``
    model trains on its own device in its own dtype; else the process's device in the
    precision's dtype, the run's memory checked before anything allocates."""
    if given is not None:
        parameter = next(given.parameters())
        device, dtype = parameter.device, parameter.dtype
        return device, resolve_precision(config.precision, device, dtype), dtype
    device = processes.device
    precision = resolve_precision(config.precision, device)
    dtype = PRECISION_WEIGHTS[precision]
    check_memory(config, device, dtype, processes)
    return device, precision, dtype


def trained_model(
    config: GRPOConfig,
    given: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase | None,
    checkpoint: Path | None,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model that trains and its tokenizer: ``given`` (with adapters if
    ``config.lora_rank``), else ``config.model`` loaded on ``device`` in ``dtype`` (a resumed
    run's ``checkpoint``: its weights, or its adapters over the base model)."""
    if given is not None:
        if config.lora_rank and is_lora(given):
            raise ValueError(
                f"model is a peft model already, and lora_rank={config.lora_rank} would wrap "
                "it again: leave lora_rank 0 (its adapters train)"
            )
        model = _adapted(given, config) if config.lora_rank else given
    elif config.lora_rank:  # the base model, frozen, with adapters that train
        base, tokenizer = load_model(config.model, device=device, dtype=dtype)
        if checkpoint:
            model = load_lora(base, checkpoint, trainable=True)
        else:
            model = _adapted(base, config)
        # What the adapter checkpoints name as their base: --model, not its cache folder.
        model.peft_config["default"].base_model_name_or_path = config.model
    else:
        model, tokenizer = load_model(checkpoint or config.model, device=device, dtype=dtype)
    if config.gradient_checkpointing is not False:
        enable_checkpointing(model)
    return model, tokenizer


@dataclasses.dataclass
class CallersModel:
    """What a run switches on a model object its caller gave (activation checkpointing, the
    attention packing swaps in, train or eval mode), as it was, to switch back when the run
    ends: the caller's model keeps the trained weights and nothing else of the run. LoRA's
    adapters, which a run with ``lora_rank`` injects into the caller's model, stay."""

    model: PreTrainedModel
    checkpointing: bool
    attention: str | None
    training: bool

    @classmethod
    def of(cls, model: PreTrainedModel) -> CallersModel:
        """``model``'s switches now."""
        inner = unwrapped(model)
        return cls(
            model, bool(getattr(inner, "is_gradient_checkpointing", False)),
            getattr(inner.config, "_attn_implementation", None), model.training,
        )  # fmt: skip

    def restore(self) -> None:
        """Switch the model back to what ``of`` saw."""
        inner = unwrapped(self.model)
        if getattr(inner, "is_gradient_checkpointing", False) and not self.checkpointing:
            inner.gradient_checkpointing_disable()
        if self.attention is not None and inner.config._attn_implementation != self.attention:
            inner.set_attn_implementation(self.attention)
        self.model.train(self.training)


def _adapted(model: PreTrainedModel, config: GRPOConfig) -> PreTrainedModel:
    # Adapters that train over the frozen model.
    return with_lora(
        model, config.lora_rank, alpha=config.lora_alpha, dropout=config.lora_dropout,
        target_modules=config.lora_target_modules,
    )  # fmt: skip


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Activation checkpointing on ``model``'s layers (their inputs kept, the rest recomputed
    in the backward), non-reentrant; in force while the layers are in train mode."""
    model = unwrapped(model)
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5's name
    if enable is None:
        enable = model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


def frozen_reference(
    config: GRPOConfig,
    model: PreTrainedModel,
    scorer: TransformersPolicy,
    *,
    given: bool,
    weights_dtype: torch.dtype,
    device: torch.device,
) -> Scorer | None:
    """The starting model, frozen, for the KL penalty and the KL term in the loss (None when
    neither is asked for): with LoRA the trained model itself with its adapter disabled (no
    copy); a given model's copy; else ``config.model`` loaded again on the trained model's
    ``device`` in its ``weights_dtype``, so that its log-probs start equal to the policy's."""
    if not (config.kl_coef > 0 or config.kl_loss_coef > 0):
        return None
    if is_lora(model):
        return AdapterDisabled(scorer)
    if given:
        frozen = copy.deepcopy(model).requires_grad_(False).eval()
        return TransformersPolicy(
            frozen, scorer.tokenizer, input_mode="tokens", generate=False,
            compute_dtype=scorer.compute_dtype,
        )  # fmt: skip
    local = dataclasses.replace(config, ray_address=None)  # the trainer's own, not an actor
    return reference_scorer(local, config.model, weights_dtype=weights_dtype, device=device)


def check_memory(
    config: GRPOConfig, device: torch.device, dtype: torch.dtype, processes: Processes
) -> None:
    """That the run fits ``device``'s memory before anything is allocated: a sub-env per
    response, each generating up to ``max_new_tokens`` a turn; across processes each one's
    groups and its slice of the trained weights."""
    tokens, batch = config.max_response_tokens + 1, processes.num_envs
    batches = [("--minibatch-size", min(config.minibatch_size, batch), tokens, True)]
    if config.backend == "transformers":  # else a server generates, in its own memory
        batches.append(("--groups × --group-size", batch, tokens, False))
    if config.eval_episodes:
        batches.append(("--eval-episodes", min(32, config.eval_episodes), tokens, False))
    sampling_copy = config.asynchronous and config.backend == "transformers"
    copies = 1 + (config.kl_coef > 0 or config.kl_loss_coef > 0) + sampling_copy
    records = ("--eval-episodes", config.eval_episodes) if config.eval_episodes else None
    shards = (processes.world, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    check_run(config, device, batches, records, copies, True, dtype_name(dtype), shards)
