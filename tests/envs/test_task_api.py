"""A task is a ``Task``: registering one, the argument split, sources, the format registry."""

import gymnasium as gym
import pytest
from gsm8k_fixture import FIXTURE

import llm_gym
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv, make_task_env
from llm_gym.rewards import ANSWER_FORMATS, MODES, extract_answer
from llm_gym.sources import IndexedSource, ProceduralSource, Source
from llm_gym.tasks import Task, TaskScore, countdown_task, gsm8k_task


def exact(response, item):
    right = response.strip() == item["answer"]
    return TaskScore(float(right), {"success": right}, answered=bool(response.strip()))


def sums_task(n: int = 100) -> Task:
    rows = [{"query": f"{i} + {i}?", "answer": str(2 * i)} for i in range(n)]
    return Task(source=rows, prompt="Answer with a number only.", reward=exact)


def test_readme_task_registers_and_splits_its_arguments_from_the_envs():
    llm_gym.register_task("LLMChat-TestSums-v0", sums_task)
    try:  # the id is this test's: `llm-gym envs`' test lists the registry's
        env = gym.make("LLMChat-TestSums-v0", n=3, seed=0, repeats=2)
        queries = [env.reset()[0]["history"][-1]["content"] for _ in range(6)]
        assert sorted(queries) == sorted(["0 + 0?", "1 + 1?", "2 + 2?"] * 2)
        assert queries[0::2] == queries[1::2]  # repeats=2 went to the env
        assert env.unwrapped.epoch_size == 6  # n=3 went to the task
        obs, reward, terminated, _, info = env.step(str(2 * int(queries[-1].split()[0])))
        assert (reward, terminated, info["success"]) == (1.0, True, True)
        envs = gym.make_vec(
            "LLMChat-TestSums-v0", num_envs=3, vectorization_mode="vector_entry_point"
        )
        assert isinstance(envs.unwrapped, DatasetChatVectorEnv) and envs.num_envs == 3
        assert envs.unwrapped.epoch_size == 100
    finally:
        del gym.registry["LLMChat-TestSums-v0"]


def test_a_task_unpacks_into_the_env_arguments_and_the_env_gives_it_back():
    task = gsm8k_task(answer_format="boxed")
    assert dict(task).keys() == {
        "system_prompt",
        "reward",
        "answer_format",
        "field_map",
        "required_fields",
        "concurrent_reward",
        "reward_version",
    }
    env = DatasetChatEnv([{"question": "1+1?", "answer": "#### 2"}], **task)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(r"so \boxed{2}")
    assert reward == 1.0 and info["reward_version"] == task.reward_version == "1"
    assert info["item"] == {"query": "1+1?", "answer": "#### 2"}  # what rescore reads
    assert env.task.reward_version == "1"
    assert env.task.answer_format == "boxed" and env.task.prompt == task.prompt
    assert env.task.concurrent_reward is False  # GSM8K's reward is cheap: scored in turn
    assert ANSWER_FORMATS["boxed"].instruction in task.prompt


def test_a_data_loading_source_loads_when_the_env_is_made_not_before():
    calls = []

    def load():
        calls.append(1)
        return [{"query": "a?"}]

    task = Task(source=load)
    assert calls == []
    DatasetChatEnv.from_task(task)
    assert calls == [1]
    assert callable(gsm8k_task(split="test").source)  # a GSM8K task loads nothing yet


def test_from_task_keeps_the_task_prompt_unless_the_user_gives_one():
    task = Task([{"query": "q?"}], prompt="Task prompt.")
    first = DatasetChatEnv.from_task(task, system_prompt=None).reset(seed=0)[0]["history"][0]
    assert first["content"] == "Task prompt."
    mine = DatasetChatEnv.from_task(task, system_prompt="Mine.").reset(seed=0)[0]["history"][0]
    assert mine["content"] == "Mine."


def test_registered_gsm8k_env_is_the_task_functions_env():
    env = gym.make("LLMChat-GSM8K-v0", data_dir=FIXTURE, split="test", answer_format="hash")
    assert env.unwrapped.task.answer_format == "hash"
    assert env.unwrapped.system_prompt == gsm8k_task(answer_format="hash").prompt


def test_sources_follow_the_source_protocol():
    procedural = countdown_task(level=0).source
    assert isinstance(procedural, ProceduralSource) and isinstance(procedural, Source)
    assert isinstance(IndexedSource([{"query": "a"}]), Source)
    assert not isinstance([{"query": "a"}], Source)


def test_one_answer_format_registry_under_both_names():
    assert MODES == tuple(ANSWER_FORMATS) == ("tags", "hash", "boxed", "last_number")
    for name, answer_format in ANSWER_FORMATS.items():
        assert answer_format.instruction and callable(answer_format.extract), name
    assert extract_answer("x = 3, then 41", "last_number") == "41"


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: make_task_env(42), TypeError, "task_factory must be a Task, a function"),
        (lambda: DatasetChatEnv.from_task({"source": []}), TypeError, "task must be an llm_gym"),
        (lambda: make_task_env(sums_task, n=2, bogus=1), TypeError, "bogus"),
        (lambda: make_task_env(countdown_task, level=9), ValueError, "level must be an int in"),
    ],
)
def test_bad_task_arguments_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
