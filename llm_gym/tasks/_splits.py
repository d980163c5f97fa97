"""Loading a task's split offline from a folder of jsonl files, else from the Hub."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llm_gym.envs.data_sources import load_hub_dataset, load_local_dataset

__all__ = ["SPLITS", "load_split"]

SPLITS = ("train", "test")


def load_split(
    name: str,
    split: str,
    data_dir: str | os.PathLike[str] | None,
    env_var: str,
    hub_id: str,
    hub_config: str | None,
) -> Any:
    """``split`` of task ``name`` as a ``datasets.Dataset``.

    From ``data_dir`` (a folder holding ``train.jsonl``/``test.jsonl``) if given, else from
    the folder in ``$env_var`` if set, else from the Hub's ``hub_id``; every failure names
    both the local and the Hub option.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if data_dir is not None:
        origin = f"data_dir={str(data_dir)!r}"
    elif os.environ.get(env_var):
        data_dir, origin = os.environ[env_var], f"${env_var}={os.environ[env_var]!r}"
    if data_dir is not None:
        path = Path(data_dir).expanduser() / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{name}'s {split!r} split was not found: {origin} has no file {path.name} "
                f"({path}). Point data_dir= or ${env_var} at a folder holding "
                f"train.jsonl and test.jsonl, or leave both unset to load {hub_id!r} "
                "from the Hugging Face Hub."
            )
        return load_local_dataset(path)
    try:
        return load_hub_dataset(hub_id, hub_config, split)
    except Exception as error:  # any Hub failure gets the same advice
        raise FileNotFoundError(
            f"{name} could not be loaded from the Hugging Face Hub ({hub_id!r}, config "
            f"{hub_config!r}): {str(error).rstrip('.')}. Offline, pass data_dir= (or set "
            f"${env_var}) to a folder holding train.jsonl and test.jsonl."
        ) from error
