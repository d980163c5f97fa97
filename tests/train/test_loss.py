"""GRPO's losses, advantages and update diagnostics against TRL 1.16's own: a real
``trl.GRPOTrainer`` over a tiny model computes its ``_compute_loss`` on a batch, and
``llm_gym.train.loss`` must give the same loss and the same gradient (its advantages,
``llm_gym.train.advantages``, the same values)."""

import datasets
import numpy as np
import pytest
import torch
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanstd

from llm_gym.lm.tensors import selected_log_probs
from llm_gym.train.advantages import advantages, group_advantages, overlong_penalty
from llm_gym.train.loss import (
    EntropyBonus,
    grpo_loss,
    log_importance_weights,
    truncated_is_weights,
    update_stats,
)

MAX_LENGTH = 6  # TRL's max_completion_length: dr_grpo's constant


def trl_trainer(model_dir, tokenizer, tmp_path, **changes):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=MAX_LENGTH,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **{"loss_type": "grpo", **changes},
    )  # fmt: skip  (each case names its loss)
    return GRPOTrainer(
        model=model_dir,  # a folder: with beta, TRL loads its reference from it
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": ["q"] * 4}),
        processing_class=tokenizer,
    )


def batch(seed=0, rows=4, prompt=5, completion=MAX_LENGTH):
    # Prompts of one length (TRL scores without position ids, llm_gym with: no padding, so
    # both see the same positions); completions right-padded to different lengths.
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 5, 1][:rows])
    return {
        "prompt_ids": torch.randint(10, 400, (rows, prompt), generator=g),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(10, 400, (rows, completion), generator=g),
        "completion_mask": (torch.arange(completion)[None] < lengths[:, None]).long(),
        "advantages": torch.tensor([1.3, -0.7, 0.4, -1.0][:rows]),
    }


def per_token_log_probs(trainer, inputs):
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep = inputs["completion_ids"].shape[1]
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]


CASES = {
    "grpo": ({}, {}),
    "bnpo": ({"loss_type": "bnpo"}, {"loss_type": "bnpo"}),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"loss_type": "dr_grpo", "max_length": MAX_LENGTH}),
    "dapo clip-higher": (
        {"loss_type": "dapo", "epsilon_high": 0.28},
        {"loss_type": "dapo", "clip_coef_high": 0.28, "num_tokens": 40},
    ),
    "cispo": (
        {"loss_type": "cispo", "epsilon_high": 1.1},
        {"loss_type": "cispo", "clip_coef_high": 1.1, "num_tokens": 40},
    ),
    "gspo": (
        {"importance_sampling_level": "sequence"},
        {"importance_sampling_level": "sequence"},
    ),
    "two-sided": ({"delta": 1.1}, {"delta": 1.1}),
    "k3 KL": ({"beta": 0.04}, {"beta": 0.04, "ref": True}),
    "k3 KL, no bias correction": (
        {"beta": 0.04, "use_bias_correction_kl": False},
        {"beta": 0.04, "ref": True, "kl_bias_correction": False},
    ),
    "truncated IS": ({}, {"is": True}),
    "sapo": ({"loss_type": "sapo"}, {"loss_type": "sapo"}),
    "luspo": (
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    ),
    "vespo": ({"loss_type": "vespo"}, {"loss_type": "vespo", "num_tokens": 40}),
    "vespo, truncated IS": (
        {"loss_type": "vespo"},
        {"loss_type": "vespo", "num_tokens": 40, "is": True},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_loss_equals_trls_in_value_and_gradient(case, tiny_dir, smollm2_tokenizer, tmp_path):
    trl_args, ours = CASES[case]
    trainer = trl_trainer(tiny_dir, smollm2_tokenizer, tmp_path, **trl_args)
    trainer.model.eval()  # "eval" mode: TRL divides by no accumulation steps
    inputs = batch()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        now = per_token_log_probs(trainer, inputs)
    # Old log-probs off the current ones, so that ratios spread across both clip bounds.
    old = now + 0.3 * torch.randn(now.shape, generator=g)
    old[0, 0], old[1, 0] = now[0, 0] - 1.0, now[1, 0] + 1.0  # one clipped above, one below
    inputs["old_per_token_logps"] = old
    inputs["num_items_in_batch"] = torch.tensor(40.0)  # the iteration's tokens, not this batch's
    kwargs = {k: v for k, v in ours.items() if k not in ("ref", "is")}
    if ours.get("ref"):
        ref = now + 0.2 * torch.randn(now.shape, generator=g)
        inputs["ref_per_token_logps"], kwargs["ref_log_probs"] = ref, ref
    if ours.get("is"):
        # TRL applies the weights of its vLLM sampler only when it samples with vLLM; the
        # weights themselves come from truncated_is_weights (tested against TRL's below).
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
        sampled = old + 0.5 * torch.randn(now.shape, generator=g)
        mask = inputs["completion_mask"].bool()
        weights, _ = truncated_is_weights(old, sampled, mask, 1.2)
        inputs["importance_sampling_ratio"], kwargs["is_weights"] = weights, weights
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    expected = trainer._compute_loss(trainer.model, inputs)
    expected_grads = torch.autograd.grad(expected, params)
    log_probs = per_token_log_probs(trainer, inputs)
    mask = inputs["completion_mask"].bool()
    loss = grpo_loss(log_probs, old, mask, inputs["advantages"], 0.2, **kwargs)
    grads = torch.autograd.grad(loss, params)

    assert loss.item() == pytest.approx(expected.item(), abs=1e-6) and loss.item() != 0.0
    for ours_grad, trls in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours_grad, trls, atol=1e-6, rtol=1e-5)
    if case == "k3 KL, no bias correction":  # TRL's kl metric: the k3 to the reference
        stats = update_stats(log_probs, old, mask, inputs["advantages"], 0.2, ref_log_probs=ref)
        assert stats["reference_kl"] / stats["tokens"] == pytest.approx(
            trainer._metrics["eval"]["kl"][-1], abs=1e-7
        )
        assert stats["reference_kl"] > 0
    if case in ("grpo", "dapo clip-higher", "two-sided"):  # TRL's clip_ratio/* too
        high, delta = trl_args.get("epsilon_high"), trl_args.get("delta")
        stats = update_stats(
            log_probs, old, mask, inputs["advantages"], 0.2, clip_coef_high=high, delta=delta
        )
        metrics = trainer._metrics["eval"]
        assert stats["clip_low"] / stats["tokens"] == pytest.approx(
            metrics["clip_ratio/low_mean"][-1], abs=1e-7
        )
        assert stats["clip_high"] / stats["tokens"] == pytest.approx(
            metrics["clip_ratio/high_mean"][-1], abs=1e-7
        )
        assert stats["clip_low"] > 0 and (stats["clip_high"] > 0 or delta is not None)


@pytest.mark.parametrize("linear_head", [True, False], ids=["chunked head", "whole logits"])
def test_the_entropy_bonus_equals_trls_in_value_and_gradient(
    linear_head, tiny_dir, smollm2_tokenizer, tmp_path
):
    # TRL's loss less entropy_coef times the mean per-token entropy, its gradient through the
    # entropy too: ours through selected_log_probs' chunked output layer (LinearLogProbs),
    # and through the whole logits of a model whose logits are scaled (soft-capped ones too).
    trainer = trl_trainer(tiny_dir, smollm2_tokenizer, tmp_path, loss_type="dapo", entropy_coef=0.1)
    trainer.model.eval()
    if not linear_head:  # a logit scale of 1 leaves the logits as they are, not the path
        trainer.model.config.logit_scale = 1.0 + 1e-12
    inputs = batch()
    mask = inputs["completion_mask"].bool()
    tokens = int(mask.sum())
    with torch.no_grad():
        old = per_token_log_probs(trainer, inputs)
    inputs["old_per_token_logps"] = old + 0.3 * torch.randn(old.shape)
    inputs["num_items_in_batch"] = torch.tensor(float(tokens))
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    expected = trainer._compute_loss(trainer.model, inputs)
    expected_grads = torch.autograd.grad(expected, params)

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.ones_like(ids, dtype=torch.bool)  # right padding: positions as TRL's
    prompt = inputs["prompt_ids"].shape[1]
    selected = torch.cat([torch.zeros_like(inputs["prompt_mask"]).bool(), mask], 1)
    log_probs, entropy = selected_log_probs(
        trainer.model, ids, attention, selected, entropy=True, entropy_grad=True
    )
    log_probs, entropy = log_probs[:, prompt:], entropy[:, prompt:]
    bonus = EntropyBonus(0.1)
    loss = grpo_loss(
        log_probs, inputs["old_per_token_logps"], mask, inputs["advantages"], 0.2,
        loss_type="dapo", num_tokens=tokens,
    ) - bonus.applied() * entropy[mask].sum() / tokens  # fmt: skip
    grads = torch.autograd.grad(loss, params)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert trainer._metrics["eval"]["entropy"][-1] == pytest.approx(
        (entropy[mask].sum() / tokens).item(), abs=1e-6
    )
    for ours_grad, trls in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(ours_grad, trls, atol=1e-6, rtol=1e-5)
    # Without the entropy's gradient the bonus moves nothing: the gradients differ.
    _, flat = selected_log_probs(trainer.model, ids, attention, selected, entropy=True)
    assert not flat.requires_grad


def test_the_adaptive_entropy_control_steps_as_trls():
    # TRL's rule: no bonus before a step's entropy is known; the coefficient rises by delta
    # while the entropy is at or below the target, falls above it, within [low, high], and
    # applies only while the last step's entropy was at or below the target.
    bonus = EntropyBonus(0.0, target=0.5, delta=0.3, low=0.1, high=0.5)
    applied = []
    for entropy in (0.4, 0.4, 0.4, 0.9, 0.9, 0.2):
        applied.append(bonus.applied())
        bonus.step(entropy)
    assert applied == pytest.approx([0.0, 0.3, 0.5, 0.5, 0.0, 0.0])
    assert bonus.coef == pytest.approx(0.4) and bonus.last_entropy == 0.2
    resumed = EntropyBonus(0.0, target=0.5, delta=0.3, low=0.1, high=0.5)
    resumed.load_state_dict(bonus.state_dict())
    assert resumed.applied() == bonus.applied() == pytest.approx(0.4)
    assert not EntropyBonus().on and EntropyBonus(target=0.2).on and EntropyBonus(0.01).on


def test_truncated_is_weights_equal_trls_token_truncate():
    g = torch.Generator().manual_seed(2)
    old, sampled = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    sampled[0, 1] = float("nan")  # a log-prob the sampler did not give: no correction
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    weights, cut = truncated_is_weights(old, sampled, mask.bool(), 2.0)
    # TRL 1.16's _generate_and_score_completions, vllm_importance_sampling_mode="token_truncate"
    diff = torch.nan_to_num((old - sampled) * mask, nan=0.0)
    assert torch.equal(weights, torch.clamp(torch.exp(diff), max=2.0))
    assert weights[0, 1] == 1.0 and torch.equal(cut, (torch.exp(diff) > 2.0) & mask.bool())
    assert cut.any() and (weights[~mask.bool()] == 1.0).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trls(scale):
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.1, 1.0, 0.5, 0.5, 0.5])
    # TRL 1.16's _generate_and_score_completions, for one reward function
    mean = rewards.view(-1, 3).mean(1).repeat_interleave(3)
    if scale == "batch":
        std = nanstd(rewards).expand_as(rewards)
    else:
        std = nanstd(rewards.view(-1, 3), dim=1).repeat_interleave(3)
    expected = rewards - mean
    if scale != "none":
        expected = expected / (std + 1e-4)
    torch.testing.assert_close(group_advantages(rewards, 3, scale=scale), expected)
    first = np.array([1.0, 0.0, 0.0])  # Bessel's correction: ddof=1, as TRL
    if scale == "group":
        value = (first - first.mean()) / (first.std(ddof=1) + 1e-4)
        assert group_advantages(rewards, 3)[:3].tolist() == pytest.approx(value.tolist())


REWARDS = np.array([1.0, 0.0, 0.0, 0.2, 0.1, 1.0, 0.5, 0.5, 0.5])  # 3 groups of 3


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_rloo_subtracts_the_mean_of_the_other_responses(scale):
    groups = REWARDS.reshape(3, 3)
    others = np.array([[np.delete(g, i).mean() for i in range(3)] for g in groups])
    expected = groups - others
    if scale == "group":
        expected /= groups.std(1, ddof=1, keepdims=True) + 1e-4
    elif scale == "batch":
        expected /= REWARDS.std(ddof=1) + 1e-4
    got = advantages(torch.tensor(REWARDS), 3, "rloo", scale)
    np.testing.assert_allclose(got.numpy(), expected.reshape(-1), rtol=1e-6)
    assert got[6:].tolist() == [0.0] * 3  # equal rewards: nothing to learn


def test_reinforce_plus_plus_whitens_the_group_centred_rewards_over_the_batch():
    centred = (REWARDS.reshape(3, 3) - REWARDS.reshape(3, 3).mean(1, keepdims=True)).reshape(-1)
    expected = (centred - centred.mean()) / (centred.std(ddof=1) + 1e-4)
    got = advantages(torch.tensor(REWARDS), 3, "reinforce++", scale="none")  # its own scale
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-12)
    assert abs(float(got.mean())) < 1e-9 and float(got.std()) == pytest.approx(1.0, rel=1e-3)


def test_rebn_normalises_the_rewards_over_the_batch_without_a_group_baseline():
    expected = (REWARDS - REWARDS.mean()) / (REWARDS.std(ddof=1) + 1e-4)
    got = advantages(torch.tensor(REWARDS), 3, "rebn")
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
    assert got[6] == got[7] == got[8] != 0.0  # a group of equal rewards still has a signal


def test_grpo_is_group_advantages_and_unknown_estimators_are_refused():
    rewards = torch.tensor(REWARDS)
    assert torch.equal(
        advantages(rewards, 3, "grpo", "batch"), group_advantages(rewards, 3, "batch")
    )
    with pytest.raises(ValueError, match="estimator must be one of"):
        advantages(rewards, 3, "ppo")


def test_diagnostics_count_clipped_tokens_and_the_kl():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.0, 0.0], [-0.5, -0.5, 0.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    stats = update_stats(new, old, mask, torch.tensor([1.0, -1.0]), 0.2)
    # Row 0: e^0.5 > 1.2 with a positive advantage; row 1: two tokens at e^-0.5 < 0.8.
    assert (stats["tokens"], stats["clip_high"], stats["clip_low"]) == (5.0, 1.0, 2.0)
    k3 = lambda d: np.exp(d) - d - 1  # noqa: E731  (CleanRL's, d = log π - log π_old)
    assert stats["approx_kl"] == pytest.approx(k3(0.5) + 2 * k3(-0.5))
    # cispo clips above its cap only, and GSPO's sequence ratio counts at every token.
    cispo = update_stats(new, old, mask, torch.tensor([1.0, -1.0]), 0.2, loss_type="cispo",
                         clip_coef_high=1.5)  # fmt: skip
    assert (cispo["clip_high"], cispo["clip_low"]) == (1.0, 0.0)
    seq = update_stats(new, old, mask, torch.tensor([1.0, -1.0]), 0.2,
                       importance_sampling_level="sequence")  # fmt: skip
    # Row 0's ratio e^0.25 above 1.2 at its 2 tokens, row 1's e^(-1/3) below 0.8 at its 3.
    assert (seq["clip_high"], seq["clip_low"]) == (2.0, 3.0)


def test_loss_errors_name_the_argument():
    lp, mask, adv = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), torch.ones(1)
    with pytest.raises(ValueError, match=r"loss_type must be one of \('grpo', .* got 'ppo'"):
        grpo_loss(lp, lp, mask, adv, 0.2, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level must be one of"):
        log_importance_weights(lp, lp, mask, "episode")
    with pytest.raises(ValueError, match="'dr_grpo' needs max_length"):
        grpo_loss(lp, lp, mask, adv, 0.2, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="beta=0.1 needs ref_log_probs"):
        grpo_loss(lp, lp, mask, adv, 0.2, beta=0.1)
    with pytest.raises(ValueError, match=r"scale must be one of \('group', 'batch', 'none'\)"):
        group_advantages(torch.ones(4), 2, scale="std")


def test_dapo_over_the_whole_batch_does_not_depend_on_the_split():
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(4, 5, generator=g, requires_grad=True)
    old, adv = lp.detach() + 0.1, torch.tensor([1.0, -1.0, 0.5, -0.5])
    mask = torch.rand(4, 5, generator=g) > 0.3
    whole = grpo_loss(lp, old, mask, adv, 0.2, loss_type="dapo")
    tokens = int(mask.sum())
    halves = sum(
        grpo_loss(lp[s], old[s], mask[s], adv[s], 0.2, loss_type="dapo", num_tokens=tokens)
        for s in (slice(0, 1), slice(1, 4))
    )
    assert halves.item() == pytest.approx(whole.item(), abs=1e-7)


@pytest.mark.parametrize("max_length, cache", [(100, 20), (48, 16), (10, 0)])
def test_the_overlong_penalty_equals_trls(max_length, cache):
    from trl.rewards import get_soft_overlong_punishment

    lengths = list(range(0, max_length + 5))
    theirs = get_soft_overlong_punishment(max_length, cache)([[1] * n for n in lengths])
    assert [overlong_penalty(n, max_length, cache) for n in lengths] == pytest.approx(theirs)
