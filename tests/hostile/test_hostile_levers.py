"""Levers that do nothing or harm, said before anything heavy loads (issue 75): a warm-up longer
than the run, the adaptive entropy's bounds without its target, a reward for failing, a
discount on a one-turn task, ``check-template`` on a folder that is no model, a resume that
names an ``auto`` value."""

import json
import subprocess
import sys

import gymnasium as gym
import pytest
from train_fixture import keep_torch_threads  # noqa: F401  (fixtures)

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.cli import main
from llm_gym.train import GRPOConfig


def cli(*args, timeout=60):
    """``llm-gym ARGS`` in a fresh process: its exit code and the last line of stderr."""
    done = subprocess.run([sys.executable, "-m", "llm_gym", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    return done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def test_a_warm_up_longer_than_the_run_is_refused_naming_its_steps():
    with pytest.raises(ValueError) as refused:
        GRPOConfig(warmup_steps=100, iterations=3)
    assert str(refused.value) == (
        "warmup_steps (--warmup-steps 100) is longer than the run's 3 optimizer steps "
        "(--iterations 3 x --update-epochs 1): the rate would never reach --learning-rate; "
        "at most 3"
    )
    assert GRPOConfig(warmup_steps=6, iterations=3, update_epochs=2).warmup_steps == 6


def test_the_adaptive_entropys_bounds_without_its_target_are_refused():
    with pytest.raises(ValueError, match=r"^--entropy-coef-max shape the adaptive entropy"):
        GRPOConfig(entropy_coef_max=0.5)
    with pytest.raises(ValueError, match=r"^--entropy-coef-delta, --entropy-coef-min shape"):
        GRPOConfig(entropy_coef_delta=0.01, entropy_coef_min=0.001)
    with pytest.raises(ValueError, match=r"entropy_coef_max \(--entropy-coef-max\) must be"):
        GRPOConfig(entropy_target=1.0, entropy_coef_min=0.5, entropy_coef_max=0.1)
    assert GRPOConfig(entropy_target=1.0, entropy_coef_max=0.5).entropy_coef_max == 0.5


def test_a_reward_for_failing_and_a_charge_without_tools_are_refused():
    with pytest.raises(ValueError, match=r"^tool_error_reward=0.1 would pay for failing"):
        gym.make("LLMChat-v0", query="q", tools=["python"], tool_error_reward=0.1)
    with pytest.raises(ValueError, match=r"^tool_error_reward=-0.1 charges failed tool calls, "
                       "and the env has no tools"):  # fmt: skip
        gym.make("LLMChat-v0", query="q", tool_error_reward=-0.1)
    with pytest.raises(ValueError, match=r"^invalid_move_reward=0.5 would pay for a move"):
        gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0", invalid_move_reward=0.5)


def test_a_discount_on_a_one_turn_task_is_refused(tiny_dir, tmp_path, capsys):
    args = ["train", "--model", tiny_dir, "--out", str(tmp_path / "run"), "--gamma", "0.5",
            "--advantage", "turn-grpo", "--groups", "1", "--group-size", "2",
            "--eval-episodes", "0", "--no-progress"]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "llm-gym: error: gamma (--gamma 0.5) discounts later turns' rewards, and "
        "LLMChat-ReasoningGym-v0 plays one turn an episode: leave it at 1"
    )


def test_check_template_on_a_folder_without_a_tokenizer_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    code, line = cli("check-template", "--model", str(tmp_path))
    assert code == 2 and line == (
        f"llm-gym: error: --model '{tmp_path}': not a model folder (no tokenizer: none of "
        "tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json); pass 'default' "
        "or a folder saved with save_pretrained (model and tokenizer)"
    )
    code, line = cli("check-template", "--model", str(tmp_path / "nonexistent"))
    assert code == 2 and "is not a folder" in line


def test_check_templates_help_says_its_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["check-template", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a Jinja file to check instead (default: the model's) --system-prompt" in text
    assert "(default: None)" not in text.split("--chat-template NAME_OR_FILE", 2)[2][:120]


def test_a_resume_names_an_auto_value_as_its_flag_does(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", tiny_dir, "--out", str(out), "--iterations", "1", "--groups",
            "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-episodes", "0",
            "--no-progress", "--threads", "1"]  # fmt: skip
    assert main(args) == 0
    assert json.loads((out / "run_config.json").read_text())["overlong_cache"] is None
    resume = ["train", "--out", str(out), "--resume", "--overlong-cache", "0", "--no-progress"]
    assert main(resume) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(
        "llm-gym: error: --overlong-cache 0 differs from the resumed run's auto ("
    )


def test_a_bad_env_argument_is_one_line_without_gymnasiums_kwargs(tiny_dir, tmp_path):
    code, line = cli("rollout", "--model", tiny_dir, "--env", "LLMChat-TextArena-v0",
                     "--env-arg", "invalid_move_reward=abc", "--episodes", "1",
                     "--out", str(tmp_path / "r"), "--no-progress", timeout=120)  # fmt: skip
    assert code == 2 and line == (
        "llm-gym: error: invalid_move_reward must be an int or float, got str: 'abc'"
    )


def test_ctrl_c_before_the_run_begins_is_one_line(monkeypatch, capsys, tmp_path):
    # A Ctrl-C while the command starts (torch's import, the flags' checks) is one line, exit
    # 130, whatever it interrupted.
    import llm_gym.cli as cli_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "check_flags", interrupted)
    assert main(["train", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert err == "llm-gym: interrupted before the run began; nothing was written\n"


def test_a_signal_while_the_trackers_finish_tells_one_story(
    tiny_dir, tmp_path, monkeypatch, capsys
):
    # The summary says finished: the trackers finish too, and the line says the run finished.
    import os
    import signal

    from llm_gym.run.trackers import Trackers

    finish = Trackers.finish
    closed = []

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as the trackers start to finish
        finish(self, *args, **kwargs)
        closed.append(True)

    monkeypatch.setattr(Trackers, "finish", signalled)
    out = tmp_path / "run"
    args = ["train", "--model", tiny_dir, "--out", str(out), "--iterations", "1", "--groups",
            "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-episodes", "0",
            "--no-progress", "--threads", "1", "--report-to", "tensorboard"]  # fmt: skip
    assert main(args) == 130
    assert closed == [True]  # the trackers finished, the signal waited for them
    assert json.loads((out / "summary.json").read_text())["interrupted"] is False
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (
        f"llm-gym: interrupted; the run had finished: {out / 'summary.json'} holds what it came to"
    )


def test_tools_with_dynamic_sampling_are_refused_before_anything_loads():
    code, line = cli("train", "--tools", "python", "--dynamic-sampling", "2")
    assert code == 2 and line == (
        "llm-gym: error: dynamic_sampling (--dynamic-sampling) refills single-turn tasks, and "
        "--tools plays several turns an episode: drop one"
    )


def test_an_out_folder_that_cannot_be_made_is_not_called_gone(tmp_path):
    # /proc takes no new folder: --out there never existed, and the line says no more.
    code, line = cli("train", "--out", "/proc/llm-gym-qa", "--iterations", "1", timeout=120)
    assert code == 2 and "/proc/llm-gym-qa" in line and "is gone" not in line, line


def test_check_template_names_the_template_it_falls_back_to(tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "llm_gym", "check-template", "--model",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == (
        f"{tmp_path} has no chat template: llm_gym's chatml_format built-in, which renders its "
        "prompts, keeps earlier turns' tokens over 4 turns"
    )


@pytest.mark.parametrize(
    "arg, told",
    [
        ("rewards=bogus", "rewards must be one of ('game', 'progress', 'outcome'), got 'bogus'"),
        ("invalid_move_reward=Infinity", "invalid_move_reward must be finite, got inf"),
    ],
)
def test_bad_env_arguments_are_told_before_the_model_loads(tmp_path, arg, told):
    # A model folder whose weights are missing: had the model loaded first, its error would
    # be the line; the env's comes before.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    code, line = cli("train", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "r"),
                     "--env", "LLMChat-TextArena-v0", "--env-arg", "game=GuessTheNumber-v0",
                     "--env-arg", arg)  # fmt: skip
    assert code == 2 and line == f"llm-gym: error: {told}"
    assert not (tmp_path / "r").exists()


def test_a_bad_cpu_bf16_variable_is_one_line_before_anything_loads(tmp_path):
    import os

    env = {**os.environ, "LLM_GYM_CPU_BF16": "garbage"}
    done = subprocess.run([sys.executable, "-m", "llm_gym", "train", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr.strip() == (
        "llm-gym: error: LLM_GYM_CPU_BF16 must be '0', '1' or unset, got 'garbage'"
    )
    assert not (tmp_path / "run_config.json").exists()
