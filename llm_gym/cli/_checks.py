"""Checks of flag combinations the parser cannot see (a flag the task does not take, one that
would be ignored, a folder that is not a model), made before anything heavy loads. Each
error names the flag; ``main`` prints it on one line with exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

from llm_gym.cli._args import llm_gym_env_ids, make_config, task_function
from llm_gym.train.config import CONFIG_FILE, RESUMABLE, GRPOConfig, load_config

__all__ = ["check_flags", "dataset_env_ids", "resumed_config"]

MODEL_FLAGS = {"model": "--model", "ref_model": "--ref-model"}
DATASET_FLAGS = {"split": "--split", "data_dir": "--data-dir"}


def _takes(env_id: str, argument: str) -> bool:
    function = task_function(env_id)
    return function is not None and argument in inspect.signature(function).parameters


def dataset_env_ids() -> list[str]:
    """The task env ids whose questions come from a dataset (their task takes ``data_dir``)."""
    return [i for i in llm_gym_env_ids() if i.startswith("LLMChat-") and _takes(i, "data_dir")]


def check_flags(args: argparse.Namespace, given: set[str]) -> None:
    """A ``ValueError`` naming the flag for a combination the run would fail on or ignore;
    ``given``: the options the command line gives (``given_options``)."""
    for dest, flag in DATASET_FLAGS.items():
        if dest in given and not _takes(args.env, dest):
            raise ValueError(
                f"{flag} applies to dataset tasks ({', '.join(dataset_env_ids())}); "
                f"{args.env} generates its questions"
            )
    if "answer_format" in given and not _takes(args.env, "answer_format"):
        raise ValueError(
            f"--answer-format applies to tasks that ask for an answer format; {args.env} "
            "reads answers in a format of its own (code, a game's moves)"
        )
    # rollout charges the KL against --ref-model only; train's kl_coef is its own penalty.
    if "kl_coef" in given and "ref_model" in vars(args) and args.ref_model is None:
        if args.kl_coef > 0:
            raise ValueError(
                f"--kl-coef {args.kl_coef} needs --ref-model (the KL is measured against "
                "it; without one no KL is charged): pass --ref-model default or a folder"
            )
    for dest, flag in MODEL_FLAGS.items():
        value = vars(args).get(dest)
        folder = Path(value).expanduser() if value not in (None, "default") else None
        if folder is not None and folder.exists() and not (folder / "config.json").is_file():
            raise ValueError(
                f"{flag} {value}: not a model folder (no config.json); expected 'default' or "
                "a folder saved with save_pretrained (model and tokenizer)"
            )


def resumed_config(args: argparse.Namespace, given: set[str]) -> GRPOConfig:
    """``train --resume``: the run config saved in ``--out`` with the ``given`` flags that a
    resumed run may change (``RESUMABLE``); a given flag that would change anything else is a
    ``ValueError`` naming it (a flag equal to the saved value is fine)."""
    if args.overwrite:  # checked first: there may be no run to load
        raise ValueError("resume and overwrite contradict each other: pass one")
    saved, parsed = load_config(args.out), make_config(GRPOConfig, args)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    changes = {}
    for dest in sorted(given):
        renamed = {"env_arg": "env_args", "backend_arg": "backend_args", "no_progress": "progress"}
        name = renamed.get(dest, dest)
        if name not in fields or name == "out":  # --threads, --resume: not the run's config
            continue
        value = getattr(parsed, name)
        if name in RESUMABLE:
            changes[name] = value
        elif value != getattr(saved, name):
            raise ValueError(
                f"--{dest.replace('_', '-')} {value!r} differs from the resumed run's "
                f"{getattr(saved, name)!r} ({Path(args.out) / CONFIG_FILE}); with --resume only "
                "--iterations, --save-every, --keep-checkpoints, --eval-episodes, --device, "
                "--threads, --no-progress and the --backend options may change (or start over "
                "with --overwrite)"
            )
    return GRPOConfig.resumed(args.out, **changes)
