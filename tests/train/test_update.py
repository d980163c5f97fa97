"""The update as parts (``llm_gym.train.update.GRPOUpdate``), each run alone: the plan of
micro-batches, the old policy's and the reference's log-probs, one epoch's optimizer step,
and the advantages it takes (one a token, whatever the estimator)."""

import numpy as np
import pytest
import torch
from conftest import DEVICES

from llm_gym.lm.loading import tiny_model
from llm_gym.train import GRPOConfig, per_token_advantages
from llm_gym.train.advantages import token_advantages
from llm_gym.train.loss import microbatch_tokens
from llm_gym.train.optim import adamw
from llm_gym.train.update import EpochStep, GRPOUpdate, UpdatePlan

LENGTHS = [14, 9, 12, 7, 10]
PROMPT = 4  # each sequence's first tokens are its prompt: not in the loss
VALUES = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0])
PAD = 255

pytestmark = pytest.mark.usefixtures("one_thread")  # reductions in one order


def batch():
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, PAD, size=n) for n in LENGTHS]
    return tokens, [np.arange(n) >= PROMPT for n in LENGTHS]


def updater(device="cpu", **options):
    torch.manual_seed(0)
    model = tiny_model(vocab_size=256, hidden_size=32).to(device)
    config = GRPOConfig(model="x", learning_rate=1e-3, warmup_steps=0, **options)
    trained = [p for p in model.parameters() if p.requires_grad]
    return GRPOUpdate(model, adamw(trained, config.learning_rate), config, PAD)


def test_the_plan_splits_by_the_token_budget_and_counts_the_policy_tokens():
    tokens, masks = batch()
    plan = updater(max_tokens_per_microbatch=24, packing=False).plan(tokens, masks)
    assert isinstance(plan, UpdatePlan)
    assert sorted(i for rows in plan.batches for i in rows) == list(range(len(LENGTHS)))
    # Padded micro-batches: rows × the longest at most the budget (a longer one alone).
    for rows in plan.batches:
        assert len(rows) * max(LENGTHS[i] for i in rows) <= 24 or len(rows) == 1
    assert plan.real == len(plan.batches) and plan.responses == len(LENGTHS)
    # The loss reads the policy's tokens past the first position: the mask's from PROMPT on.
    assert plan.num_tokens == sum(n - PROMPT for n in LENGTHS)
    # On the CPU, micro-batches of half the budget or more recompute their activations, and
    # the host hands their memory back at once.
    sizes = [microbatch_tokens([LENGTHS[i] for i in rows], False) for rows in plan.batches]
    assert plan.checkpointed == [size >= 12 for size in sizes] and plan.lean == any(
        plan.checkpointed
    )
    # 4096 tokens a micro-batch: one of 14 tokens is small, and its activations (5.6 KB a
    # token for this toy model) lighter than the weights (147 KB); all 52 are heavier.
    small = updater().plan(tokens[:1], masks[:1])
    assert small.checkpointed == [False] and small.lean is False
    heavy = updater().plan(tokens, masks)
    assert heavy.checkpointed == [True] and heavy.lean is True
    forced = updater(gradient_checkpointing=True).plan(tokens, masks)
    assert forced.checkpointed == [True] * len(forced.batches)


def test_old_and_reference_log_probs_are_computed_only_where_the_update_reads_them():
    tokens, masks = batch()
    one = updater()
    plan = one.plan(tokens, masks)
    old, refs = one.old_and_reference(tokens, masks, plan)
    assert old == refs == [None] * len(plan.batches)  # one epoch: the first forward is old
    two = updater(update_epochs=2)
    old, refs = two.old_and_reference(tokens, masks, two.plan(tokens, masks))
    assert refs == [None] * len(old) and all(o is not None for o in old)
    for o, rows in zip(old, two.plan(tokens, masks).batches, strict=True):
        # The old policy's log-probs: each position the loss reads, finite and below 0.
        assert o.shape[0] == len(rows) and not o.requires_grad
        selected = two._padded(tokens, masks, rows)[2]
        assert torch.isfinite(o[selected]).all() and (o[selected] < 0).all()
    # An asynchronous batch's ratio is taken to the sampled log-probs: no forward for it.
    drawn = [np.full(n, -1.0, np.float32) for n in LENGTHS]
    late = updater(update_epochs=2, asynchronous=True)
    old, _ = late.old_and_reference(tokens, masks, late.plan(tokens, masks), drawn)
    assert old == [None] * len(old)


@pytest.mark.parametrize("device", DEVICES)
def test_one_epoch_is_one_step_whose_loss_does_not_depend_on_the_split(device):
    tokens, masks = batch()
    advantages = per_token_advantages(VALUES, LENGTHS)
    steps, weights = [], []
    for budget in (4096, 24):  # one micro-batch; several
        update = updater(device, max_tokens_per_microbatch=budget, packing=False)
        before = [p.detach().clone() for p in update.model.parameters()]
        plan = update.plan(tokens, masks)
        old, refs = update.old_and_reference(tokens, masks, plan)
        step = update.epoch(tokens, masks, advantages, plan, old, refs)
        assert isinstance(step, EpochStep) and update.stepped
        assert step.learning_rate == pytest.approx(1e-3) and step.grad_norm > 0
        moved = [
            not torch.equal(b, p) for b, p in zip(before, update.model.parameters(), strict=True)
        ]
        assert any(moved)
        assert step.stats["tokens"] == plan.num_tokens  # every policy token, once
        steps.append(step)
        weights.append([p.detach().cpu() for p in update.model.parameters()])
    assert steps[0].loss == pytest.approx(steps[1].loss, rel=1e-5, abs=1e-7)
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_per_token_advantages_train_as_one_value_a_response_would():
    # The update takes one advantage a token. Spread from one a response, they are the
    # response's value on its tokens; a turn-level estimator's differ turn by turn.
    tokens, masks = batch()
    spread = per_token_advantages(VALUES, LENGTHS)
    assert [a.shape for a in spread] == [(n,) for n in LENGTHS]
    assert all(
        a.dtype == np.float32 and (a == v).all()
        for a, v in zip(spread, VALUES.tolist(), strict=True)
    )
    turns = token_advantages(masks[0], [6, 4], torch.tensor([1.0, -1.0]))
    assert turns[PROMPT : PROMPT + 6].tolist() == [1.0] * 6 and turns[-4:].tolist() == [-1.0] * 4
    with pytest.raises(ValueError, match="values has 5 advantages for 4 conversations"):
        per_token_advantages(VALUES, LENGTHS[:4])
    rows = updater()(tokens, masks, spread)
    assert np.isfinite(rows["loss"]) and rows["approx_kl"] == pytest.approx(0.0, abs=1e-6)
