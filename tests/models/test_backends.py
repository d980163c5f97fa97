"""The three generation backends pass the same sampler tests against a real vLLM server on the
CPU (started once for this module, fp32, the default model): transformers (``TransformersPolicy``),
vLLM (``VLLMSampler``, which started the server) and OpenAI-compatible (``OpenAISampler`` at the
same server's URL, as a user's own server). Deselect with ``-m "not vllm"``; CI runs them."""

import copy

import gymnasium as gym
import numpy as np
import pytest
from backend_fixture import FP32_TOLERANCE, QUESTIONS, prompts_for

from llm_gym import wrappers
from llm_gym.chat.containers import Response
from llm_gym.checks import ArgumentTypeError
from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.samplers import OpenAISampler, Sample, Sampler

pytestmark = pytest.mark.vllm

BACKENDS = ("transformers", "vllm", "openai")


@pytest.fixture(scope="module")
def served(vllm_default):
    """The test run's vLLM server of the default model, with this module's settings."""
    return vllm_default.with_settings(max_new_tokens=24, temperature=1.0, seed=0)


def variant(sampler, **changes):
    """``sampler`` (sharing its server) with other sampling settings."""
    new = copy.copy(sampler)
    vars(new).update(changes)
    return new


def backend(name, smol, served, **settings):
    """The backend ``name`` as a Sampler with ``settings`` (max_new_tokens, temperature, seed,
    num_samples)."""
    settings = {"max_new_tokens": 24, "temperature": 1.0, "seed": 0, "_calls": 0} | settings
    if name == "transformers":
        model, tokenizer = smol
        kwargs = {"max_new_tokens": settings["max_new_tokens"], "do_sample": False}
        if settings["temperature"] > 0:
            kwargs.update(do_sample=True, temperature=settings["temperature"])
        return TransformersPolicy(
            model, tokenizer, input_mode="tokens", generate_kwargs=kwargs,
            num_samples=settings.get("num_samples"),
        )  # fmt: skip
    if name == "vllm":
        return variant(served, **settings)
    sampler = OpenAISampler(served.base_url, vocab_size=len(smol[1]))
    return variant(sampler, **settings)


@pytest.mark.parametrize("name", BACKENDS)
def test_samples_are_token_ids_with_log_probs_finish_reason_and_version(name, smol, served):
    sampler = backend(name, smol, served)
    eos = smol[1].eos_token_id
    samples = sampler.sample(prompts_for(smol[1]))
    assert isinstance(sampler, Sampler) and len(samples) == 3
    for s in samples:
        assert isinstance(s, Sample) and s.tokens.dtype == np.int64 and s.tokens.ndim == 1
        assert 1 <= len(s.tokens) <= 24 and eos not in s.tokens[:-1].tolist()
        assert s.log_probs.dtype == np.float32 and s.log_probs.shape == s.tokens.shape
        assert np.all(s.log_probs <= 0)
        assert s.finish_reason == ("stop" if s.tokens[-1] == eos else "length")
        assert s.version == sampler.version == 0
    # The same prompt twice in one call: two draws, not one response twice.
    assert not np.array_equal(samples[0].tokens, samples[2].tokens)


@pytest.mark.parametrize("name", BACKENDS)
def test_log_probs_agree_with_the_scorer_in_fp32(name, smol, served):
    model, tokenizer = smol
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    prompts = prompts_for(tokenizer)
    samples = backend(name, smol, served, max_new_tokens=32).sample(prompts)
    scored = scorer.score(prompts, [s.tokens for s in samples])
    for s, reference in zip(samples, scored, strict=True):
        assert np.abs(s.log_probs - reference).max() < FP32_TOLERANCE


def test_vllm_greedy_decoding_gives_transformers_tokens(smol, served):
    prompts = prompts_for(smol[1])[:2]
    hf = backend("transformers", smol, served, temperature=0).sample(prompts)
    for sampler in (
        variant(served, temperature=0.0),
        backend("openai", smol, served, temperature=0),
    ):
        for a, b in zip(hf, sampler.sample(prompts), strict=True):
            np.testing.assert_array_equal(a.tokens, b.tokens)


@pytest.mark.parametrize("name", ["vllm", "openai"])
def test_a_seed_reproduces_the_samples_and_each_call_draws_anew(name, smol, served):
    prompts = prompts_for(smol[1])
    first = backend(name, smol, served, seed=7)
    again = backend(name, smol, served, seed=7)
    a, b = first.sample(prompts), again.sample(prompts)
    assert all(np.array_equal(x.tokens, y.tokens) for x, y in zip(a, b, strict=True))
    later = first.sample(prompts)  # the second call of the same sampler
    assert not all(np.array_equal(x.tokens, y.tokens) for x, y in zip(a, later, strict=True))


def test_a_requests_own_seed_gives_its_sample_whatever_else_is_in_the_call(smol, served):
    # What a trainer's sub-env stream asks for: its request's sample, wherever it sits.
    prompts = prompts_for(smol[1])
    sampler = backend("vllm", smol, served)
    whole = sampler.sample(prompts, seeds=[11, 12, 13])
    alone = sampler.sample(prompts[2:], seeds=[13])
    assert np.array_equal(whole[2].tokens, alone[0].tokens)
    assert not np.array_equal(whole[0].tokens, sampler.sample(prompts[:1], seeds=[99])[0].tokens)
    with pytest.raises(ValueError, match=r"seeds must give one seed per sample \(3\), got 2"):
        sampler.sample(prompts, seeds=[1, 2])
    with pytest.raises(ValueError, match=r"seeds\[1\]"):
        sampler.sample(prompts, seeds=[1, -2, 3])


@pytest.mark.parametrize("name", BACKENDS)
def test_num_samples_gives_k_responses_per_observation(name, smol, served):
    tokenizer = smol[1]
    sampler = backend(name, smol, served, num_samples=3, max_new_tokens=8)
    policy = sampler if name == "transformers" else SamplerPolicy(sampler, tokenizer)
    obs = {"tokens": tuple(prompts_for(tokenizer)[:2])}
    responses = policy(obs)
    assert [len(group) for group in responses] == [3, 3]
    for response in responses[0]:
        assert isinstance(response, Response) and len(response.tokens) <= 8
        assert response.text == tokenizer.decode(response.tokens, skip_special_tokens=False)


def play_tool_episode(policy, tokenizer, seed):
    env = gym.make(
        "LLMChat-Products-v0", tools=["python"], tool_format="markdown", max_tool_calls=2,
        input_mode="tokens", tokenizer=tokenizer, observation_keys=("tokens", "policy_mask"),
    )  # fmt: skip
    obs, _ = env.reset(seed=seed)
    turns, done = 0, False
    while not done:
        response = policy(obs)
        before = obs["tokens"]
        obs, _, terminated, truncated, info = env.step(response)
        done = terminated or truncated
        turns += 1
        expected = np.concatenate([before, response.tokens])
        assert np.array_equal(obs["tokens"][: len(expected)], expected)  # ids as sampled
    versions = env.unwrapped.conversation.versions
    env.close()
    return turns, versions, info


@pytest.mark.parametrize("name", BACKENDS)
def test_a_multi_turn_tool_episode_keeps_its_token_prefix(name, smol, served):
    tokenizer = smol[1]
    sampler = backend(name, smol, served, temperature=0, max_new_tokens=64)
    policy = sampler if name == "transformers" else SamplerPolicy(sampler, tokenizer)
    turns, versions, info = play_tool_episode(policy, tokenizer, seed=0)
    # The default model calls the tool at once on this task (see test_tool_demo), so the
    # episode has a turn after the tool's output: the prefix held across turns.
    assert turns >= 2 and info["num_tool_calls"] >= 1
    assert versions == (0,) * turns


def test_history_and_text_inputs_render_to_the_tokens_mode_prompt(smol, served):
    tokenizer = smol[1]
    greedy = variant(served, temperature=0.0, max_new_tokens=12)
    history = ({"role": "user", "content": QUESTIONS[0]},)
    by_history = SamplerPolicy(greedy, tokenizer, input_mode="history")({"history": history})
    by_tokens = SamplerPolicy(greedy, tokenizer)({"tokens": prompts_for(tokenizer)[0]})
    np.testing.assert_array_equal(by_history.tokens, by_tokens.tokens)
    assert by_history.text == by_tokens.text and by_history.version == 0


def test_the_kl_wrapper_takes_the_samplers_log_probs_as_the_generators(smol, served):
    model, tokenizer = smol
    ref = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    env = gym.make("LLMChat-ReasoningGym-v0", input_mode="tokens", tokenizer=tokenizer)
    env = wrappers.KLRewardWrapper(env, ref_model=ref, coef=0.1)
    obs, _ = env.reset(seed=0)
    response = SamplerPolicy(variant(served, max_new_tokens=16), tokenizer)(obs)
    _, _, _, _, info = env.step(response)
    np.testing.assert_array_equal(info["log_probs"], response.log_probs)
    # The same weights on both sides: the KL is the fp32 mismatch only.
    assert np.abs(info["kl"]).max() < FP32_TOLERANCE and len(info["kl"]) == len(response.tokens)


def test_bad_prompts_are_refused_naming_the_argument(smol, served):
    sampler = backend("openai", smol, served)
    with pytest.raises(ArgumentTypeError, match="prompts must be a list"):
        sampler.sample(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"prompts\[0\] must hold at least 1 token"):
        sampler.sample([np.array([], dtype=np.int64)])
    with pytest.raises(ValueError, match=r"prompts\[0\]: token ids must lie in \[0, 49152\)"):
        sampler.sample([np.array([1, 10**6])])
    with pytest.raises(ValueError, match="base_url must be an http"):
        OpenAISampler("127.0.0.1:8000")
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        OpenAISampler(served.base_url, temperature=-1.0)
