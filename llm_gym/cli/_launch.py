"""``llm-gym train --nproc-per-node N``: the same command in N processes through
``torch.distributed.run`` (torchrun), which sets each one's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous, as ``torchrun --nproc-per-node N -m llm_gym train ...``
does; under it the launch flags say nothing.

A run of several processes stops as one process does. Ctrl-C or a ``SIGTERM`` to the launcher
reaches every process (torchrun forwards it), each writes what it finished, the first says so
in one line, and the launcher exits 130 or 143. A process that dies on its own stops the others
(torchrun sends them ``SIGTERM``; one blocked in a collective sees its peer gone): a process
killed by a signal could say nothing, so the launcher says which one it was, in one line, and
exits as the shell would (128 + the signal); one that failed said its own error, and its code is
the launcher's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

from llm_gym.cli._args import usage_error

__all__ = ["DEFAULT_MASTER_PORT", "LAUNCHED", "launch", "processes"]

DEFAULT_MASTER_PORT = 29500  # torchrun's, with --master-addr and no --master-port
# Set for the processes this launcher starts: the launcher speaks for a process that died, so
# the others do not say it again.
LAUNCHED = "LLM_GYM_LAUNCHED"


def processes(args: argparse.Namespace, config: Any) -> int:
    """The processes of a ``train`` run across devices (1: this one), its flags checked."""
    if args.command != "train":
        return 1
    world = args.nproc_per_node * args.nnodes
    if args.node_rank >= args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} must be below --nnodes {args.nnodes}")
    if args.nnodes > 1 and args.master_addr is None:
        raise ValueError(
            f"--nnodes {args.nnodes} needs --master-addr: the address of --node-rank 0's "
            "machine, which every machine can reach"
        )
    config.check_world(world, f" (--nproc-per-node {args.nproc_per_node} x --nnodes {args.nnodes})")
    return world


def launch(args: argparse.Namespace, argv: list[str], kept: Callable[[], str]) -> int:
    """Run ``llm-gym`` with ``argv`` in ``--nproc-per-node`` processes on this machine (the
    node ``--node-rank`` of ``--nnodes``); the exit code. ``kept()`` says, once the run has
    stopped, where what it finished is."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    launcher = ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", str(args.nnodes)]
    if args.master_addr is None and args.master_port is None:  # a free port, the launcher's
        launcher += ["--standalone"]
    else:  # one machine with a port given: the rendezvous on this one
        host, port = args.master_addr or "127.0.0.1", args.master_port or DEFAULT_MASTER_PORT
        if args.node_rank == 0 and (busy := _port_taken(host, port)):
            return usage_error(
                f"--master-port {port} on {host} cannot be taken for the rendezvous ({busy}): "
                "pass a free port, or leave out --master-addr and --master-port on one machine"
            )
        launcher += ["--node-rank", str(args.node_rank), "--master-addr", host,
                     "--master-port", str(port)]  # fmt: skip
    try:
        with _launched(), _quiet_launcher():
            run(get_args_parser().parse_args([*launcher, "-m", "llm_gym", *argv]))
    except ChildFailedError as error:
        rank, code = _root_cause({rank: f.exitcode for rank, f in error.failures.items()})
        if code < 0:  # killed: it could not say so itself
            killed = f"process {rank} of the run was killed by {signal.Signals(-code).name}"
            return usage_error(f"{killed}; {kept()}", 128 - code)
        return code
    except (SignalException, KeyboardInterrupt) as error:  # each process stopped as one does
        print(f"llm-gym: interrupted; {kept()}", file=sys.stderr)
        return 128 + int(getattr(error, "sigval", signal.SIGINT))
    return 0


def _root_cause(codes: dict[int, int]) -> tuple[int, int]:
    """The failed process (rank, exit code) that stopped the run: a process killed by a
    signal other than the SIGTERM and SIGINT that torchrun sends the others, else the first.

    >>> _root_cause({0: 1, 1: -9})
    (1, -9)
    >>> _root_cause({0: -15, 1: 3})
    (1, 3)
    """
    sent = (-signal.SIGTERM, -signal.SIGINT)
    killed = [rank for rank, code in sorted(codes.items()) if code < 0 and code not in sent]
    failed = [rank for rank, code in sorted(codes.items()) if code > 0]
    rank = (killed or failed or sorted(codes))[0]
    return rank, codes[rank] or 1


@contextlib.contextmanager
def _launched() -> Iterator[None]:
    # The processes inherit the launcher's environment.
    before = os.environ.get(LAUNCHED)
    os.environ[LAUNCHED] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[LAUNCHED]
        else:
            os.environ[LAUNCHED] = before


@contextlib.contextmanager
def _quiet_launcher() -> Iterator[None]:
    # torchrun's agent logs each signal it forwards and each process it stops; the processes
    # and this launcher's one line say what happened.
    # Each of its modules' loggers has its own level (torch's get_logger sets it).
    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _port_taken(host: str, port: int) -> str | None:
    # Why the rendezvous could not listen on host:port, where host is this machine (None:
    # free, or another machine's, which only that machine can tell).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as error:
        if error.errno == errno.EADDRNOTAVAIL:  # not an address of this machine
            return None
        return error.strerror or str(error)
    return None
