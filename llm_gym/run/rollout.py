"""Rollouts of a model on a chat task, the job behind ``llm-gym rollout`` (README, "The
``llm-gym`` command": one vector env, one batched generation a step, episodes saved as they end).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from llm_gym.models import load_model
from llm_gym.run.config import RolloutConfig
from llm_gym.run.plots import plot_curves
from llm_gym.run.setup import charge_kl, make_sampler, resolve_device, resolve_dtype, task_envs

__all__ = [
    "ARRAYS",
    "EPISODES_FILE",
    "Episodes",
    "PLOT_FILE",
    "SUMMARY_FILE",
    "Rollout",
    "RolloutConfig",
    "Summary",
    "prepare_out",
    "summarize",
]

ARRAYS = ("conversation_ids", "policy_mask", "token_kl")  # Episodes' record keys JSON skips
EPISODES_FILE = "episodes.jsonl"
PROCEDURAL_EPISODES = 64  # the default for tasks without a fixed size
SUMMARY_FILE = "summary.json"
PLOT_FILE = "rollout.png"


@dataclass
class Summary:
    """What a rollout's episodes came to: the table ``llm-gym rollout`` prints."""

    episodes: int
    accuracy: float
    format_rate: float
    mean_reward: float
    mean_kl: float | None
    level: int | None
    tokens_per_second: float
    generated_tokens: int
    seconds: float
    tool_episode_share: float | None = None  # episodes with at least one tool call
    tool_calls_per_episode: float | None = None
    failed_tool_share: float | None = None  # of all calls

    def table(self) -> str:
        """The summary as aligned ``name  value`` lines."""
        kl = "n/a (no --ref-model)" if self.mean_kl is None else f"{self.mean_kl:.5f}"
        rows = [
            ("episodes", f"{self.episodes}"),
            ("accuracy", f"{self.accuracy:.3f}"),
            ("format rate", f"{self.format_rate:.3f}"),
            ("mean reward", f"{self.mean_reward:.4f}"),
            ("mean KL / token", kl),
        ]
        if self.level is not None:
            rows.append(("level (last episode)", f"{self.level}"))
        if self.tool_episode_share is not None:
            failed = self.failed_tool_share
            rows += [
                ("episodes with a tool call", f"{self.tool_episode_share:.3f}"),
                ("tool calls / episode", f"{self.tool_calls_per_episode:.2f}"),
                ("failed tool calls", "n/a (no calls)" if failed is None else f"{failed:.3f}"),
            ]
        rows.append(("tokens/s", f"{self.tokens_per_second:.1f}"))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def prepare_out(out: Path) -> Path:
    """Create the run folder with an empty episodes file and no earlier run's summary or plot
    (an interrupted run must not leave another run's summary beside its episodes)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (EPISODES_FILE, SUMMARY_FILE, PLOT_FILE):
        (out / name).unlink(missing_ok=True)
    return out / EPISODES_FILE


def _scalar(value: Any) -> Any:
    """A JSON-ready Python value for one env's info entry."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def _entry(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s values of a vector info, nested dicts (a task's metadata) included."""
    return {
        key: _entry(value, i) if isinstance(value, dict) else _scalar(value[i])
        for key, value in info.items()
        if not key.startswith("_")
    }


class Episodes:
    """The running episode of every sub-env of ``task_envs`` (SAME_STEP autoreset), and a
    record of each one that ends: an ``episodes.jsonl`` line plus the ``ARRAYS`` a trainer
    reads (``token_kl`` is None without a KL wrapper)."""

    def __init__(self, envs: Any, obs: dict[str, Any]) -> None:
        n = envs.num_envs
        self.envs, self.obs = envs, obs
        self.prompts = [list(h) for h in obs["history"]]
        self.responses: list[list[str]] = [[] for _ in range(n)]
        self.rewards = np.zeros(n)
        self.kl: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.tokens = np.zeros(n, dtype=np.int64)

    def step(self, actions: list[Any]) -> list[dict[str, Any]]:
        """Step every sub-env with its action (a ``Response``, or ``""``, which ends a sub-env's
        episode); the records of the episodes that ended (``obs`` moves on)."""
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        self.rewards += rewards
        for i, action in enumerate(actions):
            self.responses[i].append(getattr(action, "text", action))
            self.tokens[i] += len(getattr(action, "tokens", ()))
            if "kl" in info:
                self.kl[i].append(info["kl"][i])
        self.obs = obs
        return [self._finish(i, info) for i in np.flatnonzero(terminated | truncated).tolist()]

    def _finish(self, i: int, info: dict[str, Any]) -> dict[str, Any]:
        parts = _entry(info.get("final_info", {}), i)
        if "level" in info:  # the curriculum's level this episode was played at
            parts["level"] = _scalar(info["level"][i])
        kl = np.concatenate(self.kl[i]) if self.kl[i] else None
        # The task's own "reward" is kept as reward_task; "reward" is the episode's return,
        # KL penalty included.
        parts["reward_task"] = parts.pop("reward", None)
        final = info["final_obs"][i]
        if "num_tool_calls" in parts:  # the whole conversation, tool messages included
            parts["conversation"] = list(final["history"])
        record = {
            "env_index": i,
            "prompt": self.prompts[i],
            "response": self.responses[i][-1] if self.responses[i] else "",
            "responses": self.responses[i],
            "reward": float(self.rewards[i]),
            **parts,
            "num_tokens": int(self.tokens[i]),
            "kl_mean": None if kl is None or not len(kl) else float(kl.mean()),
            "kl_sum": None if kl is None else float(kl.sum()),
            "conversation_ids": np.asarray(final["tokens"]),
            "policy_mask": np.asarray(final["policy_mask"]).astype(np.bool_),
            "token_kl": kl,
        }
        self.prompts[i] = list(self.obs["history"][i])
        self.responses[i], self.kl[i] = [], []
        self.rewards[i], self.tokens[i] = 0.0, 0
        return record


class Rollout:
    """A prepared run (models, envs, run folder; any input error raised here); ``run()`` runs it."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        episodes = self.out / EPISODES_FILE  # two runs' episodes never mix in one file
        if episodes.exists() and not config.overwrite:
            done = sum(1 for line in episodes.read_text(encoding="utf-8").splitlines() if line)
            raise FileExistsError(
                f"{episodes} already holds {done} episodes from an earlier run; pass another "
                "--out, or --overwrite to start over"
            )
        device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
        model, tokenizer = load_model(config.model, device=device, dtype=dtype)
        context = getattr(model.config, "max_position_embeddings", None)
        if context is not None and config.max_new_tokens >= context:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {context} tokens"
            )
        self.policy = make_sampler(model, tokenizer, config)
        envs = task_envs(
            config, tokenizer, config.num_envs, split=config.split, data_dir=config.data_dir
        )
        if config.episodes is None:
            epoch = getattr(envs.unwrapped, "epoch_size", None)
            self.config = config = replace(config, episodes=epoch or PROCEDURAL_EPISODES)
        if config.ref_model is not None:
            envs = charge_kl(envs, config, config.ref_model)
        self.envs = envs
        self.episodes_path = prepare_out(self.out)

    def run(self) -> Summary:
        """Run the episodes; write episodes (as they finish), summary and plot."""
        torch.manual_seed(self.config.seed)
        try:
            items, seconds = self._collect()
        finally:
            self.envs.close()
        summary = summarize(items, seconds)
        record = {"config": asdict(self.config), "summary": asdict(summary)}
        (self.out / SUMMARY_FILE).write_text(json.dumps(record, indent=2) + "\n")
        plot_curves(items, ("reward", "kl_mean"), self.out / PLOT_FILE, "episode")
        return summary

    def _collect(self) -> tuple[list[dict[str, Any]], float]:
        config, envs, items = self.config, self.envs, []
        running = Episodes(envs, envs.reset(seed=config.seed)[0])
        bar = tqdm(
            total=config.episodes, unit="ep", disable=not config.progress, dynamic_ncols=True
        )
        start, generated, correct = time.perf_counter(), 0, 0
        with self.episodes_path.open("a", encoding="utf-8") as f:
            while len(items) < config.episodes:
                actions = self.policy(running.obs)
                generated += sum(len(a.tokens) for a in actions)
                for record in running.step(actions):
                    if len(items) == config.episodes:
                        break  # the last batch may finish more episodes than were asked for
                    kept = {key: value for key, value in record.items() if key not in ARRAYS}
                    record = {"episode": len(items), **kept}
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    f.flush()  # a line per finished episode, readable after Ctrl-C
                    items.append(record)
                    correct += bool(record.get("success", False))
                    bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix(
                    tok_s=f"{generated / elapsed:.1f}", acc=f"{correct / max(len(items), 1):.3f}"
                )
        bar.close()
        return items, time.perf_counter() - start


def summarize(items: list[dict[str, Any]], seconds: float) -> Summary:
    """The ``Summary`` of finished episodes' records, ``seconds`` after the start."""
    n = len(items)
    kls = [r["kl_mean"] for r in items if r.get("kl_mean") is not None]
    tokens = sum(r["num_tokens"] for r in items)
    tools: dict[str, float | None] = {}
    if n and all("num_tool_calls" in r for r in items):
        calls = [r["num_tool_calls"] for r in items]
        failed = sum(r["failed_tool_calls"] for r in items)
        tools = {
            "tool_episode_share": sum(c > 0 for c in calls) / n,
            "tool_calls_per_episode": sum(calls) / n,
            "failed_tool_share": failed / sum(calls) if sum(calls) else None,
        }
    return Summary(
        episodes=n,
        accuracy=sum(bool(r.get("success", False)) for r in items) / max(n, 1),
        format_rate=sum(float(r.get("reward_answer", 0.0)) > 0 for r in items) / max(n, 1),
        mean_reward=float(np.mean([r["reward"] for r in items])) if n else math.nan,
        mean_kl=float(np.mean(kls)) if kls else None,
        level=items[-1].get("level") if n else None,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
        generated_tokens=tokens,
        seconds=seconds,
        **tools,
    )
