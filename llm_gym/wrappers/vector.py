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
    KLCharge,
    PromptScorer,
    compose_retrievers,
    record_args,
    stack_info,
)

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]


class RetrieveLogProb(PromptScorer, VectorWrapper, gym.utils.RecordConstructorArgs):
    """``info[key][i]``: the model's log-probs of sub-env i's response tokens this step.

    All N (prompt, response) pairs go through the model in one left-padded forward pass.
    """

    def __init__(
        self, env: VectorEnv, model: Any, key: str = "ref_log_probs", assistant_only: bool = True
    ) -> None:
        record_args(self, locals())
        self._setup_scorer(model, key, assistant_only)
        VectorWrapper.__init__(self, env)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if len(actions) != self.num_envs:
            raise ValueError(f"actions must hold {self.num_envs} responses, got {len(actions)}")
        log_probs = self._score_actions(list(actions), batched=True)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info.update(stack_info([{self.log_prob_key: lp} for lp in log_probs]))
        self._prompt = obs
        return obs, rewards, terminated, truncated, info


class KLComputation(KLCharge, VectorWrapper, gym.utils.RecordConstructorArgs):
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
        self._setup_kl(env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller)
        VectorWrapper.__init__(self, env)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        gens = self._actions_log_probs(list(actions))
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        parts = self._charge(gens or list(info[self.gen_key]), info[self.ref_key], rewards)
        info.update(stack_info(parts))
        if self.add_to_reward:
            penalties = info["kl_penalty"].astype(np.float64)
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
