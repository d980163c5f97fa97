"""KL wrappers: numbers against plain forward passes, stacking, vector versions, errors."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gsm8k_fixture import make_gsm8k_env

from llm_gym import ChatEnv, Response, TransformersPolicy
from llm_gym.lm.loading import tiny_model
from llm_gym.wrappers import (
    AdaptiveKLController,
    KLComputation,
    KLRewardWrapper,
    RetrieveKL,
    RetrieveLogProb,
)
from llm_gym.wrappers import vector as vector_kl

QUERIES = ["What is 2+2?", "Name a prime number larger than ten.", "Hi"]


@pytest.fixture(scope="module")
def models(gpt2_tokenizer):
    gen = tiny_model(gpt2_tokenizer, seed=0)
    ref = tiny_model(gpt2_tokenizer, seed=1)
    return gen, ref


@pytest.fixture(scope="module")
def policies(models, gpt2_tokenizer):
    gen, ref = models
    sampler = TransformersPolicy(
        gen,
        gpt2_tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": 6, "do_sample": True, "temperature": 1.0},
    )
    gen_scorer = sampler.get_new_version(generate=False)
    ref_scorer = TransformersPolicy(ref, gpt2_tokenizer, input_mode="tokens", generate=False)
    return sampler, gen_scorer, ref_scorer


def make_env(tok, query=QUERIES[0], max_turns=1):
    return ChatEnv("tokens", tokenizer=tok, query=query, max_turns=max_turns)


def oracle_log_probs(model, prompt_tokens, response_tokens):
    """Plain forward over prompt + response, log_softmax, gather the response tokens."""
    ids = torch.as_tensor(np.r_[prompt_tokens, response_tokens])[None]
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[len(prompt_tokens) - 1 :].numpy()


def sample(sampler, obs):
    torch.manual_seed(0)
    return sampler(obs)


def test_same_model_gives_zero_kl_and_unchanged_reward(policies, gpt2_tokenizer):
    sampler, gen_scorer, _ = policies
    env = KLRewardWrapper(make_env(gpt2_tokenizer), gen_scorer, coef=0.5)
    obs, _ = env.reset(seed=0)
    action = sample(sampler, obs)
    _, reward, terminated, _, info = env.step(action)
    np.testing.assert_allclose(info["kl"], 0.0, atol=1e-4)
    assert reward == pytest.approx(0.0, abs=1e-4) and terminated
    assert info["kl"].dtype == np.float32 and info["kl"].shape == action.tokens.shape
    np.testing.assert_allclose(info["log_probs"], action.log_probs)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_equals_independent_computation(estimator, policies, models, gpt2_tokenizer):
    sampler, gen_scorer, ref_scorer = policies
    gen, ref = models
    coef = 0.3
    env = RetrieveKL(
        make_env(gpt2_tokenizer), gen_scorer, ref_scorer, coef=coef, estimator=estimator
    )
    obs, _ = env.reset(seed=0)
    action = sample(sampler, obs)
    _, reward, _, _, info = env.step(action)
    log_p = oracle_log_probs(gen, obs["tokens"], action.tokens)
    log_q = oracle_log_probs(ref, obs["tokens"], action.tokens)
    expected = {
        "k1": log_p - log_q,
        "k2": 0.5 * (log_p - log_q) ** 2,
        "k3": np.exp(log_q - log_p) - 1 - (log_q - log_p),
    }[estimator]
    np.testing.assert_allclose(info["kl"], expected, atol=1e-4)
    np.testing.assert_allclose(info["ref_log_probs"], log_q, atol=1e-4)
    assert info["kl_penalty"] == pytest.approx(coef * expected.sum(), abs=1e-3)
    assert reward == pytest.approx(-coef * expected.sum(), abs=1e-3)
    np.testing.assert_allclose(info["token_rewards"], -coef * expected, atol=1e-4)


def test_task_reward_lands_on_the_last_token(policies, models, gpt2_tokenizer):
    _, gen_scorer, ref_scorer = policies
    env = KLRewardWrapper(
        make_gsm8k_env(
            dataset=[{"question": "2+2?", "answer": "#### 4"}],
            input_mode="tokens",
            tokenizer=gpt2_tokenizer,
        ),
        ref_scorer,
        coef=0.1,
    )
    obs, _ = env.reset(seed=0)
    text = "<answer>4</answer>"
    tokens = np.asarray(gpt2_tokenizer(text)["input_ids"])
    gen_lp = gen_scorer(obs, Response(text, tokens)).log_probs.response
    _, reward, terminated, _, info = env.step(Response(text, tokens, gen_lp))
    assert info["reward_right"] == 1.0 and terminated
    assert reward == pytest.approx(1.0 - info["kl_penalty"], abs=1e-6)
    np.testing.assert_allclose(
        info["token_rewards"][:-1], -0.1 * info["kl"][:-1], rtol=1e-6, atol=1e-7
    )
    assert info["token_rewards"][-1] == pytest.approx(1.0 - 0.1 * info["kl"][-1], abs=1e-6)


def test_multi_turn_charges_only_this_steps_response(policies, models, gpt2_tokenizer):
    sampler, _, ref_scorer = policies
    _, ref = models
    env = RetrieveLogProb(make_env(gpt2_tokenizer, max_turns=3), ref_scorer)
    obs, _ = env.reset(seed=0)
    for _turn in range(3):
        action = sample(sampler, obs)
        prompt = obs["tokens"]
        obs, *_, info = env.step(action)
        assert info["ref_log_probs"].shape == action.tokens.shape
        expected = oracle_log_probs(ref, prompt, action.tokens)
        np.testing.assert_allclose(info["ref_log_probs"], expected, atol=1e-4)
    assert len(prompt) > 20  # the last prompt held two earlier turns that were not charged


class RecordingScorer:
    """Delegates to a policy; records what each call asked for."""

    generate = False

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    def __call__(self, obs, responses=None, *, response_only=False):
        self.calls.append(response_only)
        return self.policy(obs, responses, response_only=response_only)


def test_response_only_is_asked_for_when_only_the_response_is_kept(
    policies, models, gpt2_tokenizer
):
    sampler, _, ref_scorer = policies
    _, ref = models
    scorer = RecordingScorer(ref_scorer)
    answers = {}
    for assistant_only in (True, False):
        env = RetrieveLogProb(make_env(gpt2_tokenizer), scorer, assistant_only=assistant_only)
        obs, _ = env.reset(seed=0)
        action = sample(sampler, obs)
        *_, info = env.step(action)
        answers[assistant_only] = (obs["tokens"], action.tokens, info["ref_log_probs"])
    assert scorer.calls == [True, False]
    prompt, response, log_probs = answers[True]
    np.testing.assert_allclose(log_probs, oracle_log_probs(ref, prompt, response), atol=1e-4)
    _, _, full = answers[False]  # the whole conversation: prompt and response
    assert full.shape == (len(prompt) + len(response),)
    np.testing.assert_allclose(full[-len(response) :], log_probs, atol=1e-5)


def test_composed_wrappers_equal_retrieve_kl(policies, gpt2_tokenizer):
    sampler, gen_scorer, ref_scorer = policies
    composed = KLComputation(
        RetrieveLogProb(
            RetrieveLogProb(make_env(gpt2_tokenizer), gen_scorer, key="log_probs"),
            ref_scorer,
            key="ref_log_probs",
        ),
        coef=0.2,
        estimator="k3",
    )
    single = RetrieveKL(make_env(gpt2_tokenizer), gen_scorer, ref_scorer, coef=0.2, estimator="k3")
    obs_a, _ = composed.reset(seed=0)
    obs_b, _ = single.reset(seed=0)
    action = sample(sampler, obs_a)
    _, reward_a, *_, info_a = composed.step(action)
    _, reward_b, *_, info_b = single.step(action)
    assert reward_a == reward_b
    for key in ("log_probs", "ref_log_probs", "kl", "token_rewards"):
        np.testing.assert_array_equal(info_a[key], info_b[key])


def test_vector_wrapper_matches_per_env_wrapper(policies, gpt2_tokenizer):
    sampler, gen_scorer, ref_scorer = policies
    envs = gym.vector.SyncVectorEnv(
        [lambda q=q: make_env(gpt2_tokenizer, query=q) for q in QUERIES]
    )
    venv = vector_kl.RetrieveKL(envs, gen_scorer, ref_scorer, coef=0.1)
    obs, _ = venv.reset(seed=0)
    actions = sample(sampler, obs)
    assert len(actions) == len(QUERIES)
    _, rewards, terminated, _, info = venv.step(actions)
    assert terminated.all() and info["_kl"].all()
    for i, query in enumerate(QUERIES):
        env = RetrieveKL(make_env(gpt2_tokenizer, query=query), gen_scorer, ref_scorer, coef=0.1)
        env.reset(seed=0)
        _, reward, *_, single = env.step(actions[i])
        np.testing.assert_allclose(info["kl"][i], single["kl"], atol=1e-5)
        np.testing.assert_allclose(info["ref_log_probs"][i], single["ref_log_probs"], atol=1e-5)
        assert rewards[i] == pytest.approx(reward, abs=1e-5)


def test_vector_legacy_wrapper_uses_response_log_probs(policies, gpt2_tokenizer):
    sampler, gen_scorer, _ = policies
    envs = gym.vector.SyncVectorEnv([lambda q=q: make_env(gpt2_tokenizer, q) for q in QUERIES])
    venv = vector_kl.KLRewardWrapper(envs, gen_scorer, coef=1.0)
    obs, _ = venv.reset(seed=0)
    _, rewards, *_, info = venv.step(sample(sampler, obs))
    np.testing.assert_allclose(rewards, 0.0, atol=1e-4)
    assert info["kl_penalty"].shape == (3,)


def test_adaptive_controller_updates_from_collected_kl(policies, gpt2_tokenizer):
    sampler, gen_scorer, ref_scorer = policies
    controller = AdaptiveKLController(init_kl_coef=0.2, target=0.01, horizon=10)
    env = RetrieveKL(make_env(gpt2_tokenizer), gen_scorer, ref_scorer, kl_controller=controller)
    penalties = []
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        penalties.append(env.step(sample(sampler, obs))[-1]["kl_penalty"])
    kl = np.mean(penalties) / 0.2
    expected = 0.2 * (1 + np.clip(kl / 0.01 - 1, -0.2, 0.2) * 2 / 10)
    assert env.get_wrapper_attr("update_kl_coef")() == pytest.approx(expected)
    assert env.coef == pytest.approx(expected)
    with pytest.raises(ValueError, match="at least one step since the last update"):
        env.update_kl_coef()


def test_wrappers_record_their_arguments_without_copying_models(policies, gpt2_tokenizer):
    _, gen_scorer, ref_scorer = policies
    task = gym.make("LLMChat-v0", input_mode="tokens", tokenizer=gpt2_tokenizer, query="Hi")
    env = RetrieveKL(task, gen_scorer, ref_scorer, coef=0.4)
    recorded = env.spec.additional_wrappers[-1]
    assert recorded.name == "RetrieveKL" and recorded.kwargs["coef"] == 0.4
    assert recorded.kwargs["ref_model"] is ref_scorer


# -- errors ------------------------------------------------------------------------------


def test_generate_mode_model_is_rejected(policies, gpt2_tokenizer):
    sampler, _, _ = policies
    with pytest.raises(ValueError, match="model must score responses.*generate=False.*generate"):
        RetrieveLogProb(make_env(gpt2_tokenizer), sampler)
    with pytest.raises(ValueError, match="ref_model must score responses"):
        KLRewardWrapper(make_env(gpt2_tokenizer), sampler)


def test_plain_string_without_log_probs_says_what_to_pass(policies, gpt2_tokenizer):
    _, _, ref_scorer = policies
    env = KLRewardWrapper(make_env(gpt2_tokenizer, max_turns=2), ref_scorer)
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="carries none. Pass a Response with log_probs"):
        env.step("hello")
    # Nothing moved: the conversation still ends at the user's turn.
    assert env.unwrapped.history.roles == ["user"]


def test_length_mismatch_mentions_pad_eos(policies, gpt2_tokenizer):
    sampler, gen_scorer, ref_scorer = policies
    env = KLComputation(
        RetrieveLogProb(
            RetrieveLogProb(make_env(gpt2_tokenizer), gen_scorer, "log_probs", False),
            ref_scorer,
        )
    )
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="differ in length.*pad_token == eos_token"):
        env.step(sample(sampler, obs))


def test_gen_and_ref_must_agree_on_padding(policies, models, gpt2_tokenizer, smollm2_tokenizer):
    _, gen_scorer, ref_scorer = policies
    padded = ref_scorer.get_new_version(pad_output=True)
    with pytest.raises(ValueError, match="pad_output=False.*got pad_output=True"):
        RetrieveKL(make_env(gpt2_tokenizer), gen_scorer, padded)
    other = TransformersPolicy(
        tiny_model(smollm2_tokenizer), smollm2_tokenizer, input_mode="tokens", generate=False
    )
    with pytest.raises(ValueError, match="must share a tokenizer and padding convention"):
        RetrieveKL(make_env(gpt2_tokenizer), gen_scorer, other)


def test_kl_computation_needs_reference_log_probs(gpt2_tokenizer):
    with pytest.raises(ValueError, match=r"reads info\['ref_log_probs'\]: wrap the env"):
        KLComputation(make_env(gpt2_tokenizer))
    with pytest.raises(ValueError, match="estimator must be one of .*got 'kl'"):
        KLComputation(make_env(gpt2_tokenizer), estimator="kl")
    with pytest.raises(ValueError, match="ref_model is required"):
        RetrieveKL(make_env(gpt2_tokenizer))
