"""Each option declared once: ``--help`` of ``train`` and ``rollout``, the docs' option
tables, the config dataclasses and the resume rules all come from the one declaration
(``llm_gym.options``), and a YAML recipe (``--config``) sets options as flags do."""

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from llm_gym.cli import build_parser, main
from llm_gym.options import flags, option_specs, options_table, resumable
from llm_gym.run.config import ProfileConfig, RolloutConfig
from llm_gym.train import resumed_config
from llm_gym.train.config import RESUMABLE, GRPOConfig

ROOT = Path(__file__).resolve().parents[2]
# The command's own flags: the process's (--threads, the launch), the recipe, --help.
PROCESS_FLAGS = {
    "-h", "--help", "--config", "--threads", "--nproc-per-node", "--nnodes", "--node-rank",
    "--master-addr", "--master-port",
}  # fmt: skip


def _command(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _words(text: str) -> str:
    # Without whitespace: argparse wraps lines at spaces and after hyphens.
    return "".join(text.split())


@pytest.mark.parametrize(
    ("command", "config"),
    [("train", GRPOConfig), ("rollout", RolloutConfig), ("profile", ProfileConfig)],
)
def test_help_docs_tables_and_the_dataclass_agree(command, config, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    parser = _command(command)
    specs = option_specs(config)
    # Every field is an option, and every flag but the process's is a field.
    assert [s.name for s in specs] == [f.name for f in dataclasses.fields(config)]
    actions = {a.option_strings[0]: a for a in parser._actions}
    assert set(actions) - PROCESS_FLAGS == {s.flag for s in specs}
    helps = _words(parser.format_help())
    table = options_table(config)
    for spec in specs:
        action = actions[spec.flag]
        assert action.dest == spec.name  # the flag fills its field, under the field's name
        shown = spec.help.replace("%(default)s", str(action.default))
        assert _words(shown) in helps, spec.flag
        row = next(line for line in table.splitlines() if line.startswith(f"| `{spec.flag}` |"))
        assert f"| `{spec.name}` |" in row
        assert ("| yes |" in row) == spec.resumable, spec.flag
        assert _words(spec.help.replace("%(default)s", str(spec.default))).replace(
            "|", "\\|"
        ) in _words(row)
    # The parser's defaults build the dataclass's defaults.
    args = parser.parse_args([])
    assert config(**{s.name: getattr(args, s.name) for s in specs}) == config()


def test_the_docs_pages_hold_the_generated_tables():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    pages = (("training.md", GRPOConfig), ("cli.md", RolloutConfig),
             ("envs/cards.md", ProfileConfig))  # fmt: skip
    for page, config in pages:
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        rendered = hooks.option_tables(text, page)
        assert options_table(config) in rendered and "<!-- llm-gym options" not in rendered


def test_the_resume_rules_are_the_declared_ones():
    assert RESUMABLE == resumable(GRPOConfig)
    assert {"iterations", "save_every", "device", "report_to", "packing", "num_agents",
            "agent_timeout", "workers", "ray_address", "backend"} <= set(RESUMABLE)  # fmt: skip
    assert not {"seed", "learning_rate", "loss_type", "env", "model"} & set(RESUMABLE)


def test_a_flag_the_resume_may_not_change_is_refused_with_the_generated_list(
    tiny_dir, tmp_path, capsys
):
    from llm_gym.train.run_folder import resumable_flags, save_config

    out = tmp_path / "run"
    out.mkdir()
    save_config(GRPOConfig(model=tiny_dir, out=str(out)))
    code = main(["train", "--resume", "--out", str(out), "--model", tiny_dir, "--seed", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("llm-gym: error: --seed 3 differs from the resumed run's 0")
    named = flags(GRPOConfig)
    listed = resumable_flags()
    assert listed == ", ".join(named[n] for n in RESUMABLE if n not in ("out", "resume",
                                                                          "overwrite"))  # fmt: skip
    assert f"with --resume only {listed} and --threads may change" in err
    assert "--num-agents" in listed and "--workers" in listed and "--ray" in listed


def test_a_saved_run_loads_where_its_tracker_is_not_installed(tmp_path, monkeypatch):
    from llm_gym.train.run_folder import load_config, save_config

    save_config(GRPOConfig(out=str(tmp_path), report_to="tensorboard"))
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else found(name)
    )
    assert load_config(tmp_path).report_to == ["tensorboard"]
    # Resuming it to report there asks for the tracker; reporting elsewhere does not.
    with pytest.raises(ValueError, match="'tensorboard' is not installed"):
        resumed_config(tmp_path)
    raw = json.loads((tmp_path / "run_config.json").read_text())
    assert raw["report_to"] == ["tensorboard"]


def test_a_recipe_sets_options_and_flags_win(tmp_path):
    from llm_gym.cli import parse_with_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "env_args: {task: chain_sum}\niterations: 3\nmax-new-tokens: 16\n"
        "overlong_cache: auto\ntools: python\nlora_target_modules: q_proj,v_proj\n"
    )
    parser = build_parser()
    args, given = parse_with_recipe(
        parser, ["train", "--config", str(recipe), "--iterations", "5", "--env-arg", "level=1"]
    )
    assert given == {"env_args", "iterations", "max_new_tokens", "overlong_cache", "tools",
                     "lora_target_modules"}  # fmt: skip
    # A flag beside the recipe wins; --env-arg adds to the recipe's env_args.
    assert args.iterations == 5 and args.env_args == {"task": "chain_sum", "level": 1}
    # Text values are read as their flags read them.
    assert (args.max_new_tokens, args.overlong_cache, args.tools) == (16, None, ["python"])
    assert args.lora_target_modules == ["q_proj", "v_proj"]
    # The parser's own defaults are left as they were for the next parse.
    assert build_parser().parse_args(["train"]).iterations == 20


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rat: 0.1\n", "'learning_rat' is not an option of GRPOConfig"),
        ("- 1\n- 2\n", "expected a mapping of option names to values, got list"),
        ("iterations: [1\n", "not YAML"),
        ("iterations: 0\n", "iterations must be an int >= 1, got 0"),
        ("loss_type: ppo\n", "loss_type must be one of"),
    ],
)
def test_a_bad_recipe_is_one_line_naming_the_key(tmp_path, capsys, text, message):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    assert main(["train", "--config", str(recipe), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym: error: ") and err.count("\n") == 1 and message in err
    assert not (tmp_path / "run").exists()


def test_a_missing_recipe_names_the_file(tmp_path, capsys):
    assert main(["rollout", "--config", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"--config {tmp_path / 'none.yaml'}: cannot be read" in err


def test_a_yaml_recipe_runs_the_main_job(tiny_dir, tmp_path):
    # The README's main job as a recipe (its flags as keys), made small: a tiny model, two
    # iterations.
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(
        "env_args: {task: chain_sum}\neval_episodes: 4\nsave_every: 2\nsave_dtype: bfloat16\n"
        "overwrite: true\niterations: 2\ngroups: 2\ngroup_size: 2\nmax_new_tokens: 4\n"
        "progress: false\n"
    )
    out = tmp_path / "demo"
    assert main(["train", "--config", str(recipe), "--model", tiny_dir, "--out", str(out),
                 "--threads", "1"]) == 0  # fmt: skip
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["env_args"] == {"task": "chain_sum"} and saved["iterations"] == 2
    assert saved["save_dtype"] == "bfloat16" and saved["eval_episodes"] == 4
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["iteration"] for r in rows] == [0, 1]
    assert json.loads((out / "summary.json").read_text())["after"] is not None
