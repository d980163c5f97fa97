"""The Sampler and Scorer protocols of llm_gym.samplers, on TransformersPolicy: exact tokens,
log-probs that score back to themselves, finish reasons, versions, and errors naming the input."""

import numpy as np
import pytest
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.samplers import FINISH_REASONS, Sample, Sampler, Scorer, is_scorer

PROMPTS = [np.array([464, 3290, 318, 11, 257]), np.array([40, 588])]


def policy_for(tiny, **generate_kwargs):
    model, tok = tiny
    kwargs = {"max_tokens": 6, "do_sample": True} | generate_kwargs
    return TransformersPolicy(model, tok, input_mode="tokens", generate_kwargs=kwargs)


def test_one_class_follows_both_protocols(tiny):
    policy = policy_for(tiny)
    assert isinstance(policy, Sampler) and isinstance(policy, Scorer) and policy.version == 0
    scorer = policy.get_new_version(generate=False)
    assert is_scorer(scorer) and not is_scorer(policy)  # the call scores only in log-prob mode
    assert isinstance(scorer, Sampler) and FINISH_REASONS == ("stop", "length")


def test_sample_gives_int64_tokens_one_float32_log_prob_each_and_the_finish_reason(tiny):
    eos = tiny[1].eos_token_id
    torch.manual_seed(0)
    samples = policy_for(tiny, temperature=0.7).sample(PROMPTS)
    assert len(samples) == 2 and all(isinstance(s, Sample) for s in samples)
    for s in samples:
        assert s.tokens.dtype == np.int64 and s.tokens.ndim == 1 and 1 <= len(s.tokens) <= 6
        assert s.log_probs.dtype == np.float32 and s.log_probs.shape == s.tokens.shape
        assert np.all(s.log_probs < 0) and eos not in s.tokens[:-1].tolist()
        assert s.finish_reason == ("stop" if s.tokens[-1] == eos else "length")
    # Forced to the budget without an EOS: "length"; forced to end on EOS: "stop".
    for s in policy_for(tiny, suppress_tokens=[eos]).sample(PROMPTS):
        assert (len(s.tokens), s.finish_reason) == (6, "length") and s.tokens[-1] != eos
    for s in policy_for(tiny, forced_eos_token_id=eos).sample(PROMPTS):
        assert (len(s.tokens), s.finish_reason) == (6, "stop") and s.tokens[-1] == eos


def test_a_stop_before_the_budget_ends_on_the_eos_token(tiny):
    greedy = policy_for(tiny, do_sample=False).sample(PROMPTS[:1])[0]
    stop = int(greedy.tokens[2])  # make the third greedy token the end of sequence
    first = greedy.tokens.tolist().index(stop)
    s = policy_for(tiny, do_sample=False, eos_token_id=stop).sample(PROMPTS[:1])[0]
    np.testing.assert_array_equal(s.tokens, greedy.tokens[: first + 1])
    assert s.finish_reason == "stop" and s.tokens[-1] == stop
    np.testing.assert_allclose(s.log_probs, greedy.log_probs[: first + 1], atol=1e-5)


def test_version_is_stamped_on_samples_and_responses(tiny):
    policy = policy_for(tiny)
    assert {s.version for s in policy.sample(PROMPTS)} == {0}
    policy.version += 1  # what a trainer does after an update
    assert {s.version for s in policy.sample(PROMPTS)} == {1}
    assert policy({"tokens": PROMPTS[0]}).version == 1
    assert [r.version for r in policy({"tokens": tuple(PROMPTS)})] == [1, 1]
    assert policy.get_new_version(generate=False).version == 1  # the same weights
    assert "version=1" in repr(policy)


def test_num_samples_gives_k_consecutive_samples_per_prompt(tiny):
    model, tok = tiny
    policy = TransformersPolicy(
        model, tok, num_samples=3, generate_kwargs={"max_tokens": 4, "do_sample": True}
    )
    samples = policy.sample(PROMPTS)
    assert len(samples) == 6 and all(1 <= len(s.tokens) <= 4 for s in samples)
    assert policy.sample([]) == []


@pytest.mark.parametrize("generate", [True, False])
def test_score_of_sampled_tokens_equals_their_sampled_log_probs(tiny, generate):
    torch.manual_seed(1)
    policy = policy_for(tiny, temperature=0.5, top_k=20)  # raw log-probs, not the sampler's
    samples = policy.sample(PROMPTS)
    scorer = policy if generate else policy.get_new_version(generate=False)
    scores = scorer.score(PROMPTS, [s.tokens for s in samples])
    for s, got in zip(samples, scores, strict=True):
        assert got.dtype == np.float32 and got.shape == s.tokens.shape
        np.testing.assert_allclose(got, s.log_probs, atol=1e-4, rtol=0)
    # The same numbers as the observation-level call, and nothing for an empty response.
    scorer = policy.get_new_version(generate=False)
    outs = scorer({"tokens": tuple(PROMPTS)}, [s.tokens for s in samples])
    for out, got in zip(outs, scores, strict=True):
        np.testing.assert_allclose(got, out.log_probs.response, atol=1e-5, rtol=0)
    empty = policy.score(PROMPTS[:1], [np.array([], dtype=np.int64)])
    assert empty[0].shape == (0,) and policy.score([], []) == []


@pytest.mark.parametrize(
    "method, args, error, message",
    [
        ("sample", (np.array([[1, 2], [3, 4]]),), TypeError, "prompts must be a list of 1-D"),
        ("sample", ([np.array([1.0, 2.0])],), TypeError, r"prompts\[0\] .* dtype float64"),
        ("sample", ([np.array([[1, 2]])],), TypeError, r"prompts\[0\] .* shape \(1, 2\)"),
        ("sample", ([PROMPTS[0], [10**6]],), ValueError, r"prompts\[1\]: token ids must lie in"),
        ("sample", ([np.array([], dtype=np.int64)],), ValueError, r"prompts\[0\] must hold at"),
        ("score", (PROMPTS, PROMPTS[:1]), ValueError, "got 1 responses for 2 prompts"),
        ("score", (PROMPTS[:1], [[-1]]), ValueError, r"responses\[0\]: token ids must lie in"),
        ("score", (PROMPTS[:1], [np.array([0.5])]), TypeError, r"responses\[0\] must be a 1-D"),
        ("score", (PROMPTS[:1], np.array([[2]])), TypeError, "responses must be a list of 1-D"),
        ("score", ([[]], [[1]]), ValueError, r"prompts\[0\] must hold at least 1 token"),
    ],
)
def test_bad_token_inputs_name_the_argument(tiny, method, args, error, message):
    policy = policy_for(tiny, max_tokens=2)
    with pytest.raises(error, match=message):
        getattr(policy, method)(*args)
    assert len(policy.sample(PROMPTS)) == 2  # still usable


def streams(*rows, iteration=1):
    from llm_gym.samplers.transformers import seeded_generator

    return [seeded_generator(0, iteration, row) for row in rows]


def test_each_row_drawn_from_its_generator_is_the_same_in_any_batch(tiny):
    # A row's sample depends on its generator alone: not on which prompts share its batch
    # (padding included), nor on torch's generator, nor on the batch's order.
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 256, size=n) for n in (5, 9, 3, 7)]
    policy = policy_for(tiny, max_tokens=10, top_k=40, temperature=0.8)
    torch.manual_seed(1)
    whole = policy.sample(prompts, generators=streams(0, 1, 2, 3))
    torch.manual_seed(2)
    half = policy.sample(prompts[3:1:-1], generators=streams(3, 2))
    for a, b in zip(whole[:1:-1], half, strict=True):
        assert np.array_equal(a.tokens, b.tokens) and np.allclose(
            a.log_probs, b.log_probs, atol=1e-5
        )
    other = policy.sample(prompts, generators=streams(0, 1, 2, 3, iteration=2))
    assert sum(np.array_equal(a.tokens, b.tokens) for a, b in zip(whole, other, strict=True)) <= 1
    # The log-probs stay those of the raw logits: they score back to themselves.
    scored = policy.score(prompts, [s.tokens for s in whole])
    for s, log_probs in zip(whole, scored, strict=True):
        np.testing.assert_allclose(s.log_probs, log_probs, atol=1e-4)


def test_row_draws_follow_the_warped_distribution(smol):
    # One token, 600 draws from SmolLM2 at temperature 0.5 and top-k 3: each of the 3 tokens
    # at its warped probability (within 4 standard errors), none outside them.
    model, tok = smol
    prompt = np.array(tok("The capital of France is")["input_ids"])
    kwargs = {"max_tokens": 1, "do_sample": True, "temperature": 0.5, "top_k": 3}
    policy = TransformersPolicy(model, tok, input_mode="tokens", generate_kwargs=kwargs)
    drawn = np.array(
        [s.tokens[0] for s in policy.sample([prompt] * 600, generators=streams(*range(600)))]
    )
    with torch.no_grad():
        logits = model(torch.as_tensor(prompt)[None]).logits[0, -1].float()
    top = logits.topk(3)
    probs = (top.values / 0.5).softmax(-1).numpy()
    assert set(drawn.tolist()) <= set(top.indices.tolist())
    for token, p in zip(top.indices.tolist(), probs, strict=True):
        assert abs((drawn == token).mean() - p) < 4 * np.sqrt(p * (1 - p) / 600) + 1e-3


def test_row_draws_refuse_what_they_cannot_apply_and_a_wrong_count(tiny):
    policy = policy_for(tiny, typical_p=0.9)
    with pytest.raises(ValueError, match=r"generate_kwargs\['typical_p'\]=0.9 is not applied"):
        policy.sample(PROMPTS, generators=streams(0, 1))
    with pytest.raises(ValueError, match=r"one generator per generated row \(2\), got 1"):
        policy_for(tiny).sample(PROMPTS, generators=streams(0))
