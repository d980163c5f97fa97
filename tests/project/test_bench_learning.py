"""scripts/bench_learning.py's pure parts: the TRL settings it compares against, the summary
lines, the standard errors, the reward curves it reads. No training runs here."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest

from llm_gym.train import GRPOConfig

SCRIPT = Path(__file__).parents[2] / "scripts" / "bench_learning.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_learning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script()


def config_of(bench: ModuleType, tmp_path: Path, *argv: str) -> GRPOConfig:
    return bench.run_config(bench.parse_args(["--device", "cpu", *argv]), str(tmp_path / "run"))


def test_trl_config_carries_llm_gyms_settings(bench, tmp_path):
    argv = ("--groups", "3", "--group-size", "4", "--iterations", "7")
    config = config_of(bench, tmp_path, *argv, "--learning-rate", "2e-5", "--max-new-tokens", "32")
    args = bench.trl_config(config, str(tmp_path / "trl"))
    assert args.num_generations == config.group_size == 4
    assert args.per_device_train_batch_size == config.groups * config.group_size == 12
    assert args.gradient_accumulation_steps == args.steps_per_generation == 1
    assert args.generation_batch_size == 12  # one generation batch per optimizer step
    assert args.num_iterations == config.update_epochs == 1
    assert args.max_steps == config.iterations == 7
    assert args.learning_rate == config.learning_rate == 2e-5
    assert args.temperature == config.temperature == 1.0
    assert args.max_completion_length == config.max_new_tokens == 32
    assert args.loss_type == config.loss_type == "dapo"
    assert args.epsilon == config.clip_coef == 0.2
    assert args.epsilon_high is None  # TRL then clips at 1 + epsilon above too
    assert args.beta == config.kl_coef == 0.0
    assert args.max_grad_norm == config.max_grad_norm == 1.0
    assert args.scale_rewards == "group"
    assert args.seed == config.seed == 0
    # llm_gym's optimizer: torch.optim.AdamW(params, lr), its defaults, and its schedule: a
    # half cosine, warmed up over a tenth of the steps (none of 7).
    assert args.optim == "adamw_torch"  # a str enum
    assert (args.weight_decay, args.adam_beta1, args.adam_beta2) == (0.01, 0.9, 0.999)
    assert args.adam_epsilon == 1e-8
    assert args.lr_scheduler_type == "cosine"
    assert args.warmup_steps == 0
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert not args.gradient_checkpointing and not args.use_vllm
    assert args.logging_steps == 1 and args.report_to in ([], "none", ["none"])
    assert args.output_dir == str(tmp_path / "trl")


def test_the_schedule_reaches_trl_and_trls_own_defaults_drop_the_recipe(bench, tmp_path):
    config = config_of(bench, tmp_path, "--set", "lr_schedule=linear")
    args = bench.trl_config(config, str(tmp_path / "trl"))
    assert (args.lr_scheduler_type, args.warmup_steps) == ("linear", 2)  # a tenth of 20
    config = config_of(bench, tmp_path, "--set", "lr_schedule=constant", "--set", "warmup_steps=3")
    args = bench.trl_config(config, str(tmp_path / "trl"))
    assert (args.lr_scheduler_type, args.warmup_steps) == ("constant_with_warmup", 3)
    own = bench.trl_config(config_of(bench, tmp_path), str(tmp_path / "trl"), own_defaults=True)
    assert (own.learning_rate, own.lr_scheduler_type, own.weight_decay) == (1e-6, "linear", 0.0)
    assert own.optim == "adamw_torch_fused" and own.loss_type == "dapo"
    # The budget and the dtype stay the run's.
    assert (own.max_steps, own.num_generations, own.max_completion_length) == (20, 8, 48)
    assert own.per_device_train_batch_size == 16 and not own.bf16


def test_trainers_are_named_and_need_seeds(bench, capsys):
    assert bench.parse_args(["--seeds", "0-1", "--trainers", "trl,trl-defaults"]).trainers == [
        "trl",
        "trl-defaults",
    ]
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "--trainers", "llm_gym,sb3"])
    assert "--trainers takes a comma-separated list of llm_gym, trl, trl-defaults" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        bench.parse_args(["--trainers", "trl"])
    assert "pass --seeds too" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "--trainers", "trl", "--kl-coef", "0.1"])
    assert "without KL" in capsys.readouterr().err


def test_loss_type_reaches_both_configs(bench, tmp_path):
    with pytest.raises(SystemExit):  # a name GRPOConfig does not know
        bench.parse_args(["--loss-type", "sum"])
    config = config_of(bench, tmp_path, "--loss-type", "dapo")
    assert config.loss_type == "dapo"
    assert bench.trl_config(config, str(tmp_path / "trl")).loss_type == "dapo"


def test_the_comparison_refuses_what_it_cannot_match(bench, tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--vs-trl", "--kl-coef", "0.1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--vs-trl", "--eval-episodes", "0"])
    config = config_of(bench, tmp_path, "--kl-coef", "0.1")
    with pytest.raises(ValueError, match="without KL"):
        bench.trl_config(config, str(tmp_path / "trl"))


def test_rollout_env_kwargs_are_the_runs_task(bench, tmp_path, smollm2_tokenizer):
    config = config_of(bench, tmp_path, "--task", "basic_arithmetic", "--level", "2")
    kwargs = bench.rollout_env_kwargs(config, smollm2_tokenizer)
    assert kwargs == {"task": "basic_arithmetic", "level": 2, "answer_format": "last_number"}


@pytest.mark.parametrize(
    ("rate", "episodes", "expected"),
    [(0.5, 64, 0.0625), (0.25, 8, math.sqrt(0.25 * 0.75 / 8)), (0.0, 10, 0.0), (1.0, 3, 0.0)],
)
def test_standard_error(bench, rate, episodes, expected):
    assert bench.standard_error(rate, episodes) == pytest.approx(expected)


def test_standard_error_needs_episodes(bench):
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        bench.standard_error(0.5, 0)


def test_summary_lines(bench):
    # SE of the after-rate: sqrt(0.375 * 0.625 / 8) = 0.1712
    assert bench.summary_line("llm_gym", 0.25, 0.375, 8, 2.44) == (
        "llm_gym: 0.250 -> 0.375 (SE 0.171), 2.4 min"
    )
    assert bench.summary_line("trl", 0.125, 0.5, 64, 12.96) == (
        "trl: 0.125 -> 0.500 (SE 0.062), 13.0 min"
    )


def test_reward_curves(bench):
    rows = [{"iteration": 0, "reward": 0.0, "success": 0.0}, {"iteration": 1, "reward": 0.25}]
    assert bench.llm_gym_rewards(rows) == ([1, 2], [0.0, 0.25])
    history = [
        {"loss": 0.0, "reward": 0.5, "step": 1},
        {"loss": 0.1, "reward": 0.75, "step": 2},
        {"train_runtime": 12.0, "step": 2},  # the run's summary: no reward
    ]
    assert bench.trl_rewards(history) == ([1, 2], [0.5, 0.75])
    # With a penalty beside it, the env's own reward (as llm_gym's rows keep it).
    shaped = [{"reward": 0.25, "rewards/env_reward_func/mean": 0.5, "step": 1}]
    assert bench.trl_rewards(shaped) == ([1], [0.5])


def test_plot_title_names_task_model_and_settings(bench, tmp_path):
    title = bench.plot_title(config_of(bench, tmp_path, "--iterations", "5"))
    assert "task chain_sum, level 0" in title and "SmolLM2-135M-Instruct" in title
    assert "5 iterations of 2 groups x 8 responses" in title and "loss dapo" in title


@pytest.mark.parametrize(
    ("spec", "seeds"), [("0-7", list(range(8))), ("3", [3]), ("2,0,5", [2, 0, 5])]
)
def test_seeds_are_a_range_or_a_list(bench, spec, seeds):
    assert bench.parse_seeds(spec) == seeds


@pytest.mark.parametrize("spec", ["a-b", "", "3--1", "-2"])
def test_bad_seeds_are_refused_naming_the_flag(bench, spec, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", spec])
    assert "--seeds" in capsys.readouterr().err


def test_set_changes_any_config_field_and_refuses_unknown_ones(bench, tmp_path, capsys):
    config = config_of(bench, tmp_path, "--set", "lr_schedule=cosine", "--set", "warmup_steps=2")
    assert (config.lr_schedule, config.warmup_steps) == ("cosine", 2)
    with pytest.raises(SystemExit):
        bench.parse_args(["--set", "nope=1"])
    assert "--set takes FIELD=VALUE of a GRPOConfig field" in capsys.readouterr().err


def test_a_seed_row_and_the_table_over_seeds(bench):
    rows = [
        {"entropy": 0.5, "response_tokens": 20.0, "zero_variance_groups": 0.5},
        {"entropy": 0.25, "response_tokens": 30.0, "zero_variance_groups": 0.0},
    ]
    summary = {"before": {"success": 0.25}, "after": {"success": 0.5}}
    row = bench.seed_row(3, summary, rows, 128, 5.5)
    assert row["gain"] == pytest.approx(25.0) and row["entropy"] == 0.25
    assert row["response_tokens"] == 25.0 and row["zero_variance_groups"] == 0.25
    se = math.hypot(math.sqrt(0.25 * 0.75 / 128), math.sqrt(0.25 / 128))
    assert row["gain_se"] == pytest.approx(100 * se)
    other = {**row, "seed": 4, "gain": 15.0}
    lines = bench.seed_table([row, other]).splitlines()
    assert lines[0] == bench.SEED_HEADER and lines[2].startswith("| 3 | 0.250 | 0.500 | +25.0 |")
    assert lines[-1] == "gain over 2 seeds: worst +15.0, mean +20.0 (SE 5.0), best +25.0"
    # A trainer without llm_gym's rows (TRL) has no entropy, lengths or flat groups to show.
    theirs = bench.seed_row(3, summary, [], 128, 7.0)
    assert theirs["entropy"] is theirs["response_tokens"] is theirs["zero_variance_groups"] is None
    assert bench.seed_table([theirs]).splitlines()[2].endswith("| 7.0 | n/a | n/a | n/a |")


def test_the_seeds_plot_has_a_panel_per_trainer(bench, tmp_path):
    curves = {
        "llm_gym": [(0, [1, 2], [0.25, 0.5]), (1, [1, 2], [0.5, 0.75])],
        "trl": [(0, [1, 2], [0.25, 0.25])],
    }
    path = bench.plot_seeds(tmp_path / "seeds.png", "title", curves)
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(path).shape
    assert (width, height) == (900, 400)  # two panels of 4.5 x 4 inches at 100 dpi
