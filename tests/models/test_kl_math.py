"""KL estimators and controllers: exact numbers for fixed inputs."""

import numpy as np
import pytest

from llm_gym.wrappers.controllers import AdaptiveKLController, ConstantKLController
from llm_gym.wrappers.estimators import kl_estimate

LOG_P = np.array([-0.5, -1.0, -2.0, -0.1])
LOG_Q = np.array([-0.7, -1.0, -1.0, -3.0])


def test_estimators_match_their_formulas():
    d = LOG_P - LOG_Q
    np.testing.assert_allclose(kl_estimate(LOG_P, LOG_Q, "k1"), d, rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(LOG_P, LOG_Q, "k2"), 0.5 * d**2, rtol=1e-6)
    ratio = np.exp(LOG_Q - LOG_P)
    np.testing.assert_allclose(kl_estimate(LOG_P, LOG_Q, "k3"), ratio - 1 - np.log(ratio), 1e-6)
    assert kl_estimate(LOG_P, LOG_Q).dtype == np.float32
    assert (kl_estimate(LOG_P, LOG_Q, "k3") >= 0).all()


def test_estimators_are_zero_when_models_agree():
    for name in ("k1", "k2", "k3"):
        assert np.array_equal(kl_estimate(LOG_P, LOG_P, name), np.zeros(4, np.float32))


def test_k3_is_unbiased_for_kl_between_categoricals():
    rng = np.random.default_rng(0)
    p, q = np.array([0.7, 0.2, 0.1]), np.array([0.4, 0.4, 0.2])
    samples = rng.choice(3, size=200_000, p=p)
    exact = float(np.sum(p * np.log(p / q)))
    for name in ("k1", "k3"):
        estimate = kl_estimate(np.log(p[samples]), np.log(q[samples]), name).mean()
        assert estimate == pytest.approx(exact, abs=5e-3)


def test_estimator_errors():
    with pytest.raises(ValueError, match="estimator must be one of .*got 'k4'"):
        kl_estimate(LOG_P, LOG_Q, "k4")
    with pytest.raises(ValueError, match=r"same shape, got \(4,\) and \(3,\).*pad_token"):
        kl_estimate(LOG_P, LOG_Q[:3])


def test_adaptive_controller_follows_torchrl_rule_on_a_fixed_sequence():
    c = AdaptiveKLController(init_kl_coef=0.1, target=1.0, horizon=100)
    expected, coef = [], 0.1
    for batch in ([-0.05, -0.15], [-0.3] * 4, [-0.0001] * 10):
        kl = -np.mean(batch) / coef
        err = np.clip(kl / 1.0 - 1, -0.2, 0.2)
        coef *= 1 + err * len(batch) / 100
        expected.append(coef)
    got = [c.update(b) for b in ([-0.05, -0.15], [-0.3] * 4, [-0.0001] * 10)]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # Hand-checked first step: KL = 0.1/0.1 = 1 = target, so the coefficient stays.
    assert got[0] == pytest.approx(0.1)
    # KL = 0.3/0.1 = 3: error clipped to +0.2, four values: 0.1 * (1 + 0.2 * 4 / 100).
    assert got[1] == pytest.approx(0.1 * 1.008)
    assert got[2] < got[1]  # KL far below target: the coefficient shrinks


def test_controllers_reject_none_and_bad_settings():
    for controller in (ConstantKLController(0.05), AdaptiveKLController(0.1, 6.0, 10_000)):
        with pytest.raises(ValueError, match="kl_values must be a non-empty sequence.*got None"):
            controller.update(None)
    c = AdaptiveKLController(0.1, 6.0, 10_000)
    with pytest.raises(ValueError, match="got an empty one"):
        c.update([])
    assert c.coef == 0.1  # a failed update changes nothing
    assert ConstantKLController(0.05).update([-1.0, -2.0]) == 0.05
    with pytest.raises(ValueError, match="horizon must be a finite number > 0, got 0"):
        AdaptiveKLController(0.1, 6.0, 0)
    with pytest.raises(ValueError, match="horizon must be a finite number > 0, got nan"):
        AdaptiveKLController(0.1, 6.0, float("nan"))
    with pytest.raises(TypeError, match="kl_coef must be a finite number >= 0, got '0.1'"):
        ConstantKLController("0.1")
    with pytest.raises(ValueError, match="kl_values must be finite, got nan at index 1"):
        c.update([-0.1, float("nan")])
    assert c.coef == 0.1


def test_adaptive_coefficient_stays_positive_when_n_exceeds_the_horizon():
    # TorchRL's and Ziegler et al.'s factor 1 - 0.2 * 10 / 1 = -1 would make it -0.1.
    c = AdaptiveKLController(0.1, 6.0, 1)
    assert c.update([0.0] * 10) == pytest.approx(0.08)
    for _ in range(50):
        c.update([0.0] * 100)
    assert 0 < c.coef < 0.08
    with pytest.raises(ValueError, match="kl_coef must be a finite number >= 0, got -1"):
        ConstantKLController(-1)
