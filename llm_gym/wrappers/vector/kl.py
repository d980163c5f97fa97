"""Vector KL wrappers, as their single-env namesakes: one padded forward scores all N responses.
Per-env values are stacked the Gymnasium way (``info[key]`` an array over envs, ``info["_" +
key]`` its mask; per-token arrays in ``object`` arrays)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from llm_gym.samplers import Scorer, check_scorer
from llm_gym.wrappers import kl as single
from llm_gym.wrappers.controllers import KLController
from llm_gym.wrappers.kl import KLCharge, retrieve, with_retrievers

if TYPE_CHECKING:
    from llm_gym.policies.base import Action

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]

VectorStep = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class RetrieveLogProb(VectorWrapper):
    """``info[key][i]``: the model's log-probs of sub-env i's response tokens this step, all N
    scored in one left-padded forward pass. Arguments as ``llm_gym.wrappers.RetrieveLogProb``.
    """

    def __init__(
        self,
        env: VectorEnv,
        model: Scorer,
        key: str = "ref_log_probs",
        assistant_only: bool = True,
    ) -> None:
        super().__init__(env)
        self.model = check_scorer(model, "model")
        single.check_tokenizer(env, model, "model")
        self.log_prob_key, self.assistant_only = key, assistant_only
        self._prompt: Any = None  # the observations the next actions answer

    reset = single.RetrieveLogProb.reset

    def step(self, actions: Sequence[Action]) -> VectorStep:
        """Score the N responses in one forward, then step the envs."""
        return retrieve(self, actions, batched=True)


class KLComputation(VectorWrapper):
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
        self.charge = KLCharge(
            env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )
        super().__init__(env)

    kl_controller = single.KLComputation.kl_controller
    coef = single.KLComputation.coef
    update_kl_coef = single.KLComputation.update_kl_coef

    def step(self, actions: Sequence[Action]) -> VectorStep:
        """Step the envs and charge each sub-env's response."""
        return self.charge.step(self.env, actions, batched=True)


class RetrieveKL(VectorWrapper):
    """Vector ``RetrieveLogProb`` for gen (optional) and ref, then ``KLComputation``'s charge,
    as ``llm_gym.wrappers.RetrieveKL``."""

    def __init__(
        self,
        env: VectorEnv,
        gen_model: Scorer | None = None,
        ref_model: Scorer | None = None,
        *,
        assistant_only: bool = True,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        kl_controller: KLController | None = None,
    ) -> None:
        keys = (gen_key, ref_key)
        env = with_retrievers(env, RetrieveLogProb, gen_model, ref_model, keys, assistant_only)
        env = KLComputation(
            env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )
        self.charge = env.charge
        super().__init__(env)

    kl_controller = single.KLComputation.kl_controller
    coef = single.KLComputation.coef
    update_kl_coef = single.KLComputation.update_kl_coef


class KLRewardWrapper(RetrieveKL):
    """Vector form of TorchRL's legacy ``KLRewardTransform`` (gen log-probs from Responses),
    as ``llm_gym.wrappers.KLRewardWrapper``."""

    def __init__(
        self,
        env: VectorEnv,
        ref_model: Scorer,
        coef: float = 1.0,
        **options: bool | str | float | KLController | None,
    ) -> None:
        super().__init__(env, None, ref_model, coef=coef, **options)
