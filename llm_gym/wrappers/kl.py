"""KL as Gymnasium reward wrappers: TorchRL's RetrieveLogProb, KLComputation, RetrieveKL and
KLRewardTransform, stackable on any chat env.

Each step, ``RetrieveLogProb`` scores the action's response tokens under a model (the
reference, or the generator) given the prompt the env showed, and ``KLComputation`` turns the
generator's and the reference's log-probs into a per-token KL and a reward penalty. Only this
step's response is charged: earlier turns were charged in earlier steps. ``RetrieveKL`` is the
two composed, as Gymnasium's ``ClipReward`` is ``TransformReward`` with a clip.

A scoring model follows the scorer protocol of ``llm_gym.samplers``: a ``TransformersPolicy``
with ``generate=False``, or ``llm_gym.distributed.RayLogProbModel``.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym

from llm_gym.samplers import check_scorer
from llm_gym.wrappers._charges import KLCharge, check_pair, score, warn_low_precision
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
        self,
        env: gym.Env,
        model: Any,
        key: str = "ref_log_probs",
        assistant_only: bool = True,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, model=model, key=key, assistant_only=assistant_only
        )
        gym.Wrapper.__init__(self, env)
        self.model = check_scorer(model, "model")
        self.log_prob_key, self.assistant_only = key, assistant_only
        self._prompt: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._prompt = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        # Scored before the env steps, so a response the model rejects changes nothing.
        (log_probs,) = score(
            self.model,
            self._prompt,
            [action],
            batched=False,
            assistant_only=self.assistant_only,
            key=self.log_prob_key,
        )
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[self.log_prob_key] = log_probs
        self._prompt = obs
        return obs, reward, terminated, truncated, info


class KLComputation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Per-token KL from ``info[gen_key]`` and ``info[ref_key]``; optionally a reward penalty.

    Writes ``info[kl_key]`` (``float32`` per response token), ``info["kl_penalty"]`` (``coef ·
    Σ kl``) and ``info["token_rewards"]`` (``-coef · kl_t``, the task reward added on the last
    token, as TorchRL's). With ``add_to_reward`` the step reward becomes ``reward -
    kl_penalty``. When no inner ``RetrieveLogProb`` writes ``gen_key``, the generator's
    log-probs come from the action ``Response``.

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
        self.kl_coefficient = self.charge.coefficient
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **self.charge.arguments
        )
        gym.Wrapper.__init__(self, env)

    # KLComputation, its vector version and TokenKLWrapper share these accessors: each keeps
    # its coefficient in self.kl_coefficient.
    @property
    def kl_controller(self) -> KLController:
        return self.kl_coefficient.controller

    @property
    def coef(self) -> float:
        return self.kl_coefficient.coef

    def update_kl_coef(self) -> float:
        """Update the coefficient from the KL rewards (``-kl_penalty``) of the steps since the
        last update, and return it. Call it at your update point, e.g. after each batch."""
        return self.kl_coefficient.update()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        gens = self.charge.action_log_probs([action], batched=False)
        obs, reward, terminated, truncated, info = self.env.step(action)
        gens = gens or [info[self.charge.gen_key]]
        (part,) = self.charge.charge(gens, [info[self.charge.ref_key]], [reward])
        info.update(part)
        if self.charge.add_to_reward:
            reward = float(reward) - part["kl_penalty"]
        return obs, reward, terminated, truncated, info


class RetrieveKL(KLComputation):
    """``RetrieveLogProb`` for the generator (optional) and the reference, then
    ``KLComputation``, in one wrapper.

    ``gen_model`` may be omitted when the actions are Responses that carry their log-probs
    (what ``TransformersPolicy`` returns). ``assistant_only`` as ``RetrieveLogProb``;
    ``kl_options`` are ``KLComputation``'s arguments (``gen_key``, ``ref_key``, ``coef``,
    ``estimator``, ``add_to_reward``, ``kl_key``, ``kl_controller``), its defaults included.
    """

    def __init__(
        self,
        env: gym.Env,
        gen_model: Any = None,
        ref_model: Any = None,
        *,
        assistant_only: bool = True,
        **kl_options: Any,
    ) -> None:
        models = {"gen_model": gen_model, "ref_model": ref_model, "assistant_only": assistant_only}
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, **models, **kl_options
        )
        check_pair(gen_model, ref_model)
        if gen_model is None:
            warn_low_precision(ref_model)
        keys = _KL_DEFAULTS | kl_options  # where the retrievers write what KLComputation reads
        if gen_model is not None:
            env = RetrieveLogProb(env, gen_model, keys["gen_key"], assistant_only)
        env = RetrieveLogProb(env, ref_model, keys["ref_key"], assistant_only)
        super().__init__(env, **kl_options)


_KL_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(KLComputation).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


class KLRewardWrapper(RetrieveKL):
    """TorchRL's legacy ``KLRewardTransform``: ``reward -= coef · Σ (log p − log q)`` with the
    generator's log-probs taken from the action ``Response`` and the reference scored here.

    Other keyword arguments as ``RetrieveKL``.

    >>> import llm_gym
    >>> from llm_gym.models import load_default_model
    >>> model, tokenizer = load_default_model()
    >>> policy = llm_gym.TransformersPolicy(model, tokenizer, generate_kwargs={"max_tokens": 6})
    >>> env = KLRewardWrapper(
    ...     llm_gym.ChatEnv(query="Hi!", max_turns=1), policy.get_new_version(generate=False)
    ... )
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(policy(obs))
    >>> abs(info["kl_penalty"]) < 1e-4  # the reference is the policy itself
    True
    """

    def __init__(self, env: gym.Env, ref_model: Any, coef: float = 1.0, **options: Any) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, _disable_deepcopy=True, ref_model=ref_model, coef=coef, **options
        )
        super().__init__(env, None, ref_model, coef=coef, **options)
