"""TokenEnv (LLMToken-GSM8K-v0) and TokenKLWrapper: layout, episode ends, rewards, checkers,
KL numbers against plain forward passes, errors."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gsm8k_fixture import (
    FIXTURE,  # made-up problems, written to a temp folder
    make_gsm8k_env,
)
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import llm_gym
from llm_gym.envs import DatasetChatEnv, TokenEnv
from llm_gym.lm.loading import tiny_model
from llm_gym.wrappers import AdaptiveKLController, TokenKLWrapper

JANET = {"question": "Janet has 9 eggs and sells them for $2 each. How much?", "answer": "#### 18"}


def make(tok, **kwargs):
    kwargs.setdefault("max_new_tokens", 8)
    kwargs.setdefault("max_prompt_length", 200)
    kwargs.setdefault("dataset", [JANET])
    return gym.make("LLMToken-GSM8K-v0", tokenizer=tok, **kwargs)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run(env, tokens):
    out = None
    for token in tokens:
        out = env.step(token)
    return out


@pytest.fixture(scope="module")
def models(gpt2_tokenizer):
    return tiny_model(gpt2_tokenizer, seed=0), tiny_model(gpt2_tokenizer, seed=1)


# -- layout and episodes ------------------------------------------------------------------


def test_spaces_and_left_padded_prompt(gpt2_tokenizer):
    env = make(gpt2_tokenizer)
    obs, info = env.reset(seed=0)
    task = make_gsm8k_env(dataset=[JANET], input_mode="tokens", tokenizer=gpt2_tokenizer)
    prompt = task.reset(seed=0)[0]["tokens"]
    assert env.observation_space["input_ids"].shape == (208,)
    assert env.observation_space["input_ids"].dtype == np.int64
    assert env.observation_space["attention_mask"].dtype == np.int8
    assert env.action_space == gym.spaces.Discrete(50257)
    assert env.observation_space.contains(obs)
    n = len(prompt)
    assert info["prompt_length"] == n and info["answer"] == "#### 18"
    np.testing.assert_array_equal(obs["input_ids"][-n:], prompt)
    assert (obs["input_ids"][:-n] == gpt2_tokenizer.pad_token_id).all()
    np.testing.assert_array_equal(obs["attention_mask"], np.r_[np.zeros(208 - n), np.ones(n)])


def test_steps_append_tokens_and_eos_terminates_with_task_reward(gpt2_tokenizer):
    env = make(gpt2_tokenizer, max_new_tokens=16)
    obs0, info = env.reset(seed=0)
    n = info["prompt_length"]
    answer = ids(gpt2_tokenizer, "<answer>18</answer>")
    obs, reward, terminated, truncated, info = env.step(answer[0])
    assert (reward, terminated, truncated, info) == (0.0, False, False, {})
    np.testing.assert_array_equal(obs["input_ids"][-n - 1 : -1], obs0["input_ids"][-n:])
    assert obs["input_ids"][-1] == answer[0] and obs["attention_mask"][-n - 1 :].all()
    assert obs["attention_mask"].sum() == n + 1
    obs, reward, terminated, truncated, info = run(env, [*answer[1:], gpt2_tokenizer.eos_token_id])
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["reward_answer"] == 1.0 and info["answer"] == "#### 18"
    np.testing.assert_array_equal(info["response_tokens"], [*answer, gpt2_tokenizer.eos_token_id])
    assert info["response_text"] == "<answer>18</answer><|endoftext|>"
    np.testing.assert_array_equal(obs["input_ids"][-len(answer) - 1 :], info["response_tokens"])


def test_length_limit_truncates_and_scores_the_cut_response(gpt2_tokenizer):
    answer = ids(gpt2_tokenizer, "<answer>17</answer>")
    env = make(gpt2_tokenizer, max_new_tokens=len(answer))
    _, reset_info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = run(env, answer)
    assert (reward, terminated, truncated) == (0.1, False, True)  # GSM8K: wrong but answered
    assert not info["success"] and list(info["response_tokens"]) == answer
    assert obs["attention_mask"].sum() == reset_info["prompt_length"] + len(answer)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(0)
    # For libraries that bootstrap truncated episodes (SB3): the limit can be terminal.
    env = make(gpt2_tokenizer, max_new_tokens=len(answer), terminate_at_max_new_tokens=True)
    env.reset(seed=0)
    assert run(env, answer)[1:4] == (0.1, True, False)


def test_numpy_actions_and_custom_eos(gpt2_tokenizer):
    env = make(gpt2_tokenizer, eos_token_ids=[13, gpt2_tokenizer.eos_token_id])  # 13 is "."
    env.reset(seed=0)
    assert env.step(np.int64(40))[2] is False
    assert env.step(np.array([41]))[2] is False
    obs, reward, terminated, truncated, info = env.step(np.array(13))
    assert terminated and list(info["response_tokens"]) == [40, 41, 13]


def test_generic_task_in_history_mode_renders_the_same_prompt(gpt2_tokenizer):
    rows = [{"query": "Repeat: 7", "answer": "7"}]
    history_task = DatasetChatEnv(rows, seed=0)  # no tokenizer: TokenEnv renders the prompt
    tokens_task = DatasetChatEnv(rows, input_mode="tokens", tokenizer=gpt2_tokenizer, seed=0)
    env = TokenEnv(history_task, tokenizer=gpt2_tokenizer, max_new_tokens=2, max_prompt_length=30)
    obs, info = env.reset(seed=0)
    prompt = tokens_task.reset(seed=0)[0]["tokens"]
    np.testing.assert_array_equal(obs["input_ids"][-len(prompt) :], prompt)
    assert info == {"answer": "7", "prompt_length": len(prompt)}
    env.step(22)  # "7"
    assert env.step(gpt2_tokenizer.eos_token_id)[1:3] == (0.0, True)  # the base task: no reward
    assert history_task.history[-1] == {"role": "assistant", "content": "7"}


def test_seeded_resets_follow_the_task_order(gpt2_tokenizer):
    env = make(gpt2_tokenizer, dataset=None, data_dir=FIXTURE)
    first = [env.reset(seed=3)[1]["answer"]] + [env.reset()[1]["answer"] for _ in range(3)]
    again = [env.reset(seed=3)[1]["answer"]] + [env.reset()[1]["answer"] for _ in range(3)]
    assert first == again and len(set(first)) == 4


def test_truncate_prompt_keeps_the_tail(gpt2_tokenizer):
    env = make(gpt2_tokenizer, max_prompt_length=20, truncate_prompt=True)
    obs, info = env.reset(seed=0)
    full = make_gsm8k_env(dataset=[JANET], input_mode="tokens", tokenizer=gpt2_tokenizer).reset()[0]
    assert info["prompt_length"] == 20 and obs["attention_mask"].sum() == 20
    np.testing.assert_array_equal(obs["input_ids"][-20:], full["tokens"][-20:])


def test_render(gpt2_tokenizer):
    env = make(gpt2_tokenizer, render_mode="ansi")
    env.reset(seed=0)
    env.step(ids(gpt2_tokenizer, "<answer>")[0])
    text = env.render()
    assert text.startswith("<|im_start|>system\n") and text.endswith("assistant\n<")


def test_gymnasium_and_sb3_env_checkers_pass(gpt2_tokenizer):
    env = make(gpt2_tokenizer, dataset=None, data_dir=FIXTURE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checker warning either
        check_env(env.unwrapped)
        sb3_check_env(env)


def test_gymnasium_vector_env(gpt2_tokenizer):
    rows = [{"question": f"{i}+{i}?", "answer": f"#### {2 * i}"} for i in range(4)]
    envs = gym.make_vec(
        "LLMToken-GSM8K-v0",
        num_envs=2,
        vectorization_mode="sync",
        tokenizer=gpt2_tokenizer,
        max_new_tokens=2,
        max_prompt_length=160,
        dataset=rows,
    )
    obs, _ = envs.reset(seed=0)
    assert obs["input_ids"].shape == (2, 162) and obs["input_ids"].dtype == np.int64
    envs.step(np.array([40, 41]))
    obs, rewards, terminated, truncated, _ = envs.step(np.array([40, 41]))
    assert truncated.tolist() == [True, True] and rewards.tolist() == [0.0, 0.0]
    envs.close()


# -- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "error", "match"),
    [
        ("7", TypeError, "action must be an int token id in \\[0, 50257\\), got str"),
        (7.0, TypeError, "got float"),
        (True, TypeError, "got bool"),
        (np.array([1, 2]), TypeError, "got ndarray"),
        (-1, ValueError, "action must be a token id in \\[0, 50257\\), got -1"),
        (50257, ValueError, "got 50257"),
    ],
)
def test_bad_actions_raise_and_change_nothing(gpt2_tokenizer, action, error, match):
    env = make(gpt2_tokenizer)
    before, _ = env.reset(seed=0)
    with pytest.raises(error, match=match):
        env.step(action)
    obs, *_ = env.step(40)
    np.testing.assert_array_equal(obs["input_ids"][:-1], before["input_ids"][1:])
    assert list(env.unwrapped.response_tokens) == [40]


def test_step_before_reset(gpt2_tokenizer):
    env = TokenEnv(make_gsm8k_env(dataset=[JANET], input_mode="tokens", tokenizer=gpt2_tokenizer))
    with pytest.raises(gym.error.ResetNeeded, match="needs a reset first"):
        env.step(0)


def test_too_long_prompt_raises_and_keeps_the_episode(gpt2_tokenizer):
    rows = [{"query": "hi"}, {"query": "word " * 100}]
    env = TokenEnv(
        DatasetChatEnv(rows, input_mode="tokens", tokenizer=gpt2_tokenizer, shuffle=False),
        max_prompt_length=30,
    )
    obs, _ = env.reset(seed=0)
    env.step(40)
    with pytest.raises(ValueError, match="has 127 tokens, more than max_prompt_length=30"):
        env.reset()
    assert list(env.response_tokens) == [40]  # the running episode is untouched
    assert env.step(41)[0]["input_ids"][-2:].tolist() == [40, 41]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be an int >= 1, got 0"),
        ({"max_prompt_length": 2.5}, ValueError, "max_prompt_length must be an int >= 1"),
        ({"truncate_prompt": "yes"}, TypeError, "truncate_prompt must be a bool, got str"),
        ({"terminate_at_max_new_tokens": 1}, TypeError, "terminate_at_max_new_tokens must be"),
        ({"eos_token_ids": [50257]}, ValueError, "eos_token_ids must be token ids in"),
        ({"render_mode": "rgb_array"}, ValueError, "render_mode must be one of"),
    ],
)
def test_bad_arguments(gpt2_tokenizer, kwargs, error, match):
    task = make_gsm8k_env(dataset=[JANET], input_mode="tokens", tokenizer=gpt2_tokenizer)
    with pytest.raises(error, match=match):
        TokenEnv(task, **kwargs)


def test_bad_task_and_tokenizer(gpt2_tokenizer, smollm2_tokenizer):
    with pytest.raises(TypeError, match="task_env must be a ChatEnv task .* got CartPoleEnv"):
        TokenEnv(gym.make("CartPole-v1"), tokenizer=gpt2_tokenizer)
    with pytest.raises(ValueError, match="single-turn \\(max_turns=1\\).*got max_turns=3"):
        TokenEnv(make_gsm8k_env(dataset=[JANET], max_turns=3), tokenizer=gpt2_tokenizer)
    with pytest.raises(ValueError, match="needs tokenizer=.*got None"):
        TokenEnv(make_gsm8k_env(dataset=[JANET]))
    task = make_gsm8k_env(dataset=[JANET], input_mode="tokens", tokenizer=gpt2_tokenizer)
    with pytest.raises(ValueError, match="got one with 49152 tokens, task_env's has 50257"):
        TokenEnv(task, tokenizer=smollm2_tokenizer)
    with pytest.raises(ValueError, match="LLMChat-GSM8K-v0 needs tokenizer="):
        gym.make("LLMToken-GSM8K-v0", dataset=[JANET])
    with pytest.raises(TypeError, match="sets input_mode itself"):
        gym.make("LLMToken-GSM8K-v0", tokenizer=gpt2_tokenizer, input_mode="text")


# -- TokenKLWrapper ------------------------------------------------------------------------


def oracle_log_prob(model, obs, token):
    """Plain forward over the unpadded window, log_softmax at the last position."""
    real = torch.as_tensor(obs["input_ids"][obs["attention_mask"] == 1])[None]
    with torch.no_grad():
        logits = model(real).logits[0, -1].double()
    return float(torch.log_softmax(logits, -1)[token])


def test_token_kl_matches_plain_forward_passes(gpt2_tokenizer, models):
    gen, ref = models
    env = TokenKLWrapper(make(gpt2_tokenizer, max_new_tokens=3), gen, ref, coef=0.5)
    obs, _ = env.reset(seed=0)
    total = 0.0
    for step, token in enumerate([40, 41, 42]):
        lp, ref_lp = oracle_log_prob(gen, obs, token), oracle_log_prob(ref, obs, token)
        obs, reward, terminated, truncated, info = env.step(token)
        assert info["log_prob"] == pytest.approx(lp, abs=1e-4)
        assert info["ref_log_prob"] == pytest.approx(ref_lp, abs=1e-4)
        assert info["kl"] == pytest.approx(lp - ref_lp, abs=1e-4)
        assert info["kl_penalty"] == pytest.approx(0.5 * info["kl"])
        task_reward = 0.0 if step < 2 else info["reward"]
        assert reward == pytest.approx(task_reward - info["kl_penalty"])
        total += info["kl_penalty"]
    assert truncated and total != 0.0


def test_token_kl_estimators_report_only_and_controller(gpt2_tokenizer, models):
    gen, ref = models
    env = TokenKLWrapper(make(gpt2_tokenizer), gen, ref, estimator="k3", add_to_reward=False)
    obs, _ = env.reset(seed=0)
    _, reward, *_, info = env.step(40)
    log_ratio = info["ref_log_prob"] - info["log_prob"]
    assert info["kl"] == pytest.approx(np.expm1(log_ratio) - log_ratio, rel=1e-4)
    assert reward == 0.0 and info["kl_penalty"] > 0
    controller = AdaptiveKLController(init_kl_coef=0.2, target=1e-6, horizon=10)
    env = TokenKLWrapper(make(gpt2_tokenizer), gen, ref, kl_controller=controller)
    env.reset(seed=0)
    env.step(40)
    assert env.coef == 0.2 and env.update_kl_coef() > 0.2


def test_token_kl_allowed_tokens_renormalize(gpt2_tokenizer, models):
    gen, ref = models
    allowed = [40, 41, gpt2_tokenizer.eos_token_id]
    env = TokenKLWrapper(make(gpt2_tokenizer), gen, ref, allowed_token_ids=allowed)
    obs, _ = env.reset(seed=0)
    lps = [oracle_log_prob(gen, obs, t) for t in allowed]
    _, _, _, _, info = env.step(41)
    assert info["log_prob"] == pytest.approx(lps[1] - np.logaddexp.reduce(lps), abs=1e-4)
    with pytest.raises(ValueError, match="action 42 is not among allowed_token_ids"):
        env.step(42)
    assert list(env.unwrapped.response_tokens) == [41]


def test_token_kl_errors(gpt2_tokenizer, models):
    gen, ref = models
    chat = gym.make("LLMChat-GSM8K-v0", dataset=[JANET])
    with pytest.raises(TypeError, match="env must be a TokenEnv .* got DatasetChatEnv"):
        TokenKLWrapper(chat, gen, ref)
    with pytest.raises(TypeError, match="ref_model must be a transformers causal LM, got str"):
        TokenKLWrapper(make(gpt2_tokenizer), gen, "gpt2")
    small = tiny_model(vocab_size=100)
    with pytest.raises(ValueError, match="gen_model's LM head has 100 outputs, fewer than"):
        TokenKLWrapper(make(gpt2_tokenizer), small, ref)
    with pytest.raises(ValueError, match="estimator must be one of"):
        TokenKLWrapper(make(gpt2_tokenizer), gen, ref, estimator="k4")
    with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list"):
        TokenKLWrapper(make(gpt2_tokenizer), gen, ref, allowed_token_ids=[])
    env = TokenKLWrapper(make(gpt2_tokenizer), gen, ref)
    with pytest.raises(gym.error.ResetNeeded):
        env.step(40)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="action must be an int token id"):
        env.step("a")
    assert env.unwrapped.response_tokens.size == 0


def test_package_exports():
    assert llm_gym.TokenEnv is TokenEnv and "LLMToken-GSM8K-v0" in gym.registry
