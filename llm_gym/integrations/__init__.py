"""Bridges to other RL libraries: ``trl`` (a ``rollout_func`` for TRL's ``GRPOTrainer``)."""
