"""What bench_kl.py times on llm_gym's side (A, L, B, B0, C, E, G), and the N GSM8K
conversations it times them on; TorchRL's side (D, F, H) is in ``torchrl_kl_baselines.py``.

Each builder returns a ``Timed`` whose output the benchmark checks against the others'.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import llm_gym  # noqa: F401  (registers LLMChat-GSM8K-v0)
from llm_gym import Response, TransformersPolicy
from llm_gym.lm import forward_logits, left_pad, token_log_probs
from llm_gym.sources import IterableSource
from llm_gym.wrappers import vector as vector_kl
from llm_gym.wrappers.kl import KLRewardWrapper

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import Timed  # noqa: E402

__all__ = [
    "COEF",
    "Case",
    "add_retrieve_kl",
    "bare_forward",
    "llm_gym_single",
    "llm_gym_vector",
    "log_probs_only",
    "make_case",
    "make_vector_env",
    "padded_batch",
]

COEF = 0.1


# -- the conversations ----------------------------------------------------------------


@dataclass
class Case:
    """One model's benchmark inputs: N prompts (token ids) and a generated Response each."""

    name: str
    model: Any
    tokenizer: Any
    rows: list[dict[str, Any]]
    prompts: list[np.ndarray]
    responses: list[Response]


def make_vector_env(tokenizer: Any, rows: list[dict[str, Any]], input_mode: str = "tokens") -> Any:
    # One stream shared by the sub-envs, restarted when exhausted: sub-env i holds row i, and
    # after each step the SAME_STEP autoreset brings back exactly the same N prompts.
    return gym.make_vec(
        "LLMChat-GSM8K-v0",
        num_envs=len(rows),
        vectorization_mode="vector_entry_point",
        dataset=IterableSource(rows),
        input_mode=input_mode,
        tokenizer=tokenizer,
    )


def make_case(name: str, model: Any, tokenizer: Any, rows: list, max_new_tokens: int) -> Case:
    envs = make_vector_env(tokenizer, rows)
    obs, _ = envs.reset(seed=0)
    policy = TransformersPolicy(
        model,
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
    )
    start = time.perf_counter()
    responses = policy(obs)
    print(f"  generated {len(responses)} responses in {time.perf_counter() - start:.1f} s")
    return Case(name, model, tokenizer, rows, [np.asarray(p) for p in obs["tokens"]], responses)


def padded_batch(case: Case, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = zip(case.prompts, case.responses, strict=True)
    sequences = [np.concatenate([p, r.tokens]) for p, r in pairs]
    return left_pad(sequences, pad_id, case.model.device)


def same_prompts(obs: Any, case: Case, where: str) -> None:
    if not all(np.array_equal(a, b) for a, b in zip(obs["tokens"], case.prompts, strict=True)):
        raise RuntimeError(f"{where}: the env did not come back to the same N prompts")


def same_histories(obs: Any, case: Case, where: str) -> None:
    questions = [history[-1]["content"] for history in obs["history"]]
    if questions != [row["question"] for row in case.rows]:
        raise RuntimeError(f"{where}: the env did not come back to the same N questions")


# -- the timed methods: each returns (wall s, cpu s) of its timed part, and its output ----


def bare_forward(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Timed:
    attention = mask.long()

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=attention, use_cache=False).logits

    return Timed(call)


def log_probs_only(model: Any, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> Timed:
    with torch.inference_mode():
        logits = forward_logits(model, ids, mask, keep)
    window = slice(-keep, None)

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return token_log_probs(logits, ids[:, window], mask[:, window])

    return Timed(call)


def llm_gym_vector(env: Any, case: Case, actions: list[Any] | None = None) -> Timed:
    obs, _ = env.reset(seed=0)
    check = same_prompts if "tokens" in obs else same_histories
    check(obs, case, "vector env reset")
    actions = case.responses if actions is None else actions

    def call() -> dict[str, Any]:
        obs, _, _, _, info = env.step(actions)
        check(obs, case, "vector env autoreset")
        return info

    return Timed(call)


def llm_gym_single(case: Case, scorer: Any) -> Timed:
    env = KLRewardWrapper(
        gym.make(
            "LLMChat-GSM8K-v0",
            dataset=IterableSource(case.rows),
            input_mode="tokens",
            tokenizer=case.tokenizer,
        ),
        scorer,
        coef=COEF,
    )
    env.reset(seed=0)
    env.unwrapped.reset_dataloader()  # the next reset serves row 0

    def call() -> list[dict[str, Any]]:
        infos = []
        for prompt, response in zip(case.prompts, case.responses, strict=True):
            obs, _ = env.reset()
            if not np.array_equal(obs["tokens"], prompt):
                raise RuntimeError("single env: reset did not serve the prompts in file order")
            infos.append(env.step(response)[4])
        return infos

    return Timed(call)


def add_retrieve_kl(methods: dict[str, Timed], case: Case, scorer: Any, baselines: Any) -> None:
    """E/F in tokens mode, KL over every token (TorchRL's tokens mode refuses assistant_only);
    G/H in history mode with assistant_only=True, the responses given as text. F/H (TorchRL's)
    when ``baselines`` (the ``torchrl_kl_baselines`` module) is given."""
    tokenizer = case.tokenizer
    retrieve_env = vector_kl.RetrieveKL(
        make_vector_env(tokenizer, case.rows), scorer, scorer, coef=COEF, assistant_only=False
    )
    methods["E"] = llm_gym_vector(retrieve_env, case)
    history_env = make_vector_env(tokenizer, case.rows, "history")
    history_scorer = scorer.get_new_version(input_mode="history")
    texts = tokenizer.batch_decode([r.tokens for r in case.responses], skip_special_tokens=True)
    chats = [
        [*history, {"role": "assistant", "content": text}]
        for history, text in zip(history_env.reset(seed=0)[0]["history"], texts, strict=True)
    ]
    history_kl = vector_kl.RetrieveKL(history_env, history_scorer, history_scorer, coef=COEF)
    methods["G"] = llm_gym_vector(history_kl, case, texts)
    if baselines is not None:
        full = [
            np.concatenate([p, r.tokens]) for p, r in zip(case.prompts, case.responses, strict=True)
        ]
        methods["F"] = Timed(*baselines.retrieve_kl_tokens(case.model, tokenizer, full))
        methods["H"] = Timed(*baselines.retrieve_kl_history(case.model, tokenizer, chats))
