"""What every run sets up: device, dtype, the task's vector env, sampler and KL penalty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from llm_gym.checks import check_choice
from llm_gym.models import load_model
from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.run.config import DTYPE_NAMES, RunConfig
from llm_gym.samplers import OpenAISampler, VLLMSampler
from llm_gym.wrappers import vector as vector_wrappers

__all__ = [
    "DTYPES",
    "SERVER_LOG",
    "charge_kl",
    "make_sampler",
    "resolve_device",
    "resolve_dtype",
    "task_envs",
]

SERVER_LOG = "vllm-server.log"  # in the run folder, with --backend vllm
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
assert tuple(DTYPES) == DTYPE_NAMES  # the names RunConfig checks without torch


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` or None: CUDA when there is a GPU, else the CPU; else the named device,
    which must exist here."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        expected = "'auto', 'cpu', 'cuda' or 'cuda:N'"
        raise ValueError(f"device must be {expected}, got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} needs a GPU, and torch sees none here")
    return resolved


def resolve_dtype(dtype: str) -> torch.dtype:
    """A torch dtype from its name (``"float32"``, ``"bfloat16"``, ``"float16"``)."""
    return DTYPES[check_choice("dtype", dtype, DTYPE_NAMES)]


def task_envs(
    config: RunConfig, tokenizer: Any, num_envs: int, **options: Any
) -> gym.vector.VectorEnv:
    """``config``'s task (with ``options``; None: the env's default) in the native vector env
    if any, in tokens mode with the history (for records) and policy mask (for a trainer) in
    the observation, and the difficulty curriculum if ``config.curriculum`` asks for one."""
    options.update(answer_format=config.answer_format, **config.tool_options())
    kwargs: dict[str, Any] = {
        **config.env_args,
        **{key: value for key, value in options.items() if value is not None},
        "input_mode": "tokens",
        "tokenizer": tokenizer,
        "observation_keys": ("tokens", "history", "policy_mask"),
    }
    spec = gym.spec(config.env)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    envs = gym.make_vec(config.env, num_envs=num_envs, vectorization_mode=mode, **kwargs)
    if config.curriculum:
        envs = vector_wrappers.DifficultyCurriculum(envs, window=config.curriculum)
    return envs


def make_sampler(
    model: Any, tokenizer: Any, config: RunConfig, *, served: str | Path | None = None
) -> TransformersPolicy | SamplerPolicy:
    """A tokens-mode policy over ``config.backend`` that samples ``max_new_tokens`` at
    ``temperature`` (greedy at 0): a ``TransformersPolicy`` of ``model``, or a
    ``SamplerPolicy`` over a vLLM server started from ``served`` (default: ``config.model``;
    its log in ``config.out``) or over the server at ``config.base_url``."""
    if config.backend == "transformers":
        kwargs: dict[str, Any] = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature)
        return TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    sampling = {
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "vocab_size": len(tokenizer),
    }
    if config.backend == "openai":
        sampler = OpenAISampler(config.base_url, config.served_model, **sampling)
    else:
        engine = dict(config.backend_args)
        device = resolve_device(config.device)
        sampler = VLLMSampler(
            served or config.model, dtype=engine.pop("dtype", config.dtype),
            device=str(device), engine_args=engine, python=config.vllm_python,
            log_path=Path(config.out) / SERVER_LOG, **sampling,
        )  # fmt: skip
    return SamplerPolicy(sampler, tokenizer, input_mode="tokens")


def charge_kl(
    envs: gym.vector.VectorEnv,
    config: RunConfig,
    reference: str,
    *,
    gen: Any = None,
    controller: Any = None,
) -> gym.vector.VectorEnv:
    """``envs`` in the vector ``RetrieveKL``: ``config.kl_coef`` · KL (``config.estimator``)
    against the frozen ``reference`` ('default' or a folder), one forward a step; the policy's
    side from ``gen`` (None: the Responses' log-probs)."""
    device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
    model, tokenizer = load_model(reference, device=device, dtype=dtype)
    model.requires_grad_(False)
    ref = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    return vector_wrappers.RetrieveKL(
        envs, gen, ref, coef=config.kl_coef, estimator=config.estimator, kl_controller=controller
    )
