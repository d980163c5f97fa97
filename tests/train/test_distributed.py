"""RayLogProbModel on a local Ray cluster: shared named actor, same numbers as the local policy,
KL wrappers and RolloutFromModel with it, a dead or stuck actor, errors."""

import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch

from llm_gym import ChatEnv, Response, RolloutFromModel, TransformersPolicy
from llm_gym.episodes.ray import RayLogProbModel
from llm_gym.lm.loading import load_gpt2_tokenizer, tiny_model
from llm_gym.samplers import check_scorer
from llm_gym.wrappers import RetrieveLogProb

pytestmark = pytest.mark.ray
ACTOR = "llm-gym-test-ref"
QUERIES = ["What is 2+2?", "Name a prime number larger than ten."]
RESPONSES = [np.array([40, 1101, 1049, 50256]), np.array([17, 13, 11])]


# The factories run inside the actor. Ray's workers cannot import this test module, so it is
# pickled by value (a script's or a package's functions need nothing of the kind).
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def make_ref_pair():
    tokenizer = load_gpt2_tokenizer()
    return tiny_model(tokenizer, seed=1), tokenizer


def make_generating_policy():
    return SimpleNamespace(generate=True)


class SleepyScorer:
    """A scorer that never answers in time."""

    generate = False
    input_mode = "tokens"

    def __call__(self, obs, responses=None, *, response_only=False):
        time.sleep(600)


@pytest.fixture(scope="module")
def cluster():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=100 * 2**20,
        namespace="llm-gym-tests",
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def remote(cluster):
    """The shared named actor holding the reference model, in tokens mode."""
    return RayLogProbModel(
        make_ref_pair, actor_name=ACTOR, policy_kwargs={"input_mode": "tokens"}, timeout=120
    )


@pytest.fixture(scope="module")
def local():
    model, tokenizer = make_ref_pair()  # the same seed: the same weights as the actor's
    return TransformersPolicy(model, tokenizer, generate=False, input_mode="tokens")


def prompts(tokenizer):
    envs = [ChatEnv("tokens", tokenizer=tokenizer, query=q, max_turns=1) for q in QUERIES]
    return [env.reset(seed=0)[0] for env in envs]


def test_two_clients_share_one_actor_and_match_the_local_policy(remote, local):
    other = RayLogProbModel(actor_name=ACTOR)  # another env's client, found by name
    again = RayLogProbModel(make_ref_pair, actor_name=ACTOR)  # get_if_exists: no new actor
    assert other.actor == remote.actor == again.actor  # one actor (handles compare by id)
    observations = prompts(local.tokenizer)
    for client, obs, response in zip((remote, other), observations, RESPONSES, strict=True):
        got = client(obs, response)
        want = local(obs, response)
        assert type(got) is type(want)
        np.testing.assert_allclose(got.log_probs.response, want.log_probs.response, atol=1e-5)
        np.testing.assert_allclose(got.log_probs.full, want.log_probs.full, atol=1e-5)
        np.testing.assert_array_equal(got.tokens.full, want.tokens.full)
        assert len(got.log_probs.response) == len(response)
    batched = {"tokens": tuple(o["tokens"] for o in observations)}
    got, want = other(batched, RESPONSES), local(batched, RESPONSES)
    assert isinstance(got, list) and len(got) == 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.log_probs.response, w.log_probs.response, atol=1e-5)
    # response_only reaches the policy in the actor: response positions only, same numbers.
    for g, w in zip(other(batched, RESPONSES, response_only=True), want, strict=True):
        assert g.log_probs.full is None
        np.testing.assert_allclose(g.log_probs.response, w.log_probs.response, atol=1e-5)


def test_same_protocol_as_a_log_prob_policy(remote):
    assert remote.generate is False and remote.input_mode == "tokens"
    assert remote.pad_output is False and len(remote.tokenizer) == 50257
    check_scorer(remote, "ref_model")  # what the KL wrappers accept
    assert "actor 'llm-gym-test-ref'" in repr(remote) and "input_mode='tokens'" in repr(remote)
    # The token-level score of the Scorer protocol runs in the actor too.
    tokens = [o["tokens"] for o in prompts(remote.tokenizer)]
    got = remote.score(tokens, RESPONSES)
    want = [
        remote(o, r, response_only=True).log_probs.response
        for o, r in zip(prompts(remote.tokenizer), RESPONSES, strict=True)
    ]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, atol=1e-5)
    # The policy's own errors come back with their type.
    with pytest.raises(ValueError, match="obs has no 'tokens' key"):
        remote({"history": ({"role": "user", "content": "hi"},)}, "x")


def test_retrieve_log_prob_with_the_actor_matches_the_local_policy(remote, local):
    tokenizer = local.tokenizer
    generate_kwargs = {"max_new_tokens": 5, "do_sample": True}
    sampler = TransformersPolicy(
        tiny_model(tokenizer, seed=0),
        tokenizer,
        input_mode="tokens",
        generate_kwargs=generate_kwargs,
    )

    def make_env(scorer):
        return RetrieveLogProb(ChatEnv("tokens", tokenizer=tokenizer, max_turns=1), scorer)

    # Two envs, each with its own client of the one actor; two envs with local policies.
    shared = [make_env(remote), make_env(RayLogProbModel(actor_name=ACTOR))]
    alone = [make_env(local), make_env(local)]
    torch.manual_seed(0)
    for query, ray_env, local_env in zip(QUERIES, shared, alone, strict=True):
        obs, _ = ray_env.reset(options={"query": query})
        local_env.reset(options={"query": query})
        action = sampler(obs)
        assert isinstance(action, Response)
        *_, ray_info = ray_env.step(action)
        *_, local_info = local_env.step(action)
        assert ray_info["ref_log_probs"].shape == action.tokens.shape
        np.testing.assert_allclose(
            ray_info["ref_log_probs"], local_info["ref_log_probs"], atol=1e-5
        )


def test_rollout_from_model_with_the_actor_as_ref_model(remote, local):
    model = tiny_model(local.tokenizer, seed=0)
    encoded = local.tokenizer(QUERIES, padding=True, return_tensors="pt")
    batch = {"input_ids": encoded.input_ids, "prompt_rindex": encoded.attention_mask.sum(-1)}

    def reward(input_ids, attention_mask):
        return attention_mask.sum(-1).float()

    rollouts = [
        RolloutFromModel(model, ref, reward, max_new_tokens=4, label_baseline=False)
        for ref in (remote, local.model)
    ]
    torch.manual_seed(0)
    generated, log_probs, _ = rollouts[1].generate(batch)
    ray_out, local_out = (r.create_rollout(batch, generated, log_probs) for r in rollouts)
    torch.testing.assert_close(
        ray_out["next"]["reward_kl"], local_out["next"]["reward_kl"], atol=1e-5, rtol=0
    )
    assert ray_out["next"]["reward_kl"].abs().max() > 0


def test_stuck_then_killed_actor_raises_instead_of_hanging(cluster):
    sleepy = RayLogProbModel(SleepyScorer, num_cpus=0.5, timeout=60)  # the start may be slow
    assert sleepy.input_mode == "tokens" and sleepy.tokenizer is None
    sleepy.timeout = 1.0
    with pytest.raises(RuntimeError, match=r"did not answer within 1 s"):
        sleepy({"tokens": np.array([1, 2])}, np.array([3]))
    ray.kill(sleepy.actor)
    sleepy.timeout = 30.0  # a dead actor must answer at once, not after the timeout
    with pytest.raises(RuntimeError, match=r"the Ray reference-model actor \(actor \w+\) died"):
        sleepy({"tokens": np.array([1, 2])}, np.array([3]))


def test_factory_that_does_not_score_fails_at_start(cluster):
    with pytest.raises(
        RuntimeError,
        match="(?s)died: .*must score responses: a TransformersPolicy with generate=Fa",
    ):
        RayLogProbModel(make_generating_policy, num_cpus=0.5, timeout=60)


def test_bad_arguments(cluster):
    cases = [
        (ValueError, "pass ref_model_factory .* or actor_name", {}),
        (TypeError, "ref_model_factory must be a zero-argument callable", {"ref_model_factory": 3}),
        (ValueError, "num_cpus must be a finite number >= 0, got -1", {"num_cpus": -1}),
        (ValueError, "num_gpus must be a finite number >= 0", {"num_gpus": "1"}),
        (ValueError, "actor_name must be None or a non-empty str", {"actor_name": ""}),
        (ValueError, "timeout must be a finite number > 0, got 0", {"timeout": 0}),
        (ValueError, "timeout must be a finite number", {"timeout": float("inf")}),
        (TypeError, "policy_kwargs must be a dict", {"policy_kwargs": ["tokens"]}),
        (ValueError, "may not set 'generate'", {"policy_kwargs": {"generate": True}}),
        (ValueError, "no running Ray actor named 'nobody'", {"actor_name": "nobody"}),
    ]  # fmt: skip
    for error, message, kwargs in cases:
        with pytest.raises(error, match=message):
            RayLogProbModel(**({"ref_model_factory": None} | kwargs))


def test_ray_must_be_initialized(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match=r"Ray is not initialized: call ray.init\(\)"):
        RayLogProbModel(make_ref_pair)
