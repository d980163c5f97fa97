"""Samplers own their settings and batching: TransformersSampler (the policy's sampler),
with_settings on every backend, BatchingSampler (many callers, one sample call) and
check_sampler's error."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.samplers import (
    BatchingSampler,
    ConfigurableSampler,
    OpenAISampler,
    Sample,
    Sampler,
    SamplingSettings,
    TransformersSampler,
    check_sampler,
)

# Equal lengths: a batch needs no padding, so greedy ids match one-by-one calls exactly.
PROMPTS = [np.array([464, 3290, 318, 11]), np.array([40, 588, 257, 13])]
PROMPTS += [np.array([1, 2, 3, 4]), np.array([99, 100, 101, 102])]


class Gated:
    """A sampler whose first call waits until ``release``: the calls made meanwhile queue."""

    def __init__(self, sampler):
        self.sampler, self.version = sampler, 0
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[tuple[SamplingSettings, int]] = []
        self.settings = SamplingSettings()

    def sample(self, prompts):
        self.calls.append((self.settings, len(prompts)))
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30)
        return self.sampler.sample(prompts)

    def with_settings(self, **overrides):
        configured = Gated(self.sampler.with_settings(**overrides))
        configured.entered, configured.release = self.entered, self.release
        configured.calls, configured.settings = self.calls, SamplingSettings(**overrides)
        return configured


class Echo:
    """Answers each prompt with its own ids plus the temperature: who got what is visible."""

    version = 3

    def __init__(self, temperature=1.0):
        self.temperature = temperature

    def sample(self, prompts):
        extra = int(self.temperature * 10)
        return [Sample(np.append(p, extra), None, "length", self.version) for p in prompts]

    def with_settings(self, *, temperature=None, top_p=None, max_new_tokens=None, seed=None):
        return Echo(self.temperature if temperature is None else temperature)


@pytest.fixture(scope="module")
def greedy(tiny):
    model, tok = tiny
    return TransformersSampler(
        model, tok, generate_kwargs={"max_new_tokens": 5, "do_sample": False}
    )


def submit_from_threads(batching, jobs):
    """Each (prompts, settings) submitted from a thread of its own; their futures."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(lambda job: batching.submit(*job), jobs))


def test_transformers_sampler_is_the_policys_sampler_and_samples_as_it_does(tiny):
    model, tok = tiny
    kwargs = {"max_new_tokens": 6, "do_sample": True}
    sampler = TransformersSampler(model, tok, generate_kwargs=kwargs)
    policy = TransformersPolicy(model, tok, input_mode="tokens", generate_kwargs=kwargs)
    assert isinstance(sampler, Sampler) and isinstance(sampler, ConfigurableSampler)
    assert isinstance(policy.sampler, TransformersSampler) and policy.model is model
    torch.manual_seed(0)
    mine = sampler.sample(PROMPTS[:2])
    torch.manual_seed(0)
    theirs = policy.sample(PROMPTS[:2])
    for a, b in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.log_probs, b.log_probs, rtol=1e-5, atol=1e-5)
        assert a.finish_reason == b.finish_reason
    responses = [s.tokens for s in mine]
    mine_scores, their_scores = (
        sampler.score(PROMPTS[:2], responses),
        policy.score(PROMPTS[:2], responses),
    )
    for a, b in zip(mine_scores, their_scores, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    policy.version = 4  # one counter: the policy's version is its sampler's
    assert policy.sampler.version == 4 and policy.sample(PROMPTS[:1])[0].version == 4


def test_with_settings_overrides_one_call_and_leaves_the_sampler_as_it_was(greedy):
    greedy.version = 2
    short = greedy.with_settings(max_new_tokens=2)
    assert isinstance(short, TransformersSampler) and short.model is greedy.model
    assert short.version == 2 and short.generate_kwargs["max_new_tokens"] == 2
    assert greedy.generate_kwargs["max_new_tokens"] == 5 and greedy.seed is None
    assert all(len(s.tokens) <= 2 for s in short.sample(PROMPTS))
    assert max(len(s.tokens) for s in greedy.sample(PROMPTS)) > 2
    hot = greedy.with_settings(temperature=1.5, top_p=0.9, seed=7)
    assert hot.generate_kwargs["do_sample"] and hot.generate_kwargs["temperature"] == 1.5
    assert not greedy.generate_kwargs["do_sample"]
    state = torch.random.get_rng_state()
    first, again = hot.sample(PROMPTS), hot.sample(PROMPTS)
    assert torch.equal(state, torch.random.get_rng_state())  # the global generator kept
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)  # a seed: the same draws
    greedy.version = 0


def test_the_policys_with_settings_is_a_policy_over_its_configured_sampler(tiny):
    model, tok = tiny
    policy = TransformersPolicy(model, tok, input_mode="tokens", generate_kwargs={"max_tokens": 6})
    short = policy.with_settings(max_new_tokens=1)
    assert isinstance(short, TransformersPolicy) and short.sampler is not policy.sampler
    assert (
        short.generate_kwargs["max_new_tokens"] == 1
        and policy.generate_kwargs["max_new_tokens"] == 6
    )
    assert all(len(r.tokens) <= 1 for r in short({"tokens": PROMPTS[:2]}))


def test_openai_sampler_with_settings_over_a_gateway(tiny, greedy):
    from llm_gym.agents import Gateway

    with Gateway(greedy, tiny[1]) as gateway:
        sampler = OpenAISampler(gateway.url, max_new_tokens=5, temperature=0.0)
        short = sampler.with_settings(max_new_tokens=2, seed=3)
        assert isinstance(sampler, ConfigurableSampler) and short.seed == 3
        assert sampler.max_new_tokens == 5 and sampler.seed is None  # left as it was
        assert all(len(s.tokens) <= 2 for s in short.sample(PROMPTS[:2]))
        expected = greedy.sample(PROMPTS[:2])
        for a, b in zip(sampler.sample(PROMPTS[:2]), expected, strict=True):
            np.testing.assert_array_equal(a.tokens, b.tokens)


def test_concurrent_calls_share_a_batch_and_get_the_one_by_one_greedy_samples(greedy):
    expected = [greedy.sample([p])[0] for p in PROMPTS]
    gated = Gated(greedy)
    with BatchingSampler(gated, batch_wait=0) as batching:
        first = batching.submit([PROMPTS[0]])
        assert gated.entered.wait(30)  # the sampler is busy: the other calls queue up
        rest = submit_from_threads(batching, [([p], None) for p in PROMPTS[1:]])
        gated.release.set()
        results = [f.result(60) for f in [first, *rest]]
        assert batching.largest_batch == len(PROMPTS) - 1 and batching.batches == 2
    assert [n for _, n in gated.calls] == [1, len(PROMPTS) - 1]
    for result, want in zip(results, expected, strict=True):
        (got,) = result.samples
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.log_probs, want.log_probs, rtol=1e-4, atol=1e-4)
        assert got.finish_reason == want.finish_reason and result.seconds >= 0


def test_calls_with_different_settings_never_share_a_sample_call():
    gated = Gated(Echo())
    hot, cold = SamplingSettings(temperature=0.5), SamplingSettings(temperature=0.2)
    with BatchingSampler(gated, batch_wait=0) as batching:
        first = batching.submit([np.array([0])])
        assert gated.entered.wait(30)
        jobs = [([np.array([1])], hot), ([np.array([2])], cold), ([np.array([3])], hot)]
        jobs += [([np.array([4]), np.array([5])], None)]
        futures = submit_from_threads(batching, jobs)
        gated.release.set()
        got = [[s.tokens.tolist() for s in f.result(30).samples] for f in [first, *futures]]
    assert got == [[[0, 10]], [[1, 5]], [[2, 2]], [[3, 5]], [[4, 10], [5, 10]]]
    calls = sorted(gated.calls[1:], key=str)
    assert calls == sorted([(hot, 2), (cold, 1), (SamplingSettings(), 2)], key=str)


def test_sample_from_many_threads_and_asample_and_with_settings():
    import asyncio

    with BatchingSampler(Echo(), max_batch=3) as batching:
        assert batching.version == 3
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: batching.sample([np.array([i])]), range(16)))
        assert [o[0].tokens.tolist() for o in outs] == [[i, 10] for i in range(16)]
        assert batching.largest_batch <= 3
        cold = batching.with_settings(temperature=0.2)
        assert isinstance(cold, Sampler) and cold.sample([np.array([7])])[0].tokens[-1] == 2

        async def together():
            return await asyncio.gather(*(batching.asample([np.array([i])]) for i in range(4)))

        assert [o[0].tokens[0] for o in asyncio.run(together())] == [0, 1, 2, 3]


def test_settings_on_a_sampler_without_with_settings_are_refused():
    class Plain:
        version = None

        def sample(self, prompts):
            return [Sample(p, None, "length") for p in prompts]

    with BatchingSampler(Plain()) as batching:
        assert not batching.configurable and len(batching.sample([np.array([1])])) == 1
        with pytest.raises(ValueError, match=r"settings \{'seed': 1\} need a sampler with"):
            batching.sample([np.array([1])], SamplingSettings(seed=1))


def test_check_sampler_names_the_argument_what_was_expected_and_what_came():
    with pytest.raises(TypeError) as error:
        check_sampler(object(), "judge")
    message = str(error.value)
    assert message.startswith("judge must be a Sampler with sample(prompts) -> list[Sample]")
    assert message.endswith("got object")
    with pytest.raises(TypeError, match="^sampler must be a Sampler.*got str$"):
        BatchingSampler("gpt2")
    echo = Echo()
    assert check_sampler(echo) is echo
