"""Dropout in training: off in every forward of the update (the old policy's, the loss's) and
after it (sampling's), with activation checkpointing on or off; in the loss's forwards only
when ``keep_dropout`` asks for it."""

import numpy as np
import pytest
import torch

from llm_gym.lm.loading import tiny_model
from llm_gym.train import GRPOConfig, per_token_advantages
from llm_gym.train.optim import adamw
from llm_gym.train.update import GRPOUpdate, training_forwards

LENGTHS = [14, 9, 12, 7]
ADVANTAGES = torch.tensor([1.0, -1.0, 0.5, -0.5])
PAD = 255  # tiny_model's pad id for 256 tokens


# One thread: reductions in one order, so that runs compare bit for bit.
pytestmark = pytest.mark.usefixtures("one_thread")


def gpt2():
    """A tiny GPT-2 with GPT-2's own dropout, its checkpointing enabled as the trainer does."""
    model = tiny_model(vocab_size=256, hidden_size=32, arch="gpt2")
    config = model.config
    assert (config.embd_pdrop, config.resid_pdrop, config.attn_pdrop) == (0.1, 0.1, 0.1)
    model.gradient_checkpointing_enable({"use_reentrant": False})
    return model


def batch():
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, PAD, size=n) for n in LENGTHS]
    return tokens, [np.arange(n) >= 3 for n in LENGTHS]


def watched(model):
    """Per call of an ``nn.Dropout``, whether it changed its input; per forward of the first
    block's MLP, whether gradients were on (a checkpointed forward runs it again in the
    backward)."""
    acted, mlp = [], []
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.register_forward_hook(
                lambda module, args, out: acted.append(not torch.equal(args[0], out))
            )
    block = model.transformer.h[0]
    block.mlp.register_forward_pre_hook(lambda module, args: mlp.append(torch.is_grad_enabled()))
    return acted, mlp


@pytest.mark.parametrize("keep_dropout", [False, True])
def test_the_update_runs_without_dropout_unless_kept_and_checkpoints_either_way(keep_dropout):
    torch.manual_seed(0)
    model = gpt2().train()  # a model may come in train mode: it samples in eval mode anyway
    acted, mlp = watched(model)
    config = GRPOConfig(
        model="x", update_epochs=2, learning_rate=1e-9, gradient_checkpointing=True,
        keep_dropout=keep_dropout,
    )  # fmt: skip
    trained = [p for p in model.parameters() if p.requires_grad]
    updater = GRPOUpdate(model, adamw(trained, config.learning_rate), config, PAD)
    assert not any(module.training for module in model.modules())
    tokens, masks = batch()
    row = updater(tokens, masks, per_token_advantages(ADVANTAGES, LENGTHS))
    # One micro-batch: the old policy's forward (no gradient), then each epoch's loss forward
    # and its recompute in the backward.
    assert mlp == [False, True, True, True, True]
    # Five nn.Dropout calls a forward (the embeddings', each block's residual after its
    # attention and after its MLP; the attention's own runs inside SDPA), in three forwards,
    # and those of the recomputes (up to the last activation the backward needs).
    assert len(acted) > 5 * 3
    if keep_dropout:  # the loss's forwards and their recomputes drop; the old policy's not
        assert acted[:5] == [False] * 5 and all(acted[5:])
        assert row["approx_kl"] > 1e-4  # the ratio compares two dropout masks (8e-4)
    else:
        assert not any(acted)
        # Two epochs at lr 1e-9: the policy barely moved, and the ratio says so.
        assert row["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert not any(module.training for module in model.modules())  # sampling's mode again


@pytest.mark.parametrize("dropout", [False, True])
def test_checkpointing_gives_the_gradients_of_no_checkpointing(dropout):
    # The recompute replays the forward as it ran (without dropout, or with its very masks,
    # the random state restored): the same gradients, bit for bit.
    model = gpt2()
    ids = torch.from_numpy(batch()[0][0])[None]
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(3)
        with training_forwards(model, dropout=dropout, checkpointing=checkpointing):
            model(input_ids=ids, use_cache=False).logits.logsumexp(-1).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad()
    assert all(torch.equal(grads[0][name], grads[1][name]) for name in grads[0])
    # The layers as they were: transformers' own switch on, no wrapped forward left.
    block = model.transformer.h[0]
    assert block.gradient_checkpointing and "forward" not in vars(block)
