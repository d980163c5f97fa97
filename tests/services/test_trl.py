"""The GSM8K reward functions as TRL ``reward_funcs``: TRL's argument shapes, and a real
two-step GRPOTrainer run with a tiny model on the mini GSM8K fixture."""

import functools
import json

import datasets
import gymnasium as gym
import numpy as np
import pytest
import torch
from gsm8k_fixture import FIXTURE  # made-up problems, written to a temp folder
from trl import GRPOConfig, GRPOTrainer

from llm_gym.chat.templates import CHATML_TEMPLATE
from llm_gym.integrations.trl import env_reward_func, make_rollout_func
from llm_gym.lm.loading import tiny_model
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


# -- the rollout_func bridge ------------------------------------------------------------


def grpo_config(tmp_path, **changes):
    return GRPOConfig(
        **{
            "output_dir": str(tmp_path), "max_steps": 2, "per_device_train_batch_size": 4,
            "num_generations": 2, "max_completion_length": 6, "use_cpu": True, "bf16": False,
            "report_to": "none", "logging_steps": 1, "save_strategy": "no",
            "disable_tqdm": True, "seed": 0, **changes,
        }
    )  # fmt: skip


class Recording:
    """Wraps a rollout_func and keeps what it returned."""

    def __init__(self, func):
        self.func, self.outputs = func, []

    def __call__(self, prompts, trainer):
        out = self.func(prompts, trainer)
        self.outputs.append((list(prompts), out))
        return out


@pytest.mark.parametrize("max_turns", [1, 2])
def test_rollout_func_drives_an_env_and_its_rewards_reach_the_trainer(
    smollm2_tokenizer, tmp_path, max_turns
):
    torch.manual_seed(0)
    rollout = Recording(
        make_rollout_func("LLMChat-GSM8K-v0", dataset=fixture_rows(10), max_turns=max_turns)
    )
    trainer = GRPOTrainer(
        model=tiny_model(smollm2_tokenizer, seed=0),
        reward_funcs=[env_reward_func],
        args=grpo_config(tmp_path),
        train_dataset=datasets.Dataset.from_dict({"prompt": ["solve"] * 8}),
        processing_class=smollm2_tokenizer,
        rollout_func=rollout,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(rollout.outputs) == len(logs) == 2
    questions = {row["question"] for row in fixture_rows(10)}
    for (prompts, out), log in zip(rollout.outputs, logs, strict=True):
        n = len(prompts)
        assert n == 4 and len(out["completion_ids"]) == len(out["logprobs"]) == n
        assert log["rewards/env_reward_func/mean"] == pytest.approx(np.mean(out["env_reward"]))
        texts = [smollm2_tokenizer.decode(ids) for ids in out["prompt_ids"]]
        asked = [next(q for q in questions if q in text) for text in texts]
        assert asked[0] == asked[1] and asked[2] == asked[3]  # a group shares its question
        for ids, logprobs in zip(out["completion_ids"], out["logprobs"], strict=True):
            assert len(ids) == len(logprobs) >= 1
        if "env_mask" in out:
            assert max_turns == 2
            for ids, mask, logprobs in zip(
                out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
            ):
                assert len(mask) == len(ids) and set(mask) <= {0, 1} and mask[0] == 1
                # What the env inserted between turns carries no log-prob and no gradient.
                assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
    # Over both steps, 4 groups: the env's stream, no question twice in an epoch of 10.
    all_asked = [
        next(q for q in questions if q in smollm2_tokenizer.decode(ids))
        for _, out in rollout.outputs
        for ids in out["prompt_ids"][::2]
    ]
    assert len(set(all_asked)) == 4


def fake_trainer(tokenizer, tmp_path, group=2):
    class Trainer:  # what rollout_func reads of GRPOTrainer
        model = tiny_model(tokenizer, seed=1)
        processing_class = tokenizer
        num_generations = num_generations_eval = group
        args = grpo_config(tmp_path)

        class accelerator:  # noqa: N801
            unwrap_model = staticmethod(lambda m: m)

    return Trainer


def test_multi_turn_env_mask_marks_the_env_tokens(smollm2_tokenizer, tmp_path):
    # A model that never answers: every episode runs its two turns.
    rollout = make_rollout_func("LLMChat-GSM8K-v0", dataset=fixture_rows(4), max_turns=2)
    out = rollout(["x"] * 2, fake_trainer(smollm2_tokenizer, tmp_path))
    for ids, mask in zip(out["completion_ids"], out["env_mask"], strict=True):
        assert 0 in mask and mask[0] == 1 and mask[-1] == 1  # policy, env, policy
        inserted = smollm2_tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        assert "<|im_start|>user" in inserted or "<|im_start|>" in inserted


def full_forward_log_probs(model, prompt_ids, completion_ids):
    """Each completion token's float32 log-prob under ``model``, from one full forward."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def test_the_rollout_samples_in_its_compute_dtype(smollm2_tokenizer, tmp_path):
    trainer = fake_trainer(smollm2_tokenizer, tmp_path)
    gaps = {}
    for dtype in (None, torch.bfloat16):
        torch.manual_seed(0)
        rollout = make_rollout_func(
            "LLMChat-GSM8K-v0", dataset=fixture_rows(4), compute_dtype=dtype
        )
        out = rollout(["solve"] * 2, trainer)
        assert next(trainer.model.parameters()).dtype == torch.float32  # weights untouched
        gaps[dtype] = max(
            (full_forward_log_probs(trainer.model, p, c) - torch.tensor(lp)).abs().max().item()
            for p, c, lp in zip(
                out["prompt_ids"], out["completion_ids"], out["logprobs"], strict=True
            )
        )
    # float32 sampling is the float32 forward's; bfloat16 autocast's log-probs are not.
    assert gaps[None] < 1e-4 < 1e-3 < gaps[torch.bfloat16]


def test_rollout_func_errors(smollm2_tokenizer):
    with pytest.raises(gym.error.Error):
        make_rollout_func("Nope-v0")
    with pytest.raises(TypeError, match=r"compute_dtype must be a torch.dtype or None, got 'bf16'"):
        make_rollout_func("LLMChat-GSM8K-v0", compute_dtype="bf16")
    with pytest.raises(ValueError, match="one return per completion, got 1 for 2"):
        env_reward_func(completions=["a", "b"], env_reward=[1.0])


def test_a_chat_env_takes_each_prompt_as_its_query(smollm2_tokenizer, tmp_path):
    rollout = make_rollout_func("LLMChat-v0")
    prompts = ["What is 2+2?", [{"role": "user", "content": "Name a colour."}]]
    out = rollout(prompts, fake_trainer(smollm2_tokenizer, tmp_path))
    texts = [smollm2_tokenizer.decode(ids) for ids in out["prompt_ids"]]
    assert "What is 2+2?" in texts[0] and "Name a colour." in texts[1]
    assert out["env_reward"] == [0.0, 0.0] and "env_mask" not in out
    with pytest.raises(TypeError, match="a prompt must be a str or a conversation"):
        rollout([3, 4], fake_trainer(smollm2_tokenizer, tmp_path))


def test_a_batch_of_partial_groups_is_refused(smollm2_tokenizer, tmp_path):
    rollout = make_rollout_func("LLMChat-GSM8K-v0", dataset=fixture_rows(4))
    with pytest.raises(ValueError, match="batch of 3 prompts is not whole groups"):
        rollout(["x"] * 3, fake_trainer(smollm2_tokenizer, tmp_path))


def test_an_env_without_a_turn_limit_is_refused(smollm2_tokenizer, tmp_path):
    rollout = make_rollout_func("LLMChat-v0", max_turns=None)
    with pytest.raises(ValueError, match="without max_turns here, so an episode could go on"):
        rollout(["hi", "ho"], fake_trainer(smollm2_tokenizer, tmp_path))


def test_a_tool_episode_passes_the_envs_policy_mask_as_env_mask(
    smollm2_tokenizer, tmp_path, monkeypatch
):
    import llm_gym.integrations.trl as bridge
    from llm_gym.chat import Response

    tok = smollm2_tokenizer
    script = [
        '<tool_call>{"name": "python", "arguments": {"code": "print(40 + 2)"}}</tool_call>',
        "<answer>42</answer>",
    ]

    class Scripted:  # the trainer's model, replaced by a policy that calls a tool, then answers
        def __init__(self, *args, **kwargs):
            self.turn = 0

        def __call__(self, batch):
            text = script[min(self.turn, 1)]
            self.turn += 1
            ids = np.array(tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
            n = len(batch["tokens"])
            return [Response(text, ids, np.full(len(ids), -0.5, np.float32)) for _ in range(n)]

    monkeypatch.setattr(bridge, "TransformersPolicy", Scripted)
    rows = [{"question": "40 + 2?", "answer": "#### 42"}] * 2
    rollout = make_rollout_func("LLMChat-GSM8K-v0", dataset=rows, tools=["python"])
    out = rollout(["x"] * 2, fake_trainer(tok, tmp_path))
    assert out["env_reward"] == [1.0, 1.0]
    for ids, mask, logprobs in zip(
        out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
    ):
        tool_part = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        policy_part = tok.decode([t for t, m in zip(ids, mask, strict=True) if m == 1])
        assert "<|im_start|>tool\n42\n" in tool_part and "tool_call" not in tool_part
        assert policy_part == f"{script[0]}<|im_end|>{script[1]}<|im_end|>"
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if m == 0)
