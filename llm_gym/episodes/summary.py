"""What finished episodes came to: ``summarize`` (the table ``llm-gym rollout`` prints, the
metrics an iteration of ``llm-gym train`` reports) and a rubric's part names
(``rubric_part_names``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_gym.envs import single_env
from llm_gym.episodes.episode import Episode
from llm_gym.rubrics import Rubric

__all__ = [
    "OUTCOMES",
    "Summary",
    "answer_format_held",
    "iteration_metrics",
    "ran_out",
    "rubric_part_names",
    "summarize",
    "zero_variance_share",
]

OUTCOMES = ("win", "draw", "loss", "unfinished")  # a game's end, as its env's info says
MAX_TURN_COLUMNS = 12  # the turns the table's "mean reward by turn" row shows


@dataclass
class Summary:
    """What a rollout's episodes came to: the table ``llm-gym rollout`` prints."""

    episodes: int
    accuracy: float
    # The share of episodes whose response held an answer in the asked format (None: the
    # task asks for none): ``answer_format_held``'s verdict, the ``part format`` row's meaning.
    format_rate: float | None
    mean_reward: float
    mean_kl: float | None
    level: int | None
    tokens_per_second: float
    generated_tokens: int
    seconds: float
    tool_episode_share: float | None = None  # episodes with at least one tool call
    tool_calls_per_episode: float | None = None
    failed_tool_share: float | None = None  # of all calls
    hint: str | None = None  # what to try when few responses follow the answer format
    worker_restarts: int | None = None  # Ray env workers that died and were replaced
    turns_per_episode: float | None = None  # assistant turns
    # Multi-turn episodes: the mean reward of each turn, over the episodes that reached it.
    turn_rewards: list[float] | None = None
    # Games: the share of episodes won, drawn, lost and cut by max_turns (None: no games).
    outcomes: dict[str, float] | None = None
    pass_rate: float | None = None  # code: episodes whose every test passed (None: no code)
    # A Rubric reward's parts: each one's mean over the episodes that have it (as paid or
    # reported: a gate's share held, a metric's mean), by name; and each judge's costs.
    parts: dict[str, float] | None = None
    judges: dict[str, dict[str, float]] | None = None

    def table(self) -> str:
        """The summary as aligned ``name  value`` lines, then the hint, if any."""
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines + ([self.hint] if self.hint else []))

    def rows(self) -> list[tuple[str, str]]:
        """The table's ``(name, value)`` rows, formatted (a report's numbers)."""
        kl = "n/a (no --ref-model)" if self.mean_kl is None else f"{self.mean_kl:.5f}"
        rate = "n/a (no answer format)" if self.format_rate is None else f"{self.format_rate:.3f}"
        rows = [
            ("episodes", f"{self.episodes}"),
            ("accuracy", f"{self.accuracy:.3f}"),
            ("format rate", rate),
            ("mean reward", f"{self.mean_reward:.4f}"),
            ("mean KL / token", kl),
        ]
        if self.level is not None:
            rows.append(("level (last episode)", f"{self.level}"))
        if self.turns_per_episode is not None and (
            self.turns_per_episode > 1 or self.tool_episode_share is not None
        ):  # multi-turn episodes
            rows.append(("turns / episode", f"{self.turns_per_episode:.2f}"))
        if self.turn_rewards is not None:
            by_turn = ", ".join(f"{mean:.3f}" for mean in self.turn_rewards[:MAX_TURN_COLUMNS])
            more = len(self.turn_rewards) > MAX_TURN_COLUMNS
            rows.append(("mean reward by turn", by_turn + (", ..." if more else "")))
        if self.pass_rate is not None:
            rows.append(("pass rate (all tests)", f"{self.pass_rate:.3f}"))
        if self.outcomes is not None:
            shares = " / ".join(f"{self.outcomes[name]:.3f}" for name in OUTCOMES)
            rows.append((" / ".join(OUTCOMES), shares))
        if self.tool_episode_share is not None:
            failed = self.failed_tool_share
            rows += [
                ("episodes with a tool call", f"{self.tool_episode_share:.3f}"),
                ("tool calls / episode", f"{self.tool_calls_per_episode:.2f}"),
                ("failed tool calls", "n/a (no calls)" if failed is None else f"{failed:.3f}"),
            ]
        for name, mean in (self.parts or {}).items():
            rows.append((f"part {name} (mean)", f"{mean:.4f}"))
        for name, cost in (self.judges or {}).items():
            per = cost["seconds"] / cost["calls"] if cost["calls"] else 0.0
            rows.append(
                (
                    f"{name}: calls / tokens / s",
                    f"{cost['calls']:.0f} / "
                    f"{cost['tokens']:.0f} / {cost['seconds']:.1f} ({per:.2f} s a call)",
                )
            )
            rows.append((f"{name}: cache hits / errors",
                         f"{cost['cache_hits']:.0f} / {cost['errors']:.0f}"))  # fmt: skip
        rows.append(("tokens/s", f"{self.tokens_per_second:.1f}"))
        if self.worker_restarts is not None:
            rows.append(("env worker restarts", f"{self.worker_restarts}"))
        return rows


def answer_format_held(record: Mapping[str, Any]) -> bool | None:
    """Whether an episode's response held an answer in the asked format: its reward's
    ``format`` gate held (a ``Rubric``'s part, the ``part format`` row; HumanEval's "code
    found"), else TorchRL's ``reward_answer`` was paid; None when the episode has neither
    (a task that asks for no format, such as IFEval).

    >>> answer_format_held({"format": 1.0, "pass_fraction": 0.0})
    True
    >>> answer_format_held({"reward_answer": 0.0}), answer_format_held({"followed": 1.0})
    (False, None)
    """
    for key in ("format", "reward_answer"):
        value = record.get(key)
        if isinstance(value, (int, float)):
            return float(value) > 0
    return None


def rubric_part_names(envs: Any) -> list[str]:
    """The part names of ``envs``' reward where it is a ``Rubric`` (the info keys that hold
    their values); none otherwise."""
    reward = getattr(single_env(envs), "reward", None)
    return [part.name for part in reward.parts] if isinstance(reward, Rubric) else []


def summarize(
    episodes: Sequence[Episode | Mapping[str, Any]], seconds: float, parts: Sequence[str] = ()
) -> Summary:
    """The ``Summary`` of finished ``episodes`` (``Episode``s or their records),
    ``seconds`` after the start; with the mean of each of a rubric's ``parts``
    (``rubric_part_names``) over the episodes that have it.

    >>> summarize([{"reward": 1.0, "success": True, "num_tokens": 4}], 2.0).tokens_per_second
    2.0
    """
    items = [e.record() if isinstance(e, Episode) else e for e in episodes]
    n = len(items)
    kls = [r["kl_mean"] for r in items if r.get("kl_mean") is not None]
    tokens = sum(r["num_tokens"] for r in items)
    turns = [len(r.get("responses", ())) for r in items]  # assistant turns of each
    extra: dict[str, Any] = {}  # tool and game rows, where the episodes have them
    if n and all("num_tool_calls" in r for r in items):
        calls = [r["num_tool_calls"] for r in items]
        failed = sum(r["failed_tool_calls"] for r in items)
        extra = {
            "tool_episode_share": sum(c > 0 for c in calls) / n,
            "tool_calls_per_episode": sum(calls) / n,
            "failed_tool_share": failed / sum(calls) if sum(calls) else None,
        }
    if n and all("tests" in r for r in items):  # code graded by its tests
        extra["pass_rate"] = sum(bool(r.get("success")) for r in items) / n
    means = {}
    for name in parts:
        values = [float(r[name]) for r in items if isinstance(r.get(name), (int, float))]
        if values:
            means[name] = float(np.mean(values))
    if means:
        extra["parts"] = means
    by_turn = [r["turn_rewards"] for r in items if r.get("turn_rewards")]
    if by_turn and max(map(len, by_turn)) > 1:  # each turn's mean, over those that reached it
        extra["turn_rewards"] = [
            float(np.mean([rewards[t] for rewards in by_turn if len(rewards) > t]))
            for t in range(max(map(len, by_turn)))
        ]
    ends = [r.get("outcome") for r in items]
    held = [h for h in map(answer_format_held, items) if h is not None]
    if n and any(end is not None for end in ends):
        extra["outcomes"] = {name: ends.count(name) / n for name in OUTCOMES}
    return Summary(
        episodes=n,
        accuracy=sum(bool(r.get("success", False)) for r in items) / max(n, 1),
        format_rate=sum(held) / len(held) if held else None,
        mean_reward=float(np.mean([r["reward"] for r in items])) if n else math.nan,
        mean_kl=float(np.mean(kls)) if kls else None,
        level=items[-1].get("level") if n else None,
        tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
        generated_tokens=tokens,
        seconds=seconds,
        turns_per_episode=float(np.mean(turns)) if n else None,
        **extra,
    )


def iteration_metrics(
    episodes: Sequence[Episode],
    seconds: float,
    parts: Sequence[str] = (),
    *,
    iteration: int,
    update: Mapping[str, Any],
    level: int | None = None,
    kl_coef: float | None = None,
    tools: bool = False,
    agent: bool = False,
    group_size: int = 1,
    max_new_tokens: int | None = None,
    eos_token_id: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A training iteration's metrics row: what its ``episodes`` came to (``seconds``: their
    sampling time) and what the ``update`` gave. The mean ``reward``, ``task_reward`` and
    ``success``; with a ``kl_coef`` the mean per-token ``kl``; the update's loss and
    diagnostics; ``response_tokens``, the task's ``level``, ``tokens_per_second``, the policy
    ``versions`` that sampled them; ``zero_variance_groups``, the share of the groups of
    ``group_size`` consecutive episodes whose rewards are all equal (no signal for GRPO);
    ``truncated_share``, the share whose last response ran to ``max_new_tokens`` without
    its ``eos_token_id``; the ``extra`` entries (``staleness``, ``sync_seconds``) not None; a
    rubric's ``parts``; with ``tools`` the tool calls' rates, with ``agent`` the agent's
    calls, segments and failures.

    >>> from llm_gym.episodes import Episode, Segment
    >>> def played(reward, ids):
    ...     mask = np.arange(len(ids)) >= 2
    ...     return Episode([], ["x"], reward, reward, {}, [Segment(np.array(ids), mask, None)],
    ...                    [0], int(mask.sum()))
    >>> batch = [played(1.0, [5, 6, 7, 9]), played(1.0, [5, 6, 7, 7]), played(0.0, [5, 6, 9])]
    >>> batch.append(played(1.0, [5, 6, 8, 8]))
    >>> row = iteration_metrics(batch, 1.0, iteration=0, update={}, group_size=2,
    ...                         max_new_tokens=2, eos_token_id=9)
    >>> row["zero_variance_groups"], row["truncated_share"]
    (0.5, 0.5)
    """
    summary = summarize(episodes, seconds, parts)
    kl = kl_coef is not None
    row: dict[str, Any] = {
        "iteration": iteration,
        "reward": summary.mean_reward,
        "task_reward": float(np.mean([e.reward_task or 0.0 for e in episodes])),
        "success": summary.accuracy,
        "kl": float(np.mean(np.concatenate([e.token_kl for e in episodes]))) if kl else None,
        "kl_coef": kl_coef,
        **update,
        "response_tokens": float(np.mean([e.policy_tokens for e in episodes])),
        "level": level,
        "tokens_per_second": summary.tokens_per_second,
        # the policy versions that sampled the episodes: the last update's, never older
        "versions": sorted({v for e in episodes for v in e.versions if v is not None}),
        "zero_variance_groups": zero_variance_share([e.reward for e in episodes], group_size),
    }
    if max_new_tokens is not None:
        cut = [ran_out(e, max_new_tokens, eos_token_id) for e in episodes]
        row["truncated_share"] = float(np.mean(cut)) if cut else 0.0
    row.update((key, value) for key, value in extra.items() if value is not None)
    if summary.parts:  # a rubric's parts, each one's mean over the iteration's episodes
        row["parts"] = summary.parts
    if agent:  # what the agent did: calls, segments, failures
        row["calls_per_episode"] = float(np.mean([e.num_calls for e in episodes]))
        row["segments_per_episode"] = float(np.mean([e.num_segments for e in episodes]))
        row["agent_errors"] = sum(e.error is not None for e in episodes)
    if tools:
        row["tool_calls_per_episode"] = summary.tool_calls_per_episode
        row["failed_tool_share"] = summary.failed_tool_share
    return row


def zero_variance_share(rewards: Sequence[float], group_size: int) -> float:
    """The share of the groups of ``group_size`` consecutive ``rewards`` whose rewards are all
    equal: GRPO's advantage is zero for each of their responses.

    >>> zero_variance_share([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2)
    0.6666666666666666
    """
    groups = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    return float(np.mean(groups.max(1) == groups.min(1))) if len(groups) else 0.0


def ran_out(episode: Episode, max_new_tokens: int, eos_token_id: int | None) -> bool:
    """Whether the budget cut ``episode``'s last response: its last run of policy tokens is
    ``max_new_tokens`` long and not ended by ``eos_token_id``."""
    if not episode.segments:
        return False
    last = episode.segments[-1]
    mask = np.asarray(last.policy_mask, dtype=bool)
    positions = np.flatnonzero(mask)
    if not len(positions):
        return False
    end = positions[-1]
    breaks = np.flatnonzero(~mask[: end + 1])
    start = breaks[-1] + 1 if len(breaks) else 0
    return bool(end + 1 - start >= max_new_tokens and int(last.ids[end]) != eos_token_id)
