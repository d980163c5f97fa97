"""Forking an episode (``llm_gym.fork``): a fork stepped with an action gives what the original
would have, stepping one never changes the other, through gymnasium's wrappers and llm_gym's,
in the native vector env and a SyncVectorEnv; what cannot fork says so in one line."""

import json

import gymnasium as gym
import numpy as np
import pytest
from gsm8k_fixture import make_gsm8k_env
from mcp_fixture import mcp_server_command

import llm_gym
from llm_gym import ChatEnv, Response, TransformersPolicy
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv, ForkError, fork, fork_sub_env
from llm_gym.lm.loading import tiny_model
from llm_gym.tools import MCPTools
from llm_gym.wrappers import KLRewardWrapper

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'


def _same(a, b):
    """Two step results (obs, reward, terminated, truncated, info) are equal."""
    assert json.dumps(a[0], sort_keys=True, default=str) == json.dumps(
        b[0], sort_keys=True, default=str
    )
    assert a[1:4] == b[1:4]
    drop = ("tool_calls",)  # their seconds differ
    assert {k: v for k, v in a[4].items() if k not in drop} == {
        k: v for k, v in b[4].items() if k not in drop
    }


# Each case: an env made as a user makes it, the moves before the fork, the move both take,
# another move for the original alone.
CASES = {
    "chat": (lambda: gym.make("LLMChat-v0", query="2+2?", max_turns=4), ["5"], "4", "four"),
    "gsm8k": (
        lambda: make_gsm8k_env(max_turns=3, seed=0),
        ["Let me think."], "The answer is 18.", "Hmm.",
    ),
    "reasoning-gym": (
        lambda: gym.make("LLMChat-ReasoningGym-v0", task="chain_sum", max_turns=3, seed=0),
        ["Thinking."], "<answer>7</answer>", "Still thinking.",
    ),
    "textarena": (
        lambda: gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0", max_turns=8),
        ["[2]"], "[9]", "[15]",
    ),
    "tools": (
        lambda: gym.make("LLMChat-v0", query="6*7?", tools=["python"], max_tool_calls=3),
        [CALL], CALL, "42",
    ),
    "terminal": (
        lambda: gym.make("LLMChat-Terminal-v0", level=0),
        ["```bash\necho one > a.txt\n```"], "```bash\nls; cat a.txt\n```",
        "```bash\necho two > b.txt\n```",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fork_steps_as_the_original_would_and_apart_from_it(case):
    make, before, both, alone = CASES[case]
    env = make()
    env.reset(seed=3)
    for action in before:
        env.step(action)
    other = fork(env)
    assert type(other) is type(env) and other.unwrapped is not env.unwrapped
    # The RNG streams are copies: the same draws from here on.
    assert env.unwrapped.np_random.random() == other.unwrapped.np_random.random()
    _same(env.step(both), other.step(both))
    length = len(other.unwrapped.conversation.history)
    if not env.unwrapped.conversation.done:
        env.step(alone)  # the original goes on; the fork does not move
        assert len(env.unwrapped.conversation.history) > length
    assert len(other.unwrapped.conversation.history) == length


def test_a_fork_mid_game_plays_on_from_the_games_state():
    env = gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0", max_turns=8)
    env.reset(seed=3)
    env.step("[5]")
    other = fork(env)
    results = [fork(env).step(f"[{guess}]")[1:3] for guess in range(1, 21)]
    assert results.count((1.0, True)) == 1  # one guess of twenty wins, from one state
    won = next(g for g in range(1, 21) if results[g - 1] == (1.0, True))
    assert other.step(f"[{won}]")[1:3] == (1.0, True)
    assert not env.unwrapped.conversation.done  # no fork's move reached the original


def test_a_forks_next_episodes_are_the_originals():
    env = make_gsm8k_env(seed=0)
    env.reset(seed=0)
    other = fork(env)
    for _ in range(3):  # the stream's position and the item copied, the data shared
        assert env.reset()[1] == other.reset()[1]
    assert other.unwrapped.source is not env.unwrapped.source


def test_a_fork_of_a_procedural_task_keeps_its_own_level():
    env = gym.make("LLMChat-ReasoningGym-v0", task="chain_sum", seed=0)
    env.reset(seed=0)
    other = fork(env)
    other.unwrapped.set_level(1)
    assert (env.unwrapped.level, other.unwrapped.level) == (0, 1)


def test_gymnasiums_wrappers_keep_their_own_counts():
    env = gym.make("LLMChat-v0", query="q", max_episode_steps=2)
    env.reset(seed=0)
    env.step("a")
    other = fork(env)
    assert other.step("b")[3] and env.step("b")[3]  # both cut at their second step
    assert fork(other) is not other


@pytest.fixture(scope="module")
def kl_policy(gpt2_tokenizer):
    model = tiny_model(gpt2_tokenizer, seed=0)
    sampler = TransformersPolicy(
        model,
        gpt2_tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": 5, "do_sample": False},
    )
    return sampler, TransformersPolicy(tiny_model(gpt2_tokenizer, seed=1), gpt2_tokenizer,
                                       input_mode="tokens", generate=False)  # fmt: skip


def test_the_kl_wrapper_forks_with_its_own_charge(kl_policy, gpt2_tokenizer):
    sampler, ref = kl_policy
    env = KLRewardWrapper(
        ChatEnv("tokens", tokenizer=gpt2_tokenizer, query="Hi", max_turns=4), ref, coef=0.5
    )
    obs, _ = env.reset(seed=0)
    obs = env.step(sampler(obs))[0]
    other = llm_gym.fork(env)
    assert other.charge is not env.charge and other.env.unwrapped is not env.unwrapped
    action = sampler(obs)
    mine, theirs = env.step(action), other.step(action)
    assert mine[1] == theirs[1] != 0.0  # the same KL charged, to each its own
    np.testing.assert_array_equal(mine[4]["kl"], theirs[4]["kl"])
    assert len(env.charge.kl_rewards) == 2 and len(other.charge.kl_rewards) == 2
    other.update_kl_coef()
    assert other.charge.kl_rewards == [] and len(env.charge.kl_rewards) == 2


def test_the_native_vector_env_forks_and_branches_a_sub_env():
    rows = [{"query": "a?"}, {"query": "b?"}]
    envs = DatasetChatVectorEnv(DatasetChatEnv(rows, max_turns=3, seed=0), num_envs=2)
    envs.reset(seed=0)
    envs.step(["x", "y"])
    single = fork_sub_env(envs, 1)
    assert [m["content"] for m in single.conversation.history] == ["b?", "y"]
    assert single.step("z")[0]["history"][-1]["content"] == "z"
    branches = envs.branch(1, 3)
    assert branches.num_envs == 3 and len(branches.observation_space["history"]) == 3
    obs, rewards, terminated, truncated, _ = branches.step(["p", "q", "r"])
    assert [h[-1]["content"] for h in obs["history"]] == ["p", "q", "r"]
    assert [m["content"] for m in envs.conversations[1].history] == ["b?", "y"]
    obs, *_ = envs.step(["x2", "y2"])  # the original goes on as before
    assert obs["history"][1][-1]["content"] == "y2"
    with pytest.raises(ValueError, match=r"index must be an int in \[0, 1\], got 2"):
        envs.branch(2, 1)
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        envs.branch(0, 0)


def test_a_sync_vector_envs_sub_env_forks_with_its_wrappers():
    envs = gym.make_vec("LLMChat-TextArena-v0", num_envs=2, vectorization_mode="vector_entry_point",
                        game="GuessTheNumber-v0", max_turns=8)  # fmt: skip
    obs, _ = envs.reset(seed=0)
    envs.step(["[3]", "[4]"])
    single = fork_sub_env(envs, 0)
    assert isinstance(single, gym.Wrapper) or single.unwrapped is not envs.unwrapped.envs[0]
    history = single.unwrapped.conversation.history
    assert [m["content"] for m in history if m["role"] == "assistant"] == ["[3]"]
    with pytest.raises(ValueError, match=r"index must be a sub-env index in 0\.\.1, got 5"):
        fork_sub_env(envs, 5)


def test_mcp_tools_and_non_llm_gym_envs_refuse_in_one_line(tmp_path):
    class Plain(gym.Env):
        observation_space = action_space = gym.spaces.Discrete(2)

    with pytest.raises(ForkError, match=r"^Plain cannot fork: it is not an llm_gym env"):
        fork(Plain())
    with pytest.raises(TypeError, match="fork sub-env i of a vector env with fork_sub_env"):
        fork(gym.make_vec("LLMChat-v0", num_envs=1, query="q"))
    env = ChatEnv(query="q", tools=["python", MCPTools(mcp_server_command(tmp_path))])
    try:
        env.reset(seed=0)
        with pytest.raises(ForkError) as refused:
            fork(env)
        assert str(refused.value) == (
            "ChatEnv cannot fork: its MCP tools ['add'] keep their state in a server process, "
            "which cannot be copied"
        )
    finally:
        env.close()


def test_a_fork_is_a_response_away_from_its_tokens(gpt2_tokenizer):
    # Tokens mode: the fork's prompt is the original's, token for token.
    env = ChatEnv("tokens", tokenizer=gpt2_tokenizer, query="Hi", max_turns=3)
    obs, _ = env.reset(seed=0)
    tokens = np.array(gpt2_tokenizer.encode(" hello"), dtype=np.int64)
    obs = env.step(Response(" hello", tokens=tokens))[0]
    other = fork(env)
    np.testing.assert_array_equal(other.unwrapped.observe(other.unwrapped.conversation)["tokens"],
                                  obs["tokens"])  # fmt: skip
