"""KL coefficient controllers (Ziegler et al. 2019), with TorchRL's update rule.

Sign convention: ``update`` takes the per-step **KL rewards** the wrappers produced, i.e.
``-coef * KL`` (negative when the policy drifts). ``-mean(kl_rewards) / coef`` recovers the KL
itself; the adaptive rule then moves ``coef`` towards the KL ``target``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llm_gym.checks import check_number

__all__ = ["KLController", "ConstantKLController", "AdaptiveKLController"]


def _check_values(kl_values: Sequence[float] | np.ndarray | None) -> np.ndarray:
    if kl_values is None:
        raise ValueError("kl_values must be a non-empty sequence of KL rewards, got None")
    try:
        values = np.asarray(kl_values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"kl_values must be numbers, got {kl_values!r:.80}") from None
    if values.size == 0:
        raise ValueError("kl_values must be a non-empty sequence of KL rewards, got an empty one")
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise ValueError(
            f"kl_values must be finite, got {values[bad[0]]} at index {bad[0]}: a NaN or inf "
            "KL would set the coefficient for good (check the log-probs for -inf)"
        )
    return values


class KLController:
    """Holds ``coef``; ``update(kl_values)`` returns the coefficient for the next batch."""

    coef: float

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        """The coefficient for the next batch, given this batch's KL rewards."""
        raise NotImplementedError

    def __copy__(self) -> KLController:
        # A forked env's controller (llm_gym.fork): its own coefficient from here on.
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    def state_dict(self) -> dict[str, float]:
        """What an update changes: the coefficient (a checkpoint's part).

        >>> c = ConstantKLController(0.1); c.load_state_dict({"coef": 0.3}); c.state_dict()
        {'coef': 0.3}
        """
        return {"coef": float(self.coef)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Put the coefficient back as ``state_dict`` gave it."""
        self.coef = check_number("coef", state["coef"], 0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(coef={self.coef:.6g})"


class ConstantKLController(KLController):
    """A fixed coefficient.

    >>> ConstantKLController(0.1).update([-0.02, -0.05])
    0.1
    """

    def __init__(self, kl_coef: float) -> None:
        self.coef = check_number("kl_coef", kl_coef, 0)

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        """The same coefficient (the values are checked all the same)."""
        _check_values(kl_values)
        return self.coef


class AdaptiveKLController(KLController):
    """Adaptive coefficient: ``coef *= 1 + clip(KL / target - 1, ±0.2) * min(n / horizon, 1)``.

    ``KL = -mean(kl_values) / coef`` and ``n = len(kl_values)``, as TorchRL and Ziegler et al.
    clip the proportional error. They do not bound ``n / horizon``: with more values than the
    horizon in one update their factor can reach or pass 0 (``update([0.0] * 10)`` with
    ``horizon=1`` gives -0.1), and the penalty becomes a bonus. Here one update moves the
    coefficient by at most 20%, so it stays finite and positive.

    >>> c = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    >>> round(c.update([-2.4] * 100), 6)  # KL = 12 > target: err clipped to +0.2
    0.2004
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        self.coef = check_number("init_kl_coef", init_kl_coef, 0, strict=True)
        self.target = check_number("target", target, 0, strict=True)
        self.horizon = check_number("horizon", horizon, 0, strict=True)

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        """Move ``coef`` towards ``target`` by the rule above; the new coefficient."""
        values = _check_values(kl_values)
        kl = -values.mean() / self.coef
        error = float(np.clip(kl / self.target - 1.0, -0.2, 0.2))
        self.coef *= 1.0 + error * min(len(values) / self.horizon, 1.0)
        return self.coef
