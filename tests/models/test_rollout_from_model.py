"""RolloutFromModel: TorchRL's keys and shapes, log-probs against plain forwards, EOS/pad from the
model, score placement and clipping, the label baseline."""

from types import SimpleNamespace

import pytest
import torch
from rollout_fixture import (  # noqa: F401  (fixtures)
    EOS,
    PAD,
    VOCAB,
    M,
    constant_reward,
    length_reward,
    make_batch,
    model,
    plain_log_probs,
    ref_model,
    rows,
)

import llm_gym
from llm_gym.lm.loading import tiny_model
from llm_gym.torchrl import RolloutFromModel


@pytest.fixture(scope="module")
def sampled(model, ref_model):
    """One sampled rollout (and its generate() output) against a different reference model."""
    torch.manual_seed(0)
    rollout = RolloutFromModel(model, ref_model, length_reward, kl_coef=0.5, max_new_tokens=M)
    batch = make_batch()
    generated, log_probs, log_ratio = rollout.generate(batch)
    out = rollout.create_rollout(batch, generated, log_probs, log_ratio)
    return SimpleNamespace(out=out, generated=generated, batch=batch, rollout=rollout)


# -- keys, shapes, values ------------------------------------------------------------------


def test_keys_shapes_and_dtypes_match_torchrl(sampled):
    out = sampled.out
    b, width = 3, 6 + M
    assert set(out) == {"action", "input_ids", "attention_mask", "sample_log_prob", "mask", "next"}
    assert set(out["next"]) == {
        "input_ids", "attention_mask", "done", "terminated", "reward", "reward_raw", "reward_kl",
    }  # fmt: skip
    expected = {
        "action": ((b, M), torch.int64),
        "input_ids": ((b, M, width), torch.int64),
        "attention_mask": ((b, M, width), torch.bool),
        "sample_log_prob": ((b, M, 1), torch.float32),
        "mask": ((b, M), torch.bool),
    }
    for key, (shape, dtype) in expected.items():
        assert (tuple(out[key].shape), out[key].dtype) == (shape, dtype), key
    nxt = {"input_ids": ((b, M, width), torch.int64), "attention_mask": ((b, M, width), torch.bool)}
    nxt |= {k: ((b, M, 1), torch.bool) for k in ("done", "terminated")}
    nxt |= {k: ((b, M, 1), torch.float32) for k in ("reward", "reward_raw", "reward_kl")}
    for key, (shape, dtype) in nxt.items():
        assert (tuple(out["next"][key].shape), out["next"][key].dtype) == (shape, dtype), key
    assert llm_gym.RolloutFromModel is RolloutFromModel


def test_states_are_prompt_plus_first_t_tokens(sampled):
    out, batch = sampled.out, sampled.batch
    for row, (rindex, n) in enumerate(zip(batch["prompt_rindex"], rows(out), strict=True)):
        prompt = batch["input_ids"][row, :rindex]
        response = out["action"][row, :n]
        assert 1 <= n <= M
        assert torch.all(out["action"][row, n:] == PAD)
        for t in range(M):
            shown = min(t, n)
            state = torch.cat([prompt, response[:shown]])
            assert torch.equal(out["input_ids"][row, t, : len(state)], state)
            assert torch.all(out["input_ids"][row, t, len(state) :] == PAD)
            assert out["attention_mask"][row, t].sum() == len(state)
            assert out["attention_mask"][row, t, : len(state)].all()
            if t + 1 < M:  # next state at t is the state at t + 1
                assert torch.equal(out["next"]["input_ids"][row, t], out["input_ids"][row, t + 1])
        final = torch.cat([prompt, response])
        assert torch.equal(out["next"]["input_ids"][row, -1, : len(final)], final)
        assert out["next"]["attention_mask"][row, -1].sum() == len(final)


def test_log_probs_and_kl_match_plain_forward(sampled, model, ref_model):
    out, batch = sampled.out, sampled.batch
    for row, (rindex, n) in enumerate(zip(batch["prompt_rindex"], rows(out), strict=True)):
        prompt, response = batch["input_ids"][row, :rindex], out["action"][row, :n]
        log_p = plain_log_probs(model, prompt, response)
        log_q = plain_log_probs(ref_model, prompt, response)
        sample_log_prob = out["sample_log_prob"][row, :, 0]
        torch.testing.assert_close(sample_log_prob[:n], log_p, atol=1e-4, rtol=0)
        reward_kl = out["next"]["reward_kl"][row, :, 0]
        torch.testing.assert_close(reward_kl[:n], -0.5 * (log_p - log_q), atol=1e-4, rtol=0)
        assert torch.all(sample_log_prob[n:] == 0) and torch.all(reward_kl[n:] == 0)
    reward = out["next"]["reward_raw"] + out["next"]["reward_kl"]
    torch.testing.assert_close(out["next"]["reward"], reward)


def test_reward_kl_is_zero_when_ref_model_is_the_model(model):
    torch.manual_seed(1)
    out = RolloutFromModel(model, model, length_reward, max_new_tokens=M)(make_batch())
    assert torch.all(out["next"]["reward_kl"] == 0)
    assert torch.equal(out["next"]["reward"], out["next"]["reward_raw"])
    assert torch.all(out["sample_log_prob"][out["mask"]] < 0)


def test_score_on_the_last_real_token_minus_label_score(sampled):
    out, batch = sampled.out, sampled.batch
    done = out["next"]["done"][..., 0]
    for row, (rindex, n) in enumerate(zip(batch["prompt_rindex"], rows(out), strict=True)):
        assert done[row].nonzero().flatten().tolist() == [n - 1]  # once, on the last token
        label_score = batch["attention_mask"][row].sum()
        expected = float(rindex + n - label_score)  # the reward model saw prompt + response
        raw = out["next"]["reward_raw"][row, :, 0]
        assert raw[n - 1] == pytest.approx(expected)
        assert torch.count_nonzero(raw) == (expected != 0)
    assert torch.equal(out["mask"], torch.arange(M) < torch.tensor(rows(out))[:, None])


def test_score_clipping_both_ways(model):
    batch = make_batch()
    for score, clip, expected in [(100.0, 10.0, 10.0), (-100.0, 2.5, -2.5), (1.5, 2.5, 1.5)]:
        kwargs = {"max_new_tokens": M, "score_clip": clip, "label_baseline": False}
        out = RolloutFromModel(model, model, constant_reward(score), **kwargs)(batch)
        raw = out["next"]["reward_raw"][..., 0]
        assert raw.sum(1).tolist() == pytest.approx([expected] * 3)
        assert torch.equal(raw != 0, out["next"]["done"][..., 0])


@pytest.mark.parametrize(
    "wrap",  # (B, 1); TorchRL's (rewards, end_scores); a sequence classifier's output
    [lambda s: s[:, None], lambda s: (None, s), lambda s: SimpleNamespace(logits=s[:, None])],
    ids=["B-by-1", "torchrl-tuple", "logits"],
)
def test_reward_model_output_forms(model, wrap):
    def reward_model(input_ids, attention_mask):
        return wrap(length_reward(input_ids, attention_mask))

    rollout = RolloutFromModel(model, model, reward_model, max_new_tokens=M, label_baseline=False)
    out = rollout(make_batch())
    lengths = torch.tensor(rows(out))
    expected = torch.tensor([4, 3, 2]) + lengths
    assert out["next"]["reward_raw"][..., 0].sum(1).tolist() == expected.float().tolist()


def test_prompt_data_like_object_and_torchrl_aliases(model):
    batch = SimpleNamespace(**make_batch())
    rollout = RolloutFromModel(model, model, length_reward, max_new_tokens=M)
    assert RolloutFromModel.create_rollout_td is RolloutFromModel.create_rollout
    torch.manual_seed(2)
    out = rollout.rollout_from_data(batch)
    assert out["action"].shape == (3, M)
    generated, log_probs, log_ratio = rollout.generate(batch)
    assert generated.shape == (3, 6 + M) and log_probs.shape == (3, M, 1)
    # Without log_ratio, create_rollout computes it: here zero (ref_model is model).
    assert torch.all(rollout.create_rollout(batch, generated, log_probs)["next"]["reward_kl"] == 0)


# -- EOS and pad ids from the model ----------------------------------------------------------


def greedy_rollout(model, **kwargs):
    kwargs = {"max_new_tokens": M, "generate_kwargs": {"do_sample": False}} | kwargs
    return RolloutFromModel(model, model, length_reward, **kwargs)


def test_done_fires_at_the_models_own_eos():
    model = tiny_model(vocab_size=VOCAB)
    batch = make_batch()
    out = greedy_rollout(model)(batch)
    # Greedy decoding of this random model emits EOS (31) first for the third prompt.
    assert out["action"][2, 0] == EOS
    assert out["next"]["done"][2, :, 0].tolist() == [True] + [False] * (M - 1)
    assert out["next"]["terminated"][2, 0, 0] and rows(out)[2] == 1
    # The other rows never emit 31: they are truncated after M tokens (done, not terminated).
    assert rows(out)[:2] == [M, M] and not torch.isin(out["action"][:2], EOS).any()
    assert torch.all(out["next"]["done"][:2, -1]) and not out["next"]["terminated"][:2].any()

    # Make the second token of row 0 the EOS in the model's generation config (pad stays 31):
    # the same greedy trajectory now ends there.
    new_eos = int(out["action"][0, 1])
    first = int((out["action"][0] == new_eos).nonzero()[0])
    model.generation_config.eos_token_id = new_eos
    ended = greedy_rollout(model)(batch)
    assert torch.equal(ended["action"][0, : first + 1], out["action"][0, : first + 1])
    assert ended["next"]["done"][0, :, 0].nonzero().flatten().tolist() == [first]
    assert ended["next"]["terminated"][0, first, 0]
    assert torch.all(ended["action"][0, first + 1 :] == PAD)
    assert ended["next"]["reward_raw"][0, first, 0] == 4 + first + 1 - 6


def test_eos_and_pad_from_tokenizer_or_generate_kwargs():
    model = tiny_model(vocab_size=VOCAB)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    with pytest.raises(ValueError, match="no pad or EOS token id"):
        RolloutFromModel(model, model, length_reward)
    tokenizer = SimpleNamespace(eos_token_id=7, pad_token_id=None)
    rollout = RolloutFromModel(model, model, length_reward, tokenizer=tokenizer)
    assert (rollout.eos_token_ids, rollout.pad_token_id) == ([7], 7)
    rollout = RolloutFromModel(
        model, model, length_reward, generate_kwargs={"eos_token_id": [3, 4], "pad_token_id": 0}
    )
    assert (rollout.eos_token_ids, rollout.pad_token_id) == ([3, 4], 0)


def test_create_rollout_on_given_tokens(model):
    """A hand-made generate() output: EOS mid-way, no EOS, EOS on the very last step."""
    batch = make_batch()
    rollout = RolloutFromModel(model, model, length_reward, kl_coef=0.25, max_new_tokens=4)
    responses = [[20, 21, EOS, PAD], [22, 23, 24, 25], [26, 27, 28, EOS]]
    generated = torch.full((3, 10), PAD)
    for row, (rindex, response) in enumerate(zip(batch["prompt_rindex"], responses, strict=True)):
        generated[row, :rindex] = batch["input_ids"][row, :rindex]
        generated[row, rindex : rindex + 4] = torch.tensor(response)
    log_probs = torch.full((3, 4, 1), -1.0)
    out = rollout.create_rollout(batch, generated, log_probs, torch.ones(3, 4))
    assert out["next"]["done"][..., 0].tolist() == [
        [False, False, True, False], [False, False, False, True], [False, False, False, True]
    ]  # fmt: skip
    assert out["next"]["terminated"][..., 0].any(1).tolist() == [True, False, True]
    assert out["mask"].sum(1).tolist() == [3, 4, 4]
    assert out["next"]["reward_kl"][0, :, 0].tolist() == [-0.25, -0.25, -0.25, 0.0]
    assert out["sample_log_prob"][0, :, 0].tolist() == [-1.0, -1.0, -1.0, 0.0]
    # Scores: prompt + response (EOS included) minus the reference row's length.
    assert out["next"]["reward_raw"][..., 0].sum(1).tolist() == [4 + 3 - 6, 3 + 4 - 4, 2 + 4 - 3]
