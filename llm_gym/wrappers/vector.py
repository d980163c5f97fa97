"""Vector versions of the KL wrappers: one padded forward pass scores all N responses.

Same arguments and info keys as ``llm_gym.wrappers.kl``; per-env values are stacked the
Gymnasium way (``info[key]`` an array over envs, ``info["_" + key]`` its mask), with
per-token arrays in ``object`` arrays. With SAME_STEP autoreset the next prompt of a finished
sub-env is its new episode's first observation, so nothing has to be thrown away.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from llm_gym.wrappers.controllers import KLController
from llm_gym.wrappers.kl import (
    KLCoefficient,
    action_log_probs,
    as_response,
    check_kl_settings,
    check_scoring_model,
    compose_retrievers,
    kl_parts,
    provides_key,
    record_args,
    score,
    stack_info,
)

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]


class RetrieveLogProb(VectorWrapper, gym.utils.RecordConstructorArgs):
    """``info[key][i]``: the model's log-probs of sub-env i's response tokens this step.

    All N (prompt, response) pairs go through the model in one left-padded forward pass.
    """

    def __init__(
        self, env: VectorEnv, model: Any, key: str = "ref_log_probs", assistant_only: bool = True
    ) -> None:
        record_args(self, locals())
        check_scoring_model(model, "model")
        VectorWrapper.__init__(self, env)
        self.model, self.log_prob_key, self.assistant_only = model, key, assistant_only
        self._prompt: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._prompt = obs
        return obs, info

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._prompt is None:
            raise gym.error.ResetNeeded("Cannot call step before reset")
        responses = [as_response(a) for a in actions]
        if len(responses) != self.num_envs:
            raise ValueError(f"actions must hold {self.num_envs} responses, got {len(responses)}")
        log_probs = score(self.model, self._prompt, responses, self.assistant_only, batched=True)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info.update(stack_info([{self.log_prob_key: lp} for lp in log_probs]))
        self._prompt = obs
        return obs, rewards, terminated, truncated, info


class KLComputation(VectorWrapper, gym.utils.RecordConstructorArgs, KLCoefficient):
    """Per-token KL for each sub-env, as ``llm_gym.wrappers.KLComputation``."""

    def __init__(
        self,
        env: VectorEnv,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        kl_controller: KLController | None = None,
    ) -> None:
        record_args(self, locals())
        self.kl_controller = check_kl_settings(coef, estimator, kl_controller)
        if not provides_key(env, ref_key):
            raise ValueError(
                f"KLComputation reads info[{ref_key!r}]: wrap the env in "
                f"RetrieveLogProb(env, ref_model, key={ref_key!r}) first (or use RetrieveKL)"
            )
        VectorWrapper.__init__(self, env)
        self.gen_key, self.ref_key, self.kl_key = gen_key, ref_key, kl_key
        self.estimator, self.add_to_reward = estimator, add_to_reward
        self._gen_from_info = provides_key(env, gen_key)
        self._kl_rewards = []

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        gens = None
        if not self._gen_from_info:
            gens = [action_log_probs(a, self.gen_key) for a in actions]
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        if gens is None:
            gens = list(info[self.gen_key])
        coef = self.coef
        parts = [
            kl_parts(gen, ref, float(reward), coef, self.estimator)
            for gen, ref, reward in zip(gens, info[self.ref_key], rewards, strict=True)
        ]
        for part, gen in zip(parts, gens, strict=True):
            part[self.gen_key] = gen
            part[self.kl_key] = part.pop("kl")
        info.update(stack_info(parts))
        penalties = info["kl_penalty"].astype(np.float64)
        self._kl_rewards.extend((-penalties).tolist())
        if self.add_to_reward:
            rewards = (np.asarray(rewards, dtype=np.float64) - penalties).astype(rewards.dtype)
        return obs, rewards, terminated, truncated, info


class RetrieveKL(KLComputation):
    """Vector ``RetrieveLogProb`` for gen (optional) and ref, then ``KLComputation``."""

    def __init__(
        self,
        env: VectorEnv,
        gen_model: Any = None,
        ref_model: Any = None,
        *,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        assistant_only: bool = True,
        kl_controller: KLController | None = None,
    ) -> None:
        record_args(self, locals())
        inner = compose_retrievers(
            env, gen_model, ref_model, gen_key, ref_key, assistant_only, RetrieveLogProb
        )
        super().__init__(
            inner, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )


class KLRewardWrapper(RetrieveKL):
    """Vector form of TorchRL's legacy ``KLRewardTransform`` (gen log-probs from Responses)."""

    def __init__(
        self,
        env: VectorEnv,
        ref_model: Any,
        coef: float = 1.0,
        *,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_controller: KLController | None = None,
    ) -> None:
        record_args(self, locals())
        super().__init__(
            env,
            None,
            ref_model,
            coef=coef,
            estimator=estimator,
            add_to_reward=add_to_reward,
            kl_controller=kl_controller,
        )
