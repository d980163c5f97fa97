"""``llm-gym train``: the GRPO trainer (``grpo``), its options (``config``), the
advantages (``advantages``), its loss (``loss``) and the greedy evaluation (``evaluation``).

The names below are imported on first use, so ``llm_gym.train.config`` loads without torch."""

from llm_gym._lazy import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {
    "GRPOConfig": "llm_gym.train.config",
    "GRPOTrainer": "llm_gym.train.grpo",
    "advantages": "llm_gym.train.advantages",
    "evaluate_greedy": "llm_gym.train.evaluation",
    "group_advantages": "llm_gym.train.advantages",
    "grpo_loss": "llm_gym.train.loss",
    "per_token_advantages": "llm_gym.train.advantages",
    "resumed_config": "llm_gym.train.run_folder",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
