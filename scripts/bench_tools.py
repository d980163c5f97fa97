"""Tool calls across a vector env: concurrent (the native vector env) against one by one
(Gymnasium's ``SyncVectorEnv`` over the same sub-envs).

Each of N sub-envs calls the sandboxed ``python`` tool with code that sleeps ``--seconds``
(or, with ``--tool function``, a plain function that sleeps). One by one a step costs about
N·t; side by side about t. Target: ratio >= 8 at N = 32.

    python scripts/bench_tools.py --num-envs 32 --seconds 1
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import sharded_env_fns
from llm_gym.tools import PythonInterpreter

ROWS = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(64)]


def nap(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "slept"


def step_seconds(envs: gym.vector.VectorEnv, action: str, repeats: int) -> float:
    """Best of ``repeats`` steps in which every sub-env makes the call (the episode is
    reset before each, so the call budget never runs out)."""
    best = float("inf")
    for _ in range(repeats):
        envs.reset(seed=0)
        start = time.perf_counter()
        _, _, _, _, info = envs.step([action] * envs.num_envs)
        best = min(best, time.perf_counter() - start)
        records = [r for step in info["tool_calls"] for r in step]
        assert all(r["ok"] for r in records), records[:1]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=1.0, help="what each call takes")
    parser.add_argument("--tool", choices=["python", "function"], default="python")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    if args.tool == "python":
        tools: list = ["python"]
        code = f"import time; time.sleep({args.seconds}); print('slept')"
        arguments = {"code": code}
    else:
        tools, arguments = [nap], {"seconds": args.seconds}
    name = "python" if args.tool == "python" else "nap"
    action = f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    kwargs = {"dataset": ROWS, "tools": tools}

    native = gym.make_vec("LLMChat-GSM8K-v0", num_envs=args.num_envs, **kwargs)
    sync = gym.vector.SyncVectorEnv(sharded_env_fns("LLMChat-GSM8K-v0", args.num_envs, **kwargs))
    concurrent = step_seconds(native, action, args.repeats)
    one_by_one = step_seconds(sync, action, 1)
    native.close()
    sync.close()

    isolation = PythonInterpreter().isolation if args.tool == "python" else "n/a"
    print(f"tool: {args.tool} (sandbox: {isolation}), each call {args.seconds:g} s, "
          f"N = {args.num_envs} sub-envs")  # fmt: skip
    print(f"one by one (SyncVectorEnv) step: {one_by_one:8.2f} s")
    print(f"concurrent (native vector) step: {concurrent:8.2f} s")
    print(f"ratio one-by-one / concurrent:   {one_by_one / concurrent:8.1f}x  (target >= 8x)")


if __name__ == "__main__":
    main()
