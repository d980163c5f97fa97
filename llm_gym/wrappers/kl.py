"""KL as Gymnasium reward wrappers: TorchRL's RetrieveLogProb, KLComputation, RetrieveKL and
KLRewardTransform, stackable on any chat env.

Each step, ``RetrieveLogProb`` scores the action's response tokens under a model (the
reference, or the generator) given the prompt the env showed, and ``KLComputation`` turns the
generator's and the reference's log-probs into a per-token KL and a reward penalty. Only this
step's response is charged: earlier turns were charged in earlier steps.

A scoring model is a ``TransformersPolicy`` in log-prob mode (``generate=False``), or anything
with the same call protocol (``model(obs, response) -> LogProbOutput``, ``model.generate is
False``), such as ``llm_gym.distributed.RayLogProbModel``. A scorer whose call also takes
``response_only=`` is asked for the response's log-probs alone when ``assistant_only=True``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym.chat.containers import Response
from llm_gym.policies._scoring import takes_response_only
from llm_gym.wrappers.controllers import ConstantKLController, KLController
from llm_gym.wrappers.estimators import ESTIMATORS, kl_estimate

__all__ = ["RetrieveLogProb", "KLComputation", "RetrieveKL", "KLRewardWrapper"]


# -- shared by the single-env and the vector wrappers ----------------------------------------


def record_args(wrapper: Any, args: dict[str, Any]) -> None:
    """Record a wrapper's constructor arguments, without deep-copying the models in them.

    Called first in each ``__init__``: the first record wins, so a composite wrapper keeps
    what its user passed rather than what it passes to its base class.
    """
    kwargs = {k: v for k, v in args.items() if k not in ("self", "env", "__class__")}
    gym.utils.RecordConstructorArgs.__init__(wrapper, _disable_deepcopy=True, **kwargs)


def check_scoring_model(model: Any, argument: str) -> None:
    """A model the wrappers can score with: in log-prob mode and callable."""
    if getattr(model, "generate", None) is not False or not callable(model):
        mode = "generate mode" if getattr(model, "generate", None) is True else "not a scorer"
        raise ValueError(
            f"{argument} must score responses: a TransformersPolicy with generate=False (use "
            f"policy.get_new_version(generate=False)) or a RayLogProbModel; got "
            f"{type(model).__name__} in {mode}"
        )
    if getattr(model, "pad_output", False):
        raise ValueError(
            f"{argument} must return one unpadded output per conversation (pad_output=False), "
            "got pad_output=True"
        )


def as_response(action: Any) -> Any:
    """Dict actions become Responses; str, arrays and Responses pass through."""
    if isinstance(action, Mapping):
        return Response.from_mapping(dict(action))
    return action


def score(
    model: Any,
    prompt: Any,
    responses: list[Any],
    assistant_only: bool,
    batched: bool = False,
    response_only: bool = False,
) -> list[np.ndarray]:
    """Log-probs of each response given its prompt (one observation, or a vector env's batch
    of them), in one forward pass.

    ``response_only`` asks the scorer for the response positions only (see
    ``takes_response_only``): it skips the vocabulary projection and log-softmax over the
    prompt, most of a small model's cost.
    """
    kwargs = {"response_only": True} if response_only else {}
    outputs = model(prompt, responses if batched else responses[0], **kwargs)
    outputs = outputs if batched else [outputs]
    result = []
    for out in outputs:
        log_probs = out.log_probs.response if assistant_only else out.log_probs.full
        result.append(np.asarray(log_probs, dtype=np.float32))
    return result


def action_log_probs(action: Any, gen_key: str) -> np.ndarray:
    """The generator's log-probs carried by the action, or a clear error saying what to pass."""
    log_probs = getattr(as_response(action), "log_probs", None)
    if log_probs is None:
        raise ValueError(
            f"the generator's log-probs are missing: the action ({type(action).__name__}) "
            "carries none. Pass a Response with log_probs (TransformersPolicy with "
            f"return_log_probs=True), or wrap the env in RetrieveLogProb(env, gen_model, "
            f"key={gen_key!r}) / RetrieveKL(env, gen_model=..., ref_model=...)"
        )
    return np.asarray(log_probs, dtype=np.float32)


def kl_parts(
    gen: np.ndarray, ref: np.ndarray, reward: float, coef: float, estimator: str
) -> dict[str, Any]:
    """Per-token KL, the penalty ``coef * Σ kl`` and TorchRL's per-token rewards."""
    if len(gen) != len(ref):
        raise ValueError(
            f"generator and reference log-probs differ in length ({len(gen)} vs {len(ref)} "
            "tokens): the two models did not score the same response tokens. A common cause "
            "is pad_token == eos_token with padding masked by token id, which drops the EOS."
        )
    kl = kl_estimate(gen, ref, estimator)
    penalty = float(coef * kl.sum(dtype=np.float64))
    token_rewards = (-coef * kl).astype(np.float32)
    if len(token_rewards):
        token_rewards[-1] += reward
    return {"kl": kl, "kl_penalty": penalty, "token_rewards": token_rewards}


def provides_key(env: Any, key: str) -> bool:
    """Whether a RetrieveLogProb (or vector version) below ``env`` writes ``info[key]``."""
    while env is not None:
        if getattr(env, "log_prob_key", None) == key:
            return True
        env = getattr(env, "env", None)
    return False


def check_kl_settings(coef: float, estimator: str, kl_controller: Any) -> KLController:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    if kl_controller is None:
        return ConstantKLController(coef)
    if not isinstance(kl_controller, KLController):
        raise TypeError(f"kl_controller must be a KLController, got {type(kl_controller).__name__}")
    return kl_controller


class PromptScorer:
    """Shared by the single-env and vector ``RetrieveLogProb``: the prompt each env showed
    last, and the scoring of responses against it."""

    env: Any

    def _setup_scorer(self, model: Any, key: str, assistant_only: bool) -> None:
        check_scoring_model(model, "model")
        self.model, self.log_prob_key, self.assistant_only = model, key, assistant_only
        # Asked when only the response is kept and the scorer's call takes it (looked up once).
        self._response_only = assistant_only and takes_response_only(model)
        self._prompt: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._prompt = obs
        return obs, info

    def _score_actions(self, actions: list[Any], batched: bool) -> list[np.ndarray]:
        if self._prompt is None:
            raise gym.error.ResetNeeded("Cannot call step before reset")
        responses = [as_response(a) for a in actions]
        return score(
            self.model, self._prompt, responses, self.assistant_only, batched, self._response_only
        )


class KLCoefficient:
    """The KL coefficient, its controller and the KL rewards collected for its next update."""

    kl_controller: KLController
    _kl_rewards: list[float]

    @property
    def coef(self) -> float:
        return self.kl_controller.coef

    def update_kl_coef(self) -> float:
        """Update the coefficient from the KL rewards (``-kl_penalty``) of the steps since the
        last update, and return it. Call it at your update point, e.g. after each batch."""
        values, self._kl_rewards = self._kl_rewards, []
        if not values:
            raise ValueError("update_kl_coef needs at least one step since the last update")
        return self.kl_controller.update(values)


class KLCharge(KLCoefficient):
    """Shared by the single-env and vector ``KLComputation``: settings and the per-token
    charge."""

    def _setup_kl(
        self,
        env: Any,
        gen_key: str,
        ref_key: str,
        coef: float,
        estimator: str,
        add_to_reward: bool,
        kl_key: str,
        kl_controller: KLController | None,
    ) -> None:
        self.kl_controller = check_kl_settings(coef, estimator, kl_controller)
        if not provides_key(env, ref_key):
            raise ValueError(
                f"KLComputation reads info[{ref_key!r}]: wrap the env in "
                f"RetrieveLogProb(env, ref_model, key={ref_key!r}) first (or use RetrieveKL)"
            )
        self.gen_key, self.ref_key, self.kl_key = gen_key, ref_key, kl_key
        self.estimator, self.add_to_reward = estimator, add_to_reward
        self._gen_from_info = provides_key(env, gen_key)
        self._kl_rewards = []

    def _actions_log_probs(self, actions: list[Any]) -> list[np.ndarray] | None:
        """The generator's log-probs from the actions, unless an inner wrapper supplies them;
        checked before the env steps, so a missing one changes nothing."""
        if self._gen_from_info:
            return None
        return [action_log_probs(a, self.gen_key) for a in actions]

    def _charge(self, gens: Any, refs: Any, rewards: Any) -> list[dict[str, Any]]:
        """Per env: the info entries (gen log-probs, KL, penalty, token rewards)."""
        coef, parts = self.coef, []
        for gen, ref, reward in zip(gens, refs, rewards, strict=True):
            part = kl_parts(gen, ref, float(reward), coef, self.estimator)
            part[self.gen_key], part[self.kl_key] = gen, part.pop("kl")
            parts.append(part)
        self._kl_rewards.extend(-part["kl_penalty"] for part in parts)
        return parts


# -- single-env wrappers -----------------------------------------------------------------


class RetrieveLogProb(PromptScorer, gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Put a model's log-probs of each step's response tokens into ``info[key]``.

    Args:
        env: a chat env (its observations hold the model's input mode).
        model: a log-prob-mode ``TransformersPolicy``, or a ``RayLogProbModel``.
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
        record_args(self, locals())
        self._setup_scorer(model, key, assistant_only)
        gym.Wrapper.__init__(self, env)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        # Scored before the env steps, so a response the model rejects changes nothing.
        (log_probs,) = self._score_actions([action], batched=False)
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[self.log_prob_key] = log_probs
        self._prompt = obs
        return obs, reward, terminated, truncated, info


class KLComputation(KLCharge, gym.Wrapper, gym.utils.RecordConstructorArgs):
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
        record_args(self, locals())
        self._setup_kl(env, gen_key, ref_key, coef, estimator, add_to_reward, kl_key, kl_controller)
        gym.Wrapper.__init__(self, env)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        gens = self._actions_log_probs([action])
        obs, reward, terminated, truncated, info = self.env.step(action)
        (part,) = self._charge(gens or [info[self.gen_key]], [info[self.ref_key]], [reward])
        info.update(part)
        if self.add_to_reward:
            reward = float(reward) - part["kl_penalty"]
        return obs, reward, terminated, truncated, info


def check_same_conventions(gen_model: Any, ref_model: Any) -> None:
    """Generator and reference must tokenize and pad alike, or their log-probs don't align."""
    if getattr(gen_model, "pad_output", False) != getattr(ref_model, "pad_output", False):
        raise ValueError(
            "gen_model and ref_model disagree on padding: pad_output="
            f"{gen_model.pad_output} vs {ref_model.pad_output}; both must be False"
        )
    gen_tok, ref_tok = getattr(gen_model, "tokenizer", None), getattr(ref_model, "tokenizer", None)
    if gen_tok is None or ref_tok is None:
        return
    if len(gen_tok) != len(ref_tok) or gen_tok.pad_token_id != ref_tok.pad_token_id:
        raise ValueError(
            "gen_model and ref_model must share a tokenizer and padding convention: got "
            f"{len(gen_tok)} vs {len(ref_tok)} tokens, pad_token_id {gen_tok.pad_token_id} vs "
            f"{ref_tok.pad_token_id}"
        )


def compose_retrievers(
    env: Any,
    gen_model: Any,
    ref_model: Any,
    gen_key: str,
    ref_key: str,
    assistant_only: bool,
    retrieve: type,
) -> Any:
    """``retrieve(retrieve(env, gen_model), ref_model)``, after checking the two models."""
    if ref_model is None:
        raise ValueError("ref_model is required: the model the KL is measured against")
    check_scoring_model(ref_model, "ref_model")
    if gen_model is not None:
        check_scoring_model(gen_model, "gen_model")
        check_same_conventions(gen_model, ref_model)
        env = retrieve(env, gen_model, key=gen_key, assistant_only=assistant_only)
    return retrieve(env, ref_model, key=ref_key, assistant_only=assistant_only)


class RetrieveKL(KLComputation):
    """``RetrieveLogProb`` for the generator (optional) and the reference, then
    ``KLComputation``, in one wrapper.

    ``gen_model`` may be omitted when the actions are Responses that carry their log-probs
    (what ``TransformersPolicy`` returns). Other arguments as ``KLComputation``, plus
    ``assistant_only`` as ``RetrieveLogProb``.
    """

    def __init__(
        self,
        env: gym.Env,
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
    """TorchRL's legacy ``KLRewardTransform``: ``reward -= coef · Σ (log p − log q)`` with the
    generator's log-probs taken from the action ``Response`` and the reference scored here.

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

    def __init__(
        self,
        env: gym.Env,
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


def stack_info(infos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Vector-env info for per-env values: an array per key (object arrays for arrays)."""
    out: dict[str, Any] = {}
    for key in infos[0]:
        values = [info[key] for info in infos]
        if isinstance(values[0], np.ndarray):
            array = np.empty(len(values), dtype=object)
            array[:] = values
        else:
            array = np.asarray(values)
        out[key], out[f"_{key}"] = array, np.ones(len(values), dtype=bool)
    return out
