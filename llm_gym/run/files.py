"""Writing a run's files so that a full disk, a read-only folder or one that vanished stops
the run with one line naming the path (``RunWriteError``) and leaves no half-written file:
whole files are written aside and renamed (``write_file``), a line file cuts a line it could
not finish (``LineFile``). This module imports nothing heavy."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "EPISODES_FILE",
    "LineFile",
    "Recorder",
    "RunWriteError",
    "told",
    "write_failure",
    "write_file",
    "write_text",
]

EPISODES_FILE = "episodes.jsonl"  # a line per finished episode (rollout; train --log-episodes)
_RUST_IO = re.compile(r"\(os error (\d+)\)")  # how safetensors (Rust) reports an I/O error


class RunWriteError(OSError):
    """A run's file or folder could not be written (disk full, read-only, gone); its message
    is one line naming the path."""

    def __str__(self) -> str:
        return str(self.strerror)


class Recorder:
    """A binary file wrapper that keeps the ``OSError`` of a failed write: ``torch.save``
    turns it into a RuntimeError without the errno ("unexpected pos ...")."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: Any) -> int:
        # A short write (a file size limit, a disk filling up) is written on: the next write
        # raises the OSError that says why, where torch's writer would only see a short count.
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                written = self.file.write(view[done:])
                if not written:
                    break
                done += written
        except OSError as error:
            self.error = error
            raise
        return done

    def flush(self) -> None:
        self.file.flush()

    def __getattr__(self, name: str) -> Any:  # tell, fileno, close: the file's own
        return getattr(self.file, name)


def _errno(error: BaseException) -> int | None:
    # The errno of `error` or of what it was raised from, or a Rust I/O error's in its message
    # (safetensors'). Not __context__: a bug raised while handling an I/O error is a bug.
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno:
            return seen.errno
        match = _RUST_IO.search(str(seen))
        if match:
            return int(match.group(1))
        seen = seen.__cause__
    return None


def _probe(path: Path) -> int | None:
    # What is wrong with the folder `path` is written in, when the error did not say.
    folder = path.parent
    if not folder.is_dir():
        return errno.ENOENT
    try:
        stats = os.statvfs(folder)
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail == 0:
        return errno.ENOSPC
    if not os.access(folder, os.W_OK):
        return errno.EACCES
    return None


def write_failure(path: str | os.PathLike[str], error: BaseException) -> RunWriteError | None:
    """The one-line ``RunWriteError`` for ``error`` raised while writing ``path``, when it
    was the file system's doing (an errno, or a folder now full, read-only or gone); None
    for any other error (a bug, which should keep its traceback)."""
    if isinstance(error, RunWriteError):
        return error
    path = Path(path)
    code = _errno(error) if isinstance(error, Exception) else None
    if code is None and isinstance(error, Exception):
        code = _probe(path)
    if code is None:
        return None
    reason = os.strerror(code)
    if code == errno.ENOENT and not path.parent.is_dir():
        reason += f" (the folder {path.parent} does not exist)"
    return RunWriteError(code, f"could not write {path}: {reason}", str(path))


def told(summary: Path, unwritten: list[RunWriteError]) -> str:
    """What became of a stopped run's ``summary`` file, given the files it could not write."""
    failed = next((e for e in unwritten if e.filename == str(summary)), None)
    if failed is None:
        return f"{summary} marks the run interrupted"
    return f"the summary {summary} could not be written either"


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a folder that turned read-only or vanished: nothing left to remove
        pass


def write_file(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Have ``write(aside)`` write the file ``path`` under a hidden name beside it, then rename
    it into place: a failure leaves the previous ``path`` (if any) and no partial file; a
    file-system failure raises a one-line ``RunWriteError``."""
    path = Path(path)
    aside = path.with_name(f".{path.stem}.partial{path.suffix}")  # keeps the suffix: format
    try:
        write(aside)
        os.replace(aside, path)
    except BaseException as error:
        _unlink(aside)
        failure = write_failure(path, error)
        if failure is None or failure is error:
            raise
        raise failure from error
    return path


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """``write_file`` of ``text`` (UTF-8)."""
    return write_file(path, lambda aside: aside.write_text(text, encoding="utf-8"))


class LineFile:
    """A file of lines written one whole line at a time (``"a"``: appended, ``"w"``: from
    empty): a line the disk could not take is cut off again, so a reader never finds half a
    line, and the failure is a one-line ``RunWriteError``. Unbuffered: each line is on disk
    (in the OS's cache) when ``write`` returns, readable after Ctrl-C."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "a") -> None:
        if mode not in ("a", "w"):
            raise ValueError(f"mode must be 'a' or 'w', got {mode!r}")
        self.path = Path(path)
        try:
            self._file = open(self.path, mode + "b", buffering=0)  # noqa: SIM115 (closed in close)
        except OSError as error:
            raise write_failure(self.path, error) or error from None

    def write(self, line: str) -> None:
        """Append ``line`` (a newline is added) whole, or not at all."""
        data = memoryview((line + "\n").encode("utf-8"))
        start = self._file.seek(0, os.SEEK_END)
        try:
            while data:
                data = data[self._file.write(data) :]
        except OSError as error:
            try:
                os.ftruncate(self._file.fileno(), start)
            except OSError:
                pass
            raise write_failure(self.path, error) or error from None

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> LineFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
