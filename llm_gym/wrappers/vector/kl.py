"""Vector versions of the KL wrappers: one padded forward pass scores all N responses.

Each takes the same arguments as its single-env namesake in ``llm_gym.wrappers.kl`` (one
signature, bound here by name) and runs the same per-batch logic; per-env values are stacked
the Gymnasium way (``info[key]`` an array over envs, ``info["_" + key]`` its mask), per-token
arrays in ``object`` arrays. With SAME_STEP autoreset the next prompt of a finished sub-env is
its new episode's first observation, so nothing has to be thrown away.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from llm_gym.envs import batch_infos
from llm_gym.samplers import check_scorer
from llm_gym.wrappers import kl as single
from llm_gym.wrappers._charges import KLCharge, check_pair, score, warn_low_precision
from llm_gym.wrappers.vector._signature import single_env_arguments

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]


def _check_count(actions: Any, num_envs: int) -> list[Any]:
    if len(actions) != num_envs:
        raise ValueError(f"actions must hold {num_envs} responses, got {len(actions)}")
    return list(actions)


class RetrieveLogProb(VectorWrapper, gym.utils.RecordConstructorArgs):
    """``info[key][i]``: the model's log-probs of sub-env i's response tokens this step.

    All N (prompt, response) pairs go through the model in one left-padded forward pass.
    """

    __signature__ = inspect.signature(single.RetrieveLogProb)

    def __init__(self, env: VectorEnv, *args: Any, **kwargs: Any) -> None:
        named = single_env_arguments(single.RetrieveLogProb, env, args, kwargs)
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, **named)
        VectorWrapper.__init__(self, env)
        self.model = check_scorer(named["model"], "model")
        self.log_prob_key, self.assistant_only = named["key"], named["assistant_only"]
        self._prompt: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._prompt = obs
        return obs, info

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = _check_count(actions, self.num_envs)
        log_probs = score(
            self.model,
            self._prompt,
            actions,
            batched=True,
            assistant_only=self.assistant_only,
            key=self.log_prob_key,
        )
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info.update(batch_infos([{self.log_prob_key: lp} for lp in log_probs]))
        self._prompt = obs
        return obs, rewards, terminated, truncated, info


class KLComputation(VectorWrapper, gym.utils.RecordConstructorArgs):
    """Per-token KL for each sub-env, as ``llm_gym.wrappers.KLComputation``."""

    __signature__ = inspect.signature(single.KLComputation)

    def __init__(self, env: VectorEnv, *args: Any, **kwargs: Any) -> None:
        named = single_env_arguments(single.KLComputation, env, args, kwargs)
        self.charge = KLCharge(env, **named)
        self.kl_coefficient = self.charge.coefficient
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, **named)
        VectorWrapper.__init__(self, env)

    kl_controller = single.KLComputation.kl_controller
    coef = single.KLComputation.coef
    update_kl_coef = single.KLComputation.update_kl_coef

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = _check_count(actions, self.num_envs)
        gens = self.charge.action_log_probs(actions, batched=True)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        gens = gens or list(info[self.charge.gen_key])
        parts = self.charge.charge(gens, info[self.charge.ref_key], rewards)
        info.update(batch_infos(parts))
        if self.charge.add_to_reward:
            penalties = info["kl_penalty"].astype(np.float64)
            rewards = (np.asarray(rewards, dtype=np.float64) - penalties).astype(rewards.dtype)
        return obs, rewards, terminated, truncated, info


class RetrieveKL(KLComputation):
    """Vector ``RetrieveLogProb`` for gen (optional) and ref, then ``KLComputation``."""

    __signature__ = inspect.signature(single.RetrieveKL)

    def __init__(self, env: VectorEnv, *args: Any, **kwargs: Any) -> None:
        named = single_env_arguments(single.RetrieveKL, env, args, kwargs)
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, **named)
        gen_model, ref_model = named.pop("gen_model"), named.pop("ref_model")
        assistant_only = named.pop("assistant_only")
        check_pair(gen_model, ref_model)
        if gen_model is None:
            warn_low_precision(ref_model)
        keys = single._KL_DEFAULTS | named
        if gen_model is not None:
            env = RetrieveLogProb(env, gen_model, keys["gen_key"], assistant_only)
        env = RetrieveLogProb(env, ref_model, keys["ref_key"], assistant_only)
        super().__init__(env, **named)


class KLRewardWrapper(RetrieveKL):
    """Vector form of TorchRL's legacy ``KLRewardTransform`` (gen log-probs from Responses)."""

    __signature__ = inspect.signature(single.KLRewardWrapper)

    def __init__(self, env: VectorEnv, *args: Any, **kwargs: Any) -> None:
        named = single_env_arguments(single.KLRewardWrapper, env, args, kwargs)
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, **named)
        super().__init__(env, None, **named)
