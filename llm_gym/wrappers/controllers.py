"""KL coefficient controllers (Ziegler et al. 2019), with TorchRL's update rule.

Sign convention: ``update`` takes the per-step **KL rewards** the wrappers produced, i.e.
``-coef * KL`` (negative when the policy drifts). ``-mean(kl_rewards) / coef`` recovers the KL
itself; the adaptive rule then moves ``coef`` towards the KL ``target``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["KLController", "ConstantKLController", "AdaptiveKLController"]


def _check_values(kl_values: Sequence[float] | np.ndarray | None) -> np.ndarray:
    if kl_values is None:
        raise ValueError("kl_values must be a non-empty sequence of KL rewards, got None")
    values = np.asarray(kl_values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        raise ValueError("kl_values must be a non-empty sequence of KL rewards, got an empty one")
    return values


class KLController:
    """Holds ``coef``; ``update(kl_values)`` returns the coefficient for the next batch."""

    coef: float

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(coef={self.coef:.6g})"


class ConstantKLController(KLController):
    """A fixed coefficient.

    >>> ConstantKLController(0.1).update([-0.02, -0.05])
    0.1
    """

    def __init__(self, kl_coef: float) -> None:
        if not np.isfinite(kl_coef) or kl_coef < 0:
            raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef!r}")
        self.coef = float(kl_coef)

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        _check_values(kl_values)
        return self.coef


class AdaptiveKLController(KLController):
    """Adaptive coefficient: ``coef *= 1 + clip(KL / target - 1, ±0.2) * n / horizon``.

    ``KL = -mean(kl_values) / coef`` and ``n = len(kl_values)``, exactly as TorchRL.

    >>> c = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    >>> round(c.update([-2.4] * 100), 6)  # KL = 12 > target: err clipped to +0.2
    0.2004
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if not np.isfinite(init_kl_coef) or init_kl_coef <= 0:
            raise ValueError(f"init_kl_coef must be a finite number > 0, got {init_kl_coef!r}")
        if not np.isfinite(target) or target <= 0:
            raise ValueError(f"target must be a finite number > 0, got {target!r}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        self.coef = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, kl_values: Sequence[float] | np.ndarray) -> float:
        values = _check_values(kl_values)
        kl = -values.mean() / self.coef
        error = float(np.clip(kl / self.target - 1.0, -0.2, 0.2))
        self.coef *= 1.0 + error * len(values) / self.horizon
        return self.coef
