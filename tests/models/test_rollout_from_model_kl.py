"""RolloutFromModel's KL side: the KL scheduler, a policy as the reference model, read-only
arrays from a scorer; and its errors."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rollout_fixture import (  # noqa: F401  (fixtures)
    M,
    RecordingController,
    length_reward,
    make_batch,
    model,
    plain_log_probs,
    ref_model,
    rows,
)

from llm_gym.lm.loading import tiny_model
from llm_gym.policies import TransformersPolicy
from llm_gym.torchrl import RolloutFromModel
from llm_gym.wrappers.controllers import AdaptiveKLController, ConstantKLController

# -- KL scheduler ------------------------------------------------------------------------------


def test_step_scheduler_applies_the_adaptive_rule(model, ref_model):
    controller = AdaptiveKLController(init_kl_coef=0.2, target=0.01, horizon=10)
    rollout = RolloutFromModel(
        model, ref_model, length_reward, max_new_tokens=M, kl_scheduler=controller
    )
    assert rollout.kl_coef == 0.2  # the scheduler's coefficient from the start
    torch.manual_seed(3)
    means = [float(rollout(make_batch())["next"]["reward_kl"].mean()) for _ in range(2)]
    kl = -np.mean(means) / 0.2
    assert kl > 0
    expected = 0.2 * (1 + np.clip(kl / 0.01 - 1, -0.2, 0.2) * 2 / 10)
    assert rollout.step_scheduler() == pytest.approx(expected)
    assert rollout.kl_coef == pytest.approx(expected) and expected != pytest.approx(0.2)
    with pytest.raises(RuntimeError, match="no rollout was collected"):
        rollout.step_scheduler()
    out = rollout(make_batch())  # the new coefficient is used from the next rollout on
    log_ratio = -out["next"]["reward_kl"] / expected
    assert log_ratio[out["mask"]].abs().max() > 0


def test_num_steps_keeps_the_last_values_and_constant_controller(model, ref_model):
    controller = RecordingController(0.3)
    rollout = RolloutFromModel(
        model, ref_model, length_reward, max_new_tokens=2, num_steps=1, kl_scheduler=controller
    )
    for _ in range(3):
        last = float(rollout(make_batch())["next"]["reward_kl"].mean())
    assert rollout.step_scheduler() == 0.3
    assert controller.seen == [pytest.approx(last)]  # mean KL rewards; num_steps=1: the last


def test_log_prob_policy_as_ref_model(gpt2_tokenizer):
    model = tiny_model(gpt2_tokenizer, arch="gpt2")
    ref = tiny_model(gpt2_tokenizer, seed=1)
    policy = TransformersPolicy(ref, gpt2_tokenizer, generate=False, input_mode="tokens")
    encoded = gpt2_tokenizer(["Hello, how are", "The sky is"], padding=True, return_tensors="pt")
    batch = {"input_ids": encoded.input_ids, "prompt_rindex": encoded.attention_mask.sum(-1)}
    kwargs = {"max_new_tokens": 4, "label_baseline": False}
    local = RolloutFromModel(model, ref, length_reward, **kwargs)
    torch.manual_seed(4)
    generated, log_probs, log_ratio = local.generate(batch)
    with_policy = RolloutFromModel(model, policy, length_reward, **kwargs)
    out = with_policy.create_rollout(batch, generated, log_probs)  # log_ratio via the policy
    reward_kl = out["next"]["reward_kl"][..., 0]
    torch.testing.assert_close(reward_kl, -0.1 * log_ratio, atol=1e-5, rtol=0)
    assert out["next"]["reward_kl"].abs().max() > 0


def test_read_only_arrays_of_a_scorer_and_reward_model_raise_no_warning(model, ref_model):
    class ReadOnlyScorer:  # as Ray's zero-copy results come back: arrays that are read-only
        generate, input_mode = False, "tokens"

        def __call__(self, obs, responses, response_only=True):
            outputs = []
            for prompt, response in zip(obs["tokens"], responses, strict=True):
                values = plain_log_probs(ref_model, prompt, response).numpy()
                values.setflags(write=False)
                outputs.append(SimpleNamespace(log_probs=SimpleNamespace(response=values)))
            return outputs

    def read_only_scores(input_ids, attention_mask):
        scores = length_reward(input_ids, attention_mask).numpy()
        scores.setflags(write=False)
        return scores

    torch.manual_seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns on a view of a non-writable array
        kwargs = {"kl_coef": 0.5, "max_new_tokens": M}
        out = RolloutFromModel(model, ReadOnlyScorer(), read_only_scores, **kwargs)(make_batch())
    for row, (rindex, n) in enumerate(zip(make_batch()["prompt_rindex"], rows(out), strict=True)):
        prompt, response = make_batch()["input_ids"][row, :rindex], out["action"][row, :n]
        log_ratio = plain_log_probs(model, prompt, response) - plain_log_probs(
            ref_model, prompt, response
        )
        reward_kl = out["next"]["reward_kl"][row, :n, 0]
        torch.testing.assert_close(reward_kl, -0.5 * log_ratio, atol=1e-4, rtol=0)
    assert out["next"]["reward_raw"].abs().sum() > 0


# -- errors -------------------------------------------------------------------------------


def test_bad_constructor_arguments(model):
    args = (model, model, length_reward)
    cases = [
        (TypeError, "model must be a transformers causal LM", {"model": object()}),
        (TypeError, "ref_model must be a causal LM", {"ref_model": 3}),
        (TypeError, "reward_model must be callable", {"reward_model": "rm"}),
        (TypeError, "max_new_tokens must be an int", {"max_new_tokens": 2.0}),
        (ValueError, "max_new_tokens must be an int >= 1, got 0", {"max_new_tokens": 0}),
        (ValueError, "score_clip must be a number > 0", {"score_clip": 0}),
        (ValueError, "kl_coef must be None or a finite number >= 0", {"kl_coef": -1.0}),
        (ValueError, "num_steps must be None or an int >= 1, got 0", {"num_steps": 0}),
        (TypeError, "num_steps must be None or an int >= 1, got 1.0", {"num_steps": 1.0}),
        (TypeError, "kl_scheduler must be a KL controller", {"kl_scheduler": 0.1}),
        (ValueError, "differs from kl_scheduler.coef",
         {"kl_coef": 0.5, "kl_scheduler": ConstantKLController(0.1)}),
        (TypeError, "label_baseline must be a bool", {"label_baseline": 1}),
        (ValueError, "may not set 'max_length'", {"generate_kwargs": {"max_length": 9}}),
        (ValueError, "unknown keys", {"generate_kwargs": {"temprature": 0.5}}),
        (ValueError, "asks for 2 samples", {"generate_kwargs": {"n": 2, "do_sample": True}}),
    ]  # fmt: skip
    names = ("model", "ref_model", "reward_model")
    for error, message, changes in cases:
        kwargs = dict(zip(names, args, strict=True)) | changes
        with pytest.raises(error, match=message):
            RolloutFromModel(**kwargs)


def test_policy_ref_model_must_read_tokens(model):
    class HistoryScorer:
        generate, input_mode = False, "tokens"
        input_mode = "history"

        def __call__(self, obs, responses=None):
            raise AssertionError("not called")

    with pytest.raises(ValueError, match="input_mode='tokens'"):
        RolloutFromModel(model, HistoryScorer(), length_reward)


def test_bad_batches_and_tensors(model):
    rollout = RolloutFromModel(model, model, length_reward, max_new_tokens=M)
    good = make_batch()
    cases = [
        (KeyError, "must hold 'input_ids'", {"input_ids": None}),
        (KeyError, "must hold 'input_ids'", {"prompt_rindex": None}),
        (ValueError, "input_ids'\\] must be a non-empty \\(B, L\\) integer", {"input_ids": [1, 2]}),
        (ValueError, "input_ids'\\] must be a non-empty", {"input_ids": torch.ones(3, 6)}),
        (ValueError, "must be \\(3,\\) integers", {"prompt_rindex": [1, 2]}),
        (ValueError, "integers in \\[1, 6\\].*\\[0, 3, 2\\]", {"prompt_rindex": [0, 3, 2]}),
        (ValueError, "integers in \\[1, 6\\]", {"prompt_rindex": [7, 3, 2]}),
        (ValueError, "attention_mask'\\] must have input_ids' shape",
         {"attention_mask": torch.ones(3, 5)}),
        (KeyError, "label_baseline=False", {"attention_mask": None}),
    ]  # fmt: skip
    for error, message, changes in cases:
        with pytest.raises(error, match=message):
            rollout(good | changes)
    generated, log_probs, log_ratio = rollout.generate(good)
    with pytest.raises(ValueError, match=r"generated must have shape \(3, 12\).*got \(3, 11\)"):
        rollout.create_rollout(good, generated[:, :-1], log_probs)
    with pytest.raises(ValueError, match=r"log_ratio must have shape \(3, 6\)"):
        rollout.create_rollout(good, generated, log_probs, log_ratio[:, :2])
    with pytest.raises(TypeError, match="log_probs must be a torch.Tensor, got ndarray"):
        rollout.create_rollout(good, generated, log_probs.numpy())

    def two_scores(input_ids, attention_mask):
        return torch.zeros(2)

    bad_reward = RolloutFromModel(model, model, two_scores, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"one score per sequence, shape \(3,\), got shape \(2,\)"):
        bad_reward(good)
    with pytest.raises(RuntimeError, match="needs a kl_scheduler"):
        rollout.step_scheduler()
