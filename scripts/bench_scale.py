"""Episodes/s of one task driven five ways, in one run: the synchronous vector env
(``DatasetChatVectorEnv``: every step waits for its slowest sub-env), the asynchronous driver
(``AsyncEpisodes``, sub-envs on threads) and Ray env workers (``AsyncEpisodes(ray_address=)``)
with 1, 2 and 4 workers; ratios against the synchronous vector env and against one worker.

Two tasks:
- waiting tool: item k asks the ``lookup`` tool for key k, which waits 0.5 s, or 2 s for every
  eighth item (k % 8 == 0). Unshuffled, sub-env 0 of 8 gets every slow item: one slow sub-env
  in eight. The policy is scripted (a tool call, then an answer after the tool's result), so
  the waits, not this 2-core CPU, are the limit: what is measured is how much waiting each
  driver hides. Each Ray worker holds 8 sub-envs (a machine's worth), so more workers run
  more conversations, as more machines would.
- the default task (``LLMChat-ReasoningGym-v0``) with the default model's greedy generation:
  the CPU is the limit here, and the drivers can only keep it as busy as the sync env does.

Run: ``.venv/bin/python scripts/bench_scale.py`` (about 4 minutes; ``--quick`` halves it).

Last run (2 cores, torch 2.13, Ray 2.60, a local Ray instance; episodes/s, / sync, / 1 worker):
waiting tool: sync 3.99; async 9.39 (2.36x); Ray 1 worker 9.24 (2.32x), 2 workers 17.14
(4.30x, 1.86x), 4 workers 33.00 (8.28x, 3.57x). Default task: sync 2.32; async 2.18 (0.94x);
Ray 1, 2, 4 workers 2.16, 2.14, 2.18 (0.93x, 0.92x, 0.94x). README, "Scaling out", reads them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from typing import Any

import gymnasium as gym

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
from llm_gym.episodes import AsyncEpisodes, Episodes

SLOW, FAST, SUB_ENVS = 2.0, 0.5, 8


def lookup(key: str) -> str:
    """Look a key up in a slow store.

    Args:
        key: What to look up.
    """
    time.sleep(SLOW if int(key) % SUB_ENVS == 0 else FAST)
    return f"value {key}"


def answered(response: str, sample: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    return float("value" in response), {"success": "value" in response}


def scripted(obs: dict[str, Any]) -> list[str]:
    """Calls the tool on the item's key, then answers with what it said."""
    out = []
    for history in obs["history"]:
        if history[-1]["role"] == "tool":
            out.append(f"<answer>{history[-1]['content']}</answer>")
        else:
            key = history[-1]["content"].split()[-1]
            call = {"name": "lookup", "arguments": {"key": key}}
            out.append(f"<tool_call>{json.dumps(call)}</tool_call>")
    return out


scripted.input_mode = "history"


def tool_env(items: int) -> DatasetChatEnv:
    rows = [{"query": f"Look up item {k}"} for k in range(items)]
    return DatasetChatEnv(rows, shuffle=False, tools=[lookup], max_turns=3, reward=answered)


def sync_rate(envs: Any, policy: Any, episodes: int, seed: int = 0) -> float:
    start = time.perf_counter()
    obs, _ = envs.reset(seed=seed)
    running, done = Episodes(envs, obs), 0
    while done < episodes:
        done += len(running.step(policy({policy.input_mode: running.obs[policy.input_mode]})))
    rate = done / (time.perf_counter() - start)
    envs.close()
    return rate


def async_rate(env_fn: Any, num_envs: int, policy: Any, episodes: int, **kwargs: Any) -> float:
    with AsyncEpisodes(env_fn, num_envs, policy, seed=0, **kwargs) as rollouts:
        start = time.perf_counter()  # the workers are up: their start is not the driver's
        count = sum(1 for _ in rollouts.play(episodes))
        return count / (time.perf_counter() - start)


def measure(name: str, sync: Any, run: Any, workers: tuple[int, ...]) -> dict[str, float]:
    rates = {"sync vector env": sync(), "async driver": run(None)}
    for w in workers:
        rates[f"Ray, {w} worker{'s' * (w > 1)}"] = run(w)
    base, one = rates["sync vector env"], rates.get("Ray, 1 worker")
    print(f"\n{name}")
    print(f"{'driver':<18} {'episodes/s':>10} {'/ sync':>7} {'/ 1 worker':>10}")
    for label, rate in rates.items():
        per_worker = f"{rate / one:9.2f}x" if one and label.startswith("Ray") else ""
        print(f"{label:<18} {rate:10.2f} {rate / base:6.2f}x {per_worker:>10}", flush=True)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes")
    parser.add_argument("--ray-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=args.ray_cpus, log_to_driver=False, include_dashboard=False)
    per_worker = 24 if args.quick else 48
    items = per_worker * 4
    tool_fn = functools.partial(tool_env, items)

    def tool_run(workers: int | None) -> float:
        if workers is None:
            return async_rate(tool_fn, SUB_ENVS, scripted, per_worker)
        return async_rate(tool_fn, SUB_ENVS * workers, scripted, per_worker * workers,
                          ray_address="local", workers=workers)  # fmt: skip

    measure(
        f"waiting tool ({FAST:g} s, {SLOW:g} s for one item in {SUB_ENVS}; {SUB_ENVS} sub-envs, "
        f"{SUB_ENVS} per Ray worker)",
        lambda: sync_rate(DatasetChatVectorEnv(tool_env(items), SUB_ENVS), scripted, per_worker),
        tool_run,
        (1, 2, 4),
    )

    from llm_gym.lm.loading import load_model
    from llm_gym.policies import TransformersPolicy

    model, tokenizer = load_model("default")
    kwargs = {"max_new_tokens": 24, "do_sample": False}
    policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    env_kwargs = {"input_mode": "tokens", "tokenizer": tokenizer,
                  "observation_keys": ("tokens", "history", "policy_mask")}  # fmt: skip
    env_fn = functools.partial(gym.make, "LLMChat-ReasoningGym-v0", **env_kwargs)
    episodes = 16 if args.quick else 32

    def default_run(workers: int | None) -> float:
        extra = {} if workers is None else {"ray_address": "local", "workers": workers}
        return async_rate(env_fn, SUB_ENVS, policy, episodes, **extra)

    measure(
        f"default task, default model, greedy, {kwargs['max_new_tokens']} new tokens, "
        f"{SUB_ENVS} sub-envs in all",
        lambda: sync_rate(
            gym.make_vec(
                "LLMChat-ReasoningGym-v0",
                num_envs=SUB_ENVS,
                vectorization_mode="vector_entry_point",
                **env_kwargs,
            ),
            policy,
            episodes,
        ),  # fmt: skip
        default_run,
        (1, 2, 4),
    )
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
