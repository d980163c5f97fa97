"""The run's generation, one part of ``GRPOTrainer``: the policy that samples
(``config.backend``), how each update's weights reach it (``llm_gym.samplers.weights``),
its server to close, and the sub-envs' random streams."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.run.setup import make_policy
from llm_gym.samplers.transformers import SubEnvGenerators
from llm_gym.samplers.weights import LocalWeights, ServedWeights, WeightSync, export_model
from llm_gym.train.run_folder import SERVED_FOLDER
from llm_gym.train.sharding import Processes, barrier, broadcast_object, full_weights

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.policies.base import Policy
    from llm_gym.train.config import GRPOConfig

__all__ = ["Generation", "generation"]


@dataclass
class Generation:
    """What samples a run's episodes: the ``policy``, its ``weight_sync``, the ``server``
    (a served policy) to close or None, and the sub-envs' ``generators`` (None with
    ``--async``, whose sampler draws from its own)."""

    policy: Policy
    weight_sync: WeightSync
    server: Any
    generators: SubEnvGenerators | None


def generation(
    config: GRPOConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    processes: Processes,
    out: Path,
    compute_dtype: torch.dtype,
) -> Generation:
    """The sampling of a run training ``model``: the transformers backend samples with the
    model itself (``--async``: a copy that each update's weights are copied into), a served
    backend from a server of the weights exported to ``out/served``. Across processes, the
    first starts the vLLM server and the others sample from it."""
    lead, world = processes.lead, processes.world
    if config.backend == "transformers":
        # --async: a copy samples while this one trains (in eval mode: no dropout)
        sampler = copy.deepcopy(model).eval() if config.asynchronous else model
        policy = make_policy(
            sampler, tokenizer, config, compute_dtype=compute_dtype, device=processes.device
        )
        weight_sync: WeightSync = LocalWeights(model, sampler, policy)
        server = None
    else:
        folder = out / SERVED_FOLDER
        policy = None
        if lead:  # the weights training starts from
            export_model(model, tokenizer, folder)
            policy = make_policy(
                model, tokenizer, config, served=folder, compute_dtype=compute_dtype,
                device=processes.device,
            )  # fmt: skip
        if world > 1:
            url = broadcast_object(policy.sampler.base_url if lead else None)
            policy = policy or make_policy(model, tokenizer, config, server=url)
        gather = full_weights if world > 1 else None
        weight_sync = ServedWeights(model, policy.sampler, folder, lead=lead, gather=gather,
                                barrier=barrier)  # fmt: skip
        server = policy
    # Each sub-env's own generator (see SubEnvGenerators); --async: the sampler's own.
    generators = None if config.asynchronous else SubEnvGenerators(config.seed, processes.first_env)
    policy.sub_env_generators = generators
    return Generation(policy, weight_sync, server, generators)
