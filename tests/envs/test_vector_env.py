"""Vectorized GSM8K: sync / async / native agree; SAME_STEP autoreset; GRPO groups; errors."""

import json
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
from conftest import GSM8K_PATH
from gsm8k_fixture import (
    FIXTURE,  # made-up problems, written to a temp folder
    make_gsm8k_env,
)
from gymnasium.vector import AutoresetMode

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv, sharded_env_fns

ROWS = [{"query": f"q{i}", "id": i} for i in range(10)]
RIGHT, WRONG = "<answer>12</answer>", "no answer"
ANSWERS = {
    row["question"]: row["answer"]
    for row in map(json.loads, (FIXTURE / "train.jsonl").read_text().splitlines())
}


def make_vec(mode, num_envs=3, **kwargs):
    """The native vector env, or Sync/AsyncVectorEnv over sharded copies of the task."""
    kwargs.setdefault("data_dir", FIXTURE)
    if mode == "vector_entry_point":
        return gym.make_vec("LLMChat-GSM8K-v0", num_envs=num_envs, **kwargs)
    fns = sharded_env_fns("LLMChat-GSM8K-v0", num_envs, **kwargs)
    # Gymnasium's default is NEXT_STEP; compare like with like.
    if mode == "sync":
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return gym.vector.AsyncVectorEnv(  # text spaces need shared_memory=False
        fns, shared_memory=False, autoreset_mode=AutoresetMode.SAME_STEP
    )


def user_queries(obs):
    return [history[1]["content"] for history in obs["history"]]


def rollout(envs, steps=4):
    """Prompts, rewards, ends and final observations of a seeded rollout."""
    obs, info = envs.reset(seed=5)
    trace = [(user_queries(obs), list(info["answer"]))]
    for t in range(steps):
        actions = [RIGHT if (i + t) % 2 else WRONG for i in range(envs.num_envs)]
        obs, rewards, terminated, truncated, info = envs.step(actions)
        final = [o and o["history"][-1]["content"] for o in info.get("final_obs", [None] * 3)]
        trace.append((user_queries(obs), rewards.tolist(), terminated.tolist(), final))
    return trace


def test_native_is_the_default_vectorization():
    envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=2, data_dir=FIXTURE)
    assert isinstance(envs, DatasetChatVectorEnv) and envs.num_envs == 2
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    single = make_gsm8k_env(data_dir=FIXTURE)
    assert envs.single_observation_space == single.observation_space
    assert envs.single_action_space == single.action_space
    assert envs.observation_space == gym.vector.utils.batch_space(single.observation_space, 2)


def test_sync_async_and_native_give_the_same_rollout():
    traces = {}
    for mode in ("sync", "async", "vector_entry_point"):
        envs = make_vec(mode, max_turns=2)
        traces[mode] = rollout(envs)
        envs.close()
    assert traces["sync"] == traces["async"] == traces["vector_entry_point"]
    queries = traces["sync"][0][0]
    # One order (seed 5), split among the sub-envs: its first three questions.
    single = make_gsm8k_env(data_dir=FIXTURE)
    assert queries == [single.reset(seed=5)[0]["history"][1]["content"]] + [
        single.reset()[0]["history"][1]["content"] for _ in range(2)
    ]


def test_plain_make_vec_sync_shuffles_each_sub_env_on_its_own():
    # What sharded_env_fns is for: gym.make_vec gives every sub-env the same arguments.
    envs = gym.make_vec("LLMChat-GSM8K-v0", 3, vectorization_mode="sync", data_dir=FIXTURE)
    assert [env.unwrapped.shard for env in envs.envs] == [(0, 1)] * 3
    assert [env.unwrapped.shard for env in make_vec("sync").envs] == [(0, 3), (1, 3), (2, 3)]
    with pytest.raises(TypeError, match="sets each sub-env's shard itself"):
        sharded_env_fns("LLMChat-GSM8K-v0", 2, shard=(0, 2))
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        sharded_env_fns("LLMChat-GSM8K-v0", 0)


@pytest.mark.parametrize("mode", ["sync", "async", "vector_entry_point"])
def test_tokens_mode_same_prompts(mode, gpt2_tokenizer):
    envs = make_vec(mode, input_mode="tokens", tokenizer=gpt2_tokenizer)
    obs, _ = envs.reset(seed=1)
    for i in range(3):
        single = make_gsm8k_env(
            data_dir=FIXTURE, input_mode="tokens", tokenizer=gpt2_tokenizer, shard=(i, 3)
        )
        assert np.array_equal(obs["tokens"][i], single.reset(seed=1 + i)[0]["tokens"])
    assert envs.observation_space.contains(obs)
    envs.close()


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_native_batched_obs_are_in_the_space(mode, gpt2_tokenizer):
    envs = make_vec("vector_entry_point", input_mode=mode, tokenizer=gpt2_tokenizer)
    obs, info = envs.reset(seed=0)
    assert envs.observation_space.contains(obs) and len(obs[mode]) == 3
    action = envs.action_space.sample()
    obs, rewards, terminated, truncated, info = envs.step(action)
    assert envs.observation_space.contains(obs)
    assert rewards.dtype == np.float64 and terminated.dtype == np.bool_ and terminated.all()


def test_same_step_autoreset_single_turn():
    envs = make_vec("vector_entry_point", num_envs=2)
    obs, _ = envs.reset(seed=0)
    first = user_queries(obs)
    obs, rewards, terminated, truncated, info = envs.step([WRONG, "<answer>7</answer>"])
    assert terminated.tolist() == [True, True] and truncated.tolist() == [False, False]
    assert info["_final_obs"].tolist() == [True, True]
    final = info["final_obs"]
    assert [o["history"][1]["content"] for o in final] == first
    assert [o["history"][-1] for o in final] == [
        {"role": "assistant", "content": WRONG},
        {"role": "assistant", "content": "<answer>7</answer>"},
    ]
    assert info["final_info"]["reward_answer"].tolist() == [0.0, 1.0]
    assert list(info["final_info"]["answer"]) == [ANSWERS[q] for q in first]
    # The returned observation already starts the next episode: no step is wasted; its
    # reset info (the new answer) sits at the top level, as in SyncVectorEnv.
    assert all(len(h) == 2 for h in obs["history"]) and user_queries(obs) != first
    assert list(info["answer"]) == [ANSWERS[q] for q in user_queries(obs)]


def test_same_step_autoreset_multi_turn_only_resets_finished_envs():
    envs = make_vec("vector_entry_point", num_envs=2, max_turns=2)
    obs, _ = envs.reset(seed=0)
    first = user_queries(obs)
    obs, rewards, terminated, truncated, info = envs.step(["<answer>1</answer>", "thinking"])
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert info["_final_obs"].tolist() == [True, False] and info["final_obs"][1] is None
    assert [len(h) for h in obs["history"]] == [2, 3]  # sub-env 0 restarted, 1 goes on
    assert user_queries(obs)[1] == first[1] and user_queries(obs)[0] != first[0]
    # Sub-env 0's info is its new episode's reset info; sub-env 1's is its step info.
    assert info["_reward_answer"].tolist() == [False, True]
    assert list(info["answer"]) == [ANSWERS[q] for q in user_queries(obs)]
    obs, rewards, terminated, truncated, info = envs.step(["thinking", "still thinking"])
    assert terminated.tolist() == [False, False] and truncated.tolist() == [False, True]
    assert info["final_obs"][1]["history"][-1]["content"] == "still thinking"


@pytest.mark.parametrize("num_envs, repeats", [(6, 3), (4, 2)])
def test_grpo_groups_fill_consecutive_sub_envs(num_envs, repeats):
    env = DatasetChatEnv(ROWS, repeats=repeats, group_repeats=True)
    envs = DatasetChatVectorEnv(env, num_envs)
    _, info = envs.reset(seed=10)
    served = [info["id"].tolist()]
    for _ in range(9):
        _, _, terminated, _, info = envs.step(["x"] * num_envs)
        assert terminated.all()
        served.append(info["id"].tolist())
    served = np.array(served)  # (episodes, num_envs)
    n_groups = num_envs // repeats
    groups = served.reshape(10, n_groups, repeats)
    assert (groups == groups[..., :1]).all()  # sub-envs g*G .. g*G+G-1 share a item
    # The groups split seed 10's order between them: step k, group g has item k*n + g,
    # so every item once per epoch.
    single = DatasetChatEnv(ROWS)
    order = [single.reset(seed=10)[1]["id"]] + [single.reset()[1]["id"] for _ in range(19)]
    assert groups[..., 0].ravel().tolist() == order[: 10 * n_groups]
    assert sorted(order[:10]) == list(range(10))


def test_grpo_group_stays_aligned_when_members_finish_at_different_turns():
    env = make_gsm8k_env(data_dir=FIXTURE, repeats=3, group_repeats=True, max_turns=2)
    envs = DatasetChatVectorEnv(env, 3)
    obs, _ = envs.reset(seed=0)
    assert len(set(user_queries(obs))) == 1
    obs, _, terminated, _, _ = envs.step(["<answer>1</answer>", "hmm", "hmm"])
    assert terminated.tolist() == [True, False, False]
    ahead = user_queries(obs)[0]
    assert ahead != user_queries(obs)[1]
    obs, _, _, truncated, _ = envs.step(["hmm", "hmm", "hmm"])
    assert truncated.tolist() == [False, True, True]
    assert user_queries(obs)[1:] == [ahead, ahead]  # the laggards join the leader's item


def test_repeats_without_groups_split_the_stream_like_sharded_sync():
    # 3 sub-envs, repeats 2: stream q0 q0 q1 q1 q2 q2 ..., a item's copies may span steps.
    native = make_vec("vector_entry_point", num_envs=3, repeats=2)
    sync = make_vec("sync", num_envs=3, repeats=2)
    for envs in (native, sync):
        obs, _ = envs.reset(seed=3)
        queries = user_queries(obs)
        for _ in range(3):
            queries += user_queries(envs.step([WRONG] * 3)[0])
        envs.trace = queries
    assert native.trace == sync.trace
    stream = native.trace
    assert stream[0::2] == stream[1::2] and len(set(stream[0::2])) == 6


def test_constructor_seed_is_the_shared_order():
    envs = DatasetChatVectorEnv(DatasetChatEnv(ROWS, seed=4), 3)
    _, info = envs.reset()
    single = DatasetChatEnv(ROWS, seed=4)
    assert info["id"].tolist() == [single.reset()[1]["id"] for _ in range(3)]


def test_seed_list_and_dataloader_stream():
    envs = DatasetChatVectorEnv(DatasetChatEnv(ROWS), 2)
    _, info = envs.reset(seed=[8, 9])  # what reset(seed=8) gives: one order, split
    _, same = envs.reset(seed=8)
    single = DatasetChatEnv(ROWS)
    expected = [single.reset(seed=8)[1]["id"], single.reset()[1]["id"]]
    assert info["id"].tolist() == same["id"].tolist() == expected
    # A dataloader is one stream shared by the sub-envs, drawn in sub-env order.
    envs = DatasetChatVectorEnv(DatasetChatEnv.from_dataloader(ROWS), 3)
    _, info = envs.reset(seed=0)
    assert info["id"].tolist() == [0, 1, 2]
    _, _, _, _, info = envs.step(["a", "b", "c"])
    assert info["id"].tolist() == [3, 4, 5]


@pytest.mark.parametrize("group_repeats", [False, True])
def test_reset_dataloader_restarts_every_order(group_repeats):
    env = DatasetChatEnv(ROWS, repeats=2, group_repeats=group_repeats)
    envs = DatasetChatVectorEnv(env, 4)
    _, first = envs.reset(seed=1)
    _, _, _, _, second = envs.step(["x"] * 4)
    envs.step(["x"] * 4)
    assert envs.reset_dataloader() is envs
    _, _, _, _, info = envs.step(["x"] * 4)  # autoreset: the orders' first items again
    assert info["id"].tolist() == first["id"].tolist()
    envs.reset_dataloader()
    _, info = envs.reset()
    assert info["id"].tolist() == first["id"].tolist()
    assert envs.step(["x"] * 4)[4]["id"].tolist() == second["id"].tolist()


# -- errors ---------------------------------------------------------------------------


def test_bad_constructor_arguments():
    with pytest.raises(
        ValueError, match=r"num_envs must be a multiple of repeats=3.*got num_envs=4"
    ):
        DatasetChatVectorEnv(DatasetChatEnv(ROWS, repeats=3, group_repeats=True), 4)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got 0"):
        DatasetChatVectorEnv(DatasetChatEnv(ROWS), 0)
    with pytest.raises(TypeError, match="env must be a DatasetChatEnv, got CartPoleEnv"):
        DatasetChatVectorEnv(gym.make("CartPole-v1").unwrapped, 2)
    with pytest.raises(ValueError, match="num_envs must be a multiple of repeats=2"):
        gym.make_vec(
            "LLMChat-GSM8K-v0", num_envs=3, data_dir=FIXTURE, repeats=2, group_repeats=True
        )


def test_bad_actions_change_nothing():
    envs = make_vec("vector_entry_point", num_envs=3, max_turns=2)
    with pytest.raises(gym.error.ResetNeeded):
        envs.step(["a", "b", "c"])
    obs, _ = envs.reset(seed=0)
    with pytest.raises(ValueError, match="actions must hold num_envs=3 responses, got 2"):
        envs.step(["a", "b"])
    with pytest.raises(TypeError, match=r"actions\[2\]: action must be a str.*got int"):
        envs.step(["a", "b", 3])
    with pytest.raises(TypeError, match="actions must be a sequence of 3 responses, got str"):
        envs.step("abc")
    assert [c.history.to_chats() for c in envs.unwrapped.conversations] == list(obs["history"])
    obs, *_ = envs.step(["a", "b", "c"])
    assert [h[-1]["content"] for h in obs["history"]] == ["a", "b", "c"]


def test_a_given_item_goes_to_every_sub_env_and_keeps_the_stream():
    envs = DatasetChatVectorEnv(DatasetChatEnv(ROWS, repeats=2, group_repeats=True), 2)
    _, info = envs.reset(seed=0, options={"item": ROWS[7]})
    assert info["id"].tolist() == [7, 7]
    _, _, _, _, info = envs.step(["x", "y"])  # then the order's first item, as a group
    assert info["id"].tolist() == [DatasetChatEnv(ROWS).reset(seed=0)[1]["id"]] * 2


def test_bad_seed_list():
    envs = DatasetChatVectorEnv(DatasetChatEnv(ROWS), 2)
    obs, _ = envs.reset(seed=0)
    with pytest.raises(ValueError, match="seed as a list must have num_envs=2 entries, got 3"):
        envs.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match=r"seed\[1\] must be None or an int >= 1.*got 0"):
        envs.reset(seed=[5, 0])
    # Checked before any sub-env reset: the vector env is as before.
    assert [c.history.to_chats() for c in envs.unwrapped.conversations] == list(obs["history"])


def test_a_sharded_env_cannot_be_vectorized_again():
    with pytest.raises(ValueError, match=r"env must serve the whole stream.*got shard=\(1, 2\)"):
        DatasetChatVectorEnv(DatasetChatEnv(ROWS, shard=(1, 2)), 2)


def assert_same_info(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_info(a[key], b[key])
        elif key == "final_obs":
            assert list(a[key]) == list(b[key])
        else:
            assert a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist(), key


def test_native_info_is_built_exactly_like_sync():
    sync, native = make_vec("sync", max_turns=2), make_vec("vector_entry_point", max_turns=2)
    infos = [envs.reset(seed=2)[1] for envs in (sync, native)]
    assert_same_info(*infos)
    for actions in (["<answer>3</answer>", WRONG, WRONG], [WRONG, WRONG, RIGHT]):
        infos = [envs.step(actions)[4] for envs in (sync, native)]
        assert infos[0]["_final_obs"].any() and not infos[0]["_final_obs"].all()
        assert_same_info(*infos)


# -- exactly-once epochs --------------------------------------------------------------


def finished_episodes(envs, count):
    """The (question, answer) of the first ``count`` finished episodes, step by step and in
    sub-env order, as a rollout loop collects them."""
    envs.reset(seed=11)
    seen = []
    while len(seen) < count:
        _, _, terminated, _, info = envs.step([WRONG] * envs.num_envs)
        assert terminated.all()
        for final, answer in zip(info["final_obs"], info["final_info"]["answer"], strict=True):
            seen.append((final["history"][1]["content"], answer))
    return seen[:count]


def gsm8k_test_split():
    rows = [json.loads(line) for line in (GSM8K_PATH / "test.jsonl").read_text().splitlines()]
    return Counter((row["question"], row["answer"]) for row in rows)


@pytest.mark.parametrize("repeats", [1, 3])
def test_one_epoch_of_the_gsm8k_test_split_serves_each_question_repeats_times(repeats):
    split = gsm8k_test_split()
    assert sum(split.values()) == 1319
    envs = gym.make_vec(
        "LLMChat-GSM8K-v0", num_envs=7, split="test", data_dir=GSM8K_PATH, repeats=repeats
    )
    seen = finished_episodes(envs, 2 * 1319 * repeats)
    first, second = seen[: 1319 * repeats], seen[1319 * repeats :]
    assert Counter(first) == Counter({key: n * repeats for key, n in split.items()})
    assert Counter(second) == Counter(first)  # the next epoch too, in a new order
    assert first != second


def test_sharded_sync_serves_one_epoch_exactly_once_like_native():
    fns = sharded_env_fns("LLMChat-GSM8K-v0", 7, split="test", data_dir=GSM8K_PATH)
    sync = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    native = gym.make_vec("LLMChat-GSM8K-v0", 7, split="test", data_dir=GSM8K_PATH)
    seen = finished_episodes(sync, 1319)
    assert Counter(seen) == gsm8k_test_split()
    assert finished_episodes(native, 1319) == seen
