"""``Shell``: a sandboxed shell whose calls share one workspace for an episode.

``PythonInterpreter`` starts a fresh process and scratch directory for every call; an agent in
a terminal edits files, runs programs and checks its work over several turns, so the shell's
sandbox lives from ``start`` to ``close``. One bubblewrap sandbox per episode (the same limits
as the interpreter's: docs/envs/terminal.md, "The sandbox") runs a small server, written
below, that starts each call's ``bash -c`` as ``nobody`` in the workspace and, when the call
ends, kills whatever it left running. The workspace and ``/tmp`` are size-limited tmpfs mounts
of that sandbox: they hold the episode's files, and vanish with it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import posixpath
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from llm_gym.checks import check_int, check_number, check_str
from llm_gym.tools.base import Tool, ToolError, truncate_output
from llm_gym.tools.interpreter import (
    _NOBODY,
    Execution,
    _bwrap,
    _create_pids_cgroup,
    _remove_cgroup,
    _rlimits,
    _set_limits,
    _wait,
    _write_all,
)

__all__ = ["SYSTEM_PATHS", "Shell", "ShellError", "bash_tool", "check_workdir"]

# Shown read-only in the sandbox as the host has them: a shell's tools, libraries, /etc.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_RESERVED = (*SYSTEM_PATHS, "/dev", "/proc", "/tmp", "/tests", "/logs", "/solution", "/")
_GRACE_S = 5.0  # past a call's own timeout: the server's time to kill what it left and reply
_START_S = 30.0  # bubblewrap and the server's first reply

# The server, run by the sandbox's Python (``-I``). One JSON request a line on stdin, one
# reply a line on stdout. It stays root where bwrap ran as root without a user namespace (so
# that a call, dropped to nobody, cannot signal it) and runs each call in a session of its
# own; after the call it kills every process in the sandbox's PID namespace but itself and
# bubblewrap's init, which takes background jobs and fork bombs with it.
_SERVER = r"""
import base64, io, json, os, resource, select, shutil, signal, subprocess, sys, tarfile, time
LIMITS, DROP, ENV, ROOTS = {limits!r}, {drop!r}, {env!r}, {roots!r}
reply_to = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDWR), 1)

def limited():
    for name, value in LIMITS:
        resource.setrlimit(getattr(resource, name), (value, value))
    if DROP is not None:
        os.setgroups([]); os.setgid(DROP); os.setuid(DROP)

def others():
    me, pids = os.getpid(), []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) in (1, me):
            continue
        try:
            with open(f"/proc/{{p}}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    pids.append(int(p))
        except (OSError, IndexError):
            pass
    return pids

def sweep():
    left = 0
    for _ in range(200):
        pids = others()
        if not pids:
            break
        left = max(left, len(pids))
        for pid in pids:
            try: os.kill(pid, signal.SIGKILL)
            except OSError: pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0: break
            except ChildProcessError: break
        time.sleep(0.005)
    return left

def run(command, timeout, cwd, keep):
    start = time.monotonic()
    try:
        p = subprocess.Popen(["/bin/bash", "-c", command], cwd=cwd, env=ENV,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=limited)
    except (OSError, ValueError) as error:  # too long for an argument, a NUL byte
        return {{"output": f"the shell could not start: {{error}}", "code": None,
                "timed_out": False, "size": 0, "left": 0, "seconds": 0.0}}
    fd = p.stdout.fileno()
    os.set_blocking(fd, False)
    head, tail, size, timed_out = bytearray(), bytearray(), 0, False
    deadline = start + timeout
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        ready = select.select([fd], [], [], min(deadline - now, 0.05))[0]
        chunk = b""
        if ready:
            try: chunk = os.read(fd, 1 << 16)
            except BlockingIOError: continue
            if not chunk: break
        elif p.poll() is not None:
            break  # done; a background job may hold the pipe open
        size += len(chunk)
        room = keep - len(head)
        head += chunk[:room]
        tail = (tail + chunk[max(room, 0):])[-keep:]
    if not timed_out:  # its output ended: the command's own exit, within the time left
        try: p.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired: timed_out = True
    code = p.returncode
    left = sweep()
    p.stdout.close()
    p.wait()
    raw = bytes(head) + (b"\n" + bytes(tail) if size > len(head) else b"")
    return {{"output": raw.decode("utf-8", "replace"), "code": None if timed_out else code,
            "timed_out": timed_out, "size": size, "left": left,
            "seconds": time.monotonic() - start}}

def pack(root):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name)
    return base64.b64encode(data.getvalue()).decode()

def clear(root):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)

def unpack(root, text):
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(text)), mode="r:*") as tar:
        tar.extractall(root, filter="data")
    if DROP is not None:
        for folder, dirs, files in os.walk(root):
            for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
                os.lchown(name, DROP, DROP)

def read(path, keep):
    try:
        with open(path, "rb") as f:
            return base64.b64encode(f.read(keep)).decode()
    except OSError:
        return None

for line in sys.stdin:
    request = json.loads(line)
    op = request["op"]
    try:
        if op == "run":
            answer = run(request["command"], request["timeout"], request["cwd"], request["keep"])
        elif op == "pack":
            answer = {{root: pack(root) for root in ROOTS}}
        elif op == "unpack":
            for root, text in request["roots"].items():
                if request["clear"]:
                    clear(root)
                unpack(root, text)
            answer = {{}}
        elif op == "read":
            answer = {{"data": read(request["path"], request["keep"])}}
        else:
            answer = {{}}
    except Exception as error:
        answer = {{"error": f"{{type(error).__name__}}: {{error}}"}}
    reply_to.write(json.dumps(answer) + "\n")
    reply_to.flush()
    if op == "exit":
        break
"""


class ShellError(RuntimeError):
    """The shell's sandbox cannot run here, or ended (its workspace with it)."""


def check_workdir(workdir: str) -> str:
    """``workdir`` if a sandbox can hold a workspace there: an absolute path outside the
    folders the sandbox shows from the host or keeps for itself (``/usr``, ``/tmp``,
    ``/tests``, ...); else ``ValueError``.

    >>> check_workdir("/app/")
    '/app'
    >>> check_workdir("/usr/src")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: workdir must be an absolute path outside /usr, ... got '/usr/src'
    """
    path = posixpath.normpath(check_str("workdir", workdir)) if workdir else ""
    if path.startswith("//"):
        path = path[1:]
    top = "/" + path.split("/")[1] if path.startswith("/") else ""
    if not path.startswith("/") or path == "/" or top in _RESERVED:
        raise ValueError(
            f"workdir must be an absolute path outside {', '.join(_RESERVED[:-1])} and / "
            f"itself, got {workdir!r}"
        )
    return path


class Shell:
    """A sandboxed ``bash`` whose calls share the workspace ``workdir`` from ``start`` to
    ``close``; ``tool`` is it as a ``Tool`` named ``bash``.

    ``start(files)`` opens the sandbox with ``files`` (paths under ``workdir``, relative or
    absolute, to their bytes) in the workspace; ``run(command)`` runs one call there, each
    with its ``timeout``, its output cut to ``max_output_chars`` (start and end kept), and
    kills what it left running; ``snapshot``/``restore`` copy the workspace and ``/tmp``
    (a fork's); ``read`` returns a file's bytes; ``close`` ends the sandbox and everything in
    it. ``writable`` adds empty tmpfs folders of so many MiB (``{"/logs/verifier": 1}``), which
    ``put`` fills (a verifier's tests, after the episode).

    >>> with Shell() as shell:
    ...     _ = shell.start({"notes.txt": b"one\\ntwo\\n"})
    ...     print(shell.run("wc -l < notes.txt && echo three >> notes.txt").output, end="")
    ...     print(shell.run("tail -1 notes.txt").output, end="")
    2
    three
    """

    def __init__(
        self,
        *,
        workdir: str = "/app",
        timeout: float = 10.0,
        memory_mb: int = 1024,
        max_file_mb: int = 16,
        max_processes: int = 64,
        max_output_chars: int = 4000,
        max_workspace_mb: int = 32,
        max_tmp_mb: int = 16,
        env: Mapping[str, str] | None = None,
        writable: Mapping[str, int] | None = None,
    ) -> None:
        self.workdir = check_workdir(workdir)
        _set_limits(self, timeout, memory_mb, max_file_mb, max_processes, max_output_chars)
        self.max_workspace_mb = check_int("max_workspace_mb", max_workspace_mb, low=1)
        self.max_tmp_mb = check_int("max_tmp_mb", max_tmp_mb, low=1)
        env = dict(env or {})
        bad = [k for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise TypeError(f"env must map str to str, got {bad[0]!r}: {env[bad[0]]!r}")
        self.env = env
        self.writable = {str(path): check_int(f"writable[{path!r}]", mb, low=1)
                         for path, mb in (writable or {}).items()}  # fmt: skip
        self._process: subprocess.Popen | None = None
        self._cgroup: str | None = None
        self._files: dict[str, bytes] = {}
        self._pending: dict[str, str] | None = None  # a fork's workspace, until it is used

    # -- the sandbox's life -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Whether the sandbox is running (started and not closed or killed)."""
        return self._process is not None and self._process.poll() is None

    def start(self, files: Mapping[str, bytes] | None = None) -> Shell:
        """Open the sandbox (closing one that runs) with ``files`` in the workspace."""
        self.close()
        self._files = _workspace_files(self.workdir, files or {})
        bwrap, why, as_root = _bwrap()
        if bwrap is None:
            raise ShellError(f"the shell needs bubblewrap, which cannot run here: {why}")
        self._cgroup = _create_pids_cgroup(self.max_processes) if os.geteuid() == 0 else None
        argv = self._argv(bwrap, as_root)
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        if self._files:
            self.put(self.workdir, self._files, clear=False)
        return self

    def put(self, folder: str, files: Mapping[str, bytes], clear: bool = True) -> None:
        """Write ``files`` (paths relative to ``folder``, to their bytes; a ``#!`` file
        executable) into ``folder``, the workspace or one of ``writable``, emptied first
        when ``clear``."""
        if folder != self.workdir and folder not in self.writable:
            raise ValueError(
                f"folder must be the workspace {self.workdir!r} or one of writable "
                f"{sorted(self.writable)}, got {folder!r}"
            )
        roots = {folder: _pack(_workspace_files(folder, files))}
        answer = self._request({"op": "unpack", "roots": roots, "clear": clear}, _START_S)
        if "error" in answer:
            raise ShellError(f"{folder} could not be written: {answer['error']}")

    def close(self) -> None:
        """End the sandbox: every process in it, its workspace and ``/tmp`` (a fork not yet
        used: its copy)."""
        process, self._process, self._pending = self._process, None, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            process.wait()
        if self._cgroup is not None:
            _remove_cgroup(self._cgroup)
            self._cgroup = None

    def __enter__(self) -> Shell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- calls ----------------------------------------------------------------------------------

    def run(self, command: str, timeout: float | None = None, cwd: str | None = None) -> Execution:
        """Run ``command`` with ``bash -c`` in the workspace (or ``cwd``); never raises for
        anything the command does. A sandbox that ended (a call killed its server) is
        started again from the task's files first, which the output says."""
        check_str("command", command)
        timeout = self.timeout if timeout is None else check_number("timeout", timeout, low=0)
        note = ""
        if not self.alive and not self.pending:
            note = "[the shell's sandbox had ended: it was started again from the task's files]\n"
            self.start(self._files)
        keep = 4 * self.max_output_chars + 4  # bytes: more than max_output_chars characters
        request = {"op": "run", "command": command, "timeout": timeout,
                   "cwd": cwd or self.workdir, "keep": keep}  # fmt: skip
        try:
            answer = self._request(request, timeout + _GRACE_S)
        except ShellError as error:
            return Execution(f"{note}{error}", False, None, timeout, True, False)
        if "error" in answer:  # the server could not run it; it goes on serving
            return Execution(f"{note}Error: {answer['error']}", False, None, 0.0, False, False)
        text = note + answer["output"]
        truncated = len(text) > self.max_output_chars
        text = truncate_output(text, self.max_output_chars)
        code = answer["code"]
        if answer["timed_out"]:
            text += f"\nTimeoutError: the command ran past the {timeout:g} s limit and was killed"
        elif code is not None and code < 0:
            text += f"\nkilled by signal {-code}: {signal.strsignal(-code)}"
        elif code:
            text += f"\n[exit status {code}]"
        if answer["left"] and not answer["timed_out"]:
            text += f"\n[killed {answer['left']} process(es) still running when the call ended]"
        # Left running: a background job or a fork bomb, which a call may not leave behind.
        ok = code == 0 and not answer["timed_out"] and not answer["left"]
        return Execution(text, ok, code, answer["seconds"], answer["timed_out"], truncated)

    def read(self, path: str, max_bytes: int = 1 << 16) -> bytes | None:
        """The first ``max_bytes`` of the file at ``path`` inside the sandbox (None: none)."""
        data = self._request({"op": "read", "path": path, "keep": max_bytes}, _START_S)["data"]
        return None if data is None else base64.b64decode(data)

    def snapshot(self) -> dict[str, str]:
        """The workspace and ``/tmp`` as they are (gzipped tars, base64): ``restore``'s input."""
        return self._request({"op": "pack"}, _START_S)

    def restore(self, snapshot: Mapping[str, str]) -> None:
        """Put ``snapshot``'s workspace and ``/tmp`` into this (started, empty) sandbox."""
        answer = self._request({"op": "unpack", "roots": dict(snapshot), "clear": True}, _START_S)
        if "error" in answer:
            raise ShellError(f"the snapshot could not be restored: {answer['error']}")

    def fork(self) -> Shell:
        """A shell with this one's settings, task files and a copy of its workspace and
        ``/tmp`` (processes are not copied: none outlive a call). The copy is taken now; the
        fork's sandbox starts when it is first used, so that snapshots a trainer never plays
        on cost a tar of the workspace and no sandbox."""
        other = Shell.__new__(Shell)
        other.__dict__.update(self.__dict__)
        other._process = other._cgroup = None
        other._pending = self.snapshot() if self.alive else self._pending
        return other

    @property
    def pending(self) -> bool:
        """Whether this is a fork whose sandbox has not started yet (its first use starts it)."""
        return self._pending is not None

    @property
    def tool(self) -> Tool:
        """This shell as the ``bash`` tool (``bash_tool`` of ``call``)."""
        return bash_tool(self.call, self.workdir)

    def call(self, command: str) -> str:
        """``run(command)``'s output; ``ToolError`` with it for a failed call (a status other
        than 0, killed, or processes left running)."""
        result = self.run(command)
        if not result.ok:
            raise ToolError(result.output)
        return result.output

    # -- the channel ------------------------------------------------------------------------------

    def _request(self, request: dict[str, Any], seconds: float) -> dict[str, Any]:
        if self._process is None and self._pending is not None:  # a fork's first use
            snapshot, files, self._pending = self._pending, self._files, None
            self.start()
            self._files = files
            self.restore(snapshot)
        process = self._process
        if process is None or process.poll() is not None:
            raise ShellError("the shell's sandbox is not running: start() it")
        deadline = time.monotonic() + seconds
        line = (json.dumps(request) + "\n").encode()
        problem = _write_all(process.stdin.fileno(), line, deadline)
        reply = b"" if problem is None else None
        fd = process.stdout.fileno()
        os.set_blocking(fd, False)
        while reply is not None and not reply.endswith(b"\n"):
            if not _wait(fd, deadline, write=False):
                reply = None
                break
            with contextlib.suppress(BlockingIOError):
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    reply = None
                    break
                reply += chunk
        if reply is None:  # its server died or hung: nothing in it can be trusted now
            self.close()
            raise ShellError(
                "Error: the shell's sandbox ended (a call killed its server, or it stopped "
                "answering): its workspace is lost"
            )
        return json.loads(reply)

    def _argv(self, bwrap: str, as_root: bool) -> list[str]:
        mb, limits = 1 << 20, _rlimits(self, counted=self._cgroup is not None)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workdir, "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", "TERM": "dumb", **self.env}  # fmt: skip
        drop = _NOBODY if as_root else None
        server = _SERVER.format(limits=limits, drop=drop, env=env, roots=[self.workdir, "/tmp"])
        args = [bwrap]
        for path in SYSTEM_PATHS:  # as the host has them: folders, or links (/bin -> usr/bin)
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}):
            if not any(path == p or path.startswith(p + "/") for p in SYSTEM_PATHS):
                args += ["--ro-bind", path, path]  # the server's Python
        # The writable folders are size-limited tmpfs: no filling the disk or the memory.
        for path, size in [(self.workdir, self.max_workspace_mb), ("/tmp", self.max_tmp_mb),
                           *self.writable.items(), ("/dev/shm", 1)]:  # fmt: skip
            args += ["--perms", "01777", "--size", str(size * mb), "--tmpfs", path]
        namespaces = ["--unshare-all"]
        if as_root:  # no user namespace, so that the calls can drop to nobody
            namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                          "--unshare-cgroup-try"]  # fmt: skip
        args += ["--dev", "/dev", "--proc", "/proc", *namespaces, "--die-with-parent",
                 "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin",
                 "--chdir", self.workdir, sys.executable, "-I", "-c", server]  # fmt: skip
        if self._cgroup is not None:  # enter the cgroup, then become the sandbox (same pid)
            join = f'echo $$ > {self._cgroup}/cgroup.procs && exec "$@"'
            args = ["/bin/sh", "-c", join, "sh", *args]
        return args


def bash_tool(call: Callable[[str], str], workdir: str | None = None) -> Tool:
    """The ``bash`` tool: ``bash(command)`` is ``call(command)`` (``Shell.call``'s contract)
    in the workspace ``workdir`` (None: the task's)."""
    where = f"the task's workspace ({workdir})" if workdir else "the task's workspace"
    return Tool(
        "bash",
        f"Run a bash command in {where} and return its output (stdout and stderr). Files you "
        "write stay for the next calls.",
        {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command."}},
            "required": ["command"],
        },
        call,
    )


def _workspace_files(workdir: str, files: Mapping[str, bytes]) -> dict[str, bytes]:
    """``files`` by their paths relative to the folder ``workdir``; one outside is refused."""
    out = {}
    for path, data in files.items():
        if not isinstance(data, bytes):
            raise TypeError(f"files[{path!r}] must be bytes, got {type(data).__name__}")
        full = posixpath.normpath(posixpath.join(workdir, str(path)))
        if not full.startswith(workdir + "/"):
            raise ValueError(f"files: {path!r} is outside the workspace {workdir}")
        out[posixpath.relpath(full, workdir)] = data
    return out


def _pack(files: Mapping[str, bytes]) -> str:
    # The workspace's files as the server unpacks them: a gzipped tar, base64.
    import io
    import tarfile

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), 0o644, 0
            if content.startswith(b"#!"):
                info.mode = 0o755
            tar.addfile(info, io.BytesIO(content))
    return base64.b64encode(data.getvalue()).decode()
