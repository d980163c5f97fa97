"""Rollouts of a model on a chat task, the main job behind ``llm-gym rollout``.

N conversations run in one vector env (SAME_STEP autoreset, so no generation is thrown
away); the policy adapter generates all N responses in one batch; with a reference model a
vector KL wrapper charges the KL in one padded forward. Each finished episode is appended to
``episodes.jsonl`` at once, so the file is complete and readable after an interruption.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from llm_gym.models import load_model
from llm_gym.policies import TransformersPolicy
from llm_gym.train.setup import make_task_envs, resolve_device, resolve_dtype
from llm_gym.wrappers import vector as vector_wrappers

__all__ = ["RolloutConfig", "Rollout", "Summary", "run_rollout", "make_envs", "EPISODES_FILE"]

EPISODES_FILE = "episodes.jsonl"
PROCEDURAL_EPISODES = 64  # the default for tasks without a fixed size
SUMMARY_FILE = "summary.json"
PLOT_FILE = "rollout.png"


@dataclass
class RolloutConfig:
    """What ``llm-gym rollout`` was asked to do (its command-line options)."""

    env: str = "LLMChat-ReasoningGym-v0"  # procedural and offline: runs anywhere
    env_args: dict[str, Any] = field(default_factory=dict)
    split: str | None = None
    data_dir: str | None = None
    answer_format: str | None = None
    curriculum: int = 0  # the window of the difficulty curriculum; 0: off
    num_envs: int = 8
    episodes: int | None = None  # None: one epoch of a dataset split, else 64
    model: str = "default"
    ref_model: str | None = None
    kl_coef: float = 0.05
    estimator: str = "k1"
    max_new_tokens: int = 256
    temperature: float = 0.7
    tools: list[str] | None = None  # e.g. ["python"]: multi-turn episodes with tool calls
    max_tool_calls: int = 4
    tool_format: str = "hermes"
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    out: str = "runs/rollout"
    overwrite: bool = False
    progress: bool = True


@dataclass
class Summary:
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
        kl = "n/a (no --ref-model)" if self.mean_kl is None else f"{self.mean_kl:.5f}"
        rows = [
            ("episodes", f"{self.episodes}"),
            ("accuracy", f"{self.accuracy:.3f}"),
            ("format rate", f"{self.format_rate:.3f}"),
            ("mean reward", f"{self.mean_reward:.4f}"),
            ("mean KL / token", kl),
            *([("level (last episode)", f"{self.level}")] if self.level is not None else []),
            *self._tool_rows(),
            ("tokens/s", f"{self.tokens_per_second:.1f}"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def _tool_rows(self) -> list[tuple[str, str]]:
        if self.tool_episode_share is None:
            return []
        failed = self.failed_tool_share
        failed = "n/a (no calls)" if failed is None else f"{failed:.3f}"
        return [
            ("episodes with a tool call", f"{self.tool_episode_share:.3f}"),
            ("tool calls / episode", f"{self.tool_calls_per_episode:.2f}"),
            ("failed tool calls", failed),
        ]


def make_envs(config: RolloutConfig, tokenizer: Any) -> gym.vector.VectorEnv:
    """The task's vector env in tokens mode, with the curriculum when asked for."""
    tools = {}
    if config.tools:
        tools = {
            "tools": list(config.tools),
            "max_tool_calls": config.max_tool_calls,
            "tool_format": config.tool_format,
        }
    envs = make_task_envs(
        config.env, config.num_envs, tokenizer, config.env_args,
        split=config.split, data_dir=config.data_dir, answer_format=config.answer_format,
        **tools,
    )  # fmt: skip
    if config.curriculum:
        envs = vector_wrappers.DifficultyCurriculum(envs, window=config.curriculum)
    return envs


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse to mix two runs' episodes in one file."""
    episodes = out / EPISODES_FILE
    if episodes.exists() and not overwrite:
        with episodes.open(encoding="utf-8") as f:
            done = sum(1 for line in f if line.strip())
        raise FileExistsError(
            f"{episodes} already holds {done} episodes from an earlier run; pass another --out, "
            "or --overwrite to start over"
        )


def prepare_out(out: Path) -> Path:
    """Create the run folder with an empty episodes file and no earlier run's summary or plot
    (an interrupted run must not leave another run's summary beside its episodes)."""
    episodes = out / EPISODES_FILE
    out.mkdir(parents=True, exist_ok=True)
    for name in (EPISODES_FILE, SUMMARY_FILE, PLOT_FILE):
        (out / name).unlink(missing_ok=True)
    return episodes


def _scalar(value: Any) -> Any:
    """A JSON-ready Python value for one env's info entry."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _entry(info: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s values of a vector info, nested dicts (a task's metadata) included."""
    return {
        key: _entry(value, i) if isinstance(value, dict) else _scalar(value[i])
        for key, value in info.items()
        if not key.startswith("_")
    }


class _Episodes:
    """Per-env bookkeeping of running episodes, and the records of finished ones."""

    def __init__(self, num_envs: int, obs: dict[str, Any]) -> None:
        self.prompts = [list(h) for h in obs["history"]]
        self.responses: list[list[str]] = [[] for _ in range(num_envs)]
        self.rewards = np.zeros(num_envs)
        self.kl: list[list[np.ndarray]] = [[] for _ in range(num_envs)]
        self.tokens = np.zeros(num_envs, dtype=np.int64)

    def step(self, actions: list[Any], rewards: np.ndarray, info: dict[str, Any]) -> None:
        for i, action in enumerate(actions):
            self.responses[i].append(action.text)
            self.tokens[i] += len(action.tokens)
            if "kl" in info:
                self.kl[i].append(info["kl"][i])
        self.rewards += rewards

    def finish(self, i: int, info: dict[str, Any], next_obs: dict[str, Any]) -> dict[str, Any]:
        parts = _entry(info.get("final_info", {}), i)
        if "level" in info:  # the curriculum's level this episode was played at
            parts["level"] = _scalar(info["level"][i])
        kl = np.concatenate(self.kl[i]) if self.kl[i] else None
        # The task's own "reward" is kept as reward_task; "reward" is the episode's return,
        # KL penalty included.
        parts["reward_task"] = parts.pop("reward", None)
        if "num_tool_calls" in parts:  # the whole conversation, tool messages included
            parts["conversation"] = list(info["final_obs"][i]["history"])
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
        }
        self.prompts[i] = list(next_obs["history"][i])
        self.responses[i], self.kl[i] = [], []
        self.rewards[i], self.tokens[i] = 0.0, 0
        return record


class Rollout:
    """A prepared run: models loaded, envs made, run folder claimed; ``run()`` runs it.

    Everything that can fail on the user's input (ids, paths, data, values) fails here, in
    the constructor, before any generation.
    """

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        check_out(self.out, config.overwrite)
        device, dtype = resolve_device(config.device), resolve_dtype(config.dtype)
        model, tokenizer = load_model(config.model, device=device, dtype=dtype)
        context = getattr(model.config, "max_position_embeddings", None)
        if context is not None and config.max_new_tokens >= context:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {context} tokens"
            )
        generate_kwargs: dict[str, Any] = {"max_new_tokens": config.max_new_tokens}
        if config.temperature > 0:
            generate_kwargs.update(do_sample=True, temperature=config.temperature)
        else:
            generate_kwargs["do_sample"] = False
        self.policy = TransformersPolicy(
            model, tokenizer, input_mode="tokens", generate_kwargs=generate_kwargs
        )
        envs = make_envs(config, tokenizer)
        if config.episodes is None:
            epoch = getattr(envs.unwrapped, "epoch_size", None)
            self.config = config = replace(config, episodes=epoch or PROCEDURAL_EPISODES)
        if config.ref_model is not None:
            ref_model, ref_tokenizer = load_model(config.ref_model, device=device, dtype=dtype)
            ref = TransformersPolicy(ref_model, ref_tokenizer, input_mode="tokens", generate=False)
            envs = vector_wrappers.KLRewardWrapper(
                envs, ref, coef=config.kl_coef, estimator=config.estimator
            )
        self.envs = envs
        self.episodes_path = prepare_out(self.out)

    def run(self) -> Summary:
        """Run the episodes; write episodes (as they finish), summary and plot."""
        torch.manual_seed(self.config.seed)
        try:
            items, seconds = _collect(self.envs, self.policy, self.config, self.episodes_path)
        finally:
            self.envs.close()
        summary = summarize(items, seconds)
        (self.out / SUMMARY_FILE).write_text(
            json.dumps({"config": asdict(self.config), "summary": asdict(summary)}, indent=2) + "\n"
        )
        plot(items, self.out / PLOT_FILE)
        return summary


def run_rollout(config: RolloutConfig) -> Summary:
    """Run ``config.episodes`` episodes, writing episodes, summary and plot to ``config.out``."""
    return Rollout(config).run()


def _collect(
    envs: gym.vector.VectorEnv, policy: TransformersPolicy, config: RolloutConfig, path: Path
) -> tuple[list[dict[str, Any]], float]:
    items: list[dict[str, Any]] = []
    obs, _ = envs.reset(seed=config.seed)
    running = _Episodes(config.num_envs, obs)
    bar = tqdm(total=config.episodes, unit="ep", disable=not config.progress, dynamic_ncols=True)
    start, generated, correct = time.perf_counter(), 0, 0
    with path.open("a", encoding="utf-8") as f:
        while len(items) < config.episodes:
            actions = policy(obs)
            generated += sum(len(a.tokens) for a in actions)
            obs, rewards, terminated, truncated, info = envs.step(actions)
            running.step(actions, rewards, info)
            for i in np.flatnonzero(terminated | truncated).tolist():
                if len(items) == config.episodes:
                    break  # the last batch may finish more episodes than were asked for
                record = {"episode": len(items), **running.finish(i, info, obs)}
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
    n = len(items)
    kls = [r["kl_mean"] for r in items if r.get("kl_mean") is not None]
    tokens = sum(r["num_tokens"] for r in items)
    tools: dict[str, float | None] = {}
    if n and all("num_tool_calls" in r for r in items):
        calls = [r["num_tool_calls"] for r in items]
        tools = {
            "tool_episode_share": sum(c > 0 for c in calls) / n,
            "tool_calls_per_episode": sum(calls) / n,
            "failed_tool_share": (
                sum(r["failed_tool_calls"] for r in items) / sum(calls) if sum(calls) else None
            ),
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


def plot(items: list[dict[str, Any]], path: Path) -> None:
    """Reward and KL per episode, with running means, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    episodes = np.arange(len(items))
    rewards = np.array([r["reward"] for r in items], dtype=float)
    kl = np.array([np.nan if r["kl_mean"] is None else r["kl_mean"] for r in items], dtype=float)
    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for ax, values, name in ((axes[0], rewards, "reward"), (axes[1], kl, "KL / token")):
        ax.plot(episodes, values, ".", alpha=0.5, label=name)
        if len(values) and not np.isnan(values).all():
            running = np.cumsum(np.nan_to_num(values)) / np.arange(1, len(values) + 1)
            ax.plot(episodes, running, "-", label="running mean")
        ax.set_ylabel(name)
        ax.legend(loc="best")
    axes[1].set_xlabel("episode")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
