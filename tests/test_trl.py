"""The GSM8K reward functions as TRL ``reward_funcs``: TRL's argument shapes, and a real
two-step GRPOTrainer run with a tiny model on the mini GSM8K fixture."""

import functools
import json

import datasets
import pytest
import torch
from gsm8k_fixture import FIXTURE  # made-up problems, written to a temp folder
from trl import GRPOConfig, GRPOTrainer

from llm_gym.chat.templates import CHATML_TEMPLATE
from llm_gym.models import tiny_model
from llm_gym.rewards import GSM8KReward, gsm8k_reward_func

RIGHT, WRONG, NONE = "<think>3*4</think><answer>12</answer>", "<answer>13</answer>", "12"


def fixture_rows(n):
    with open(FIXTURE / "train.jsonl") as f:
        return [json.loads(line) for line in f][:n]


# The extra keyword arguments GRPOTrainer passes to every reward function (TRL 1.x).
TRL_KWARGS = {"trainer_state": None, "log_extra": print, "log_metric": print}


def test_standard_format_strings():
    prompts = ["Tom has 3 boxes with 4 pencils each. How many?"] * 3
    rewards = gsm8k_reward_func(
        prompts=prompts,
        completions=[RIGHT, WRONG, NONE],
        completion_ids=[[1, 2], [3], [4, 5, 6]],
        answer=["Tom has 3 * 4 = <<3*4=12>>12 pencils.\n#### 12"] * 3,
        question=prompts,  # other dataset columns arrive too, and are ignored
        **TRL_KWARGS,
    )
    assert rewards == [1.0, 0.1, 0.0]


def test_conversational_format_message_lists():
    prompts = [[{"role": "user", "content": "3 * 4?"}]] * 3
    completions = [[{"role": "assistant", "content": c}] for c in (RIGHT, WRONG, NONE)]
    # A tool-using completion: the last assistant turn holds the answer.
    completions.append(
        [
            {"role": "assistant", "content": "<answer>1</answer>"},
            {"role": "tool", "content": "12"},
            {"role": "assistant", "content": RIGHT},
        ]
    )
    rewards = gsm8k_reward_func(
        prompts=prompts + prompts[:1],
        completions=completions,
        completion_ids=[[1]] * 4,
        answer=["#### 12"] * 4,
        **TRL_KWARGS,
    )
    assert rewards == [1.0, 0.1, 0.0, 1.0]


def test_configured_reward_func_and_name():
    func = GSM8KReward(mode="last_number", correct_reward=2.0).as_reward_func()
    assert func.__name__ == "gsm8k_last_number_reward"  # TRL logs rewards/<__name__>/mean
    rewards = func(prompts=["q", "q"], completions=["so 12", "so 11"], answer=["12", "12"])
    assert rewards == [2.0, 0.1]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"completions": "12", "answer": ["12"]}, TypeError, "completions must be a list, got str"),
        ({"completions": ["12"], "answer": ["1", "2"]}, ValueError, "same length, got 1 and 2"),
        ({"completions": [3], "answer": ["3"]}, TypeError, "completion must be a str or a list"),
        (
            {"completions": [[{"role": "user", "content": "x"}]], "answer": ["3"]},
            ValueError,
            "must hold an assistant message, got roles \\['user'\\]",
        ),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        gsm8k_reward_func(prompts=["q"] * len(kwargs["answer"]), **kwargs)


def run_grpo(tmp_path, tokenizer, dataset, reward_func):
    torch.manual_seed(0)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tiny_model(tokenizer, seed=0),
        reward_funcs=[reward_func],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    return [entry for entry in trainer.state.log_history if "reward" in entry]


@pytest.mark.parametrize("conversational", [False, True])
def test_grpo_trainer_runs_the_reward_function(gpt2_tokenizer, tmp_path, conversational):
    tokenizer = gpt2_tokenizer.__class__.from_pretrained(gpt2_tokenizer.name_or_path)
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.chat_template = CHATML_TEMPLATE  # GPT-2 has none; TRL renders conversations
    rows = fixture_rows(4)
    if conversational:
        prompts = [[{"role": "user", "content": row["question"]}] for row in rows]
    else:
        prompts = [row["question"] for row in rows]
    dataset = datasets.Dataset.from_dict(
        {"prompt": prompts, "answer": [row["answer"] for row in rows]}
    )
    calls = []

    @functools.wraps(gsm8k_reward_func)  # keeps __name__: TRL logs by it
    def recording_reward_func(**kwargs):
        rewards = gsm8k_reward_func(**kwargs)
        calls.append((kwargs, rewards))
        return rewards

    logs = run_grpo(tmp_path, tokenizer, dataset, recording_reward_func)
    assert len(calls) == 2 and len(logs) == 2  # one generation batch per step, logged
    for (kwargs, rewards), log in zip(calls, logs, strict=True):
        completions = kwargs["completions"]
        assert len(completions) == len(kwargs["answer"]) == len(kwargs["completion_ids"]) == 4
        assert set(kwargs["answer"]) <= {row["answer"] for row in rows}
        if conversational:
            assert all(c[-1]["role"] == "assistant" for c in completions)
        else:
            assert all(isinstance(c, str) for c in completions)
        assert all(len(ids) <= 8 for ids in kwargs["completion_ids"])
        assert log["rewards/gsm8k_reward_func/mean"] == pytest.approx(sum(rewards) / 4)
        assert log["reward"] == pytest.approx(sum(rewards) / 4)
