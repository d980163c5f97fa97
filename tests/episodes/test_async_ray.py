"""AsyncEpisodes with env workers as Ray actors on a real local cluster of three nodes (Ray's
own ``cluster_utils.Cluster``): placement on different nodes, the same episodes as threads in
one process, a killed worker and a lost node replayed without loss or double, teardown."""

import functools
import sys
import time

import gymnasium as gym
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.exceptions import RayActorError

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.episodes import AsyncEpisodes
from llm_gym.lm.loading import load_gpt2_tokenizer, tiny_model
from llm_gym.policies import TransformersPolicy

# The env constructors run inside the actors, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.ray
KEYS = ("tokens", "history", "policy_mask")
EPISODES = 12


@pytest.fixture(scope="module")
def cluster():
    # A head that runs no actors and two worker nodes: env workers must go to the workers.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=2) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False, namespace="llm-gym-async-tests")
    cluster.wait_for_nodes()
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_gpt2_tokenizer()
    kwargs = {"max_new_tokens": 5, "do_sample": False}
    policy = TransformersPolicy(
        tiny_model(tokenizer, seed=0), tokenizer, input_mode="tokens", generate_kwargs=kwargs
    )
    env_fn = functools.partial(
        gym.make, "LLMChat-Countdown-v0", level=0, input_mode="tokens", tokenizer=tokenizer,
        observation_keys=KEYS,
    )  # fmt: skip
    with AsyncEpisodes(env_fn, 4, policy, seed=7) as local:
        expected = {e.item_index: e.record() for e in local.play(EPISODES)}
    return env_fn, policy, expected


def check_same(records, expected):
    assert sorted(r["item_index"] for r in records) == list(range(EPISODES))  # each once
    for record in records:
        want = expected[record["item_index"]]
        assert record["responses"] == want["responses"]
        assert record["conversation_ids"].tolist() == want["conversation_ids"].tolist()
        assert record["reward"] == want["reward"]


def test_workers_on_two_nodes_give_the_episodes_of_one_process(cluster, setup):
    env_fn, policy, expected = setup
    with AsyncEpisodes(env_fn, 4, policy, seed=7, ray_address="auto", workers=2) as rollouts:
        worker_nodes = {node.node_id for node in cluster[1]}
        assert len(set(rollouts.nodes)) == 2 and set(rollouts.nodes) == worker_nodes
        records = [e.record() for e in rollouts.play(EPISODES)]
        assert rollouts.restarts == 0
    check_same(records, expected)


def test_a_killed_worker_loses_and_doubles_no_episode(cluster, setup):
    env_fn, policy, expected = setup
    calls = []

    def killing_policy(obs):
        calls.append(1)
        if len(calls) == 3:  # mid-run: worker 0 dies with episodes in flight
            ray.kill(rollouts.workers.actors[0], no_restart=True)
        return policy(obs)

    killing_policy.input_mode = "tokens"
    rollouts = AsyncEpisodes(env_fn, 4, killing_policy, seed=7, ray_address="auto", workers=2)
    with rollouts:
        records = [e.record() for e in rollouts.play(EPISODES)]
        assert rollouts.restarts == 1
    check_same(records, expected)


def test_close_and_ctrl_c_stop_every_actor(cluster, setup):
    env_fn, policy, _ = setup

    def interrupted(obs):
        raise KeyboardInterrupt

    interrupted.input_mode = "tokens"
    rollouts = AsyncEpisodes(env_fn, 2, interrupted, ray_address="auto", workers=2)
    actors = list(rollouts.workers.actors)
    with pytest.raises(KeyboardInterrupt):
        with rollouts:
            list(rollouts.play(2))
    assert rollouts.workers.actors == [None, None]
    assert all(dies(actor) for actor in actors)
    assert ray.is_initialized()  # Ray itself was the caller's: it keeps running


def dies(actor):
    """Whether the actor is dead, or dies soon (ray.kill acts asynchronously)."""
    for _ in range(120):
        try:
            ray.get(actor.node.remote(), timeout=60)
        except RayActorError:
            return True
        time.sleep(0.5)
    return False


def test_too_many_deaths_give_a_one_line_error(cluster, setup):
    env_fn, policy, _ = setup

    def killing_policy(obs):
        ray.kill(rollouts.workers.actors[0], no_restart=True)
        return policy(obs)

    killing_policy.input_mode = "tokens"
    rollouts = AsyncEpisodes(
        env_fn, 2, killing_policy, ray_address="auto", workers=2, max_restarts=1
    )
    with rollouts, pytest.raises(RuntimeError, match=r"env worker 0 died and max_restarts=1"):
        list(rollouts.play(EPISODES))


def test_z_a_lost_node_is_replayed_on_the_other(cluster, setup):
    env_fn, policy, expected = setup
    calls = []

    def node_killing_policy(obs):
        calls.append(1)
        if len(calls) == 3:
            cluster[0].remove_node(cluster[1][0])  # the node of one worker goes down
        return policy(obs)

    node_killing_policy.input_mode = "tokens"
    placement = [node.node_id for node in cluster[1]]
    rollouts = AsyncEpisodes(
        env_fn, 4, node_killing_policy, seed=7, ray_address="auto", workers=2,
        placement=placement,
    )  # fmt: skip
    with rollouts:
        records = [e.record() for e in rollouts.play(EPISODES)]
        assert rollouts.restarts == 1
        assert rollouts.nodes == [placement[1], placement[1]]  # both on the node left
    check_same(records, expected)


def test_bad_placement_names_itself(cluster, setup):
    env_fn, policy, _ = setup
    with pytest.raises(ValueError, match="placement must be 'spread', 'pack' or a list"):
        AsyncEpisodes(env_fn, 2, policy, ray_address="auto", workers=2, placement="everywhere")
    with pytest.raises(ValueError, match=r"needs one per worker \(2\), got 1"):
        AsyncEpisodes(env_fn, 2, policy, ray_address="auto", workers=2, placement=["x"])


def test_rollout_and_train_run_with_ray_from_the_command_line(cluster, tiny_dir, tmp_path):
    import json

    from llm_gym.cli import main

    common = ["--model", tiny_dir, "--env-arg", "task=chain_sum", "--max-new-tokens", "4",
              "--threads", "1", "--no-progress", "--ray", "auto"]  # fmt: skip
    out = tmp_path / "rollout"
    kl = ["--ref-model", tiny_dir, "--kl-coef", "0.05"]  # the reference: one shared actor
    rollout = ["rollout", *common, *kl, "--workers", "2", "--num-envs", "4", "--episodes", "6",
               "--out", str(out)]  # fmt: skip
    assert main(rollout) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["episodes"] == 6 and summary["summary"]["worker_restarts"] == 0
    assert summary["summary"]["mean_kl"] == pytest.approx(0.0, abs=1e-5)  # ref == policy
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["item_index"] for line in lines) == list(range(6))
    out = tmp_path / "train"
    # One worker for the trainings: each Ray worker is a process that imports torch (seconds).
    train = ["train", *common, "--workers", "1", "--iterations", "2", "--groups", "1",
             "--group-size", "2", "--eval-episodes", "2", "--out", str(out)]  # fmt: skip
    assert main(train) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["staleness"] <= 1 for r in rows)
    assert json.loads((out / "summary.json").read_text())["worker_restarts"] == 0
    assert main([*train, "--resume", "--iterations", "3"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
