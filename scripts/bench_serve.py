"""Cost of an env step over OpenEnv's wire (``llm-gym serve``) against the same step in
process, at 1, 64 and 256 concurrent sessions, and with a tool that waits 1 s.

The server runs in a process of its own (``llm_gym.integrations.openenv_server.Server``,
OpenEnv's ``create_app`` under uvicorn, loopback only); the clients are OpenEnv's own
``GenericEnvClient`` in asyncio, one per session, in this process. A session plays episodes of
``LLMChat-Countdown-v0`` (level 0, procedural: nothing to download): reset(seed), then one step
with the answer ``<answer>1 + 2</answer>``. The in-process baseline steps the same episodes of
``gym.make`` in a loop. Per step: latency (p50, p99) and steps/s; "added" is the wire's p50
minus the in-process p50. Every served episode is checked against its in-process twin (same
seed: same prompt, reward and info), and every episode asked for must come back (none lost).

The "step" rows are closed-loop: every session sends its next step as soon as the last one
is answered, so at 64 sessions the 2 cores are saturated and a step's latency is mostly its
wait behind the others. The "paced" rows keep the same sessions open but send steps at a fixed
total rate below saturation (``--rate``), which is what a trainer's env workers do between
generations: their added p50 is the wire's cost per step under that load.

The tool rows give every session a tool that sleeps 1 s (a slow sandbox, a web call): the
first step calls it (hermes format), the second answers. With one env per session stepped on
its own thread, N sessions should take ~1 s a round, not N s.

Usage::

    python scripts/bench_serve.py [--sessions 1 64 256] [--episodes 4] [--tool-sessions 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time

import gymnasium as gym
import numpy as np

ENV, ARGS = "LLMChat-Countdown-v0", {"level": 0}
ANSWER = "<answer>1 + 2</answer>"
TOOL_CALL = '<tool_call>{"name": "wait", "arguments": {"seconds": 1.0}}</tool_call>'


def wait(seconds: float) -> str:
    """Wait, as a slow tool does.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "done"


def env_args(tool: bool) -> dict:
    if not tool:
        return dict(ARGS)
    from llm_gym.tools import Tool

    return {**ARGS, "tools": [Tool.from_function(wait)], "max_turns": 3}


def serve(tool: bool, sessions: int, ports: multiprocessing.Queue) -> None:
    from llm_gym.integrations.openenv_server import Server

    server = Server(ENV, env_args(tool), port=0, max_sessions=sessions, ping_interval=60)
    server.start()
    ports.put(server.url)
    server.wait()


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def in_process(episodes: int, tool: bool) -> tuple[list[float], dict[int, tuple]]:
    """Per-step seconds and each seed's (prompt, reward, info) in this process."""
    import llm_gym  # noqa: F401

    env = gym.make(ENV, **env_args(tool))
    times, twins = [], {}
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        actions = [TOOL_CALL, ANSWER] if tool else [ANSWER]
        for action in actions:
            start = time.perf_counter()
            _, reward, terminated, truncated, info = env.step(action)
            times.append(time.perf_counter() - start)
        twins[seed] = (obs["history"][-1]["content"], float(reward), json.dumps(info))
    env.close()
    return times, twins


async def session(
    url: str, seeds: list[int], tool: bool, out: list, spans: list, interval: float, offset: float
) -> None:
    from openenv import GenericEnvClient

    async with GenericEnvClient(base_url=url, message_timeout_s=120) as client:
        due = time.perf_counter() + offset
        for seed in seeds:
            first = await client.reset(seed=seed)
            actions = [TOOL_CALL, ANSWER] if tool else [ANSWER]
            for action in actions:
                if interval:  # paced: this session's next step is due then, not at once
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    due += interval
                start = time.perf_counter()
                result = await client.step({"text": action})
                spans.append((start, time.perf_counter()))
            info = json.dumps(result.observation["info"])
            out.append((seed, first.observation["history"][-1]["content"], result.reward, info))


async def over_the_wire(
    url: str, sessions: int, episodes: int, tool: bool, rate: float | None
) -> tuple:
    out: list = []
    spans: list[tuple[float, float]] = []  # each step's start and end
    interval = sessions / rate if rate else 0.0  # each session's time between steps
    await asyncio.gather(
        *(
            session(
                url,
                list(range(i * episodes, (i + 1) * episodes)),
                tool,
                out,
                spans,
                interval,
                1.0 + i * interval / sessions,
            )  # fmt: skip
            for i in range(sessions)
        )
    )
    # steps/s over the span from the first step's start to the last one's end
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    return out, [end - start for start, end in spans], seconds


def run(sessions: int, episodes: int, tool: bool, rate: float | None = None) -> dict:
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(tool, sessions, ports), daemon=True)
    server.start()
    try:
        url = ports.get(timeout=120)
        out, steps, seconds = asyncio.run(over_the_wire(url, sessions, episodes, tool, rate))
    finally:
        server.terminate()
        server.join(timeout=10)
    local, twins = in_process(sessions * episodes, tool)
    equal = sum((prompt, reward, info) == twins[seed] for seed, prompt, reward, info in out)
    return {
        "sessions": sessions,
        "steps": len(steps),
        "steps_s": len(steps) / seconds,
        "p50_ms": 1e3 * percentile(steps, 50),
        "p99_ms": 1e3 * percentile(steps, 99),
        "local_p50_ms": 1e3 * percentile(local, 50),
        "local_steps_s": len(local) / sum(local),
        "equal": equal,
        "asked": sessions * episodes,
        "lost": sessions * episodes - len(out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per session")
    parser.add_argument("--tool-sessions", type=int, nargs="*", default=[1, 64])
    parser.add_argument("--paced-sessions", type=int, nargs="*", default=[64])
    parser.add_argument("--rate", type=float, default=400.0, help="paced rows: steps/s in all")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; {ENV} {ARGS}; server in its own process; OpenEnv clients")
    header = (
        f"{'case':<14}{'sessions':>9}{'steps':>7}{'steps/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'in-proc p50':>13}{'added p50':>11}{'equal':>11}{'lost':>6}"
    )
    print(header + "\n" + "-" * len(header))
    cases = [("step", n, False, None) for n in args.sessions]
    cases += [(f"paced {args.rate:g}/s", n, False, args.rate) for n in args.paced_sessions]
    cases += [("tool 1 s", n, True, None) for n in args.tool_sessions]
    for name, sessions, tool, rate in cases:
        episodes = 1 if tool else args.episodes
        r = run(sessions, episodes, tool, rate)
        added = r["p50_ms"] - r["local_p50_ms"]
        print(
            f"{name:<14}{r['sessions']:>9}{r['steps']:>7}{r['steps_s']:>10.1f}{r['p50_ms']:>9.2f}"
            f"{r['p99_ms']:>9.2f}{r['local_p50_ms']:>13.3f}{added:>11.2f}"
            f"{r['equal']:>6}/{r['asked']:<4}{r['lost']:>6}",
            flush=True,
        )
    print(
        "added p50 = wire p50 - in-process p50 per step (goal <= 2 ms at 64 sessions); "
        "equal: episodes whose prompt, reward and info equal the in-process twin's"
    )


if __name__ == "__main__":
    main()
