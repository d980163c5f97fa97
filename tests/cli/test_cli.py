"""The ``llm-gym`` command, driven as a user would: files written, summary, errors, Ctrl-C."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from gsm8k_fixture import FIXTURE  # made-up problems, written to a temp folder

from llm_gym.chat import Response
from llm_gym.cli import main
from llm_gym.run import Rollout, RolloutConfig


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    # main(["--threads", "1", ...]) in this process must not slow the rest of the suite.
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def cli(*args, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "llm_gym", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        timeout=300,
        **kwargs,
    )


def rollout_args(model_dirs, out, *extra):
    return [
        "rollout",
        "--env", "LLMChat-GSM8K-v0",
        "--split", "test",
        "--data-dir", str(FIXTURE),
        "--model", model_dirs[0],
        "--num-envs", "2",
        "--episodes", "3",
        "--max-new-tokens", "6",
        "--out", str(out),
        "--threads", "1",
        "--no-progress",
        *extra,
    ]  # fmt: skip


def test_rollout_writes_episodes_summary_and_plot(model_dirs, tmp_path):
    out = tmp_path / "run"
    result = cli(*rollout_args(model_dirs, out, "--ref-model", model_dirs[1], "--kl-coef", "0.5"))
    assert result.returncode == 0, result.stderr
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [e["episode"] for e in episodes] == [0, 1, 2]
    questions = [json.loads(line)["question"] for line in (FIXTURE / "test.jsonl").open()]
    for e in episodes:
        assert e["prompt"][-1]["role"] == "user" and e["prompt"][-1]["content"] in questions
        assert 1 <= e["num_tokens"] <= 6 and isinstance(e["response"], str)
        assert e["answer"].split("#### ")[-1] and set(e) >= {"reward_answer", "reward_right"}
        # A different reference model: KL is charged, and the reward is task reward - penalty.
        assert e["kl_sum"] != 0.0
        assert e["reward"] == pytest.approx(e["reward_right"] - 0.5 * e["kl_sum"], abs=1e-4)
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["episodes"] == 3
    assert summary["mean_reward"] == pytest.approx(np.mean([e["reward"] for e in episodes]))
    assert summary["mean_kl"] == pytest.approx(np.mean([e["kl_mean"] for e in episodes]))
    assert summary["generated_tokens"] == sum(e["num_tokens"] for e in episodes)
    assert (out / "rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("episodes", "accuracy", "format rate", "mean reward", "mean KL", "tokens/s"):
        assert name in result.stdout
    assert re.search(r"^episodes +3$", result.stdout, re.MULTILINE)
    # GSM8K's rubric: each part's mean over the episodes, a row each.
    for name in ("format", "right"):
        mean = np.mean([e[name] for e in episodes])
        assert re.search(rf"^part {name} \(mean\) +{mean:.4f}$", result.stdout, re.MULTILINE)


def test_default_episodes_cover_the_split_exactly_once(model_dirs, tmp_path):
    out = tmp_path / "run"
    args = rollout_args(model_dirs, out, "--max-new-tokens", "2")
    del args[args.index("--episodes") : args.index("--episodes") + 2]
    assert main(args) == 0
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    questions = [json.loads(line)["question"] for line in (FIXTURE / "test.jsonl").open()]
    # 3 questions over 2 envs: each exactly once, the last step's extra episode left out.
    assert sorted(e["prompt"][-1]["content"] for e in episodes) == sorted(questions)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["episodes"] == summary["summary"]["episodes"] == 3


def test_default_episodes_of_a_procedural_task(model_dirs, tmp_path):
    config = RolloutConfig(env="LLMChat-Countdown-v0", model=model_dirs[0], out=str(tmp_path))
    assert Rollout(config).config.episodes == 64


def test_second_run_refuses_then_overwrites(model_dirs, tmp_path):
    out = tmp_path / "run"
    assert main(rollout_args(model_dirs, out)) == 0
    result = cli(*rollout_args(model_dirs, out))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0  # one line, no traceback
    assert "already holds 3 episodes" in result.stderr and "--overwrite" in result.stderr
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 3  # untouched
    assert main([*rollout_args(model_dirs, out), "--overwrite", "--episodes", "2"]) == 0
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 2


def test_interrupted_run_keeps_finished_episodes(model_dirs, tmp_path):
    out = tmp_path / "run"
    args = rollout_args(model_dirs, out)
    args[args.index("--episodes") + 1] = "100000"
    process = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "llm_gym", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        # As from a terminal: a shell's background job inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (
        not episodes.exists() or len(episodes.read_text().splitlines()) < 4
    ):
        time.sleep(0.2)
    started = episodes.exists() and len(episodes.read_text().splitlines()) >= 4
    process.send_signal(signal.SIGINT)
    try:  # the interrupted run writes its summary, plot and report before it exits
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say where it hangs: faulthandler dumps the stacks
        process.send_signal(signal.SIGABRT)
        _, stderr = process.communicate(timeout=60)
        pytest.fail(f"no exit after SIGINT (4 episodes before it: {started}):\n{stderr}")
    assert process.returncode == 130, stderr
    assert "finished episodes are in" in stderr and "Traceback" not in stderr
    lines = episodes.read_text().splitlines()
    assert len(lines) >= 4
    assert [json.loads(line)["episode"] for line in lines] == list(range(len(lines)))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPole-v1"], "env id 'CartPole-v1' is unknown; rollout runs the task envs: "),
        (
            ["--env", "LLMChat-v0"],
            "'LLMChat-v0' is not a task env; rollout runs .*LLMChat-GSM8K-v0",
        ),
        (["--max-new-tokens", "100000"], "max_new_tokens=100000 leaves no room for a prompt"),
        (["--model", "/no/such/model"], "Model path '/no/such/model' is not a readable folder"),
        (["--data-dir", "/no/such/data"], "/no/such/data"),
        (["--num-envs", "0"], r"argument --num-envs: expected a number >= 1, got '0'"),
        (["--temperature", "-1"], r"argument --temperature: expected a number >= 0.0, got '-1'"),
        (["--episodes", "many"], r"argument --episodes: expected int, got 'many'"),
        (["--kl-coef", "nan"], r"argument --kl-coef: expected a number >= 0.0, got 'nan'"),
        (["--estimator", "k9"], r"argument --estimator: invalid choice: 'k9'"),
        (["--env-arg", "level"], r"argument --env-arg: expected KEY=VALUE, got 'level'"),
        (["--answer-format", "xml"], r"argument --answer-format: invalid choice: 'xml'"),
        (["--curriculum", "0"], r"argument --curriculum: expected a number >= 1, got '0'"),
        (["--tools", "ruby"], r"argument --tools: expected a comma-separated list of \['python'\]"),
        (["--max-tool-calls", "0"], r"argument --max-tool-calls: expected a number >= 1"),
        (["--tool-format", "xml"], r"argument --tool-format: invalid choice: 'xml'"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message, model_dirs, tmp_path, capsys):
    argv = rollout_args(model_dirs, tmp_path / "run")
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    # argparse's own errors exit; errors found while setting up are returned.
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not (tmp_path / "run").exists()  # nothing written for a run that never started


@pytest.mark.slow  # three runs of the command (about 17 s)
def test_default_task_is_procedural_with_env_args_and_curriculum(model_dirs, tmp_path):
    # No --env, no data: the default task is generated offline.
    out = tmp_path / "run"
    args = ["rollout", "--model", model_dirs[0], "--num-envs", "2", "--episodes", "4",
            "--max-new-tokens", "4", "--out", str(out), "--threads", "1", "--no-progress",
            "--env-arg", "task=leg_counting", "--env-arg", "level=1",
            "--answer-format", "last_number", "--curriculum", "2"]  # fmt: skip
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    assert "level (last episode)" in result.stdout
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["task"] for e in episodes} == {"leg_counting"}
    assert all(e["level"] in (0, 1, 2) for e in episodes) and episodes[0]["level"] == 1
    assert "final answer as a number" in episodes[0]["prompt"][0]["content"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["env_args"] == {"task": "leg_counting", "level": 1}
    bad = cli(*args[:-6], "--overwrite", "--env-arg", "task=nope")
    assert bad.returncode == 2 and "task must be a reasoning-gym task" in bad.stderr


def test_async_rollout_reads_the_data_dir(model_dirs, tmp_path, monkeypatch):
    # Issue 53: --async built its sub-envs without --split/--data-dir and went to the Hub.
    monkeypatch.delenv("LLM_GYM_GSM8K_PATH", raising=False)
    out = tmp_path / "run"
    assert main(rollout_args(model_dirs, out, "--async")) == 0
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    questions = {json.loads(line)["question"] for line in (FIXTURE / "test.jsonl").open()}
    assert len(episodes) == 3
    assert {e["prompt"][-1]["content"] for e in episodes} <= questions


def test_missing_gsm8k_data_says_how_to_provide_it(model_dirs, tmp_path):
    args = rollout_args(model_dirs, tmp_path / "run")
    del args[args.index("--data-dir") : args.index("--data-dir") + 2]
    env = {k: v for k, v in os.environ.items() if k != "LLM_GYM_GSM8K_PATH"}
    result = subprocess.run(
        [sys.executable, "-m", "llm_gym", *args],
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "LLM_GYM_GSM8K_PATH" in result.stderr and "openai/gsm8k" in result.stderr


def test_envs_reads_no_data():
    # The same table whether GSM8K's data is there or not: the command never loads it.
    with_data = cli("envs", env={"LLM_GYM_GSM8K_PATH": str(FIXTURE)})
    without = cli("envs", env={"LLM_GYM_GSM8K_PATH": ""})
    assert with_data.returncode == without.returncode == 0, without.stderr
    assert with_data.stdout == without.stdout and "LLMChat-GSM8K-v0" in without.stdout


def test_rollout_with_tools_records_calls_and_the_conversation(
    model_dirs, tmp_path, smollm2_tokenizer
):
    args = rollout_args(model_dirs, tmp_path / "cli", "--tools", "python", "--max-tool-calls", "2")
    assert main(args) == 0
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["config"]["tools"] == ["python"] and summary["config"]["max_tool_calls"] == 2
    # A scripted policy: a call that runs, a call of an unknown tool (it fails), the answer.
    script = [
        '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "The answer is 42",
    ]
    tok = smollm2_tokenizer

    def scripted(obs):
        texts = [script[sum(m["role"] == "tool" for m in h)] for h in obs["history"]]
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        return [Response(t, np.array(i)) for t, i in zip(texts, ids, strict=True)]

    config = RolloutConfig(
        env="LLMChat-GSM8K-v0", split="test", data_dir=str(FIXTURE), model=model_dirs[0],
        num_envs=2, episodes=3, tools=["python"], max_tool_calls=2,
        out=str(tmp_path / "scripted"), progress=False,
    )  # fmt: skip
    rollout = Rollout(config)
    rollout.policy = scripted
    result = rollout.run()
    episodes = [json.loads(line) for line in rollout.episodes_path.open()]
    assert len(episodes) == 3
    for e in episodes:
        assert (e["num_tool_calls"], e["failed_tool_calls"]) == (2, 1)
        roles = [m["role"] for m in e["conversation"]]
        assert roles == ["system", "user", *["assistant", "tool"] * 2, "assistant"]
        assert "42" in e["conversation"][3]["content"]  # the python tool's output
        assert e["responses"] == script and '"name": "python"' in e["prompt"][0]["content"]
    assert (result.tool_calls_per_episode, result.tool_episode_share) == (2.0, 1.0)
    assert result.failed_tool_share == 0.5
