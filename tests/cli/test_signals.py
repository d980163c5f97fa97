"""``llm_gym.run.signals``: SIGTERM raised as Ctrl-C is, the signals after the first ignored
while a run writes what it finished, a rename that waits for its end, the interruption a
library passed on inside its own error, and the watch on a launcher."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llm_gym.run.signals import (
    Interrupted,
    deferred,
    exit_code,
    hold_signals,
    interruptible,
    interruption,
    launcher_gone,
    watch_launcher,
)


def deliver():
    # Python runs a signal's handler in the main thread between bytecodes; a sleep is some.
    time.sleep(0.05)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopping_signal_raises_interrupted_with_the_shells_exit_code(signum, code):
    with pytest.raises(Interrupted) as raised, interruptible():
        os.kill(os.getpid(), signum)
        deliver()
    assert raised.value.signum == signum and exit_code(raised.value) == code
    assert isinstance(raised.value, KeyboardInterrupt) and str(raised.value) == signum.name
    assert interruption(ValueError("after the run")) is None  # the context's record is gone


def test_the_signals_after_the_first_are_ignored_until_the_context_ends():
    seen, given = [], signal.getsignal(signal.SIGTERM)  # a library may have set one
    with interruptible():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            deliver()
        except Interrupted as error:
            seen.append(error.signum)
            os.kill(os.getpid(), signal.SIGINT)  # the launcher's forwarded copy, say
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("wrote the summary")
        # A library's error on its way out is the interruption it stood for.
        assert interruption(RuntimeError("gloo: Connection closed")).signum == signal.SIGTERM
    assert seen == [signal.SIGTERM, "wrote the summary"]
    assert signal.getsignal(signal.SIGTERM) is given  # the handlers given back


def test_a_held_run_ignores_signals_and_a_deferred_block_raises_at_its_end():
    steps = []
    with pytest.raises(Interrupted), interruptible():
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            deliver()
            steps.append("renamed")
        steps.append("never")
    assert steps == ["renamed"]
    with interruptible():
        hold_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        deliver()
        steps.append("held")
    assert steps == ["renamed", "held"]


def test_the_interruption_inside_a_checkpoint_exception_is_found():
    from torch.distributed.checkpoint.api import CheckpointException

    stop = KeyboardInterrupt()
    wrapped = CheckpointException("write_data", {0: (RuntimeError("zip"), None), 1: (stop, None)})
    assert interruption(wrapped) is stop
    assert interruption(CheckpointException("write_data", {0: (OSError(28, "full"), None)})) is None


def test_a_process_whose_launcher_dies_gets_sigterm():
    # A launcher that starts a child and dies at once; the child, under the watch, is stopped
    # by the SIGTERM that the watch sends when its parent is gone.
    child = textwrap.dedent("""
        import os, sys, time
        os.environ["TORCHELASTIC_RUN_ID"] = "test"
        from llm_gym.run.signals import Interrupted, interruptible, launcher_gone, watch_launcher
        with interruptible():
            watch_launcher(every=0.05)
            print("watching", flush=True)
            try:
                time.sleep(60)
            except Interrupted as error:
                print(f"stopped by {error}, launcher gone: {launcher_gone()}", flush=True)
    """)
    launcher = (
        "import subprocess, sys; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=sys.stdout); "
        "print(sys.stdin.readline(), end='')"  # the test closes stdin once the child watches
    )
    process = subprocess.Popen(
        [sys.executable, "-c", launcher], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "watching\n"
    process.kill()  # the launcher dies; its child stops within its polling interval
    process.wait()
    assert process.stdout.read() == "stopped by SIGTERM, launcher gone: True\n"
    assert watch_launcher() is None and not launcher_gone()  # not under torchrun: no watch


def test_a_background_jobs_ignored_sigint_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interruptible():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            deliver()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
