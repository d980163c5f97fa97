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
