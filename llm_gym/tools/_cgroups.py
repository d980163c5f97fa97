"""A pids cgroup per sandboxed call: the process limit that binds root too.

``RLIMIT_NPROC`` does not apply to root (the kernel exempts uid 0), and CI machines and
containers often run as root. A cgroup's ``pids.max`` does; it is used where the pids
controller is mounted writable (cgroup v1, or v2 with pids delegated).
"""

from __future__ import annotations

import itertools
import os
import time
import warnings
from functools import cache

__all__ = ["PidsCgroup"]

_COUNTER = itertools.count()


class PidsCgroup:
    """A fresh cgroup limited to ``max_pids`` processes; ``procs`` is the file a process
    writes its pid to, to join it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.procs = os.path.join(path, "cgroup.procs")

    @classmethod
    def create(cls, max_pids: int) -> PidsCgroup | None:
        """A new cgroup, or None (with a warning, once) where none can be made."""
        base = _pids_root()
        if base is None:
            _warn_no_cgroup()
            return None
        path = os.path.join(base, f"llm_gym-{os.getpid()}-{next(_COUNTER)}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(max_pids))
        except OSError:
            _remove(path)
            _warn_no_cgroup()
            return None
        return cls(path)

    def remove(self) -> None:
        """Delete the cgroup once its processes are gone (a killed PID namespace takes a
        moment to empty)."""
        _remove(self.path)


def _remove(path: str) -> None:
    for _ in range(100):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


@cache
def _pids_root() -> str | None:
    """The directory of this process's pids cgroup, if we may create children in it."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for hierarchy, controllers, relative in lines:
        v1 = "pids" in controllers.split(",")
        if not v1 and not (hierarchy == "0" and controllers == ""):
            continue
        for fields in mounts:
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
            v1_pids = fstype == "cgroup" and "pids" in options.split(",")
            if not (v1_pids if v1 else fstype == "cgroup2"):
                continue
            base = os.path.join(fields[4], relative.lstrip("/"))
            if _can_limit(base):
                return base
    return None


def _can_limit(base: str) -> bool:
    probe = os.path.join(base, f"llm_gym-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, "pids.max"))
    finally:
        _remove(probe)


@cache
def _warn_no_cgroup() -> None:
    warnings.warn(
        "llm_gym's Python interpreter runs as root without a writable pids cgroup: the kernel "
        "does not apply RLIMIT_NPROC to root, so model-written code can start processes "
        "without a count limit (they still die at the wall-clock limit).",
        RuntimeWarning,
        stacklevel=4,
    )
