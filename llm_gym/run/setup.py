"""What every run sets up: device, dtype, the task's vector env, sampler and KL penalty."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import torch

from llm_gym.checks import check_choice
from llm_gym.episodes import AsyncEpisodes
from llm_gym.lm.loading import load_model
from llm_gym.lm.lora import is_adapter_folder
from llm_gym.lm.precision import fast_dtype, runs_fast
from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.rubrics import JUDGE_NEW_TOKENS, RunRubric, judge_rubric
from llm_gym.run.config import DTYPE_CHOICES, DTYPE_NAMES, RunConfig, is_url, rubric_weights
from llm_gym.run.describe import answer_format_of
from llm_gym.samplers import OpenAISampler, VLLMSampler
from llm_gym.samplers.vllm import SERVED_NAME
from llm_gym.samplers.weights import export_model
from llm_gym.wrappers import kl as single_wrappers
from llm_gym.wrappers import vector as vector_wrappers

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.policies.base import Policy
    from llm_gym.samplers import Scorer
    from llm_gym.wrappers.controllers import KLController
    from llm_gym.wrappers.curriculum import LevelSchedule

__all__ = [
    "DTYPES",
    "SERVER_LOG",
    "async_episodes",
    "charge_kl",
    "compute_dtype",
    "dtype_name",
    "env_kwargs",
    "kl_sub_env",
    "make_policy",
    "reference_scorer",
    "resolve_device",
    "run_rubric",
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


def resolve_dtype(dtype: str, device: torch.device | None = None) -> torch.dtype:
    """A torch dtype from its name (``"float32"``, ``"bfloat16"``, ``"float16"``), or for
    ``"auto"`` the one ``device`` (None: ``resolve_device``'s) runs fast: bfloat16 where it
    has the instructions for it, else float32. A named dtype below float32 that ``device``
    runs slowly warns, once per dtype and device type."""
    check_choice("dtype", dtype, DTYPE_CHOICES)
    device = resolve_device(device)
    if dtype == "auto":
        return fast_dtype(device)
    resolved = DTYPES[dtype]
    if not runs_fast(resolved, device) and (dtype, device.type) not in _WARNED:
        _WARNED.add((dtype, device.type))
        warnings.warn(
            f"dtype {dtype!r} runs slowly on this {device.type} (it has no {dtype} matrix "
            "instructions, so they fall back to plain loops): 'auto' or 'float32' runs faster",
            stacklevel=2,
        )
    return resolved


_WARNED: set[tuple[str, str]] = set()  # (dtype, device type): resolve_dtype's warning, once


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: what a vLLM server's ``--dtype`` takes."""
    return str(dtype).removeprefix("torch.")


def env_kwargs(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, **options: object
) -> dict[str, Any]:
    """The arguments of ``config``'s task env (with ``options``; None: the env's default): tokens
    mode with the history (for records) and policy mask (for a trainer) in the observation."""
    options.update(answer_format=answer_format_of(config), **config.tool_options())
    return {
        **config.env_args,
        **{key: value for key, value in options.items() if value is not None},
        "input_mode": "tokens",
        "tokenizer": tokenizer,
        "observation_keys": ("tokens", "history", "policy_mask"),
    }


def task_envs(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, num_envs: int, **options: object
) -> gym.vector.VectorEnv:
    """``config``'s task (``env_kwargs``) in the native vector env if any, and the difficulty
    curriculum if ``config.curriculum`` asks for one."""
    kwargs = env_kwargs(config, tokenizer, **options)
    spec = gym.spec(config.env)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    envs = gym.make_vec(config.env, num_envs=num_envs, vectorization_mode=mode, **kwargs)
    if config.curriculum:
        envs = vector_wrappers.DifficultyCurriculum(envs, window=config.curriculum)
    return envs


def make_policy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: RunConfig,
    *,
    served: str | Path | None = None,
    compute_dtype: torch.dtype | None = None,
    server: str | None = None,
    device: torch.device | None = None,
) -> TransformersPolicy | SamplerPolicy:
    """A tokens-mode policy over ``config.backend`` that samples ``max_new_tokens`` at
    ``temperature`` (greedy at 0): a ``TransformersPolicy`` of ``model``, or a
    ``SamplerPolicy`` over a vLLM server started from ``served`` (default: ``config.model``;
    its log in ``config.out``) or over the server at ``config.base_url``. ``compute_dtype``:
    what ``model`` computes in (``TransformersPolicy``'s) and a vLLM server's dtype (None:
    ``config.dtype``'s). ``server``: the URL of the vLLM server that another process of the
    run started, sampled from instead of starting one. ``device``: where a vLLM server runs
    (None: ``config.device``'s; a trainer's: its own, resolved once)."""
    if config.backend == "transformers":
        kwargs: dict[str, Any] = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature)
        return TransformersPolicy(
            model, tokenizer, input_mode="tokens", generate_kwargs=kwargs,
            compute_dtype=compute_dtype,
        )  # fmt: skip
    sampling = {
        "max_new_tokens": config.max_new_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "vocab_size": len(tokenizer),
    }
    if config.backend == "openai":
        sampler = OpenAISampler(config.base_url, config.served_model, **sampling)
    elif server is not None:  # the vLLM server another process of the run started
        sampler = OpenAISampler(server, SERVED_NAME, **sampling)
    else:
        engine = dict(config.backend_args)
        device = device if device is not None else resolve_device(config.device)
        dtype = dtype_name(compute_dtype or resolve_dtype(config.dtype, device))
        if served is None and is_adapter_folder(config.model):  # vLLM loads whole models
            served = export_model(model, tokenizer, Path(config.out) / "served-model")
        sampler = VLLMSampler(
            served or config.model, dtype=engine.pop("dtype", dtype),
            device=str(device), engine_args=engine, python=config.vllm_python,
            log_path=Path(config.out) / SERVER_LOG, **sampling,
        )  # fmt: skip
    return SamplerPolicy(sampler, tokenizer, input_mode="tokens")


def async_episodes(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, policy: Policy, num_envs: int, *,
    ref: Scorer | None = None, controller: KLController | None = None,
    curriculum: LevelSchedule | None = None, batch_wait: float = 0.05,
    shared_updates: str = "episode", **options: object,
) -> AsyncEpisodes:  # fmt: skip
    """``AsyncEpisodes`` of ``config``'s task (``env_kwargs`` with ``options``) from
    ``config.seed``, its env workers in Ray actors with ``config.ray_address``; with a scorer
    ``ref``, each sub-env charges ``config.kl_coef`` · KL against it (the coefficient of the
    shared ``controller``, when given); ``curriculum``: the level schedule every sub-env shares.
    A server backend gets a request per ready turn, transformers one batch at a time (ready
    turns wait ``batch_wait`` for the env steps in flight; ``shared_updates``: when the
    curriculum and the controller count episodes, see ``AsyncEpisodes``)."""
    env_fn = functools.partial(gym.make, config.env, **env_kwargs(config, tokenizer, **options))
    if ref is not None:
        env_fn = functools.partial(
            kl_sub_env, env_fn, ref, coef=config.kl_coef, estimator=config.estimator,
            kl_controller=controller,
        )  # fmt: skip
    calls = 1 if config.backend == "transformers" else num_envs
    return AsyncEpisodes(
        env_fn, num_envs, policy, seed=config.seed, input_mode="tokens", sampler_calls=calls,
        ray_address=config.ray_address, workers=config.workers, curriculum=curriculum,
        kl_controller=controller, batch_wait=batch_wait, shared_updates=shared_updates,
    )  # fmt: skip


def kl_sub_env(env_fn: Callable[[], gym.Env], ref: Scorer, **kwargs: Any) -> gym.Env:
    """``env_fn()``'s env charged the KL to ``ref`` by the single-env ``RetrieveKL`` (its
    ``kwargs``): an asynchronous driver's sub-env. At module level, so Ray can pickle it."""
    return single_wrappers.RetrieveKL(env_fn(), None, ref, **kwargs)


def compute_dtype(config: RunConfig, device: torch.device, weights: torch.dtype) -> torch.dtype:
    """What a model of ``weights`` computes in on ``device``: ``config.dtype`` (by autocast)
    over float32 weights; weights below float32, their own."""
    return weights if weights != torch.float32 else resolve_dtype(config.dtype, device)


def reference_scorer(
    config: RunConfig,
    reference: str,
    *,
    weights_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> Scorer:
    """The frozen ``reference`` model ('default' or a folder) as a scorer: a
    ``TransformersPolicy`` here, or with ``config.ray_address`` one Ray actor every env worker
    shares (``RayLogProbModel``). It computes in ``config.dtype``, its weights loaded in
    ``weights_dtype`` (None: that dtype; a trainer's: the trained weights', so that both score
    alike), on ``device`` (None: ``config.device``'s; a trainer's: its own)."""
    device = device if device is not None else resolve_device(config.device)
    weights = weights_dtype or resolve_dtype(config.dtype, device)
    kwargs = {"input_mode": "tokens", "compute_dtype": compute_dtype(config, device, weights)}
    if config.ray_address is not None:
        from llm_gym.episodes.ray import RayLogProbModel, connect

        connect(config.ray_address)
        factory = functools.partial(load_model, reference, device=device, dtype=weights)
        return RayLogProbModel(factory, policy_kwargs=kwargs, timeout=600)
    model, tokenizer = load_model(reference, device=device, dtype=weights)
    model.requires_grad_(False)
    return TransformersPolicy(model, tokenizer, generate=False, **kwargs)


def charge_kl(
    envs: gym.vector.VectorEnv,
    config: RunConfig,
    reference: str,
    *,
    gen: Scorer | None = None,
    controller: KLController | None = None,
    ref: Scorer | None = None,
) -> gym.vector.VectorEnv:
    """``envs`` in the vector ``RetrieveKL``: ``config.kl_coef`` · KL (``config.estimator``)
    against the frozen ``reference`` ('default' or a folder; or the scorer ``ref``), one
    forward a step; the policy's side from ``gen`` (None: the Responses' log-probs)."""
    if ref is None:
        ref = reference_scorer(config, reference)
    return vector_wrappers.RetrieveKL(
        envs, gen, ref, coef=config.kl_coef, estimator=config.estimator, kl_controller=controller
    )


def run_rubric(
    config: RunConfig,
    tokenizer: PreTrainedTokenizerBase,
    group_size: int = 1,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> RunRubric:
    """``config.rubric``'s parts, each judge part asking ``config.judge`` (one model, loaded
    once, frozen; or a server at its URL, its prompts in ``config.judge_tokenizer``'s
    template, else ``tokenizer``'s); a group judge scores ``group_size`` responses a call. A
    judge model runs on ``device`` in ``dtype`` (None: ``config``'s; a trainer's: its own,
    resolved once)."""
    weights = rubric_weights(config.rubric)
    task_weight = weights.pop("task", 0.0)
    if not weights:
        return RunRubric(task_weight=task_weight)
    if is_url(config.judge):
        if config.judge_tokenizer is not None:
            tokenizer = load_model(config.judge_tokenizer)[1]
        sampler: Any = OpenAISampler(
            config.judge, None, max_new_tokens=JUDGE_NEW_TOKENS * group_size,
            temperature=0.0, seed=config.seed, vocab_size=len(tokenizer),
        )  # fmt: skip
    else:
        device = device if device is not None else resolve_device(config.device)
        dtype = dtype if dtype is not None else resolve_dtype(config.dtype, device)
        model, tokenizer = load_model(config.judge, device=device, dtype=dtype)
        model.requires_grad_(False)
        kwargs = {"do_sample": False, "max_new_tokens": JUDGE_NEW_TOKENS * group_size}
        sampler = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    return judge_rubric(weights, sampler, tokenizer, task_weight=task_weight)
