"""AsyncEpisodes against the synchronous vector env: the same episodes for a seed (greedy),
exactly-once epochs, reward and KL wrappers, slow tools, versions, failures and bad input."""

import functools
import json
import threading

import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.chat import Response
from llm_gym.envs import DatasetChatEnv
from llm_gym.episodes import AsyncEpisodes, Episode, Episodes, VectorEpisodes
from llm_gym.lm.loading import load_gpt2_tokenizer, tiny_model
from llm_gym.policies import TransformersPolicy
from llm_gym.wrappers import RetrieveKL
from llm_gym.wrappers import vector as vector_wrappers

KEYS = ("tokens", "history", "policy_mask")


@pytest.fixture(scope="module")
def tiny():
    tokenizer = load_gpt2_tokenizer()
    model = tiny_model(tokenizer, seed=0)
    kwargs = {"max_new_tokens": 6, "do_sample": False}
    policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    ref = TransformersPolicy(tiny_model(tokenizer, seed=1), tokenizer, input_mode="tokens",
                             generate=False)  # fmt: skip
    return tokenizer, policy, ref


def countdown(tokenizer):
    kwargs = {"input_mode": "tokens", "tokenizer": tokenizer, "observation_keys": KEYS}
    return {"id": "LLMChat-Countdown-v0", "level": 0, **kwargs}


def sync_episodes(envs, policy, count, seed):
    """The vector env's episodes by stream position: sub-env i's k-th episode is item
    i + k * num_envs."""
    obs, _ = envs.reset(seed=seed)
    running, done, by_position = Episodes(envs, obs), [0] * envs.num_envs, {}
    while len(by_position) < count:
        responses = policy({policy.input_mode: running.obs[policy.input_mode]})
        for episode in running.step(responses):
            i = episode.env_index
            by_position[i + done[i] * envs.num_envs] = episode
            done[i] += 1
    return {p: e for p, e in by_position.items() if p < count}


def same_episode(a: Episode, b: Episode):
    """The fields two sources' episodes share: prompt, turns, tokens, masks, log-probs,
    rewards and their parts, versions and KL."""
    assert a.prompt == b.prompt and a.responses == b.responses and a.response == b.response
    assert len(a.segments) == len(b.segments) == 1
    for x, y in zip(a.segments, b.segments, strict=True):
        np.testing.assert_array_equal(x.ids, y.ids)
        np.testing.assert_array_equal(x.policy_mask, y.policy_mask)
        np.testing.assert_allclose(x.log_probs, y.log_probs, atol=1e-5)
    assert a.reward == pytest.approx(b.reward, abs=1e-6)
    assert a.reward_task == b.reward_task and a.success == b.success
    np.testing.assert_allclose(a.sampled_log_probs, b.sampled_log_probs, atol=1e-5)
    assert a.versions == b.versions and a.num_tokens == b.num_tokens
    np.testing.assert_allclose(a.token_kl, b.token_kl, atol=1e-5)
    assert a.kl_sum == pytest.approx(b.kl_sum, abs=1e-4)


def test_same_episodes_as_the_vector_env_with_reward_and_kl_wrappers(tiny):
    tokenizer, policy, ref = tiny
    spec = countdown(tokenizer)
    env_id, kwargs = spec.pop("id"), spec

    def one_env():
        env = gym.make(env_id, **kwargs)
        env = gym.wrappers.TransformReward(env, lambda r: 2.0 * r + 1.0)
        return RetrieveKL(env, ref_model=ref, coef=0.1)

    envs = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    envs = gym.wrappers.vector.TransformReward(envs, lambda r: 2.0 * r + 1.0)
    envs = vector_wrappers.RetrieveKL(envs, None, ref, coef=0.1)
    expected = sync_episodes(envs, policy, 10, seed=5)
    # The vector env as an EpisodeSource: an episode of each sub-env a call, in stream order.
    source = VectorEpisodes(envs, policy, seed=5)
    played = source.episodes(3) + source.episodes(3)
    with pytest.raises(ValueError, match=r"count must be the vector env's num_envs=3 \(.*got 4"):
        source.episodes(4)
    with AsyncEpisodes(one_env, 3, policy, seed=5) as rollouts:
        got = rollouts.episodes(10)  # in stream order
    assert [e.item_index for e in got] == list(range(10)) and {e.seed for e in got} == {5}
    for position, episode in enumerate(got):
        assert isinstance(episode, Episode) and episode.versions == [0]
        same_episode(episode, expected[position])
        if position < len(played):
            same_episode(episode, played[position])
    # the KL penalty is in the return: reward = 2 r_task + 1 - 0.1 sum(kl)
    e = got[0]
    assert e.reward == pytest.approx(2 * e.reward_task + 1 - 0.1 * e.kl_sum, abs=1e-4)
    # The record holds the synchronous one's keys, first which item of the stream it played
    # (and the level it was drawn at and the coefficient it was charged: a sub-env's info).
    record, sync_record = e.record(), expected[0].record()
    assert list(record)[:2] == ["item_index", "seed"] and sync_record.keys() <= record.keys()


def rows(n):
    return [{"query": f"question {i}?", "answer": str(i)} for i in range(n)]


def echo_policy(obs):
    """Answers each question with its number: the reward below counts it right."""
    return [h[-1]["content"].split()[1].rstrip("?") for h in obs["history"]]


def exact(response, sample):
    return float(response == sample["answer"]), {"success": response == sample["answer"]}


def test_every_sample_exactly_repeats_times_in_an_epoch_across_calls():
    env_fn = functools.partial(DatasetChatEnv, rows(7), repeats=2, reward=exact)
    with AsyncEpisodes(env_fn, 3, echo_policy, seed=1) as rollouts:
        first = rollouts.episodes(5)  # a part of the epoch, then the rest
        gen = rollouts.play(9)
        second = [next(gen), next(gen)]
        gen.close()  # stopped early: its drawn items are played next time
        third = list(rollouts.play(7))
    records = [e.record() for e in first + second + third]
    positions = [r["item_index"] for r in records]
    assert sorted(positions) == list(range(14))
    questions = [r["prompt"][-1]["content"] for r in records]
    assert sorted(questions) == sorted(f"question {i}?" for i in range(7) for _ in range(2))
    # repeats=2: stream positions 2k and 2k+1 hold one item (a GRPO group)
    by_position = {r["item_index"]: r["prompt"][-1]["content"] for r in records}
    assert all(by_position[2 * k] == by_position[2 * k + 1] for k in range(7))
    assert all(r["reward"] == 1.0 and r["success"] for r in records)
    assert all(r["seed"] == 1 for r in records)  # with item_index: which item it played


SLOW_RELEASED = threading.Event()  # set once the other conversations have all finished


def lookup(key: str) -> str:
    """Look a key up; key "slow" waits until the test lets it go.

    Args:
        key: What to look up.
    """
    if key == "slow" and not SLOW_RELEASED.wait(60):  # a guard far above the expected time
        raise RuntimeError("the slow lookup was never released: the others waited for it")
    return f"value of {key}"


def tool_policy(obs):
    """Calls the lookup tool once (question 0 asks the slow key), then answers."""
    out = []
    for history in obs["history"]:
        if history[-1]["role"] == "tool":
            out.append(history[-2]["content"].split("question ")[-1][:1] or "x")
            continue
        number = history[-1]["content"].split()[1].rstrip("?")
        key = "slow" if number == "0" else number
        out.append(f'<tool_call>{json.dumps({"name": "lookup", "arguments": {"key": key}})}'
                   "</tool_call>")  # fmt: skip
    return out


def test_a_slow_tool_holds_up_only_its_own_conversation():
    env_fn = functools.partial(
        DatasetChatEnv, rows(8), shuffle=False, tools=[lookup], max_turns=3, reward=exact
    )
    SLOW_RELEASED.clear()
    records = []
    with AsyncEpisodes(env_fn, 4, tool_policy, seed=0) as rollouts:
        for episode in rollouts.play(8):  # as they finish
            records.append(episode.record())
            if len(records) == 7:  # all but the slow one finished while it waited
                SLOW_RELEASED.set()
    order = [r["item_index"] for r in records]
    assert sorted(order) == list(range(8))
    assert order[-1] == 0  # the slow one finished last; the others went on meanwhile
    envs = DatasetChatVectorEnv_(env_fn, 4)
    expected = sync_episodes(envs, _with_mode(tool_policy), 8, seed=0)
    for record in records:
        assert record["num_tool_calls"] == 1
        want = expected[record["item_index"]]
        assert record["conversation"] == want.info["conversation"]
        assert record["responses"] == want.responses


def DatasetChatVectorEnv_(env_fn, n):  # noqa: N802
    from llm_gym.envs import DatasetChatVectorEnv

    return DatasetChatVectorEnv(env_fn(), n)


def _with_mode(policy):
    policy = functools.partial(policy)
    policy.input_mode = "history"
    return policy


def versioned(obs):
    return [Response("7", tokens=[22], log_probs=[-0.5], version=3) for _ in obs["history"]]


def test_records_carry_each_turns_version_and_sampled_log_probs():
    env_fn = functools.partial(DatasetChatEnv, rows(3), reward=exact)
    with AsyncEpisodes(env_fn, 2, versioned, seed=0) as rollouts:
        records = [e.record() for e in rollouts.episodes(3)]
    assert [r["versions"] for r in records] == [[3]] * 3
    assert [r["sampled_log_probs"].tolist() for r in records] == [[-0.5]] * 3


def picky(response, sample):
    if sample["answer"] == "4":
        raise ValueError("this reward cannot score sample 4")
    return exact(response, sample)


def test_a_failing_sub_env_stops_the_run_naming_it_and_no_record_is_partial():
    env_fn = functools.partial(DatasetChatEnv, rows(6), shuffle=False, reward=picky)
    rollouts = AsyncEpisodes(env_fn, 2, echo_policy, seed=0)
    seen = []
    with pytest.raises(RuntimeError, match=r"sub-env [01] failed on item 4 .*cannot score"):
        for episode in rollouts.play(6):
            seen.append(episode)
    finished = {e.item_index for e in seen}
    assert {0, 1, 2, 3} <= finished and 4 not in finished  # 5 may have finished meanwhile
    assert all(e.reward == 1.0 for e in seen)
    rollouts.close()


def test_a_policy_that_never_answers_times_out():
    released = threading.Event()

    def stuck(obs):
        released.wait(60)
        return echo_policy(obs)

    env_fn = functools.partial(DatasetChatEnv, rows(2))
    with AsyncEpisodes(env_fn, 2, stuck, timeout=0.2) as rollouts:
        with pytest.raises(TimeoutError, match="within timeout=0.2 s"):
            list(rollouts.episodes(2))
        released.set()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_envs": 0}, ValueError, "num_envs must be an int >= 1, got 0"),
        ({"workers": 2}, ValueError, "workers=2 needs ray_address"),
        ({"workers": 5}, ValueError, "workers must be <= num_envs=2, got 5"),
        ({"timeout": 0}, ValueError, "timeout must be"),
        ({"sampler_calls": 0}, ValueError, "sampler_calls must be an int >= 1"),
        ({"policy": "gpt2"}, TypeError, "policy must be callable"),
        ({"env_fn": lambda: gym.make("CartPole-v1")}, TypeError, "made CartPoleEnv"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, message):
    arguments = {
        "env_fn": functools.partial(DatasetChatEnv, rows(2)),
        "num_envs": 2,
        "policy": echo_policy,
        **kwargs,
    }
    with pytest.raises(error, match=message):
        AsyncEpisodes(**arguments)


def test_bad_count_names_itself():
    with AsyncEpisodes(functools.partial(DatasetChatEnv, rows(2)), 1, echo_policy) as rollouts:
        with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
            next(rollouts.play(0))
