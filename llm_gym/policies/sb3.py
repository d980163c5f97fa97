"""``LLMActorCriticPolicy``: a transformers causal LM as a stable-baselines3 actor-critic for
token-level envs (``llm_gym.TokenEnv``, RL4LMs' design). docs/integrations.md's
"stable-baselines3" section has a PPO run and says what saving pickles (``policy_kwargs``: the
``ModelSpec`` forms).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from gymnasium import spaces
from stable_baselines3.common.distributions import CategoricalDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

from llm_gym.lm.tensors import position_ids
from llm_gym.policies.distributions import allowed_token_mask

__all__ = ["LLMActorCriticPolicy", "ModelSpec", "last_positions"]

# A model object, a local folder saved with save_pretrained ("default": SmolLM2), or a
# function returning a model.
ModelSpec = nn.Module | str | os.PathLike | Callable[[], nn.Module]


def _resolve_model(spec: ModelSpec, argument: str = "model") -> nn.Module:
    """The transformers model a ``ModelSpec`` names (objects are returned as they are)."""
    if isinstance(spec, nn.Module):
        model = spec
    elif isinstance(spec, (str, os.PathLike)):
        from llm_gym.lm.loading import load_model

        model = load_model(spec)[0]
    elif callable(spec):
        model = spec()
    else:
        raise TypeError(
            f"{argument} must be a transformers model, a local model folder or a function "
            f"returning a model, got {type(spec).__name__}"
        )
    if not (isinstance(model, nn.Module) and hasattr(model, "config")):
        raise TypeError(f"{argument} must give a transformers model, got {type(model).__name__}")
    return model


def last_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token (the mask's last 1), for left or right padding."""
    length = attention_mask.shape[-1]
    return length - 1 - attention_mask.flip(-1).argmax(-1)


class LLMActorCriticPolicy(ActorCriticPolicy):
    """An SB3 ``ActorCriticPolicy`` whose actor is a causal LM and whose critic is a value head.

    Actions are ``Categorical(lm_head(h_last))``, ``h_last`` being the final hidden state at
    each row's last real token (positions count from the first real token, so left padding
    changes nothing); the value is a zero-initialised linear head on ``h_last`` (or on
    ``value_model``'s). The LMs stay in eval mode (no dropout) while training: PPO's
    probability ratio must compare the same function at rollout and update time.

    Args:
        observation_space / action_space / lr_schedule: given by the SB3 algorithm.
        model: the policy LM: a transformers causal LM, a local folder saved with
            ``save_pretrained`` (``"default"`` for SmolLM2-135M-Instruct), or a function
            returning a model. It is trained in place.
        value_model: optional separate critic trunk (a causal LM or a base model, same
            forms as ``model``). Default: the value head shares the policy LM.
        allowed_token_ids: restrict the actions to these token ids (the others get
            probability 0), e.g. digits and EOS for an arithmetic task. Default: all.
        use_sde: must be False (passed by SB3).
        optimizer_class / optimizer_kwargs: as SB3's; only parameters with
            ``requires_grad`` are optimised, so freezing LM layers works.
    """

    def __init__(
        self,
        observation_space: spaces.Dict,
        action_space: spaces.Discrete,
        lr_schedule: Schedule,
        model: ModelSpec,
        *,
        value_model: ModelSpec | None = None,
        allowed_token_ids: Sequence[int] | None = None,
        use_sde: bool = False,
        optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        _check_spaces(observation_space, action_space)
        if use_sde:
            raise ValueError("use_sde must be False: the action space is Discrete, got True")
        policy_lm = _resolve_model(model, "model")
        n_actions = int(action_space.n)
        critic = None if value_model is None else _resolve_model(value_model, "value_model")
        allowed = allowed_token_mask(allowed_token_ids, n_actions)

        # ActorCriticPolicy builds its MLP heads in _build; here _build only records the
        # schedule, and the LM parts are attached once nn.Module is set up.
        super().__init__(
            observation_space,
            action_space,
            lr_schedule,
            net_arch=[],
            ortho_init=False,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
        )
        self._model_spec, self._value_model_spec = model, value_model
        self.allowed_token_ids = None if allowed is None else allowed.nonzero()[:, 0].tolist()
        self.model = policy_lm
        self.value_model = critic
        trunk = critic if critic is not None else policy_lm
        self.value_head = nn.Linear(trunk.config.get_text_config().hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.register_buffer("allowed_token_mask", allowed, persistent=False)
        self.set_training_mode(False)  # before the head check: dropout would fail it
        _check_lm_head(policy_lm, n_actions)
        trainable = [p for p in self.parameters() if p.requires_grad]
        self.optimizer = self.optimizer_class(trainable, lr=lr_schedule(1), **self.optimizer_kwargs)

    def _build(self, lr_schedule: Schedule) -> None:
        # Called by ActorCriticPolicy.__init__ before the LM can be attached; see __init__.
        pass

    def _get_constructor_parameters(self) -> dict[str, Any]:
        # What BaseModel.save/load (policy-only files) rebuilds the policy from.
        return {
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "lr_schedule": self._dummy_schedule,
            "model": self._model_spec,
            "value_model": self._value_model_spec,
            "allowed_token_ids": self.allowed_token_ids,
            "optimizer_class": self.optimizer_class,
            "optimizer_kwargs": self.optimizer_kwargs,
        }

    def set_training_mode(self, mode: bool) -> None:
        """SB3's training mode for the heads; the LMs stay in eval mode."""
        super().set_training_mode(mode)
        self.model.eval()
        if self.value_model is not None:
            self.value_model.eval()

    # -- SB3's policy interface ------------------------------------------------------------

    def forward(
        self, obs: PyTorchObs, deterministic: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Actions (next tokens), their values and log-probs, from one pass of the LM."""
        distribution, hidden = self._actor(obs)
        actions = distribution.get_actions(deterministic=deterministic)
        return actions, self._value(obs, hidden), distribution.log_prob(actions)

    def evaluate_actions(
        self, obs: PyTorchObs, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Values, log-probs of ``actions`` and entropies, for PPO's and A2C's losses."""
        distribution, hidden = self._actor(obs)
        log_prob = distribution.log_prob(actions)
        return self._value(obs, hidden), log_prob, distribution.entropy()

    def get_distribution(self, obs: PyTorchObs) -> CategoricalDistribution:
        """The categorical over next tokens (the allowed ones) for ``obs``."""
        return self._actor(obs)[0]

    def predict_values(self, obs: PyTorchObs) -> torch.Tensor:
        """The critic's values ``(B, 1)`` for ``obs``."""
        return self._value(obs)

    # -- internals -------------------------------------------------------------------------

    def _actor(self, obs: PyTorchObs) -> tuple[CategoricalDistribution, torch.Tensor]:
        """The action distribution and ``h_last`` ``(B, H)``, from one trunk pass."""
        ids, mask = _inputs(obs)
        hidden = self._trunk_hidden(self.model, ids, mask)
        logits = self.model.get_output_embeddings()(hidden)
        # An LM head padded past the tokenizer's vocabulary has outputs no action names.
        logits = logits[:, : int(self.action_space.n)].float()
        if self.allowed_token_mask is not None:
            logits = logits.masked_fill(~self.allowed_token_mask, torch.finfo(logits.dtype).min)
        return self.action_dist.proba_distribution(action_logits=logits), hidden

    def _value(self, obs: PyTorchObs, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """The value head on the critic's ``h_last`` (``hidden``: the policy LM's, if shared)."""
        if self.value_model is not None or hidden is None:
            trunk = self.model if self.value_model is None else self.value_model
            hidden = self._trunk_hidden(trunk, *_inputs(obs))
        return self.value_head(hidden.float())

    @staticmethod
    def _trunk_hidden(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The final hidden state at each row's last real token, without the LM head."""
        trunk = getattr(model, "base_model", model)
        out = trunk(
            input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False
        )
        rows = torch.arange(ids.shape[0], device=ids.device)
        return out.last_hidden_state[rows, last_positions(mask)]


def _check_lm_head(model: nn.Module, n_actions: int) -> None:
    """``model`` must have an LM head with an output per action, which on the trunk's last
    hidden state gives the model's own logits.

    The policy computes them that way (the trunk once, the head at one position per row),
    not with ``model(..., output_hidden_states=True)``, which in transformers 5 installs
    forward hooks that make the model unpicklable (and SB3 pickles ``policy_kwargs``).
    Models that post-process their logits (e.g. Gemma 2's soft-capping) are refused here.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise TypeError(
            f"model must be a causal LM with an LM head (AutoModelForCausalLM), got "
            f"{type(model).__name__}"
        )
    if head.weight.shape[0] < n_actions:
        raise ValueError(
            f"model's LM head has {head.weight.shape[0]} outputs but the action space has "
            f"{n_actions} tokens: the model and the env's tokenizer do not match"
        )
    ids = torch.arange(1, 4, device=model.device)[None] % model.config.get_text_config().vocab_size
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        hidden = LLMActorCriticPolicy._trunk_hidden(model, ids, torch.ones_like(ids))
        head = head(hidden).float()
    if not torch.allclose(full, head, rtol=1e-3, atol=1e-3):
        raise ValueError(
            f"model ({type(model).__name__}) post-processes its logits beyond its LM head "
            "(e.g. soft-capping or scaling), which LLMActorCriticPolicy does not reproduce"
        )


def _inputs(obs: PyTorchObs) -> tuple[torch.Tensor, torch.Tensor]:
    # SB3 may hand over float tensors (its preprocessing casts Box observations); ids up
    # to 2**24 survive float32 exactly.
    ids, mask = obs["input_ids"].long(), obs["attention_mask"].long()
    if not bool(mask.any(-1).all()):
        raise ValueError("every observation row needs a real token: attention_mask is all 0")
    return ids, mask


def _check_spaces(observation_space: Any, action_space: Any) -> None:
    keys = ("input_ids", "attention_mask")
    if not isinstance(observation_space, spaces.Dict) or any(
        not isinstance(observation_space.spaces.get(k), spaces.Box) for k in keys
    ):
        raise TypeError(
            "observation_space must be a Dict with 'input_ids' and 'attention_mask' Box "
            f"spaces (a TokenEnv's), got {observation_space}"
        )
    shapes = {observation_space[k].shape for k in keys}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1:
        raise ValueError(
            "observation_space's input_ids and attention_mask must be 1-D of one length, got "
            f"shapes {[observation_space[k].shape for k in keys]}"
        )
    if not isinstance(action_space, spaces.Discrete):
        raise TypeError(f"action_space must be Discrete (token ids), got {action_space}")
