"""What ``llm-gym train`` refuses, each in one line naming what is wrong: flag combinations,
values the parser or the config checks, before anything heavy loads."""

import pytest
import torch
from train_fixture import keep_torch_threads, train_args  # noqa: F401  (fixture)

from llm_gym.cli import main
from llm_gym.train import GRPOConfig


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env", "LLMChat-v0"], "env id 'LLMChat-v0' is not a task env; train runs"),
        (["--env", "Nope-v0"], "env id 'Nope-v0' is unknown"),
        (["--resume"], "--resume needs an earlier run in"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "bogus"],
         "device"),
        (["--kl-target", "1.0"], "kl_target needs kl_coef > 0"),
        (["--resume", "--overwrite"], "resume and overwrite contradict each other"),
        (["--loss-type", "cispo"], "loss_type 'cispo' caps the ratio at clip_coef_high"),
        (["--tis-cap", "2", "--async"], "tis_cap (--tis-cap) with --async"),
        (["--loss-type", "cispo", "--clip-coef-high", "5", "--delta", "2"], "cispo has none"),
        (["--precision", "bf16", "--dtype", "float32"], "precision 'bf16' trains bfloat16"),
        (["--loss-type", "luspo"], "pass importance_sampling_level='sequence'"),
        (["--loss-type", "vespo", "--importance-sampling-level", "sequence"],
         "loss_type 'vespo' takes each response's ratio itself"),
        (["--dynamic-sampling", "1", "--async"], "dynamic_sampling (--dynamic-sampling) with"),
        (["--overlong-cache", "49"], "overlong_cache (--overlong-cache) must be at most"),
    ],
)  # fmt: skip
def test_bad_input_gets_one_line(tiny_dir, tmp_path, capsys, extra, message):
    assert main(train_args(tiny_dir, tmp_path / "run", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--group-size", "1"], "expected a number >= 2, got '1'"),
        (["--learning-rate", "0"], "expected a number > 0.0, got '0'"),
        (["--dtype", "int8"], "invalid choice: 'int8'"),
        (["--loss-type", "ppo"], "invalid choice: 'ppo'"),
        (["--scale-rewards", "std"], "invalid choice: 'std'"),
        (["--advantage", "ppo"], "invalid choice: 'ppo'"),
        (["--lr-schedule", "step"], "invalid choice: 'step'"),
        (["--warmup-steps", "-1"], "expected a number >= 0, got '-1'"),
        (["--delta", "0.9"], "expected a number > 1.0, got '0.9'"),
    ],
)
def test_bad_numbers_are_refused_by_the_parser(tiny_dir, tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(train_args(tiny_dir, tmp_path / "run", *extra))
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("group_size", 1, "group_size must be an int >= 2, got 1"),
        ("iterations", 0.5, "iterations must be an int >= 1, got 0.5"),
        ("temperature", float("nan"), "temperature must be a finite number > 0, got nan"),
        ("kl_coef", -1.0, "kl_coef must be a finite number >= 0, got -1.0"),
        ("dtype", "fp8", "dtype must be one of"),
        ("max_tool_calls", 0, "max_tool_calls must be an int >= 1, got 0"),
        ("loss_type", "ppo", "loss_type must be one of ('grpo', 'bnpo', 'dr_grpo', 'dapo'"),
        ("importance_sampling_level", "episode", "importance_sampling_level must be one of"),
        ("kl_loss_coef", -0.1, "kl_loss_coef must be a finite number >= 0, got -0.1"),
        ("tis_cap", 0, "tis_cap must be None or a finite number > 0, got 0"),
        ("clip_coef_high", float("inf"), "clip_coef_high must be None or a finite number > 0"),
    ],
)
def test_bad_config_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        GRPOConfig(**{field: value})


def test_tools_with_a_kl_penalty_are_refused_by_name():
    with pytest.raises(ValueError, match="tools with kl_coef > 0 is not supported yet"):
        GRPOConfig(tools=["python"], kl_coef=0.1)
