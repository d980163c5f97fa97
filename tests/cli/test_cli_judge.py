"""``--rubric`` and ``--judge`` on ``llm-gym rollout`` and ``train`` (issue 41, item 4): a
judge task end to end from the command, every part's mean in the summary, the judges' costs,
and the flag errors; ``extend_reward``, the env's ``reward_parts``, underneath."""

import json
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from llm_gym.cli import main
from llm_gym.policies import TransformersPolicy
from llm_gym.rubrics import (
    JUDGE_NEW_TOKENS,
    TASK_PART,
    Judge,
    Part,
    Rubric,
    extend_reward,
    parse_score,
)
from llm_gym.run.config import RolloutConfig, rubric_weights
from llm_gym.train.config import GRPOConfig


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def right(response, item):
    return float(response.strip() == item["answer"])


def short(response, item):
    return float(len(response) <= 3)


# -- extend_reward and reward_parts ----------------------------------------------------------


def test_extend_reward_adds_parts_after_the_task_s_and_scales_what_the_task_pays():
    digits = Part("format", lambda r, i: float(r.isdigit()), role="gate")
    task = Rubric([digits, Part("right", right)])
    extra = Part("short", short, weight=0.5)
    both = extend_reward(task, [extra])
    assert [p.name for p in both.parts] == ["format", "right", "short"]
    assert both("4", {"answer": "4"}).reward == 1.5
    assert both("x", {"answer": "4"}).reward == 0.0  # the task's gate holds for every part
    doubled = extend_reward(task, [extra], task_weight=2.0)
    assert doubled("4", {"answer": "4"}).reward == 2.5
    # At 0 the task's parts are reported, never paid or gating: only the extra part pays.
    judged = extend_reward(task, [extra], task_weight=0)
    assert [p.role for p in judged.parts] == ["metric", "metric", "reward"]
    score = judged("x", {"answer": "4"})
    assert score.reward == 0.5 and score.info == {"format": 0.0, "right": 0.0, "short": 1.0}


def test_a_plain_reward_function_becomes_the_task_score_part_with_its_info():
    def plain(response, item):
        return float(response == item["answer"]), {"seen": response}

    rubric = extend_reward(plain, [Part("short", short, role="metric")])
    score = rubric("4", {"answer": "4"})
    assert score.reward == 1.0
    assert score.info == {"seen": "4", TASK_PART: 1.0, "short": 1.0}
    assert extend_reward(None, [Part("short", short)])("4", {}).reward == 1.0
    with pytest.raises(ValueError, match="task_weight must be .*>= 0, got -1"):
        extend_reward(plain, [], task_weight=-1)


def test_a_task_env_takes_reward_parts_and_puts_each_part_in_info():
    length = Part("length", lambda r, i: float(len(r)), role="metric")
    env = gym.make("LLMChat-Countdown-v0", level=0, reward_parts=[length])
    plain = gym.make("LLMChat-Countdown-v0", level=0)
    env.reset(seed=3)
    _, info0 = plain.reset(seed=3)
    answer = "<answer>" + " + ".join(map(str, info0["numbers"])) + "</answer>"
    _, reward, *_, info = env.step(answer)
    _, reward0, *_, plain_info = plain.step(answer)
    assert reward == reward0 and info["length"] == float(len(answer))
    assert {k: v for k, v in info.items() if k != "length"} == plain_info
    expected = r"reward_parts must be llm_gym.rubrics.Part objects, got \['function'\]"
    with pytest.raises(TypeError, match=expected):
        gym.make("LLMChat-Countdown-v0", reward_parts=[short])


# -- the options ---------------------------------------------------------------------------


def test_rubric_weights_parse_and_refuse_what_they_cannot_read():
    weights = rubric_weights(" task , judge=0 ,group-judge=2")
    assert weights == {"task": 1.0, "judge": 0.0, "group-judge": 2.0}
    for spec, message in [
        ("", "rubric must name parts"),
        ("task,kindness", "PART one of .* got 'kindness'"),
        ("judge,judge=2", "names 'judge' twice"),
        ("judge=nan", "judge's weight must be a finite number >= 0, got 'nan'"),
        ("judge=x", "got 'x'"),
    ]:
        with pytest.raises(ValueError, match=message):
            rubric_weights(spec)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["rollout", "--rubric", "task,judge"], "part 'judge' asks an LLM judge: pass judge"),
        (["rollout", "--judge", "default"], "judge .* is asked only by a judge part of rubric"),
        (["rollout", "--rubric", "group-judge", "--judge", "default"], "train has groups"),
        (["rollout", "--rubric", "judge", "--judge", "default", "--judge-tokenizer", "default"],
         "judge_tokenizer .* is for a judge served at a URL"),
        (["train", "--rubric", "group-judge", "--judge", "default", "--async"],
         "'group-judge' sees a GRPO group's responses together"),
        (["rollout", "--rubric", "judge", "--judge", "default", "--ray"], "not supported with Ray"),
        (["rollout", "--rubric", "judge=-2", "--judge", "default"], "weight must be"),
        (["rollout", "--env", "LLMChat-Verifiers-v0", "--rubric", "judge", "--judge", "default"],
         "--rubric and --judge apply to task envs"),
        (["rollout", "--rubric", "judge", "--judge", "/nonexistent/j"], "not a readable folder"),
    ],
)  # fmt: skip
def test_rubric_and_judge_errors_are_one_line_naming_the_flag(argv, message, tmp_path, capsys):
    code = main([*argv, "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("llm-gym: error: ") and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_the_configs_keep_the_rubric_and_judge_for_resume():
    config = GRPOConfig(rubric="task,group-judge=0.5", judge="http://127.0.0.1:1/v1")
    assert config.judge_tokenizer is None and config.rubric == "task,group-judge=0.5"
    assert RolloutConfig().rubric == "task" and RolloutConfig().judge is None


# -- end to end ------------------------------------------------------------------------------


def test_rollout_with_a_judge_scores_every_episode_and_reports_parts_and_costs(
    tiny_dir, default_model, tmp_path, capsys
):
    out = tmp_path / "run"
    argv = [
        "rollout", "--env", "LLMChat-IFEval-v0", "--model", tiny_dir, "--judge", "default",
        "--rubric", "task,judge=0.5", "--num-envs", "4", "--episodes", "4",
        "--max-new-tokens", "12", "--out", str(out), "--threads", "1", "--no-progress",
        "--dtype", "float32",  # the judge asked again below is the float32 default model
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert len(records) == 4
    # Each episode's reward is the task's strict fraction plus half the judge's score.
    for record in records:
        assert record["judge_reply"].startswith("Score:")
        value, why = parse_score(record["judge_reply"], 0, 10)
        assert record["judge"] == (0.0 if value is None else value)
        assert record.get("judge_error") == why  # None where the reply parsed
        assert record["reward"] == pytest.approx(record["strict_fraction"] + 0.5 * record["judge"])
    # The summary: every part's mean over the episodes, the judge's calls and tokens.
    assert list(summary["parts"])[-1] == "judge" and len(summary["parts"]) >= 2  # the task's first
    for name, mean in summary["parts"].items():
        assert mean == pytest.approx(np.mean([r[name] for r in records]))
    cost = summary["judges"]["judge"]
    assert cost["calls"] + cost["cache_hits"] == 4 and cost["errors"] == 0
    assert cost["tokens"] > 4 * 100  # the template alone is over 100 tokens a prompt
    assert f"part judge (mean)           {summary['parts']['judge']:.4f}" in printed
    assert f"judge: calls / tokens / s   {cost['calls']:.0f} / {cost['tokens']:.0f}" in printed
    # The same judge, asked again in this process, replies as the command's did.
    model, tokenizer = default_model
    kwargs = {"do_sample": False, "max_new_tokens": JUDGE_NEW_TOKENS}
    sampler = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    judge = Judge(sampler, tokenizer, reply_prefix="Score:")
    again = Rubric([Part("judge", judge)]).score_batch(
        [r["response"] for r in records], [{"query": r["prompt"][-1]["content"]} for r in records]
    )
    pairs = zip(again, records, strict=True)
    same = sum(score.info["judge_reply"] == record["judge_reply"] for score, record in pairs)
    assert same >= 3  # greedy in a batch of another make-up: a near tie may flip one


def test_train_with_a_group_judge_pays_it_and_reports_it_per_iteration(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [
        "train", "--env", "LLMChat-Countdown-v0", "--answer-format", "tags", "--model", tiny_dir,
        "--judge", "default", "--rubric", "task=0,group-judge", "--iterations", "2",
        "--groups", "1", "--group-size", "2", "--max-new-tokens", "8", "--eval-episodes", "0",
        "--out", str(out), "--threads", "1", "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        # The task's parts are reported, not paid: the reward is the group judge's alone.
        assert set(row["parts"]) == {"format", "right", "group-judge"}
        assert row["reward"] == pytest.approx(row["parts"]["group-judge"])
    assert summary["parts"] == rows[-1]["parts"]
    cost = summary["judges"]["group-judge"]
    assert cost["calls"] + cost["cache_hits"] == 2  # one prompt per group per iteration
    assert "rubric parts (means, last iteration): format " in printed
    assert f"group-judge: {cost['calls']} calls" in printed
