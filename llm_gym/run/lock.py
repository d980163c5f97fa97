"""One process at a time in a run folder: ``FolderLock`` holds ``<out>/.llm-gym.lock`` (an
``fcntl.flock`` on it, and the owner's pid and host in it) from a run's setup to its end, so
that a second run into the same ``--out`` (``--overwrite`` or not) fails at once instead of
mixing its files with the first's or deleting them. The kernel drops a flock when its process
dies, however it dies: a lock file left by a dead process is taken over, with a message."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from llm_gym.run.files import write_failure

__all__ = ["LOCK_FILE", "FolderInUse", "FolderLock"]

LOCK_FILE = ".llm-gym.lock"
_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


class FolderInUse(FileExistsError):
    """Another run holds the run folder; the message names it and the owner's pid."""

    def __str__(self) -> str:
        return str(self.strerror)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _owner(path: Path) -> dict[str, Any]:
    try:
        owner = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _release(fd: int, path: Path, created: list[Path], pid: int) -> None:
    # Module level, holding no reference to the lock: weakref.finalize calls it too.
    if os.getpid() != pid:  # a forked child exiting: the lock is its parent's
        return
    try:
        if os.fstat(fd).st_ino == path.stat().st_ino:  # still our file, not a successor's
            path.unlink()
    except OSError:  # the folder vanished or turned read-only: the flock goes all the same
        pass
    os.close(fd)
    for folder in created:  # made for this run and left empty: a run that never started
        try:
            folder.rmdir()
        except OSError:
            break


class FolderLock:
    """Hold the run folder ``out`` for this process (created if missing) until ``release``,
    or until the process ends; ``flag`` names the folder's option in messages.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> lock = FolderLock(out)
    >>> FolderLock(out)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    llm_gym.run.lock.FolderInUse: --out ... is in use by another run: process ... on ...
    >>> lock.release()
    >>> FolderLock(out).release()
    """

    def __init__(self, out: str | os.PathLike[str], flag: str = "--out") -> None:
        self.out, self.path = Path(out), Path(out) / LOCK_FILE
        if self.out.exists() and not self.out.is_dir():
            raise NotADirectoryError(f"{flag} {self.out} is a file; expected a folder")
        missing = [p for p in (self.out, *self.out.parents) if not p.exists()]
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise (write_failure(self.path, error) or error) from None
        for _ in range(10):  # a release between our open and flock unlinks the file: again
            fd = self._open()
            owner = _owner(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno not in _BUSY:  # a file system without flock: the pid decides
                    if self._foreign(owner):
                        os.close(fd)
                        raise self._busy(flag, owner) from None
                else:
                    os.close(fd)
                    if not owner:  # it has the file and not yet written itself in: a moment
                        time.sleep(0.2)
                        owner = _owner(self.path)
                    raise self._busy(flag, owner) from None
            try:
                same = os.fstat(fd).st_ino == self.path.stat().st_ino
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise FolderInUse(errno.EBUSY, f"{flag} {self.out}: could not take {self.path}")
        pid, host = _me()
        before, where = owner.get("pid"), owner.get("host")
        if isinstance(before, int) and (before, where) != (pid, host):
            dead = where == host and not _alive(before)
            print(
                f"llm-gym: {self.out}: taking over the lock of process {before} on {where}, "
                f"which {'is no longer running' if dead else 'no longer holds it'}",
                file=sys.stderr,
            )
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps({"pid": pid, "host": host, "argv": sys.argv}) + "\n").encode())
        except OSError as error:  # a full disk: no lock held, nothing left open
            os.close(fd)
            raise (write_failure(self.path, error) or error) from None
        self._finalizer = weakref.finalize(self, _release, fd, self.path, missing, pid)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise (write_failure(self.path, error) or error) from None

    @staticmethod
    def _foreign(owner: dict[str, Any]) -> bool:
        # Held by a live process other than this one (checked without flock).
        pid, host = owner.get("pid"), owner.get("host")
        if not isinstance(pid, int) or (pid, host) == _me():
            return False
        return host != socket.gethostname() or _alive(pid)

    def _busy(self, flag: str, owner: dict[str, Any]) -> FolderInUse:
        pid, host = owner.get("pid", "unknown"), owner.get("host", "unknown host")
        this = " (this process)" if (pid, host) == _me() else ""
        return FolderInUse(
            errno.EBUSY,
            f"{flag} {self.out} is in use by another run: process {pid} on {host}{this} "
            f"holds {self.path}; wait for it to end or pass another {flag}",
        )

    @property
    def held(self) -> bool:
        """Whether this lock still holds the folder."""
        return self._finalizer.alive

    def release(self) -> None:
        """Let the folder go (again: nothing); a folder this lock created and nothing else
        filled is removed."""
        self._finalizer()


def _me() -> tuple[int, str]:
    return os.getpid(), socket.gethostname()
