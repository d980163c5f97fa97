"""``TokenKLWrapper``: a per-token KL penalty for ``TokenEnv``, for token-level RL libraries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from llm_gym.envs.tokens import TokenEnv
from llm_gym.lm.tensors import next_token_log_probs
from llm_gym.policies.distributions import allowed_token_mask
from llm_gym.wrappers.controllers import KLController
from llm_gym.wrappers.kl import KLCharge, KLComputation, RetrieveLogProb

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TokenKLWrapper"]


def _log_prob(
    model: PreTrainedModel, state: dict[str, np.ndarray], allowed: torch.Tensor | None, token: int
) -> float:
    """log π(token | state) under ``model``, on the model's device."""
    device = model.device
    ids = torch.as_tensor(state["input_ids"][None], dtype=torch.long, device=device)
    mask = torch.as_tensor(state["attention_mask"][None], dtype=torch.bool, device=device)
    allowed = None if allowed is None else allowed.to(device)
    return float(next_token_log_probs(model, ids, mask, allowed)[0, token])


class TokenKLWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Subtract ``coef · kl_t`` from each ``TokenEnv`` step's reward:
    ``reward_t -= coef * kl(log π(a_t|s_t), log π_ref(a_t|s_t))``, where the penalty arises (as
    RL4LMs and TRL's PPO do), not a whole response at once as the chat-level KL wrappers.

    ``kl_t`` is the estimator applied to the generator's and the reference's log-prob of the
    token just taken, given the observation (the left-padded window the policy saw). ``info``
    gets ``log_prob``, ``ref_log_prob``, ``kl`` and ``kl_penalty`` (``coef · kl_t``) every step.

    Args:
        env: a ``TokenEnv`` (possibly wrapped).
        gen_model: the policy's causal LM (for SB3, the object given as
            ``policy_kwargs["model"]``, which PPO trains in place, so log π is current).
        ref_model: the frozen reference LM (same tokenizer).
        coef, estimator, add_to_reward, kl_controller: as ``KLComputation``'s, as are the
            ``coef``, ``kl_controller`` and ``update_kl_coef`` accessors.
        allowed_token_ids: renormalize both distributions over these ids, to match a policy
            whose actions are restricted (``LLMActorCriticPolicy(allowed_token_ids=...)``).

    >>> import llm_gym
    >>> from llm_gym.envs import DatasetChatEnv
    >>> from llm_gym.lm.loading import load_gpt2_tokenizer, tiny_model
    >>> tokenizer = load_gpt2_tokenizer()
    >>> task = DatasetChatEnv([{"query": "Hi"}], input_mode="tokens", tokenizer=tokenizer)
    >>> env = llm_gym.TokenEnv(task, max_new_tokens=3, max_prompt_length=32)
    >>> model = tiny_model(tokenizer)
    >>> env = TokenKLWrapper(env, model, model, coef=0.1)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(40)
    >>> reward, float(info["kl"])  # the reference is the policy itself
    (0.0, 0.0)
    """

    def __init__(
        self,
        env: gym.Env,
        gen_model: PreTrainedModel,
        ref_model: PreTrainedModel,
        coef: float = 0.05,
        *,
        estimator: str = "k1",
        add_to_reward: bool = True,
        allowed_token_ids: Sequence[int] | None = None,
        kl_controller: KLController | None = None,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self,
            _disable_deepcopy=True,
            gen_model=gen_model,
            ref_model=ref_model,
            coef=coef,
            estimator=estimator,
            add_to_reward=add_to_reward,
            allowed_token_ids=allowed_token_ids,
            kl_controller=kl_controller,
        )
        if not isinstance(env.unwrapped, TokenEnv):
            raise TypeError(
                f"env must be a TokenEnv (possibly wrapped), got {type(env.unwrapped).__name__}; "
                "for chat envs use RetrieveKL or KLRewardWrapper"
            )
        vocab = env.unwrapped.vocab_size
        for name, model in (("gen_model", gen_model), ("ref_model", ref_model)):
            head = getattr(model, "get_output_embeddings", lambda: None)()
            if head is None or not callable(model):
                raise TypeError(
                    f"{name} must be a transformers causal LM, got {type(model).__name__}"
                )
            if head.weight.shape[0] < vocab:
                raise ValueError(
                    f"{name}'s LM head has {head.weight.shape[0]} outputs, fewer than the "
                    f"env's {vocab} tokens: model and tokenizer do not match"
                )
        self.charge = KLCharge(
            None, "log_prob", "ref_log_prob", coef, estimator, add_to_reward, "kl", kl_controller
        )
        allowed = allowed_token_mask(allowed_token_ids, vocab)
        gym.Wrapper.__init__(self, env)
        self.gen_model, self.ref_model = gen_model, ref_model
        self._allowed = allowed
        self._prompt: dict[str, np.ndarray] | None = None

    kl_controller = KLComputation.kl_controller
    coef = KLComputation.coef
    update_kl_coef = KLComputation.update_kl_coef

    reset = RetrieveLogProb.reset  # keeps the state the next token is taken in

    def step(
        self, action: int | np.integer | np.ndarray
    ) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Score the token under both models, step the env and charge the token's KL."""
        if self._prompt is None:
            raise gym.error.ResetNeeded("Cannot call TokenKLWrapper.step before reset")
        state = self._prompt
        # Checked and scored before the env steps, so that a bad action changes nothing.
        token = self.env.unwrapped.check_action(action)
        if self._allowed is not None and not self._allowed[token]:
            raise ValueError(f"action {token} is not among allowed_token_ids")
        gen = _log_prob(self.gen_model, state, self._allowed, token)
        ref = _log_prob(self.ref_model, state, self._allowed, token)
        obs, reward, terminated, truncated, info = self.env.step(action)
        # The chat wrappers' charge, over a response of one token.
        part = self.charge.charge([np.array([gen])], [np.array([ref])], [reward])[0]
        kl, penalty = float(part["kl"][0]), part["kl_penalty"]
        self._prompt = obs
        info = {**info, "log_prob": gen, "ref_log_prob": ref, "kl": kl, "kl_penalty": penalty}
        if self.charge.add_to_reward:
            reward = float(reward) - penalty
        return obs, reward, terminated, truncated, info
