"""TransformersPolicy in log-prob mode and get_dist: log-probs against an independent forward
pass, masks, padding, errors."""

import numpy as np
import pytest
import torch
from policy_fixture import QUERIES, SYSTEM, chat_obs, oracle_log_probs
from transformers import GPT2LMHeadModel

from llm_gym import History, Response
from llm_gym.lm import keeps_logits
from llm_gym.policies import LogProbOutput, MaskedCategorical, TransformersPolicy


class GPT2WithoutLogitsToKeep(GPT2LMHeadModel):
    """GPT-2 whose forward does not take ``logits_to_keep``, as some models' do not."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None):
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
        )


# -- log-prob mode -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled(smol):
    """A prompt (in all three forms) and a response SmolLM2 sampled for it."""
    model, tok = smol
    obs = chat_obs(QUERIES[0], tokenizer=tok, history_only=False)
    obs = {key: value[0] for key, value in obs.items()}
    torch.manual_seed(2)
    policy = TransformersPolicy(model, tok, generate_kwargs={"max_tokens": 10, "do_sample": True})
    return obs, policy(obs)


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_log_prob_mode_matches_plain_forward(smol, sampled, mode):
    model, tok = smol
    obs, response = sampled
    scorer = TransformersPolicy(model, tok, input_mode=mode, generate=False)
    out = scorer(obs, response)
    assert isinstance(out, LogProbOutput)
    expected = oracle_log_probs(model, obs["tokens"], response.tokens)
    np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)
    np.testing.assert_allclose(out.log_probs.response, response.log_probs, atol=1e-4)
    np.testing.assert_array_equal(out.tokens.prompt, obs["tokens"])
    np.testing.assert_array_equal(out.tokens.response, response.tokens)
    full = out.log_probs.full
    assert full.shape == out.input_ids.shape and full[0] == 0.0 and np.all(full[1:] < 0)
    assert out.masks.all_attention_mask.all()
    np.testing.assert_array_equal(
        out.masks.all_assistant_mask[len(obs["tokens"]) :], np.ones(len(response.tokens), bool)
    )


def test_log_prob_mode_scores_a_whole_conversation(smol):
    model, tok = smol
    messages = (
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    )
    out = TransformersPolicy(model, tok, generate=False)({"history": messages})
    prompt = History(messages[:1]).apply_chat_template(
        tok, add_generation_prompt=True, tokenize=True
    )
    np.testing.assert_array_equal(out.tokens.prompt, prompt)
    assert tok.decode(out.tokens.response.tolist()) == "4<|im_end|>\n"
    expected = oracle_log_probs(model, prompt, out.tokens.response)
    np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)


def test_assistant_mask_selects_exactly_the_assistant_tokens(smol):
    model, tok = smol
    messages = (
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am a bot."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "It is 4."},
    )
    out = TransformersPolicy(model, tok, generate=False)({"history": messages})
    mask = out.masks.all_assistant_mask
    # Contiguous runs of the mask, decoded: each assistant turn's content and its end marker.
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    runs = [
        tok.decode(out.input_ids[a:b].tolist())
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]
    assert runs == ["I am a bot.<|im_end|>", "It is 4.<|im_end|>"]


def test_pad_equal_to_eos_keeps_real_eos_log_probs(tiny_gpt2):
    model, tok = tiny_gpt2
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos == 50256
    # Prompts of different lengths (so the shorter is left-padded with eos ids), one holding
    # a real eos; responses ending in eos.
    prompts = [np.array([464, 3290, eos, 318]), np.array([40, 588])]
    responses = [np.array([257, 1310, eos]), np.array([11, eos])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    outs = scorer({"tokens": prompts}, responses)
    for prompt, response, out in zip(prompts, responses, outs, strict=True):
        expected = oracle_log_probs(model, prompt, response)
        np.testing.assert_allclose(out.log_probs.response, expected, atol=1e-4)
        assert out.log_probs.response[-1] < -1.0  # a real log-prob, not a zeroed pad
    assert outs[0].log_probs.prompt[2] < -1.0  # the eos inside the prompt too

    # Generation: force eos as the last token; its log-prob comes from the raw logits.
    policy = TransformersPolicy(
        model,
        tok,
        input_mode="tokens",
        generate_kwargs={"max_tokens": 4, "forced_eos_token_id": eos, "pad_token_id": eos},
    )
    for prompt, response in zip(prompts, policy({"tokens": prompts}), strict=True):
        assert response.tokens[-1] == eos
        expected = oracle_log_probs(model, prompt, response.tokens)
        np.testing.assert_allclose(response.log_probs, expected, atol=1e-4)
        assert response.log_probs[-1] < -1.0


def test_batched_log_probs_equal_unbatched_with_absolute_positions(tiny_gpt2):
    model, tok = tiny_gpt2
    prompts = [np.array([464, 3290, 318, 11, 257]), np.array([40])]
    responses = [np.array([1310, 13]), np.array([588, 11, 257, 13])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    batched = scorer({"tokens": prompts}, responses)
    for prompt, response, out in zip(prompts, responses, batched, strict=True):
        single = scorer({"tokens": prompt}, response)
        np.testing.assert_allclose(out.log_probs.full, single.log_probs.full, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt2-no-logits_to_keep"])
def test_response_only_matches_the_full_forward(tiny, tiny_gpt2, arch):
    model, tok = tiny if arch == "llama" else tiny_gpt2
    # Prompts and responses of different lengths, one response empty, so the window (the
    # longest response + 1) covers prompt tokens and padding of the other rows.
    prompts = [np.array([464, 3290, 318, 11, 257]), np.array([40]), np.array([11, 13, 40])]
    responses = [np.array([1310, 13]), np.array([588, 11, 257, 13]), np.array([], dtype=np.int64)]
    if arch.endswith("no-logits_to_keep"):  # models whose forward lacks it: logits sliced after
        model = GPT2WithoutLogitsToKeep(model.config).eval()
        model.load_state_dict(tiny_gpt2[0].state_dict())
        assert not keeps_logits(model)
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    full = scorer({"tokens": prompts}, responses)
    window = scorer({"tokens": prompts}, responses, response_only=True)
    for prompt, response, f, w in zip(prompts, responses, full, window, strict=True):
        assert w.log_probs.full is None and w.log_probs.prompt is None
        assert w.log_probs.response.shape == response.shape
        np.testing.assert_allclose(w.log_probs.response, f.log_probs.response, atol=1e-5)
        np.testing.assert_allclose(
            w.log_probs.response, oracle_log_probs(model, prompt, response), atol=1e-4
        )
        np.testing.assert_array_equal(w.tokens.response, response)
    single = scorer({"tokens": prompts[1]}, responses[1], response_only=True)
    np.testing.assert_allclose(single.log_probs.response, full[1].log_probs.response, atol=1e-5)


def test_response_only_needs_responses_and_unpadded_output(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    obs = chat_obs("a")
    with pytest.raises(ValueError, match="response_only=True needs responses .* got responses=No"):
        scorer(obs, response_only=True)
    padded = scorer.get_new_version(pad_output=True)
    with pytest.raises(ValueError, match="response_only=True needs .* pad_output=True"):
        padded(obs, ["x"], response_only=True)
    out = padded(obs, ["x"])  # still usable, and full log-probs as before
    assert out.log_probs.full.shape == out.input_ids.shape


def test_pad_output_gives_one_left_padded_batch(tiny_gpt2):
    model, tok = tiny_gpt2
    prompts = [np.array([464, 3290, 318]), np.array([40])]
    responses = [np.array([1310]), np.array([588, 11])]
    scorer = TransformersPolicy(model, tok, input_mode="tokens", generate=False)
    unpadded = scorer({"tokens": prompts}, responses)
    padded = scorer.get_new_version(pad_output=True)({"tokens": prompts}, responses)
    assert padded.input_ids.shape == padded.log_probs.full.shape == (2, 4)
    np.testing.assert_array_equal(padded.masks.all_attention_mask, [[1, 1, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_array_equal(padded.masks.all_assistant_mask, [[0, 0, 0, 1], [0, 0, 1, 1]])
    np.testing.assert_allclose(padded.log_probs.full[1, 1:], unpadded[1].log_probs.full, atol=1e-5)
    assert padded.log_probs.full[1, 0] == 0.0 and padded.tokens is None


# -- get_dist ------------------------------------------------------------------------------


def test_get_dist_masks_and_log_probs(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    prompt = chat_obs("a question", tokenizer=tok)
    responses = [Response("x", np.array([1000, 2000, tok.eos_token_id]))]
    out = scorer(prompt, responses)[0]
    n_prompt = len(out.tokens.prompt)

    dist, ids = scorer.get_dist(prompt, responses, mask="rlhf")
    assert isinstance(dist, MaskedCategorical) and ids.shape == (1, len(out.input_ids))
    log_prob = dist.log_prob(ids)
    log_prob.sum().backward()  # gradients reach the model
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad()
    np.testing.assert_allclose(
        log_prob[0, n_prompt:].detach().numpy(), out.log_probs.response, atol=1e-5
    )
    assert torch.all(log_prob[0, :n_prompt] == 0) and torch.all(dist.entropy()[0, :n_prompt] == 0)

    sft, _ = scorer.get_dist(prompt, responses, mask="prompt")
    assert sft.mask[0].tolist() == [False] * n_prompt + [True] * 3
    generic, _ = scorer.get_dist(prompt, responses, mask="attention")
    assert generic.mask[0].tolist() == [False] + [True] * (len(out.input_ids) - 1)
    np.testing.assert_allclose(
        generic.log_prob(ids)[0].detach().numpy(), out.log_probs.full, atol=1e-5
    )
    custom = [np.arange(len(out.input_ids)) % 2 == 1]
    odd, _ = scorer.get_dist(prompt, responses, mask=custom)
    assert odd.mask[0].tolist() == custom[0].tolist()


def test_get_dist_left_pads_a_batch(tiny):
    model, tok = tiny
    scorer = TransformersPolicy(model, tok, generate=False)
    prompts = chat_obs("short", "a much longer question than the first one")
    responses = [np.array([5, 6]), np.array([7])]
    dist, ids = scorer.get_dist(prompts, responses, mask="assistant")
    outs = scorer(prompts, responses)
    width = ids.shape[1]
    assert width == max(len(o.input_ids) for o in outs)
    for row, out in enumerate(outs):
        np.testing.assert_array_equal(ids[row, width - len(out.input_ids) :].numpy(), out.input_ids)
        assert dist.mask[row].sum() == len(out.tokens.response)
        lp = dist.log_prob(ids)[row, width - len(out.input_ids) :].detach().numpy()
        np.testing.assert_allclose(
            lp[out.masks.all_assistant_mask], out.log_probs.response, atol=1e-5
        )


def test_get_dist_errors(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok)
    obs = chat_obs("a")
    with pytest.raises(RuntimeError, match="get_dist .* needs a log-prob policy"):
        policy.get_dist(obs, ["x"])
    scorer = policy.get_new_version(generate=False, input_mode="tokens")
    tokens = {"tokens": (np.array([1, 2, 3]),)}
    with pytest.raises(ValueError, match="mask must be one of .* got 'sft2'"):
        scorer.get_dist(tokens, mask="sft2")
    with pytest.raises(ValueError, match="mask='prompt' needs to know where the response starts"):
        scorer.get_dist(tokens, mask="prompt")
    with pytest.raises(ValueError, match="mask='assistant' needs to know the assistant's tokens"):
        scorer.get_dist(tokens, mask="assistant")
    with pytest.raises(
        ValueError, match=r"padded shape \(1, 3\), got dtype torch.bool and shape \(1, 2\)"
    ):
        scorer.get_dist(tokens, mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=r"mask\[0\] must be a bool array of the conversation's length 3"
    ):
        scorer.get_dist(tokens, mask=[np.ones(2, bool)])
