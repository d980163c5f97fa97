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
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from safetensors.torch import save_file

from llm_gym.lm.lora import is_lora, merged_weights, unwrapped

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.samplers.base import Sampler

__all__ = [
    "WEIGHTS_FILE",
    "LocalWeights",
    "ServedWeights",
    "WeightSync",
    "export_model",
    "served_tensors",
    "write_weights",
]

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


class WeightSync(Protocol):
    """How a trainer's sampler gets the weights of each update: ``publish(version)`` makes
    the sampler sample with the trained model's weights from now on, its samples marked
    ``version`` (``write=False``: the version alone, the weights being the sampler's
    already); ``seconds``: the last move's time (None where nothing moves)."""

    seconds: float | None

    def publish(self, version: int, *, write: bool = True) -> None:
        """The trained model's weights to the sampler, as ``version``."""
        ...


class LocalWeights:
    """The weight move of a sampler in this process: none when it samples with the trained
    model itself, a state-dict copy into ``sampling`` when that is a copy of it (sampling
    while the trained one updates)."""

    seconds = None

    def __init__(self, trained: torch.nn.Module, sampling: torch.nn.Module, sampler: Sampler):
        self.trained, self.sampling, self.sampler = trained, sampling, sampler

    def publish(self, version: int, *, write: bool = True) -> None:
        """Copy the weights if the sampler's model is a copy; mark its samples ``version``."""
        if write and self.sampling is not self.trained:
            self.sampling.load_state_dict(self.trained.state_dict())
        self.sampler.version = version


class ServedWeights:
    """The weight move of a server's sampler (``VLLMSampler``): the weights written into the
    served ``folder`` (``write_weights``), then loaded by the server in place. Across
    processes ``gather`` gives a sharded model's whole weights on the first process (None on
    the others), which alone writes (``lead``); ``barrier`` holds every process until the
    server has them."""

    def __init__(
        self,
        trained: PreTrainedModel,
        sampler: Sampler,
        folder: str | os.PathLike[str],
        *,
        lead: bool = True,
        gather: Callable[[PreTrainedModel], dict[str, torch.Tensor] | None] | None = None,
        barrier: Callable[[], None] = lambda: None,
    ) -> None:
        self.trained, self.sampler, self.folder = trained, sampler, Path(folder)
        self.lead, self.gather, self.barrier = lead, gather, barrier
        self.seconds: float | None = 0.0

    def publish(self, version: int, *, write: bool = True) -> None:
        """Write and load the weights (every process calls it); mark the samples ``version``."""
        if write:
            start = time.perf_counter()
            weights = self.gather(self.trained) if self.gather is not None else None
            if self.lead:
                path = write_weights(self.trained, self.folder, weights).parent
                self.sampler.update_weights(path, version=version)
            self.barrier()  # no process samples before the server has the new weights
            self.seconds = time.perf_counter() - start
        self.sampler.version = version
