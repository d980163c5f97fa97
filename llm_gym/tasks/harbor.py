"""Harbor's task format: the folders Terminal-Bench 2.0 and the trainers that use Harbor share.

A task is a folder (Harbor's ``TaskPaths``)::

    instruction.md          the prompt
    task.toml               [verifier] timeout_sec, env; [environment] workdir, env, ...
    environment/Dockerfile  FROM, WORKDIR, COPY, ENV: the workspace the episode starts in
    solution/solve.sh       the oracle (``llm-gym check-tasks``)
    tests/test.sh           run after the episode; writes /logs/verifier/reward.txt (or .json)

The ``harbor`` package's own task model (``harbor.models.task.task.Task``) needs Python 3.12 and
pins a fastmcp 4 that openenv's and verifiers' MCP pins exclude, so the format is read here with
``tomllib``, as Harbor reads it: unknown ``task.toml`` keys ignored, a canary line at the top of
the instruction dropped, ``reward.json`` before ``reward.txt``. No Docker daemon runs here: a
Dockerfile that needs an image built (``RUN``, ``COPY --from``, a ``docker_image``) is refused at
load, by name and line.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from llm_gym.tasks.task import reward_version
from llm_gym.tools.shell import check_workdir

__all__ = [
    "DEFAULT_WORKDIR",
    "HarborTaskError",
    "TerminalTask",
    "load_harbor_task",
    "load_harbor_tasks",
    "verifier_reward",
]

DEFAULT_WORKDIR = "/app"  # Harbor's template's WORKDIR, and what a Dockerfile without one gets
_CANARY = re.compile(r"^\s*(<!--.*canary.*-->|#.*canary.*)\s*$", re.IGNORECASE)
_MAX_TASK_BYTES = 16 << 20  # a task's files, all together: what a workspace tmpfs takes


class HarborTaskError(ValueError):
    """A task folder that cannot run here: the message names the task and why."""


@dataclass(frozen=True)
class TerminalTask:
    """One terminal task: the ``instruction``, the workspace's starting ``files`` (paths
    relative to ``workdir``, to their bytes), the verifier's ``tests`` (``/tests``; its
    ``test.sh`` runs after the episode) and the oracle's ``solution`` (``/solution``; its
    ``solve.sh``), the ``env`` of both, the verifier's time limit. ``write`` lays it out as a
    Harbor task folder.

    >>> import pathlib, tempfile
    >>> test = b"grep -q hi /app/hi.txt && echo 1 > /logs/verifier/reward.txt"
    >>> task = TerminalTask("hello", "Write hi into hi.txt.", {"notes.txt": b"hello"},
    ...                     {"test.sh": test}, {"solve.sh": b"echo hi > hi.txt"})
    >>> load_harbor_task(task.write(pathlib.Path(tempfile.mkdtemp()) / "hello")) == task
    True
    """

    name: str
    instruction: str
    files: Mapping[str, bytes]
    tests: Mapping[str, bytes]
    solution: Mapping[str, bytes] = field(default_factory=dict)
    workdir: str = DEFAULT_WORKDIR
    env: Mapping[str, str] = field(default_factory=dict)
    verifier_timeout: float = 600.0

    @property
    def reward_version(self) -> str:
        """Its reward's version: llm_gym's reading of the verifier's reward (1) and a digest
        of its ``tests``, which change whenever what they check does.

        >>> TerminalTask("t", "Do it.", {}, {"test.sh": b"exit 0"}).reward_version
        '1+tests 9b6222ed2461'
        """
        digest = hashlib.sha256()
        for name in sorted(self.tests):
            digest.update(name.encode() + b"\0" + self.tests[name] + b"\0")
        return f"{reward_version('1')}+tests {digest.hexdigest()[:12]}"

    def write(self, folder: str | Path) -> Path:
        """This task as a Harbor task folder in ``folder`` (created); the folder."""
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        (root / "instruction.md").write_text(self.instruction, encoding="utf-8")
        config = f"[verifier]\ntimeout_sec = {float(self.verifier_timeout)!r}\n"
        if self.env:
            config += "\n[environment.env]\n" + "".join(
                f"{k} = {json.dumps(v)}\n" for k, v in sorted(self.env.items())
            )
        (root / "task.toml").write_text(f'schema_version = "1.4"\n\n{config}', encoding="utf-8")
        lines = ["FROM ubuntu:24.04", f"WORKDIR {self.workdir}"]
        lines += [
            f"COPY {name} {posixpath.join(self.workdir, name)}" for name in sorted(self.files)
        ]
        _write_files(root / "environment", {"Dockerfile": ("\n".join(lines) + "\n").encode()})
        _write_files(root / "environment", self.files)
        _write_files(root / "tests", self.tests)
        _write_files(root / "solution", self.solution)
        return root


def load_harbor_tasks(path: str | Path) -> list[TerminalTask]:
    """The tasks of ``path``: a task folder, or a folder of them (each subfolder with a
    ``task.toml``), in name order. Every task is checked now: one that cannot run here raises
    ``HarborTaskError`` naming it."""
    root = Path(path)
    if not root.is_dir():
        raise HarborTaskError(
            f"tasks must be a Harbor task folder or a folder of them, got {str(path)!r}"
        )
    if (root / "task.toml").is_file():
        return [load_harbor_task(root)]
    folders = sorted(p for p in root.iterdir() if (p / "task.toml").is_file())
    if not folders:
        raise HarborTaskError(
            f"tasks={str(path)!r} holds no Harbor task (a folder with task.toml, instruction.md, "
            "tests/test.sh)"
        )
    return [load_harbor_task(folder) for folder in folders]


def load_harbor_task(folder: str | Path) -> TerminalTask:
    """The task in the Harbor task ``folder``, checked (``HarborTaskError``)."""
    root = Path(folder)
    name = root.name

    def refuse(why: str) -> HarborTaskError:
        return HarborTaskError(f"task {name!r} ({root}): {why}")

    for needed in ("instruction.md", "tests/test.sh"):
        if not (root / needed).is_file():
            raise refuse(f"no {needed}")
    try:
        config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise refuse(f"task.toml cannot be read: {error}") from None
    environment = _table(config, "environment", refuse)
    verifier = _table(config, "verifier", refuse)
    if environment.get("docker_image"):
        raise refuse(
            f"[environment] docker_image = {environment['docker_image']!r} needs that image, "
            "and no Docker daemon runs here"
        )
    timeout = verifier.get("timeout_sec", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise refuse(f"[verifier] timeout_sec must be a number > 0, got {timeout!r}")
    env = {**_strings(environment.get("env", {}), "[environment] env", refuse),
           **_strings(verifier.get("env", {}), "[verifier] env", refuse)}  # fmt: skip
    dockerfile = root / "environment" / "Dockerfile"
    workdir, files, docker_env = DEFAULT_WORKDIR, {}, {}
    if dockerfile.is_file():
        workdir, files, docker_env = _read_dockerfile(dockerfile, refuse)
    if environment.get("workdir"):
        workdir = _workdir(str(environment["workdir"]), refuse, "[environment] workdir")
    instruction = (root / "instruction.md").read_text(encoding="utf-8").splitlines()
    while instruction and _CANARY.match(instruction[0]):
        instruction.pop(0)
    return TerminalTask(
        name=name,
        instruction="\n".join(instruction).strip("\n"),
        files=files,
        tests=_read_folder(root / "tests"),
        solution=_read_folder(root / "solution") if (root / "solution").is_dir() else {},
        workdir=workdir,
        env={**docker_env, **env},
        verifier_timeout=float(timeout),
    )


def verifier_reward(text: bytes | None, data: bytes | None) -> tuple[float, dict[str, Any]]:
    """The episode's reward from what the verifier wrote, as Harbor reads it: ``reward.json``
    (``data``: a flat object of names to numbers; its ``"reward"``, else their mean) before
    ``reward.txt`` (``text``: one number); and the info: ``verifier_rewards`` (every name's),
    or ``verifier_note`` saying why there is none (the reward is then 0).

    >>> verifier_reward(b"1\\n", None)
    (1.0, {'verifier_rewards': {'reward': 1.0}})
    >>> verifier_reward(None, b'{"tests": 0.5, "style": 1}')
    (0.75, {'verifier_rewards': {'tests': 0.5, 'style': 1.0}})
    >>> verifier_reward(b"yes", None)[1]["verifier_note"]
    "reward.txt must hold one number, got 'yes'"
    """
    if data is not None:
        try:
            rewards = json.loads(data)
        except (ValueError, RecursionError):
            return 0.0, {"verifier_note": f"reward.json is not JSON: {data[:80]!r}"}
        if (
            not isinstance(rewards, dict)
            or not rewards
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in rewards.values()
            )
        ):
            return 0.0, {"verifier_note": f"reward.json must be a flat object of finite numbers, "
                         f"got {data[:80]!r}"}  # fmt: skip
        rewards = {str(k): float(v) for k, v in rewards.items()}
        reward = rewards.get("reward", sum(rewards.values()) / len(rewards))
        return reward, {"verifier_rewards": rewards}
    if text is None:
        return 0.0, {"verifier_note": "the verifier wrote no reward.txt or reward.json"}
    raw = text.decode("utf-8", "replace").strip()
    try:
        reward = float(raw)
    except ValueError:
        reward = math.nan
    if not math.isfinite(reward):
        return 0.0, {"verifier_note": f"reward.txt must hold one number, got {raw[:80]!r}"}
    return reward, {"verifier_rewards": {"reward": reward}}


# -- reading a task folder ---------------------------------------------------------------------


def _table(config: Mapping[str, Any], key: str, refuse: Any) -> dict[str, Any]:
    table = config.get(key, {})
    if not isinstance(table, dict):
        raise refuse(f"[{key}] must be a table, got {table!r:.60}")
    return table


def _strings(env: Any, where: str, refuse: Any) -> dict[str, str]:
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise refuse(f"{where} must map names to strings, got {env!r:.80}")
    return {str(k): v for k, v in env.items()}


def _workdir(path: str, refuse: Any, where: str) -> str:
    try:
        return check_workdir(path)
    except ValueError as error:
        raise refuse(f"{where}: {error}") from None


def _read_dockerfile(path: Path, refuse: Any) -> tuple[str, dict[str, bytes], dict[str, str]]:
    """The workspace a Dockerfile of ``FROM``/``WORKDIR``/``COPY``/``ENV`` lines describes:
    its folder, its files (by path relative to it), its environment."""
    context = path.parent
    workdir, copies, env = DEFAULT_WORKDIR, [], {}
    text = path.read_text(encoding="utf-8").replace("\\\n", " ")
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word, rest = word.upper(), rest.strip()
        if word == "FROM":
            continue  # the host's tools stand in for the base image's
        if word == "WORKDIR":
            workdir = _workdir(posixpath.join(workdir, rest), refuse, f"Dockerfile line {number}")
        elif word == "ENV":
            pairs = re.findall(r'(\w+)=("[^"]*"|\S+)', rest) or [tuple(rest.split(None, 1))]
            for key, value in pairs:
                env[key] = value.strip('"')
        elif word == "COPY" and not rest.startswith("--from"):
            parts = [p for p in rest.split() if not p.startswith("--")]
            if len(parts) < 2:
                raise refuse(f"Dockerfile line {number}: COPY needs a source and a destination")
            copies.extend((number, source, parts[-1], workdir) for source in parts[:-1])
        else:
            raise refuse(
                f"Dockerfile line {number} needs an image built ({line[:80]!r}), and no Docker "
                "daemon runs here: only FROM, WORKDIR, COPY and ENV lines can be played"
            )
    files: dict[str, bytes] = {}
    for number, source, destination, at in copies:
        target = posixpath.normpath(posixpath.join(at, destination))
        if not (target == workdir or target.startswith(workdir + "/")):
            raise refuse(
                f"Dockerfile line {number} copies to {target}, outside the workspace "
                f"{workdir}: only the workspace is the episode's"
            )
        found = (context / source).resolve()
        if not found.is_relative_to(context.resolve()) or not found.exists():
            raise refuse(f"Dockerfile line {number}: no {source!r} in environment/")
        into = posixpath.relpath(target, workdir)
        if found.is_dir():
            for name, data in _read_folder(found).items():
                if found != context.resolve() or name != "Dockerfile":
                    files[posixpath.normpath(posixpath.join(into, name))] = data
        else:
            if destination.endswith("/") or target == workdir:
                into = posixpath.join(into, found.name)
            files[posixpath.normpath(into)] = found.read_bytes()
    if sum(map(len, files.values())) > _MAX_TASK_BYTES:
        raise refuse(f"its files pass the workspace's {_MAX_TASK_BYTES >> 20} MiB")
    return workdir, files, env


def _read_folder(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def _write_files(folder: Path, files: Mapping[str, bytes]) -> None:
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if data.startswith(b"#!") or name.endswith(".sh"):
            path.chmod(0o755)
