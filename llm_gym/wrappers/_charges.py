"""The per-batch logic of the KL wrappers, shared by the single-env and vector versions.

A single env's step is a batch of one: the wrappers in ``kl.py`` and ``vector.py`` hold
these objects and differ only in how they step their env and lay out ``info``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from llm_gym.chat.containers import Response
from llm_gym.samplers import Scorer, check_scorer, response_log_probs
from llm_gym.wrappers.controllers import ConstantKLController, KLController
from llm_gym.wrappers.estimators import ESTIMATORS, kl_estimate

__all__ = [
    "KLCharge",
    "KLCoefficient",
    "as_response",
    "check_estimator",
    "check_finite",
    "check_pair",
    "provides_key",
    "score",
    "warn_low_precision",
]


def as_response(action: Any) -> Any:
    """Dict actions become Responses; str, arrays and Responses pass through."""
    if isinstance(action, Mapping):
        return Response.from_mapping(dict(action))
    return action


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


def score(
    model: Scorer,
    prompt: Any,
    actions: Sequence[Any],
    *,
    batched: bool,
    assistant_only: bool,
    key: str,
) -> list[np.ndarray]:
    """Log-probs of each action's response given the prompt the env showed, one forward."""
    if prompt is None:
        raise gym.error.ResetNeeded("Cannot call step before reset")
    responses = [as_response(a) for a in actions]
    scored = response_log_probs(
        model, prompt, responses, batched=batched, assistant_only=assistant_only
    )
    return [
        check_finite(lp, f"info[{key!r}]", i if batched else None) for i, lp in enumerate(scored)
    ]


def provides_key(env: Any, key: str) -> bool:
    """Whether a RetrieveLogProb (or vector version) below ``env`` writes ``info[key]``."""
    while env is not None:
        if getattr(env, "log_prob_key", None) == key:
            return True
        env = getattr(env, "env", None)
    return False


def check_pair(gen_model: Any, ref_model: Any) -> None:
    """Both models score, and tokenize and pad alike, or their log-probs don't align."""
    if ref_model is None:
        raise ValueError("ref_model is required: the model the KL is measured against")
    check_scorer(ref_model, "ref_model")
    if gen_model is None:
        return
    check_scorer(gen_model, "gen_model")
    gen_tok, ref_tok = getattr(gen_model, "tokenizer", None), getattr(ref_model, "tokenizer", None)
    if gen_tok is None or ref_tok is None:
        return
    if len(gen_tok) != len(ref_tok) or gen_tok.pad_token_id != ref_tok.pad_token_id:
        raise ValueError(
            "gen_model and ref_model must share a tokenizer and padding convention: got "
            f"{len(gen_tok)} vs {len(ref_tok)} tokens, pad_token_id {gen_tok.pad_token_id} vs "
            f"{ref_tok.pad_token_id}"
        )


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")


_LOW_PRECISION = {"torch.bfloat16", "torch.float16"}
_warned_low_precision = False


def warn_low_precision(ref_model: Any) -> None:
    """Warn once per process when the reference scores below float32 and the generator's
    log-probs come from generation: their difference is then mostly rounding noise."""
    global _warned_low_precision
    dtype = str(getattr(getattr(ref_model, "model", None), "dtype", ""))
    if dtype in _LOW_PRECISION and not _warned_low_precision:
        _warned_low_precision = True
        warnings.warn(
            f"the reference model scores in {dtype.removeprefix('torch.')}, below float32, and "
            "the generator's log-probs come from generation: between a model and itself k1's "
            "mean |KL| measured 0.027 in bfloat16 against 1.5e-6 in float32. Pass gen_model= "
            "(RetrieveKL) to re-score the responses with the generator in the same forward "
            "as the reference, or score in float32.",
            UserWarning,
            stacklevel=3,
        )


class KLCoefficient:
    """The KL coefficient, its controller, and the KL rewards (``-kl_penalty``) collected
    since the controller's last update."""

    def __init__(self, coef: float, kl_controller: KLController | None) -> None:
        if kl_controller is None:
            if isinstance(coef, bool) or not isinstance(coef, (int, float, np.number)):
                raise TypeError(f"coef must be a number, got {type(coef).__name__}: {coef!r:.40}")
            if not (np.isfinite(coef) and coef >= 0):
                raise ValueError(f"coef must be a finite number >= 0, got {coef!r}")
            kl_controller = ConstantKLController(coef)
        if not isinstance(kl_controller, KLController):
            raise TypeError(
                f"kl_controller must be a KLController, got {type(kl_controller).__name__}"
            )
        self.controller = kl_controller
        self.kl_rewards: list[float] = []

    @property
    def coef(self) -> float:
        return self.controller.coef

    def update(self) -> float:
        values, self.kl_rewards = self.kl_rewards, []
        if not values:
            raise ValueError("update_kl_coef needs at least one step since the last update")
        return self.controller.update(values)


class KLCharge:
    """``KLComputation``'s settings and its per-token charge of a batch of responses."""

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
        self.coefficient = KLCoefficient(coef, kl_controller)
        if not provides_key(env, ref_key):
            raise ValueError(
                f"KLComputation reads info[{ref_key!r}]: wrap the env in "
                f"RetrieveLogProb(env, ref_model, key={ref_key!r}) first (or use RetrieveKL)"
            )
        self.gen_key, self.ref_key, self.kl_key = gen_key, ref_key, kl_key
        self.estimator, self.add_to_reward = estimator, add_to_reward
        self.gen_from_info = provides_key(env, gen_key)
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

    def action_log_probs(self, actions: Sequence[Any], batched: bool) -> list[np.ndarray] | None:
        """The generator's log-probs carried by the actions, unless an inner wrapper supplies
        them; checked before the env steps, so a missing one changes nothing."""
        if self.gen_from_info:
            return None
        return [self._carried(a, i if batched else None) for i, a in enumerate(actions)]

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

    def charge(self, gens: Any, refs: Any, rewards: Any) -> list[dict[str, Any]]:
        """Per env: the info entries (gen log-probs, per-token KL, penalty, token rewards)."""
        coef, parts = self.coefficient.coef, []
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
        self.coefficient.kl_rewards.extend(-part["kl_penalty"] for part in parts)
        return parts
