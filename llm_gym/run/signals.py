"""How a run meets the signals that stop it: Ctrl-C (``SIGINT``), a scheduler's or a
launcher's ``SIGTERM``, and the death of the launcher that started it.

Python turns only ``SIGINT`` into ``KeyboardInterrupt``; a ``SIGTERM`` kills the process
where it stands, with no summary written, the half-written checkpoint left and the run folder
still locked. Inside ``interruptible()`` both raise ``Interrupted`` (a ``KeyboardInterrupt``,
so every ``except KeyboardInterrupt`` of the run writes what it finished), and a run that has
begun to stop (``hold_signals()``) ignores the ones that follow: a terminal's Ctrl-C reaches
each process of a ``torchrun`` run twice, once from the terminal and once forwarded by the
launcher, and the second must not cut the first one's summary short. A stop that hangs still
ends with ``SIGKILL`` (torchrun sends it 30 seconds after its ``SIGTERM``).

A process that ``torchrun`` started stops on its own when the launcher dies (``SIGKILL``, a
lost terminal): ``watch_launcher()`` sends it a ``SIGTERM`` when its parent is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

__all__ = [
    "STOPPING_SIGNALS",
    "Interrupted",
    "deferred",
    "exit_code",
    "hold_signals",
    "interruptible",
    "interruption",
    "launcher_gone",
    "watch_launcher",
]

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Set once a run has begun to stop, until ``interruptible()`` ends (its signals are ignored).
_held = threading.Event()
_signalled: list[int] = []  # the stopping signal that arrived within ``interruptible()``
_parent: list[int] = []  # the launcher's process id, which ``watch_launcher()`` watches
_deferred: list[int] = []  # within ``deferred()``: the signals that arrived, for its end
_deferring = threading.Event()


class Interrupted(KeyboardInterrupt):
    """A stopping signal (``SIGINT`` or ``SIGTERM``), raised where the main thread was.

    >>> Interrupted(signal.SIGTERM).code, str(Interrupted(signal.SIGINT))
    (143, 'SIGINT')
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)  # args: what a copy of it (pickle, a pool's) is made from
        self.signum = int(signum)

    def __str__(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def code(self) -> int:
        """The shell's exit status of a process the signal stopped: 128 + its number."""
        return 128 + self.signum


def exit_code(error: KeyboardInterrupt) -> int:
    """The exit status for ``error``: 130 for Ctrl-C, 143 for ``SIGTERM``.

    >>> exit_code(KeyboardInterrupt()), exit_code(Interrupted(signal.SIGTERM))
    (130, 143)
    """
    return error.code if isinstance(error, Interrupted) else 128 + signal.SIGINT


def _raise(signum: int, frame: FrameType | None) -> None:
    if _held.is_set():  # the run is writing what it finished: let it
        return
    if _deferring.is_set():  # raised where ``deferred()`` ends
        _deferred.append(signum)
        return
    _held.set()
    _signalled.append(signum)
    raise Interrupted(signum)


def interruption(error: BaseException) -> KeyboardInterrupt | None:
    """The interruption behind ``error``: ``error`` itself when it is one; one that
    ``torch.distributed.checkpoint`` caught and passed on in its ``CheckpointException``
    (each rank's ``(exception, trace)`` in ``failures``); an ``Interrupted`` when a stopping
    signal arrived within ``interruptible()`` (a library's cleanup may have raised another
    error on its way out); else None.

    >>> interruption(ValueError("x")) is None
    True
    """
    if isinstance(error, KeyboardInterrupt):
        return error
    failures = getattr(error, "failures", None)
    for failure in failures.values() if isinstance(failures, dict) else ():
        if isinstance(failure, tuple) and isinstance(failure[0], KeyboardInterrupt):
            return failure[0]
    return Interrupted(_signalled[0]) if _signalled else None


def hold_signals() -> None:
    """From now until ``interruptible()`` ends, ignore its stopping signals: the run has
    begun to stop and writes what it finished. Without ``interruptible()``: nothing."""
    _held.set()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Within: a stopping signal waits, and is raised as ``Interrupted`` where the block ends
    (a few file renames that must not stop halfway). Without ``interruptible()``: nothing."""
    if _deferring.is_set():  # already within one
        yield
        return
    _deferring.set()
    try:
        yield
    finally:
        _deferring.clear()
    if _deferred and not _held.is_set():
        signum = _deferred[0]
        _deferred.clear()
        _raise(signum, None)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within: ``SIGINT`` and ``SIGTERM`` raise ``Interrupted`` (the first; the rest are
    ignored, as after ``hold_signals()``), unless the process ignores them already. Off the
    main thread, where Python lets no signal handler be set: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # One ignored already stays so: a shell starts a background job with SIGINT ignored.
    before = {
        signum: signal.signal(signum, _raise)
        for signum in STOPPING_SIGNALS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    _held.clear()
    _signalled.clear()
    _deferred.clear()
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        _held.clear()
        _signalled.clear()
        _deferred.clear()


def watch_launcher(every: float = 1.0) -> threading.Thread | None:
    """In a process that ``torchrun`` started (``TORCHELASTIC_RUN_ID`` is set), a daemon
    thread that sends this process ``SIGTERM`` once its parent, the launcher, is gone (the
    process is then a child of another, its parent id changed); None elsewhere. Polled every
    ``every`` seconds: Linux's ``PR_SET_PDEATHSIG`` would fire when the launcher's *thread*
    that started the process ends, not the launcher."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    parent = os.getppid()
    _parent[:] = [parent]

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="llm-gym-launcher-watch", daemon=True)
    thread.start()
    return thread


def launcher_gone() -> bool:
    """Whether the launcher that ``watch_launcher()`` watches is gone."""
    return bool(_parent) and os.getppid() != _parent[0]
