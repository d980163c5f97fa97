"""``llm-gym check-tasks``: each Harbor task's oracle (``solution/solve.sh``) played as the
policy of ``LLMChat-Terminal-v0``, and whether it scores 1: the check Harbor's authors run."""

from __future__ import annotations

import argparse
from typing import Any

from llm_gym.cli._args import usage_error
from llm_gym.options import number

__all__ = ["add_check_tasks", "check_tasks"]


def add_check_tasks(commands: Any) -> None:
    """``llm-gym check-tasks``'s parser."""
    parser = commands.add_parser(
        "check-tasks",
        help="play each Harbor task's solution/solve.sh as the policy; say whether it scores 1",
        description="Load every Harbor task in PATH as LLMChat-Terminal-v0 does (a Dockerfile "
        "that needs an image is refused by name), then play each task's solution/solve.sh as "
        "the policy's one command and run its tests/test.sh: a line per task with its reward. "
        "Exit 0 if every task scores 1, 1 if any does not, 2 for tasks that cannot load.",
    )
    add = parser.add_argument
    add("path", metavar="PATH", help="a Harbor task folder, or a folder of them")
    add("--command-timeout", type=number(float, 0, False), default=60.0, metavar="S",
        help="seconds solve.sh may run (default: %(default)s)")  # fmt: skip


def check_tasks(args: argparse.Namespace) -> int:
    """Play each task's oracle; print a line per task; 0 if all score 1, else 1."""
    from llm_gym.envs.terminal import TerminalEnv
    from llm_gym.tasks.harbor import HarborTaskError

    try:
        env = TerminalEnv(args.path, command_timeout=args.command_timeout, shuffle=False)
    except HarborTaskError as error:
        return usage_error(str(error))
    failed = 0
    with env:
        for name in sorted(env.tasks):
            env.reset(options={"item": {"task": name}})
            if not env.task_spec.solution:
                print(f"FAIL {name}: no solution/solve.sh")
                failed += 1
                continue
            _, _, _, _, info = env.step(env.oracle_action())
            solved = info["tool_calls"][0]
            _, reward, _, _, info = env.step("Done.")
            ok = reward >= 1.0
            failed += not ok
            why = info.get("verifier_note") or ("" if solved["ok"] else solved["output"][-200:])
            print(f"{'ok  ' if ok else 'FAIL'} {name}: reward {reward:g}"
                  + (f" ({why.strip()})" if why and not ok else ""))  # fmt: skip
    print(f"{len(env.tasks) - failed} of {len(env.tasks)} tasks score 1 with their solution")
    return 1 if failed else 0
