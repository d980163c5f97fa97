"""TorchRL's RetrieveLogProb, KLComputation, RetrieveKL and KLRewardTransform as Gymnasium
wrappers for any chat env (README: "KL wrappers"); the vector versions are in ``vector/``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from llm_gym.samplers import check_scorer
from llm_gym.wrappers._charges import KLCharge, retrieve, with_retrievers
from llm_gym.wrappers.controllers import KLController

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]


class RetrieveLogProb(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Put a model's log-probs of each step's response tokens into ``info[key]``.

    Args:
        env: a chat env (its observations hold the model's input mode).
        model: a scorer: a log-prob-mode ``TransformersPolicy``, or a ``RayLogProbModel``.
        key: the info key (``"ref_log_probs"``; ``"log_probs"`` for the generator).
        assistant_only: True (default): this step's response tokens only, one value per
            sampled token. False: every token of prompt plus response (first token 0.0).
    """

    def __init__(
        self, env: gym.Env, model: Any, key: str = "ref_log_probs", assistant_only: bool = True
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, model=model, key=key, assistant_only=assistant_only
        )
        gym.Wrapper.__init__(self, env)
        self.model = check_scorer(model, "model")
        self.log_prob_key, self.assistant_only = key, assistant_only
        self._prompt: Any = None  # the observation the next action answers

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset the env and keep its observation(s), the prompt(s) the next step answers."""
        self._prompt, info = self.env.reset(**kwargs)
        return self._prompt, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Score the action's response, then step the env; ``info[key]`` holds the scores."""
        return retrieve(self, action, batched=False)


class KLComputation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Per-token KL from ``info[gen_key]`` and ``info[ref_key]``; optionally a reward penalty.

    ``info`` gets ``kl_key``, ``kl_penalty`` (``coef · Σ kl``) and ``token_rewards``, as README's
    "KL wrappers" says. When no inner ``RetrieveLogProb`` writes ``gen_key``, the generator's
    log-probs come from the action ``Response``. ``charge`` holds the settings and coefficient.

    Args:
        env: an env wrapped in ``RetrieveLogProb(..., key=ref_key)``.
        gen_key / ref_key: info keys of the generator's and the reference's log-probs.
        coef: KL coefficient (ignored when ``kl_controller`` is given).
        estimator: ``"k1"`` (log p − log q, TorchRL's), ``"k2"`` or ``"k3"``.
        add_to_reward: subtract the penalty from the reward.
        kl_key: info key of the per-token KL.
        kl_controller: a ``ConstantKLController``/``AdaptiveKLController``; call
            ``update_kl_coef()`` (``env.get_wrapper_attr("update_kl_coef")()``) to update it.
    """

    def __init__(
        self,
        env: gym.Env,
        gen_key: str = "log_probs",
        ref_key: str = "ref_log_probs",
        coef: float = 1.0,
        estimator: str = "k1",
        add_to_reward: bool = True,
        kl_key: str = "kl",
        kl_controller: KLController | None = None,
    ) -> None:
        # Checks the settings before anything changes.
        self.charge = KLCharge(
            env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller
        )
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **self.charge.arguments
        )
        gym.Wrapper.__init__(self, env)

    # Every KL wrapper (single, vector, TokenKLWrapper) keeps its settings and coefficient in
    # self.charge and takes these three accessors from here.
    @property
    def kl_controller(self) -> KLController:
        """The controller that sets ``coef``."""
        return self.charge.controller

    @property
    def coef(self) -> float:
        """The KL coefficient the next step charges."""
        return self.charge.coef

    def update_kl_coef(self) -> float:
        """Update the coefficient from the KL rewards (``-kl_penalty``) of the steps since the
        last update, and return it. Call it at your update point, e.g. after each batch."""
        return self.charge.update()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step the env and charge the response's KL (see the class docstring)."""
        return self.charge.step(self.env, action, batched=False)


class RetrieveKL(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """``RetrieveLogProb`` for the generator (optional) and the reference, then
    ``KLComputation``, in one wrapper (its ``env`` is that ``KLComputation``).

    ``gen_model`` may be omitted when the actions are Responses that carry their log-probs
    (what ``TransformersPolicy`` returns). ``assistant_only`` as ``RetrieveLogProb``'s; the
    other arguments and the accessors as ``KLComputation``'s.
    """

    def __init__(
        self,
        env: gym.Env,
        gen_model: Any = None,
        ref_model: Any = None,
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
        models = {"gen_model": gen_model, "ref_model": ref_model, "assistant_only": assistant_only}
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **models, **self.charge.arguments
        )
        gym.Wrapper.__init__(self, env)

    kl_controller = KLComputation.kl_controller
    coef = KLComputation.coef
    update_kl_coef = KLComputation.update_kl_coef


class KLRewardWrapper(RetrieveKL):
    """TorchRL's legacy ``KLRewardTransform``: ``reward -= coef · Σ (log p − log q)`` with the
    generator's log-probs taken from the action ``Response`` and the reference scored here.

    Other keyword arguments as ``RetrieveKL``; README's "KL wrappers" has an example.
    """

    def __init__(self, env: gym.Env, ref_model: Any, coef: float = 1.0, **options: Any) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, ref_model=ref_model, coef=coef, **options
        )
        super().__init__(env, None, ref_model, coef=coef, **options)
