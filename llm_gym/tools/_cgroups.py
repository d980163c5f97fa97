"""A pids cgroup per sandboxed call: the process limit that binds root too.

The kernel exempts root (uid 0, common in CI and containers) from ``RLIMIT_NPROC``; a
cgroup's ``pids.max`` binds it. Used where the pids controller is mounted writable (cgroup
v1, or v2 with pids delegated).
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from functools import cache

__all__ = ["create_pids_cgroup", "remove_cgroup"]

_COUNTER = itertools.count()


def create_pids_cgroup(max_pids: int) -> str | None:
    """The folder of a new cgroup of at most ``max_pids`` processes (a process joins it by
    writing its pid to ``cgroup.procs`` there), or None, with a warning once, where none can
    be made."""
    base = _pids_root()
    name = f"llm_gym-{os.getpid()}-{next(_COUNTER)}"
    path = None if base is None else _make(os.path.join(base, name), max_pids)
    if path is None:
        _warn_no_cgroup()
    return path


def remove_cgroup(path: str) -> None:
    """Delete the cgroup once its processes are gone (a killed PID namespace takes a moment
    to empty)."""
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def _make(path: str, max_pids: int) -> str | None:
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(max_pids))
        return path
    except OSError:
        remove_cgroup(path)
        return None


@cache
def _pids_root() -> str | None:
    """The folder of this process's pids cgroup, if we may create limited children in it."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for hierarchy, controllers, relative in lines:
        if "pids" in controllers.split(","):
            fstype = "cgroup"  # v1: a hierarchy of its own
        elif hierarchy == "0" and controllers == "":
            fstype = "cgroup2"
        else:
            continue
        for fields in mounts:
            # After "-": the file system type, the source, the super options (v1: controllers).
            kind, _, options = fields[fields.index("-") + 1 :][:3]
            if kind != fstype or (kind == "cgroup" and "pids" not in options.split(",")):
                continue
            base = os.path.join(fields[4], relative.lstrip("/"))
            probe = _make(os.path.join(base, f"llm_gym-probe-{os.getpid()}"), 1)
            if probe is not None:
                remove_cgroup(probe)
                return base
    return None


@cache
def _warn_no_cgroup() -> None:
    warnings.warn(
        "llm_gym's Python interpreter runs as root without a writable pids cgroup: the kernel "
        "does not apply RLIMIT_NPROC to root, so model-written code can start processes "
        "without a count limit (they still die at the wall-clock limit).",
        RuntimeWarning,
        stacklevel=4,
    )
