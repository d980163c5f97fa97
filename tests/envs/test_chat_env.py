"""ChatEnv: spaces, the three input modes, token exactness and errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import llm_gym
from llm_gym import ChatEnv, Response

SYSTEM, QUERY = "You are a helpful assistant.", "What is 2+2?"


def make(input_mode="history", tokenizer=None, **kwargs):
    kwargs.setdefault("query", QUERY)
    kwargs.setdefault("system_prompt", SYSTEM)
    return ChatEnv(input_mode, tokenizer=tokenizer, **kwargs)


def test_gym_make_registered_id():
    env = gym.make("LLMChat-v0", query="hi")
    obs, info = env.reset(seed=0)
    assert obs == {"history": ({"role": "user", "content": "hi"},)} and info == {}
    assert env.spec.id == "LLMChat-v0" and env.spec.max_episode_steps is None


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
@pytest.mark.parametrize("tokenizer_name", ["gpt2_tokenizer", "smollm2_tokenizer"])
def test_check_env_all_modes(mode, tokenizer_name, request):
    tokenizer = request.getfixturevalue(tokenizer_name)
    check_env(make(mode, tokenizer), skip_render_check=True)
    env = make(mode, tokenizer)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs)


def test_text_mode_renders_chatml_exactly(smollm2_tokenizer):
    env = make("text", smollm2_tokenizer)
    obs, _ = env.reset(seed=0)
    assert obs["text"] == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUERY}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    obs, *_ = env.step("4")
    assert obs["text"].endswith("<|im_start|>assistant\n4<|im_end|>\n<|im_start|>assistant\n")


def test_history_after_step_has_system_user_assistant():
    env = make()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(Response("4"))
    assert [m["role"] for m in obs["history"]] == ["system", "user", "assistant"]
    assert obs["history"][-1]["content"] == "4"
    assert (reward, terminated, truncated, info) == (0.0, False, False, {})
    assert type(terminated) is bool and type(reward) is float


def test_roles_are_configurable():
    env = make(system_role="developer", user_role="human", policy_role="bot")
    env.reset(seed=0)
    obs, *_ = env.step("x")
    assert [m["role"] for m in obs["history"]] == ["developer", "human", "bot"]


def test_tokens_mode_keeps_sampled_tokens_that_do_not_round_trip(gpt2_tokenizer):
    tok = gpt2_tokenizer
    # " " + "hello" as two tokens decodes to " hello", which re-encodes as one other token.
    sampled = np.array([220, 31373], dtype=np.int64)
    assert tok(tok.decode(sampled.tolist()))["input_ids"] != sampled.tolist()
    env = make("tokens", tok)
    prompt, _ = env.reset(seed=0)
    obs, *_ = env.step(Response(tok.decode(sampled.tolist()), sampled, [-0.1, -0.2]))
    n = len(prompt["tokens"])
    assert np.array_equal(obs["tokens"][:n], prompt["tokens"])
    assert np.array_equal(obs["tokens"][n : n + 2], sampled)
    assert tok.decode(obs["tokens"][n + 2 :].tolist()) == "<|im_end|>\n<|im_start|>assistant\n"
    # A bare int64 array is a valid action too, and is appended as given.
    obs2, *_ = env.step(sampled)
    assert np.array_equal(obs2["tokens"][: len(obs["tokens"])], obs["tokens"])


def test_tokens_mode_response_ending_in_eos_is_not_closed_twice(smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = make("tokens", tok, observation_keys=("tokens", "text", "history"))
    prompt, _ = env.reset(seed=0)
    sampled = np.r_[tok("4", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    obs, *_ = env.step(Response(tok.decode(sampled), sampled))
    n = len(prompt["tokens"])
    assert np.array_equal(obs["tokens"][: n + len(sampled)], np.r_[prompt["tokens"], sampled])
    assert tok.decode(obs["tokens"].tolist()) == obs["text"]
    assert obs["history"][-1] == {"role": "assistant", "content": "4"}


def test_observations_are_fresh_objects(gpt2_tokenizer):
    env = make("tokens", gpt2_tokenizer, observation_keys=("tokens", "history"))
    obs, _ = env.reset(seed=0)
    before = obs["tokens"].copy()
    obs["tokens"][:] = 0
    assert np.array_equal(env.conversation.tokens, before)  # the env's record is untouched
    again, *_ = env.step("ok")
    assert np.array_equal(again["tokens"][: len(before)], before)
    assert again["history"] is not obs["history"]


def test_query_from_options_and_start_history():
    env = make(query=None)
    obs, _ = env.reset(options={"query": "Hi?"})
    assert obs["history"][-1] == {"role": "user", "content": "Hi?"}
    start = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    obs, _ = env.reset(options={"history": start})
    assert list(obs["history"]) == start


def test_max_turns_single_turn_terminates_multi_turn_truncates():
    env = make(max_turns=1)
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step("4")
    assert (terminated, truncated) == (True, False)
    env = make(max_turns=2)
    env.reset(seed=0)
    assert env.step("a")[2:4] == (False, False)
    assert env.step("b")[2:4] == (False, True)


@pytest.mark.parametrize(
    "action, message",
    [
        (3, "action must be a str, a Response or a dict with 'text', got int"),
        ({"tokens": [1]}, "a dict action must have a 'text' key .*got keys \\['tokens'\\]"),
        (b"bytes", "got bytes"),
    ],
)
def test_wrong_action_type_raises_typeerror_and_env_keeps_working(action, message):
    env = make()
    env.reset(seed=0)
    with pytest.raises(TypeError, match=message):
        env.step(action)
    obs, *_ = env.step("4")
    assert [m["role"] for m in obs["history"]] == ["system", "user", "assistant"]


def test_tokens_mode_rejects_out_of_vocab_ids(gpt2_tokenizer):
    env = make("tokens", gpt2_tokenizer)
    prompt, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 50257\)"):
        env.step(np.array([50257]))
    obs, *_ = env.step(np.array([40]))
    assert len(obs["tokens"]) > len(prompt["tokens"])


def test_reset_without_query_raises_and_keeps_the_conversation():
    env = make(query=None)
    env.reset(options={"query": "first"})
    with pytest.raises(ValueError, match="reset needs a user query.*options=\\{'query'"):
        env.reset(seed=1)
    obs, *_ = env.step("still here")
    assert obs["history"][-2]["content"] == "first"


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_text_and_tokens_modes_need_a_tokenizer(mode):
    with pytest.raises(
        ValueError, match=f"input_mode '{mode}' needs tokenizer=.*got tokenizer=None"
    ):
        ChatEnv(mode, query="hi")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_mode": "images"}, "input_mode must be one of .*got 'images'"),
        ({"max_turns": 0}, "max_turns must be None or an int >= 1, got 0"),
        ({"observation_keys": ("history", "audio")}, "observation_keys must be among .*'audio'"),
        ({"render_mode": "rgb_array"}, "render_mode must be one of .*'rgb_array'"),
    ],
)
def test_configuration_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ChatEnv(query="hi", **kwargs)


def test_step_before_reset():
    with pytest.raises(gym.error.ResetNeeded):
        make().step("x")


def test_render_ansi():
    env = make(render_mode="ansi")
    env.reset(seed=0)
    env.step("4")
    assert env.render() == f"[system] {SYSTEM}\n[user] {QUERY}\n[assistant] 4"


@pytest.mark.parametrize("vectorization_mode", ["sync", "async"])
def test_make_vec_with_text_spaces(vectorization_mode):
    kwargs = {"shared_memory": False} if vectorization_mode == "async" else {}
    envs = gym.make_vec(
        "LLMChat-v0",
        num_envs=2,
        vectorization_mode=vectorization_mode,
        vector_kwargs=kwargs,
        query="hi",
    )
    try:
        obs, _ = envs.reset(seed=0)
        assert obs["history"] == (({"role": "user", "content": "hi"},),) * 2
        obs, rewards, terminated, truncated, _ = envs.step(("a, b!", "ç ok"))
        assert [h[-1]["content"] for h in obs["history"]] == ["a, b!", "ç ok"]
        assert rewards.tolist() == [0.0, 0.0]
    finally:
        envs.close()


def test_package_exports():
    assert llm_gym.ChatEnv is ChatEnv
    assert "LLMChat-v0" in gym.registry


@pytest.mark.parametrize("template", ["chatml_format", "llama", None])
def test_multi_turn_prompt_equals_the_full_rendering(smollm2_tokenizer, template):
    # None: a custom (non built-in) template, rendered in full at every step.
    custom = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    kwargs = {"chat_template_name": template} if template else {"chat_template": custom}
    env = make(
        "text",
        smollm2_tokenizer,
        max_turns=3,
        template_kwargs=kwargs,
        observation_keys=("text", "tokens", "history"),
    )
    obs, _ = env.reset(seed=0)
    for reply in ("One.", "Two, three.", "Four!"):
        obs, *_ = env.step(reply)
        rendered = env.history.apply_chat_template(
            smollm2_tokenizer, add_generation_prompt=True, **kwargs
        )
        assert obs["text"] == rendered
        assert smollm2_tokenizer.decode(obs["tokens"].tolist()) == rendered
