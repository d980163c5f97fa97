"""Running a model on a task: the shared ``config``, every run's ``setup``, the ``rollout``,
the ``profile`` (a card a level).

The names below are imported on first use, so ``llm_gym.run.config`` loads without torch."""

from llm_gym._lazy import lazy_exports

# Public name -> the module that defines it.
_EXPORTS = {
    "Profile": "llm_gym.run.profile",
    "ProfileConfig": "llm_gym.run.config",
    "Rollout": "llm_gym.run.rollout",
    "RolloutConfig": "llm_gym.run.config",
    "RunConfig": "llm_gym.run.config",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
