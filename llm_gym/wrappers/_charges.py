"""The KL wrappers' one batched path: log-prob retrieval and the KL charge of N responses;
``batched=False`` is a single env's step as a batch of one (only ``info``'s layout differs)."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym.chat.containers import Response
from llm_gym.checks import check_number
from llm_gym.envs import batch_infos
from llm_gym.samplers import check_scorer, response_log_probs
from llm_gym.wrappers.controllers import ConstantKLController, KLController
from llm_gym.wrappers.estimators import check_estimator, kl_estimate

__all__ = ["KLCharge", "retrieve", "with_retrievers"]

Step = tuple[Any, Any, Any, Any, dict[str, Any]]


def as_batch(env: Any, actions: Any, batched: bool) -> list[Any]:
    """A vector env's N actions (counted) or a single env's one, as a list."""
    if not batched:
        return [actions]
    if len(actions) != env.num_envs:
        raise ValueError(f"actions must hold {env.num_envs} responses, got {len(actions)}")
    return list(actions)


def as_response(action: Any) -> Any:
    """Dict actions become Responses; str, arrays and Responses pass through."""
    return Response.from_mapping(dict(action)) if isinstance(action, Mapping) else action


def check_finite(log_probs: np.ndarray, what: str, env_index: int | None) -> np.ndarray:
    """``log_probs`` if every value is finite; else an error naming the env and the token.

    A ``-inf`` log-prob makes k1's KL ``+inf`` and k3's NaN, which would then set an
    adaptive coefficient to NaN for good.
    """
    bad = np.flatnonzero(~np.isfinite(log_probs))
    if bad.size:
        where = "" if env_index is None else f"sub-env {env_index}: "
        raise ValueError(
            f"{where}{what} must be finite, got {log_probs[bad[0]]} at response token "
            f"{bad[0]} ({bad.size} non-finite of {len(log_probs)}): a sampler that masks "
            "tokens (top-k/top-p) must report the raw model's log-probs"
        )
    return log_probs


def retrieve(wrapper: Any, actions: Any, batched: bool) -> Step:
    """``RetrieveLogProb.step`` (single or vector): score each response given the prompt the
    env showed (one forward for the batch), step the env, put the scores in ``info[key]``.

    Scored before the env steps, so a response the model rejects changes nothing.
    """
    if wrapper._prompt is None:
        raise gym.error.ResetNeeded("Cannot call step before reset")
    env, key = wrapper.env, wrapper.log_prob_key
    actions = as_batch(env, actions, batched)
    scored = response_log_probs(
        wrapper.model,
        wrapper._prompt,
        [as_response(a) for a in actions],
        batched=batched,
        assistant_only=wrapper.assistant_only,
    )
    where = f"info[{key!r}]"
    parts = [{key: check_finite(lp, where, i if batched else None)} for i, lp in enumerate(scored)]
    obs, rewards, terminated, truncated, info = env.step(actions if batched else actions[0])
    info.update(batch_infos(parts) if batched else parts[0])  # stacked over sub-envs
    wrapper._prompt = obs
    return obs, rewards, terminated, truncated, info


def provides_key(env: Any, key: str) -> bool:
    """Whether a RetrieveLogProb (or vector version) below ``env`` writes ``info[key]``."""
    while env is not None:
        if getattr(env, "log_prob_key", None) == key:
            return True
        env = getattr(env, "env", None)
    return False


# The reference models warned about scoring below float32 (weakly held: they may go).
_warned_low_precision: weakref.WeakSet[Any] = weakref.WeakSet()


def with_retrievers(
    env: Any,
    retriever: Callable[..., Any],
    gen_model: Any,
    ref_model: Any,
    keys: tuple[str, str],
    assistant_only: bool,
) -> Any:
    """``env`` wrapped in ``retriever`` (``RetrieveLogProb`` or its vector version) for the
    generator, if given, then the reference, writing ``keys`` (gen, ref). Both models must
    score, and tokenize and pad alike, or their log-probs would not align."""
    if ref_model is None:
        raise ValueError("ref_model is required: the model the KL is measured against")
    check_scorer(ref_model, "ref_model")
    if gen_model is None:
        # Log-probs from generation against a reference below float32: their difference is
        # then mostly rounding noise. Said once per reference model (torch module).
        model = getattr(ref_model, "model", None)  # a TransformersPolicy's torch model
        dtype = str(getattr(model, "dtype", ""))
        if dtype in ("torch.bfloat16", "torch.float16") and model not in _warned_low_precision:
            _warned_low_precision.add(model)
            warnings.warn(
                f"the reference model scores in {dtype.removeprefix('torch.')}, below float32, "
                "and the generator's log-probs come from generation: between a model and "
                "itself k1's mean |KL| measured 0.027 in bfloat16 against 1.5e-6 in float32. "
                "Pass gen_model= (RetrieveKL) to re-score the responses with the generator in "
                "the same forward as the reference, or score in float32.",
                UserWarning,
                stacklevel=3,
            )
        return retriever(env, ref_model, keys[1], assistant_only)
    check_scorer(gen_model, "gen_model")
    gen_tok, ref_tok = getattr(gen_model, "tokenizer", None), getattr(ref_model, "tokenizer", None)
    if gen_tok is not None and ref_tok is not None:
        if len(gen_tok) != len(ref_tok) or gen_tok.pad_token_id != ref_tok.pad_token_id:
            raise ValueError(
                "gen_model and ref_model must share a tokenizer and padding convention: got "
                f"{len(gen_tok)} vs {len(ref_tok)} tokens, pad_token_id {gen_tok.pad_token_id} "
                f"vs {ref_tok.pad_token_id}"
            )
    env = retriever(env, gen_model, keys[0], assistant_only)
    return retriever(env, ref_model, keys[1], assistant_only)


class KLCharge:
    """A KL wrapper's settings, its coefficient (``controller``) with the KL rewards
    (``-kl_penalty``) collected since the controller's last update, and the charge of a batch.

    ``env``: the env a ``KLComputation`` wraps, which must hold a ``RetrieveLogProb`` writing
    ``ref_key``; None for a wrapper that scores by itself (``TokenKLWrapper``).
    """

    def __init__(
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
        check_estimator(estimator)
        controller = kl_controller
        if kl_controller is None:
            controller = ConstantKLController(check_number("coef", coef, 0))
        if not isinstance(controller, KLController):
            raise TypeError(
                f"kl_controller must be a KLController, got {type(controller).__name__}"
            )
        if env is not None and not provides_key(env, ref_key):
            raise ValueError(
                f"KLComputation reads info[{ref_key!r}]: wrap the env in "
                f"RetrieveLogProb(env, ref_model, key={ref_key!r}) first (or use RetrieveKL)"
            )
        self.controller, self.kl_rewards = controller, []
        self.gen_key, self.ref_key, self.kl_key = gen_key, ref_key, kl_key
        self.estimator, self.add_to_reward = estimator, add_to_reward
        self.gen_from_info = env is not None and provides_key(env, gen_key)
        # What KLComputation records as its constructor arguments.
        self.arguments = {
            "gen_key": gen_key,
            "ref_key": ref_key,
            "coef": coef,
            "estimator": estimator,
            "add_to_reward": add_to_reward,
            "kl_key": kl_key,
            "kl_controller": kl_controller,
        }

    @property
    def coef(self) -> float:
        """The coefficient the next charge uses."""
        return self.controller.coef

    def update(self) -> float:
        """The controller's update from the KL rewards collected since the last one."""
        values, self.kl_rewards = self.kl_rewards, []
        if not values:
            raise ValueError("update_kl_coef needs at least one step since the last update")
        return self.controller.update(values)

    def step(self, env: Any, actions: Any, batched: bool) -> Step:
        """Step ``env`` and charge each response's KL: ``info`` gets the generator's
        log-probs, the per-token KL, ``kl_penalty`` and ``token_rewards``."""
        actions = as_batch(env, actions, batched)
        # The log-probs the actions carry, unless an inner wrapper supplies them; checked
        # before the env steps, so a missing one changes nothing.
        gens = (
            []
            if self.gen_from_info
            else [self._carried(a, i if batched else None) for i, a in enumerate(actions)]
        )
        obs, rewards, terminated, truncated, info = env.step(actions if batched else actions[0])
        # Per env: a vector env's arrays over sub-envs, a single env's values as a batch of one.
        column = list if batched else (lambda value: [value])
        gens = gens or column(info[self.gen_key])
        parts = self.charge(gens, column(info[self.ref_key]), column(rewards))
        info.update(batch_infos(parts) if batched else parts[0])
        if self.add_to_reward:
            penalties = [part["kl_penalty"] for part in parts]
            if batched:
                rewards = (np.asarray(rewards, np.float64) - penalties).astype(rewards.dtype)
            else:
                rewards = float(rewards) - penalties[0]
        return obs, rewards, terminated, truncated, info

    def _carried(self, action: Any, env_index: int | None) -> np.ndarray:
        log_probs = getattr(as_response(action), "log_probs", None)
        if log_probs is None:
            raise ValueError(
                f"the generator's log-probs are missing: the action ({type(action).__name__}) "
                "carries none. Pass a Response with log_probs (TransformersPolicy with "
                f"return_log_probs=True), or wrap the env in RetrieveLogProb(env, gen_model, "
                f"key={self.gen_key!r}) / RetrieveKL(env, gen_model=..., ref_model=...)"
            )
        values = np.asarray(log_probs, dtype=np.float32)
        return check_finite(values, "the action's Response.log_probs", env_index)

    def charge(self, gens: Sequence[Any], refs: Sequence[Any], rewards: Any) -> list[dict]:
        """Per env: the info entries (gen log-probs, per-token KL, penalty, token rewards)."""
        coef, parts = self.coef, []
        for gen, ref, reward in zip(gens, refs, rewards, strict=True):
            if len(gen) != len(ref):
                raise ValueError(
                    f"generator and reference log-probs differ in length ({len(gen)} vs "
                    f"{len(ref)} tokens): the two models did not score the same response "
                    "tokens. A common cause is pad_token == eos_token with padding masked by "
                    "token id, which drops the EOS."
                )
            kl = kl_estimate(gen, ref, self.estimator)
            token_rewards = (-coef * kl).astype(np.float32)
            if len(token_rewards):  # TorchRL's: the task reward lands on the last token
                token_rewards[-1] += float(reward)
            parts.append(
                {
                    self.gen_key: gen,
                    self.kl_key: kl,
                    "kl_penalty": float(coef * kl.sum(dtype=np.float64)),
                    "token_rewards": token_rewards,
                }
            )
        self.kl_rewards.extend(-part["kl_penalty"] for part in parts)
        return parts
