"""What forking an episode costs, per env kind: ``llm_gym.fork(env)`` mid-episode against the
naive copy, ``copy.deepcopy(env)`` (which copies the tokenizer, the dataset and the game's
modules along), and against one step of the same env, all measured in this run.

Each env is made as a user makes it (``gym.make``, wrappers included), reset, stepped twice,
then forked ``--repeats`` times; the median of each is printed with the ratio
fork / deepcopy (the target: well below 1 wherever the env holds a tokenizer or a dataset)
and fork / step. The native vector env's ``fork_env`` (one sub-env out of 16) is timed beside.

    python scripts/bench_fork.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym

import llm_gym
from llm_gym.lm.loading import load_default_model

CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kinds(tokenizer: object) -> dict[str, tuple[Callable[[], gym.Env], list[str]]]:
    tokens = {"input_mode": "tokens", "tokenizer": tokenizer}
    return {
        "chat (history)": (lambda: gym.make("LLMChat-v0", query="2+2?", max_turns=8), ["5", "4"]),
        "chat (tokens, tokenizer)": (
            lambda: gym.make("LLMChat-v0", query="2+2?", max_turns=8, **tokens), ["5", "4"],
        ),
        "GSM8K (tokens, 1319 questions)": (
            lambda: gym.make("LLMChat-GSM8K-v0", data_dir=str(SHARED_GSM8K), split="test",
                             max_turns=8, **tokens),
            ["Hmm.", "Let me see."],
        ),
        "reasoning-gym chain_sum": (
            lambda: gym.make("LLMChat-ReasoningGym-v0", task="chain_sum", max_turns=8, seed=0),
            ["Hmm.", "Let me see."],
        ),
        "TextArena GuessTheNumber": (
            lambda: gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0", max_turns=8),
            ["[3]", "[4]"],
        ),
        "tools (python interpreter)": (
            lambda: gym.make("LLMChat-v0", query="6*7?", tools=["python"], max_tool_calls=8),
            [CALL, CALL],
        ),
        # A sandbox of its own: a new bubblewrap sandbox and the workspace's tar through it.
        "terminal (shell, a sandbox)": (
            lambda: gym.make("LLMChat-Terminal-v0", level=0),
            ["```bash\nseq 1000 > numbers.txt\n```", "```bash\nwc -l numbers.txt\n```"],
        ),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--kinds", nargs="+", default=None, help="only these (name prefixes)")
    args = parser.parse_args(argv)
    _, tokenizer = load_default_model()
    print("| env | fork (ms) | deepcopy (ms) | fork / deepcopy | step (ms) | fork / step |")
    print("|---|---|---|---|---|---|")
    for name, (make, moves) in kinds(tokenizer).items():
        if args.kinds and not any(name.startswith(k) for k in args.kinds):
            continue
        env = make()
        env.reset(seed=0)
        for move in moves[:-1]:
            env.step(move)
        fork = median_seconds(lambda env=env: llm_gym.fork(env), args.repeats)
        try:  # a process (the terminal's sandbox) cannot be deep-copied at all
            naive = median_seconds(lambda env=env: copy.deepcopy(env), max(args.repeats // 20, 3))
        except TypeError:
            naive = math.nan

        def step(env: gym.Env = env, move: str = moves[-1]) -> None:
            llm_gym.fork(env).step(move)

        stepped = median_seconds(step, args.repeats) - fork  # a fork's step, less the fork
        print(f"| {name} | {fork * 1e3:.3f} | {naive * 1e3:.1f} | {fork / naive:.4f} "
              f"| {stepped * 1e3:.3f} | {fork / stepped:.2f} |", flush=True)  # fmt: skip
    if args.kinds:
        return 0
    envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=16, vectorization_mode="vector_entry_point",
                        data_dir=str(SHARED_GSM8K), split="test", max_turns=8,
                        input_mode="tokens", tokenizer=tokenizer)  # fmt: skip
    envs.reset(seed=0)
    fork = median_seconds(lambda: llm_gym.fork_sub_env(envs, 3), args.repeats)
    print(f"\nnative vector env (GSM8K, 16 sub-envs): fork_sub_env {fork * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
