"""LoRA through ``peft``: a model with trainable low-rank adapters (``with_lora``), its weights
merged for a server (``merged_weights``), and the adapter checkpoints a run saves
(``save_adapter``) loaded again, for training on (``load_lora``) or as a plain model
(``load_model`` merges them).

The reference model of a KL penalty comes for free: the same model with its adapter disabled
(``AdapterDisabled``), so a LoRA run holds one copy of the base weights, not two.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "ADAPTER_CONFIG",
    "AdapterDisabled",
    "adapter_base",
    "is_adapter_folder",
    "is_lora",
    "load_lora",
    "merged_weights",
    "save_adapter",
    "unwrapped",
    "with_lora",
]

ADAPTER_CONFIG = "adapter_config.json"  # what peft's save_pretrained writes beside the adapter


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` model (its adapters are what trains)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def unwrapped(model: Any) -> Any:
    """The transformers model under a ``peft`` wrapper (its LoRA layers in place), else
    ``model``."""
    return model.get_base_model() if is_lora(model) else model


def is_adapter_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder of LoRA adapter weights (a LoRA run's checkpoint)."""
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | os.PathLike[str]) -> str:
    """The base model an adapter folder was trained on ('default' or a folder)."""
    path = Path(folder).expanduser() / ADAPTER_CONFIG
    try:
        base = json.loads(path.read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a readable peft adapter config ({error})") from None
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path} names no base model (base_model_name_or_path: {base!r})")
    return base


def with_lora(
    model: PreTrainedModel,
    rank: int,
    *,
    alpha: float | None = None,
    dropout: float = 0.0,
    target_modules: Sequence[str] | str | None = None,
) -> Any:
    """``model`` with LoRA adapters of ``rank`` (peft's ``get_peft_model``): only they train.
    ``alpha`` defaults to ``2 · rank``; ``target_modules`` to peft's for the model's family
    (``q_proj``, ``v_proj`` for Llama and Qwen2), or ``"all-linear"``, or a list of names.
    In eval mode, as every model here is until its update switches it (peft makes the
    adapters' ``dropout`` modules in train mode, which sampling would run through)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank if alpha is None else alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules) if isinstance(target_modules, list) else target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config).eval()


def load_lora(base: PreTrainedModel, folder: str | os.PathLike[str], *, trainable: bool) -> Any:
    """``base`` with the adapter saved in ``folder``: trainable (a resumed LoRA run) or
    merged into a plain model (``trainable=False``: what ``--model`` of a LoRA checkpoint
    loads). In eval mode either way: peft leaves a trainable adapter in train mode, whose
    ``dropout`` a resumed run would sample through where the uninterrupted one did not."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, Path(folder).expanduser(), is_trainable=trainable)
    return (model if trainable else model.merge_and_unload()).eval()


def save_adapter(model: Any, folder: str | os.PathLike[str], base: str) -> None:
    """``model``'s adapter weights into ``folder`` (peft's files), naming ``base`` (the run's
    ``--model``: 'default' or a folder) as the model to load them onto."""
    model.save_pretrained(folder, safe_serialization=True)
    path = Path(folder) / ADAPTER_CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base  # not the cache folder 'default' resolved to
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def merged_weights(model: Any) -> dict[str, torch.Tensor]:
    """The base model's weights with every LoRA update added (``W + scale · B A``), named as
    the base model names them, on the CPU; ``model`` is left as it is (peft's own merge
    changes the weights in place, and unmerging does not give them back bit for bit)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            delta = sum(
                module.get_delta_weight(adapter)
                for adapter in module.active_adapters
                if adapter in module.lora_A
            )
            deltas[f"{name}.weight"] = delta
    weights = {}
    with torch.no_grad():
        for name, tensor in base.state_dict().items():
            if ".lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            value = tensor.detach().to("cpu", copy=True)
            if name in deltas:
                value += deltas[name].to("cpu", value.dtype)
            weights[name] = value
    return weights


class AdapterDisabled:
    """A scorer (``llm_gym.samplers.Scorer``) of a LoRA model with its adapter disabled: the
    base model, for a KL penalty's reference, without a second copy of its weights. Every
    call of ``scorer`` runs inside peft's ``disable_adapter()``."""

    generate = False

    def __init__(self, scorer: Any) -> None:
        model = getattr(scorer, "model", None)
        if not is_lora(model):
            raise TypeError(f"scorer must score a peft (LoRA) model, got {type(model).__name__}")
        self.scorer, self.model = scorer, model
        self.input_mode = getattr(scorer, "input_mode", "history")
        self.pad_output = False

    @contextlib.contextmanager
    def _base(self) -> Iterator[None]:
        with self.model.disable_adapter():
            yield

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._base():
            return self.scorer(*args, **kwargs)

    def score(self, prompts: Any, responses: Any) -> Any:
        with self._base():
            return self.scorer.score(prompts, responses)
