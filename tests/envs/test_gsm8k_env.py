"""GSM8K (LLMChat-GSM8K-v0): registration, data loading, rewards, episode ends, errors."""

import datasets
import gymnasium as gym
import numpy as np
import pytest
from conftest import GSM8K_PATH
from gsm8k_fixture import FIXTURE, make_gsm8k_env  # made-up problems, in a temp folder
from gymnasium.utils.env_checker import check_env

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym import Response
from llm_gym.envs import DatasetChatEnv
from llm_gym.rewards import GSM8KReward
from llm_gym.sources import datasets as data_sources
from llm_gym.tasks import GSM8K_SYSTEM_PROMPT, gsm8k_task, load_gsm8k

# Copied from torchrl/envs/llm/datasets/gsm8k.py (torchrl 0.14), GSM8K_SYSTEM_PROMPT.
TORCHRL_SYSTEM_PROMPT = "\n".join(
    [
        "A conversation between User and Assistant. The user asks a question, and the "
        "Assistant solves it.",
        "The assistant first thinks about the reasoning process in the mind and then provides "
        "the user with the answer.",
        "The reasoning process and answer are enclosed within <think></think> and "
        "<answer></answer> tags, respectively,",
        "i.e., <think>reasoning process here</think> <answer>answer here</answer>. The answer "
        "should be a number.",
    ]
)


def make(**kwargs):
    kwargs.setdefault("data_dir", FIXTURE)
    return gym.make("LLMChat-GSM8K-v0", **kwargs)


def janet_env(**kwargs):
    return make(split="test", shuffle=False, **kwargs)


def test_registered_without_time_limit():
    env = make()
    assert env.spec.max_episode_steps is None and env.spec.kwargs["task_factory"].endswith(
        ":gsm8k_task"
    )
    assert isinstance(env.unwrapped, DatasetChatEnv)


def test_system_prompt_is_torchrls():
    assert GSM8K_SYSTEM_PROMPT == TORCHRL_SYSTEM_PROMPT
    obs, info = janet_env().reset(seed=0)
    assert obs["history"][0] == {"role": "system", "content": TORCHRL_SYSTEM_PROMPT}
    assert obs["history"][1]["role"] == "user" and obs["history"][1]["content"].startswith("Janet")
    assert info == {
        "answer": "She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs for 9 * 2 = $<<9*2=18>>18.\n#### 18"
    }


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_check_env_all_modes(mode, gpt2_tokenizer):
    tokenizer = None if mode == "history" else gpt2_tokenizer
    env = make(input_mode=mode, tokenizer=tokenizer)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and list(obs) == [mode]


@pytest.mark.parametrize(
    "response, reward, parts",
    [
        ("<think>16-3-4=9, 9*2=18</think> <answer>18</answer>", 1.0, (1.0, 1.0, 1.0, True)),
        ("<answer>$18.00</answer>", 1.0, (1.0, 0.0, 1.0, True)),
        ("<think>16-3-4=9</think><answer>9</answer>", 0.1, (1.0, 1.0, 0.1, False)),
        ("The answer is 18.", 0.0, (0.0, 0.0, 0.0, False)),
    ],
)
def test_rewards_through_the_env(response, reward, parts):
    env = janet_env()
    env.reset(seed=0)
    _, r, terminated, truncated, info = env.step(response)
    assert (r, terminated, truncated) == (reward, True, False)
    assert type(r) is float and type(terminated) is bool
    got = (info["reward_answer"], info["reward_think"], info["reward_right"], info["success"])
    assert got == parts and info["reward"] == reward and info["answer"].endswith("#### 18")


@pytest.mark.parametrize("mode", ["text", "tokens"])
def test_rewards_in_text_and_tokens_modes(mode, gpt2_tokenizer):
    env = janet_env(input_mode=mode, tokenizer=gpt2_tokenizer)
    obs, _ = env.reset(seed=0)
    text = "<answer>18</answer><|im_end|>"
    tokens = np.asarray(gpt2_tokenizer(text)["input_ids"], dtype=np.int64)
    action = tokens if mode == "tokens" else text
    obs, reward, terminated, _, info = env.step(action)
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert env.observation_space.contains(obs)
    if mode == "tokens":  # the sampled tokens are in the next prompt as given
        start = len(env.reset(seed=0)[0]["tokens"])
        prompt, *_ = env.step(Response(text, tokens))
        assert np.array_equal(prompt["tokens"][start : start + len(tokens)], tokens)


def test_custom_reward_settings():
    env = janet_env(reward=GSM8KReward(mode="hash", correct_reward=2.0))
    env.reset(seed=0)
    assert env.step("so #### 18")[1] == 2.0


def test_multi_turn_terminates_on_an_answer_else_truncates():
    env = janet_env(max_turns=3)
    env.reset(seed=0)
    assert env.step("Let me think.")[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step("<answer>18</answer>")
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    assert [m["role"] for m in obs["history"]] == ["system", "user", "assistant", "assistant"]
    env.reset(seed=0)
    results = [env.step("hmm")[2:4] for _ in range(3)]
    assert results == [(False, False), (False, False), (False, True)]


def test_repeats_serve_a_question_n_times_in_a_row():
    env = make(seed=0, repeats=3)
    questions = [env.reset()[0]["history"][1]["content"] for _ in range(6)]
    assert len(set(questions[:3])) == 1 and len(set(questions[3:])) == 1
    assert questions[0] != questions[3]


def test_env_var_gives_the_data_folder(monkeypatch):
    monkeypatch.setenv("LLM_GYM_GSM8K_PATH", str(FIXTURE))
    env = gym.make("LLMChat-GSM8K-v0", split="test", shuffle=False)
    assert env.reset()[0]["history"][1]["content"].startswith("Janet’s hens")
    assert len(load_gsm8k("train")) == 10


def test_dataset_argument_overrides_the_loader():
    rows = [{"question": "2+2?", "answer": "#### 4"}]
    env = make(data_dir=None, dataset=rows)
    env.reset(seed=0)
    assert env.step("<answer>4</answer>")[1] == 1.0
    dd = datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
    assert make_gsm8k_env(dataset=dd, split="test").reset()[1] == {"answer": "#### 4"}


def test_from_dataloader_keeps_the_gsm8k_task():
    rows = [{"question": ["1+1?", "2+2?"], "answer": ["#### 2", "#### 4"]}]  # a collated batch
    env = DatasetChatEnv.from_dataloader(rows, max_turns=2, **gsm8k_task())
    obs, info = env.reset()
    assert obs["history"][0]["content"] == GSM8K_SYSTEM_PROMPT and info == {"answer": "#### 2"}
    assert env.step("<answer>2</answer>")[1:3] == (1.0, True)
    assert env.reset()[1] == {"answer": "#### 4"}


def test_hub_is_tried_when_no_folder_is_given(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return datasets.Dataset.from_list([{"question": "q", "answer": "#### 1"}])

    monkeypatch.delenv("LLM_GYM_GSM8K_PATH", raising=False)
    monkeypatch.setattr(data_sources, "hub_unavailable_reason", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    make_gsm8k_env(split="test")
    assert calls == [("openai/gsm8k", "main", "test")]


@pytest.mark.skipif(not GSM8K_PATH.is_dir(), reason=f"the real GSM8K files are not at {GSM8K_PATH}")
def test_real_gsm8k_files():
    train, test = (
        make_gsm8k_env(data_dir=GSM8K_PATH),
        make_gsm8k_env(data_dir=GSM8K_PATH, split="test"),
    )
    assert (len(train.source), len(test.source)) == (7473, 1319)
    env = gym.make("LLMChat-GSM8K-v0", data_dir=GSM8K_PATH, split="test", shuffle=False)
    obs, info = env.reset(seed=0)
    assert obs["history"][1]["content"].startswith("Janet’s ducks")
    assert info["answer"].endswith("#### 18")
    assert env.step("<think>16-3-4=9; 9*2=18</think> <answer>18</answer>")[1] == 1.0
    env.reset()  # the second question follows
    assert env.step("<answer>17</answer>")[1:3] == (0.1, True)


# -- errors ---------------------------------------------------------------------------


def test_missing_data_folder_names_the_options():
    with pytest.raises(FileNotFoundError) as raised:
        make(data_dir="/no/such/folder")
    message = str(raised.value)
    for part in (
        "data_dir='/no/such/folder'",
        "has no file train.jsonl",
        "LLM_GYM_GSM8K_PATH",
        "'openai/gsm8k'",
    ):
        assert part in message


def test_env_var_pointing_at_a_folder_without_the_split(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_GYM_GSM8K_PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"\$LLM_GYM_GSM8K_PATH=.*has no file test.jsonl"):
        make_gsm8k_env(split="test")


def test_no_data_anywhere_fails_fast_naming_hub_and_local_options(monkeypatch):
    monkeypatch.delenv("LLM_GYM_GSM8K_PATH", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refused at once: no network wait
    with pytest.raises(FileNotFoundError) as raised:
        make_gsm8k_env()
    message = str(raised.value)
    assert "'openai/gsm8k'" in message and "'main'" in message
    assert "data_dir=" in message and "LLM_GYM_GSM8K_PATH" in message
    assert "unreachable" in message


@pytest.mark.parametrize("split", ["validation", "Train", None])
def test_bad_split(split):
    with pytest.raises(
        ValueError, match=rf"split must be one of \('train', 'test'\), got {split!r}"
    ):
        make(split=split)


def test_bad_arguments():
    with pytest.raises(ValueError, match="either dataset= or data_dir="):
        make(dataset=[{"question": "q", "answer": "a"}])
    with pytest.raises(TypeError, match="reward must be a GSM8KReward, got function"):
        make(reward=lambda r, a: 1.0)
    with pytest.raises(ValueError, match="repeats must be an int >= 1"):
        make(repeats=0)
    with pytest.raises(ValueError, match=r"field_map names columns \['question'\]"):
        make(data_dir=None, dataset=[{"query": "q", "answer": "a"}])
    with pytest.raises(ValueError, match="needs tokenizer="):
        make(input_mode="tokens")


@pytest.mark.skipif(not GSM8K_PATH.is_dir(), reason=f"the real GSM8K files are not at {GSM8K_PATH}")
def test_real_gsm8k_token_prompts_are_exact(smollm2_tokenizer):
    env = make_gsm8k_env(
        data_dir=GSM8K_PATH,
        split="test",
        input_mode="tokens",
        tokenizer=smollm2_tokenizer,
        observation_keys=("text", "tokens"),
    )
    env.reset(seed=0)
    for _ in range(100):
        obs, _ = env.reset()
        whole = smollm2_tokenizer(obs["text"], add_special_tokens=False)["input_ids"]
        assert obs["tokens"].tolist() == whole
