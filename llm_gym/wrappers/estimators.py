"""Per-token KL estimators between the generator p and the reference q.

With ``log_p`` the generator's and ``log_q`` the reference's log-probs of the sampled tokens
(sampled from p), each is an estimator of KL(p || q) (Schulman, "Approximating KL divergence"):

- ``k1 = log p - log q``: unbiased, high variance, can be negative (TorchRL's).
- ``k2 = ½ (log p - log q)²``: biased, low variance, non-negative.
- ``k3 = (q/p - 1) - log(q/p)``: unbiased, low variance, non-negative.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["ESTIMATORS", "check_estimator", "kl_estimate"]


ESTIMATORS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "k1": lambda log_p, log_q: log_p - log_q,
    "k2": lambda log_p, log_q: 0.5 * (log_p - log_q) ** 2,
    "k3": lambda log_p, log_q: np.expm1(log_q - log_p) - (log_q - log_p),
}


def check_estimator(estimator: str) -> str:
    """``estimator`` if it names one of ``ESTIMATORS``."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, got {estimator!r}")
    return estimator


def kl_estimate(log_p: np.ndarray, log_q: np.ndarray, estimator: str = "k1") -> np.ndarray:
    """Per-token KL estimate (``float32``) from two equally long log-prob arrays.

    >>> kl_estimate(np.array([-1.0, -2.0]), np.array([-1.5, -2.0]), "k1")
    array([0.5, 0. ], dtype=float32)
    """
    check_estimator(estimator)
    log_p = np.asarray(log_p, dtype=np.float64)
    log_q = np.asarray(log_q, dtype=np.float64)
    if log_p.shape != log_q.shape:
        raise ValueError(
            f"log_p and log_q must have the same shape, got {log_p.shape} and {log_q.shape} "
            "(if they differ by one token, check pad_token == eos_token handling)"
        )
    return ESTIMATORS[estimator](log_p, log_q).astype(np.float32)
