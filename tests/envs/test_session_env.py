"""``SessionChatEnv``: a subclass that writes only ``env_response`` plays a session, single and
in the native vector env, token for token; ``VectorHooks`` lists all the vector env reads."""

import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import (
    DatasetChatEnv,
    DatasetChatVectorEnv,
    EnvResponse,
    SessionChatEnv,
    VectorHooks,
    make_task_env,
    seed_stream,
)


class Countdown(SessionChatEnv):
    """Count down from the item's ``start``: each turn that says the next number is paid 1."""

    def env_response(self, conversation, text, item):
        expected = item["start"] - conversation.turns
        right = text.strip() == str(expected)
        info = {"right": right}
        if expected == 1:  # the last number ends the count
            return EnvResponse(None, float(right), terminated=True, info=info)
        return EnvResponse(f"After {expected}?", float(right), info=info)


ROWS = [{"query": "Count down from 3.", "start": 3}, {"query": "Count down from 5.", "start": 5}]
KEYS = ("tokens", "policy_mask", "history")


def sampled(tok, text):
    """Token ids as a policy samples them: the text, then the end of its turn."""
    return np.array(
        tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    )


def test_a_session_is_played_token_for_token_and_ends_when_the_env_says(smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = Countdown(ROWS[:1], input_mode="tokens", tokenizer=tok, observation_keys=KEYS)
    obs, info = env.reset(seed=0)
    assert info == {"start": 3} and obs["history"][-1]["content"] == "Count down from 3."
    lengths = []
    for said, reply in (("3", "After 3?"), ("2", "After 2?")):
        ids, before = sampled(tok, said), obs["tokens"]
        obs, reward, terminated, truncated, info = env.step(ids)
        assert np.array_equal(obs["tokens"][: len(before)], before)  # the prompt, as it was
        assert np.array_equal(obs["tokens"][len(before) : len(before) + len(ids)], ids)
        assert obs["history"][-1] == {"role": "user", "content": reply}
        assert (reward, terminated, truncated, info) == (1.0, False, False, {"right": True})
        lengths.append(len(ids))
    assert obs["policy_mask"].sum() == sum(lengths)  # only the policy's tokens
    obs, reward, terminated, truncated, info = env.step(sampled(tok, "0"))
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info == {"right": False, "reward": 2.0}  # the end adds the episode's total
    assert obs["history"][-1] == {"role": "assistant", "content": "0"}
    assert env.conversation.rewards == (1.0, 1.0, 0.0)
    with pytest.raises(gym.error.ResetNeeded):
        env.step("1")


def test_max_turns_truncates_and_drops_the_envs_last_message():
    env = Countdown(ROWS[1:], max_turns=2)
    env.reset(seed=0)
    assert env.step("5")[1:] == (1.0, False, False, {"right": True})
    obs, reward, terminated, truncated, info = env.step("4")
    assert (reward, terminated, truncated, info) == (
        1.0,
        False,
        True,
        {"right": True, "reward": 2.0},
    )
    assert [m["role"] for m in obs["history"]] == ["user", "assistant", "user", "assistant"]


def test_the_native_vector_env_plays_n_sessions_of_one_instance(smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = Countdown(ROWS, shuffle=False, input_mode="tokens", tokenizer=tok, max_turns=2)
    envs = DatasetChatVectorEnv(env, num_envs=2)
    obs, info = envs.reset(seed=0)
    starts = info["start"].tolist()
    assert sorted(starts) == [3, 5]
    for turn in range(2):
        said = [str(start - turn) for start in starts]
        actions = [sampled(tok, text) for text in said]
        before = list(obs["tokens"])
        conversations = envs.conversations
        obs, rewards, terminated, truncated, info = envs.step(actions)
        assert rewards.tolist() == [1.0, 1.0] and not terminated.any()
        assert truncated.tolist() == [turn == 1] * 2  # max_turns cuts both at the second turn
    for i in range(2):  # the cut turn: the prompt and the sampled ids, token for token
        final = info["final_obs"][i]["tokens"]
        assert np.array_equal(final[: len(before[i])], before[i])
        assert np.array_equal(final[len(before[i]) : len(before[i]) + len(actions[i])], actions[i])
        assert conversations[i].turns == 1
    final_info = info["final_info"]
    assert final_info["right"].tolist() == [True, True]
    assert final_info["reward"].tolist() == [2.0, 2.0]  # each session's total
    assert [len(c.history) for c in envs.conversations] == [1, 1]  # the next sessions started


def test_env_response_must_answer_an_env_response():
    class Silent(SessionChatEnv):
        def env_response(self, conversation, text, item):
            return "nothing"

    env = Silent(ROWS)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="Silent.env_response must return an EnvResponse, got str"):
        env.step("hi")
    with pytest.raises(TypeError, match="SessionChatEnv plays without tools, got tools="):
        SessionChatEnv(ROWS, tools=[len])
    with pytest.raises(NotImplementedError, match="SessionChatEnv must implement env_response"):
        env = SessionChatEnv(ROWS)
        env.reset(seed=0)
        env.step("hi")


def test_a_seed_stream_replays_its_sessions_and_a_given_seed_is_checked():
    class Seeded(Countdown):
        seed_field = "session_seed"

    env = Seeded(seed_stream("session_seed", query="Count down from 3.", start=3))
    seeds = [env.reset(seed=7)[1]["session_seed"] for _ in range(2)]
    assert seeds == [env.reset(seed=7)[1]["session_seed"]] * 2
    assert env.reset(options={"item": {"query": "Count.", "start": 2, "session_seed": 4}})
    with pytest.raises(ValueError, match="Seeded's item needs an int session_seed >= 0, got -1"):
        env.reset(options={"item": {"query": "Count.", "start": 2, "session_seed": -1}})


# -- VectorHooks: everything DatasetChatVectorEnv reads of its single env ---------------------

MEMBERS = set(VectorHooks.__annotations__) | {
    name for name in vars(VectorHooks) if not name.startswith("_")
}


class Recording:
    """An env seen through a proxy that records every attribute read of it."""

    def __init__(self, env):
        self.env, self.read = env, set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self.env, name)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def test_the_protocol_lists_every_member_the_vector_env_reads():
    assert {"builder", "codec", "reward", "source", "shard", "repeats", "advance"} <= MEMBERS
    # A task with levels, a rubric reward (the batch scored at once) and a tool.
    env = make_task_env(
        "llm_gym.tasks.countdown:countdown_task", level=0, tools=[add], task_weight=0.5,
        max_turns=2,
    )  # fmt: skip
    recording = Recording(env)
    envs = DatasetChatVectorEnv(recording, num_envs=2)
    recording.read.clear()  # the constructor's isinstance check reads every member
    envs.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    envs.step([call, "no answer"])
    envs.step(["<answer>1</answer>", "<answer>2</answer>"])
    envs.set_level(0)
    _ = envs.epoch_size, envs.level, envs.num_levels
    envs.close()
    assert recording.read <= MEMBERS, recording.read - MEMBERS
    assert MEMBERS - recording.read <= {
        "shares_conversations", "repeats", "group_repeats", "shard", "observation_space",
        "action_space", "render_mode", "source",  # read by the constructor alone
    }  # fmt: skip


def test_dataset_and_session_envs_satisfy_the_protocol():
    assert isinstance(DatasetChatEnv(ROWS), VectorHooks)
    assert isinstance(Countdown(ROWS), VectorHooks)
    with pytest.raises(TypeError, match="env must be a DatasetChatEnv, got CartPoleEnv .*lacks"):
        DatasetChatVectorEnv(gym.make("CartPole-v1").unwrapped, 2)
