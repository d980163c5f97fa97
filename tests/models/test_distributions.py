"""MaskedCategorical: masked positions give 0, unmasked ones match torch's Categorical; the
per-token log-probs under any attention mask."""

import pytest
import torch
from torch.distributions import Categorical

from llm_gym.lm import token_log_probs
from llm_gym.policies import MaskedCategorical


@pytest.fixture
def logits():
    return torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))


# Left padding and a prompt: row 0 has 2 pad positions, row 1 none; prompts are masked too.
MASK = torch.tensor([[False, False, False, True, True], [False, True, True, True, True]])


def test_log_prob_matches_categorical_where_unmasked_and_is_zero_elsewhere(logits):
    dist = MaskedCategorical(logits, MASK)
    tokens = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(1))
    expected = Categorical(logits=logits).log_prob(tokens)
    log_prob = dist.log_prob(tokens)
    torch.testing.assert_close(log_prob[MASK], expected[MASK])
    assert torch.all(log_prob[~MASK] == 0)
    # Values at masked positions are never read: padding ids or -100 are fine there.
    tokens_ignored = tokens.masked_fill(~MASK, -100)
    torch.testing.assert_close(dist.log_prob(tokens_ignored), log_prob)


def test_entropy_matches_categorical_where_unmasked_and_is_zero_elsewhere(logits):
    entropy = MaskedCategorical(logits, MASK).entropy()
    torch.testing.assert_close(entropy[MASK], Categorical(logits=logits).entropy()[MASK])
    assert torch.all(entropy[~MASK] == 0)


def test_banned_tokens_give_no_nan_in_entropy_or_its_gradient():
    logits = torch.tensor([[[0.0, 0.0, -torch.inf, 1.0]]], requires_grad=True)
    dist = MaskedCategorical(logits, torch.tensor([[True]]))
    entropy = dist.entropy()
    expected = Categorical(logits=torch.tensor([0.0, 0.0, 1.0])).entropy()
    torch.testing.assert_close(entropy[0, 0], expected)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_gradients_flow_only_through_unmasked_positions(logits):
    logits = logits.clone().requires_grad_(True)
    tokens = torch.zeros(2, 5, dtype=torch.long)
    MaskedCategorical(logits, MASK).log_prob(tokens).sum().backward()
    assert torch.all(logits.grad[~MASK] == 0)
    assert torch.all(logits.grad[MASK].abs().sum(-1) > 0)


def test_sample_and_mode_put_ignore_index_at_masked_positions(logits):
    dist = MaskedCategorical(logits, MASK)
    samples = dist.sample((3,))
    assert samples.shape == (3, 2, 5)
    assert torch.all(samples[:, ~MASK] == -100)
    assert torch.all((samples[:, MASK] >= 0) & (samples[:, MASK] < 7))
    mode = dist.mode
    assert torch.equal(mode[MASK], logits.argmax(-1)[MASK]) and torch.all(mode[~MASK] == -100)
    assert MaskedCategorical(logits, MASK, ignore_index=0).sample()[~MASK].eq(0).all()


def test_sequence_log_prob_is_a_plain_sum_whatever_the_padding(logits):
    tokens = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(2))
    dist = MaskedCategorical(logits, MASK)
    per_token = Categorical(logits=logits).log_prob(tokens)
    expected = torch.stack([per_token[0, 3:].sum(), per_token[1, 1:].sum()])
    torch.testing.assert_close(dist.log_prob(tokens).sum(-1), expected)


def test_bad_arguments_raise_clear_errors(logits):
    with pytest.raises(
        ValueError, match=r"logits must be a torch.Tensor of shape .* got Tensor with shape \(7,\)"
    ):
        MaskedCategorical(torch.zeros(7), torch.ones(1, dtype=torch.bool))
    with pytest.raises(
        TypeError, match="mask must be a bool torch.Tensor, got Tensor of dtype torch.int64"
    ):
        MaskedCategorical(logits, MASK.long())
    with pytest.raises(
        ValueError, match=r"mask must have the logits' shape .* \(2, 5\), got \(2, 4\)"
    ):
        MaskedCategorical(logits, MASK[:, :4])
    dist = MaskedCategorical(logits, MASK)
    with pytest.raises(
        ValueError,
        match=r"value must be a tensor of token ids with shape \(2, 5\), "
        r"got Tensor with shape \(5,\)",
    ):
        dist.log_prob(torch.zeros(5, dtype=torch.long))
    bad = torch.zeros(2, 5, dtype=torch.long)
    bad[1, 2] = 7
    with pytest.raises(ValueError, match=r"outside \[0, 7\) at unmasked positions: min 0, max 7"):
        dist.log_prob(bad)


def test_token_log_probs_equal_a_plain_log_softmax_on_any_mask():
    torch.manual_seed(0)
    batch, width, vocab = 4, 7, 11
    logits = torch.randn(batch, width, vocab)
    ids = torch.randint(0, vocab, (batch, width))
    attention = torch.tensor(
        [
            [0, 0, 1, 1, 1, 1, 1],  # left padding
            [1, 1, 1, 1, 1, 1, 1],  # none
            [0, 0, 0, 0, 0, 0, 1],  # one real token: nothing has a prefix
            [1, 1, 0, 1, 1, 0, 1],  # gaps: a token after a gap has no prefix
        ],
        dtype=torch.bool,
    )
    expected = torch.zeros(batch, width)
    full = torch.log_softmax(logits, -1)
    for b in range(batch):
        for t in range(1, width):
            if attention[b, t] and attention[b, t - 1]:
                expected[b, t] = full[b, t - 1, ids[b, t]]
    got = token_log_probs(logits, ids, attention)
    assert got.dtype == torch.float32 and got.shape == (batch, width)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    assert (got[2] == 0).all() and (got[0, :3] == 0).all() and got[3, 3] == 0
