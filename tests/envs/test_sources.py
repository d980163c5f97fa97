"""Sources and shards: one seeded stream split exactly once among envs, sub-envs and ranks."""

import functools

import pytest

from llm_gym.envs import DatasetChatEnv, make_task_env
from llm_gym.sources import IndexedSource, Shard
from llm_gym.tasks import countdown_task

ROWS = [{"query": f"q{i}", "id": i} for i in range(10)]


def ids(env, n):
    return [env.reset()[1]["id"] for _ in range(n)]


def ids_after_reset(env, seed, n):
    return [env.reset(seed=seed)[1]["id"]] + ids(env, n - 1)


def test_index_source_fork_shares_data_and_seed():
    source = IndexedSource(ROWS, seed=1)
    fork = source.for_shard(Shard(1, 2))
    assert fork.data is source.data and fork.seed == source.seed == 1
    whole = [source.next_item()["id"] for _ in range(6)]
    assert [fork.next_item()["id"] for _ in range(3)] == whole[1::2]


def test_shards_split_one_order_and_its_repeats():
    whole = ids(DatasetChatEnv(ROWS, seed=3, repeats=2), 40)  # two epochs
    shards = [DatasetChatEnv(ROWS, seed=3, repeats=2, shard=(i, 3)) for i in range(3)]
    served = [ids(env, 13) for env in shards]
    assert [served[k % 3][k // 3] for k in range(39)] == whole[:39]
    # reset(seed=s + i) puts shard i on order s, as a vector env's reset(seed=s) does.
    again = [ids_after_reset(env, seed=7 + i, n=4) for i, env in enumerate(shards)]
    whole = ids_after_reset(DatasetChatEnv(ROWS, repeats=2), seed=7, n=12)
    assert [again[k % 3][k // 3] for k in range(12)] == whole


def test_procedural_shards_share_the_seed_and_split_the_indices():
    make_countdown_env = functools.partial(make_task_env, countdown_task)

    whole = make_countdown_env(seed=5)
    shard = make_countdown_env(seed=5, shard=(1, 2))
    queries = [whole.reset()[0]["history"][-1]["content"] for _ in range(4)]
    assert [shard.reset()[0]["history"][-1]["content"] for _ in range(2)] == queries[1::2]


@pytest.mark.parametrize("shard", [(2, 2), (0, 0), (-1, 2), (1,), "0/2", (True, 2), (0.0, 2)])
def test_bad_shard(shard):
    with pytest.raises(ValueError, match=r"shard must be None or \(index, count\) with ints"):
        DatasetChatEnv(ROWS, shard=shard)


def test_a_sharded_env_needs_a_seed_of_at_least_its_index():
    env = DatasetChatEnv(ROWS, seed=0, shard=(2, 4))
    obs, _ = env.reset()
    with pytest.raises(ValueError, match=r"seed must be >= the shard index 2.*got 1"):
        env.reset(seed=1)
    assert env.history.to_chats() == obs["history"]


def test_an_iterable_cannot_be_sharded():
    with pytest.raises(ValueError, match=r"shard=\(0, 2\) needs an indexable dataset"):
        DatasetChatEnv.from_dataloader(ROWS, shard=(0, 2))
