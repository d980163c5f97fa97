"""Weights for a vLLM server that follows a trainer: ``export_model`` writes the folder the
server starts from, ``write_weights`` the new weights after an update, for
``VLLMSampler.update_weights`` to load in place.

The folder's ``config.json`` unties the output embedding from the input one, and the weights
hold both: vLLM 0.32 reloads weights layer by layer and leaves a tied ``lm_head`` with its old
values (measured: log-probs 0.2 off after a reload), while an untied one is reloaded like any
other layer (within 3e-5 of the trainer's own forward in fp32).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from llm_gym.lm.lora import is_lora, merged_weights, unwrapped

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["WEIGHTS_FILE", "export_model", "served_tensors", "write_weights"]

WEIGHTS_FILE = "model.safetensors"


def served_tensors(
    model: PreTrainedModel, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The tensors ``write_weights`` sends a server: the sampling model's weights by name
    (``weights``: a sharded model's, gathered whole on the CPU; None: the model's own)."""
    # Own storage for every tensor (safetensors refuses shared ones), on the CPU, the output
    # embedding included even when the model ties it to the input one; a LoRA model's
    # adapters merged (what the server samples with is the model being trained).
    if weights is not None:  # a tied output layer's name shares its tensor: copied
        seen: set[int] = set()
        tensors = {}
        for name, tensor in weights.items():
            tensors[name] = tensor.clone() if id(tensor) in seen else tensor.contiguous()
            seen.add(id(tensor))
        return tensors
    if is_lora(model):
        tensors = merged_weights(model)
        model = unwrapped(model)
        head = model.get_output_embeddings()
        name = next(n for n, m in model.named_modules() if m is head) + ".weight"
        tensors.setdefault(name, head.weight.detach().to("cpu", copy=True))
        return {k: v.contiguous() for k, v in tensors.items()}
    tensors = {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in model.state_dict().items()
    }
    head = model.get_output_embeddings()
    if head is not None:
        name = next(n for n, m in model.named_modules() if m is head) + ".weight"
        tensors.setdefault(name, head.weight.detach().to("cpu", copy=True).contiguous())
    return tensors


def write_weights(
    model: PreTrainedModel,
    folder: str | os.PathLike[str],
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """``model``'s weights (``served_tensors``'s) into ``folder``'s ``model.safetensors``
    (written aside, then renamed: a server never reads half a file); its path."""
    path = Path(folder) / WEIGHTS_FILE
    partial = path.with_name(WEIGHTS_FILE + ".partial")
    save_file(served_tensors(model, weights), partial, metadata={"format": "pt"})
    os.replace(partial, path)
    return path


def export_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: str | os.PathLike[str]
) -> Path:
    """``folder`` made a model folder vLLM serves: ``model``'s config with the embeddings
    untied, its weights and ``tokenizer``; the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = unwrapped(model).config.to_dict()
    config["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if getattr(unwrapped(model), "generation_config", None) is not None:
        unwrapped(model).generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_weights(model, folder)
    return folder
