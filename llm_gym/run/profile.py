"""What a model scores on an env, level by level: the job behind ``llm-gym profile``
(docs/envs/cards.md). Each level's ``episodes`` questions are answered greedily once and
``samples`` times at the run's temperature; the card says the greedy success, pass@1 and
pass@K (Chen et al., 2021's unbiased estimator), the mean reward, each with its standard error
over the questions, the mean response tokens, the share of responses cut at
``max_new_tokens``, the share without an answer in the asked format, and the minutes.

Question ``q`` of a level is the same in both plays and in every run of the seed, whatever
``num_envs``: item ``q`` of the order seeded ``seed``, drawn without replacement where the
task has a size, as one native vector env of all the level's questions deals them to its
groups (each batch is its part: ``shards``); each sample draws from its own generator
(``SubEnvGenerators``), so a card does not depend on the batching.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from tqdm.auto import tqdm

import llm_gym
from llm_gym.envs.dataset import task_function
from llm_gym.episodes import Episode, play_episodes
from llm_gym.episodes.summary import answer_format_held
from llm_gym.lm.loading import load_model
from llm_gym.policies.base import Policy
from llm_gym.run.config import ProfileConfig
from llm_gym.run.files import write_text
from llm_gym.run.lock import FolderLock
from llm_gym.run.setup import (
    dtype_name,
    make_policy,
    resolve_device,
    resolve_dtype,
    run_rubric,
    task_envs,
)
from llm_gym.samplers.transformers import SubEnvGenerators

__all__ = ["CARD_FILE", "CARD_TABLE_FILE", "Profile", "card_table", "level_card", "pass_at_k"]

CARD_FILE = "card.json"
CARD_TABLE_FILE = "card.md"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of ``k`` samples drawn from ``n`` (``c`` of them right)
    is right: ``1 - C(n - c, k) / C(n, k)``, the unbiased estimator of Chen et al. (2021).

    >>> pass_at_k(8, 0, 8), pass_at_k(8, 1, 8), pass_at_k(8, 2, 1), pass_at_k(4, 1, 2)
    (0.0, 1.0, 0.25, 0.5)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    # The mean and its standard error over the questions (0 for one question).
    array = np.asarray(values, dtype=np.float64)
    se = float(array.std(ddof=1) / math.sqrt(len(array))) if len(array) > 1 else 0.0
    return float(array.mean()), se


def level_card(
    greedy: Sequence[Episode],
    samples: Sequence[Sequence[Episode]],
    max_new_tokens: int,
    seconds: float,
) -> dict[str, Any]:
    """One level's card from each question's ``greedy`` episode and its ``samples`` (the
    same ``K`` a question): ``greedy``, ``pass@1``, ``pass@K`` and ``reward`` with their
    standard errors (``*_se``) over the questions; over the samples, ``response_tokens`` (a
    mean), ``truncated`` (the share with a turn of ``max_new_tokens`` tokens) and
    ``no_answer`` (the share without an answer in the asked format; None where the task asks
    for none); ``questions``, ``K`` and ``minutes``.

    >>> e = lambda ok: Episode([], ["x"], float(ok), float(ok), {"success": ok}, [], [0], 1,
    ...                        turn_tokens=[1])
    >>> card = level_card([e(True), e(False)], [[e(True), e(False)], [e(False)] * 2], 4, 60)
    >>> card["greedy"], card["pass@1"], card["pass@2"], card["truncated"], card["no_answer"]
    (0.5, 0.25, 0.5, 0.0, None)
    """
    k = len(samples[0])
    if len(samples) != len(greedy) or any(len(s) != k for s in samples):
        raise ValueError("level_card needs one greedy episode and K samples per question")
    right = [sum(bool(e.success) for e in s) for s in samples]
    flat = [e for s in samples for e in s]
    card: dict[str, Any] = {"questions": len(greedy), "K": k}
    for name, values in (
        ("greedy", [float(bool(e.success)) for e in greedy]),
        ("pass@1", [c / k for c in right]),
        (f"pass@{k}", [pass_at_k(k, c, k) for c in right]),
        ("reward", [float(np.mean([e.reward for e in s])) for s in samples]),
    ):
        card[name], card[f"{name}_se"] = _mean_se(values)
    card["response_tokens"] = float(np.mean([sum(e.turn_tokens or [e.num_tokens]) for e in flat]))
    card["truncated"] = float(np.mean([max(e.turn_tokens or [0]) >= max_new_tokens for e in flat]))
    held = [h for h in map(answer_format_held, (e.info for e in flat)) if h is not None]
    card["no_answer"] = float(1 - np.mean(held)) if held else None
    card["minutes"] = seconds / 60
    versions = {e.info.get("reward_version") for e in [*greedy, *flat]}
    card["reward_versions"] = sorted(str(v) for v in versions if v is not None)
    return card


def card_table(card: dict[str, Any]) -> str:
    """The card as a Markdown table, a row a level.

    >>> row = {"questions": 2, "K": 2, "greedy": 0.5, "greedy_se": 0.5, "pass@1": 0.25,
    ...        "pass@1_se": 0.25, "pass@2": 0.5, "pass@2_se": 0.5, "reward": 0.25,
    ...        "reward_se": 0.25, "response_tokens": 1.0, "truncated": 0.0, "no_answer": None,
    ...        "minutes": 1.0}
    >>> table = card_table({"levels": {"0": row}}).splitlines()
    >>> table[0].split(" | ")[:5]
    ['| level', 'questions', 'greedy', 'pass@1', 'pass@2']
    >>> table[2].split(" | ")
    ['| 0', '2', '0.500 (0.500)', '0.250 (0.250)', '0.500 (0.500)', '0.250 (0.250)', '1.0', \
'0.000', 'n/a', '1.0 |']
    """
    levels = card["levels"]
    k = next(iter(levels.values()))["K"]
    rates = ["greedy", *dict.fromkeys(["pass@1", f"pass@{k}"]), "reward"]  # K = 1: one pass@1
    names = ["level", "questions", *rates, "response tokens", "truncated", "no answer", "minutes"]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for level, row in levels.items():
        cells = [level, str(row["questions"])]
        cells += [f"{row[n]:.3f} ({row[n + '_se']:.3f})" for n in rates]
        answerless = "n/a" if row["no_answer"] is None else f"{row['no_answer']:.3f}"
        cells += [f"{row['response_tokens']:.1f}", f"{row['truncated']:.3f}", answerless,
                  f"{row['minutes']:.1f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class Profile:
    """A prepared card (the levels checked, the model loaded, the folder claimed; any input
    error raised here); ``run()`` plays each level and writes ``card.json`` and ``card.md``."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config, self.out = config, Path(config.out)
        if gym.spec(config.env).vector_entry_point is None:
            raise ValueError(
                f"{config.env} has no native vector env, which deals each question to its K "
                "samples' sub-envs: profile runs the task envs"
            )
        self.levels: list[int | None] = list(config.levels or [None])
        for level in config.levels or ():  # before anything loads
            _check_level(config, level)
        card = self.out / CARD_FILE
        if card.exists() and not config.overwrite:
            raise FileExistsError(
                f"{card} holds an earlier card; pass another --out or --overwrite"
            )
        self.lock = FolderLock(self.out)
        try:
            device = resolve_device(config.device)
            self.dtype = resolve_dtype(config.dtype, device)
            model, self.tokenizer = load_model(config.model, device=device, dtype=self.dtype)
            self.sampled: Policy = make_policy(model, self.tokenizer, config)
            self.rubric: Any = None
            self.greedy = _greedy(self.sampled)
            self.rubric = run_rubric(config, self.tokenizer)
        except BaseException:
            self.close()
            raise

    def run(self) -> dict[str, Any]:
        """Play every level; write and return the card."""
        try:
            return self._run()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the sampler's server and the judges' (if any); let the folder go."""
        for part in (getattr(self, "sampled", None), getattr(self, "rubric", None)):
            close = getattr(part, "close", None)
            if close is not None:
                close()
        self.lock.release()

    def _run(self) -> dict[str, Any]:
        config = self.config
        k = config.samples
        batch = max(1, config.num_envs // k)
        batches = -(-config.episodes // batch)
        card: dict[str, Any] = {
            "env": config.env, "env_args": config.env_args, "model": config.model,
            "dtype": dtype_name(self.dtype), "backend": config.backend, "seed": config.seed,
            "temperature": config.temperature, "max_new_tokens": config.max_new_tokens,
            "llm_gym": llm_gym.__version__, "levels": {},
        }  # fmt: skip
        bar = tqdm(total=len(self.levels) * config.episodes, unit="q",
                   disable=not config.progress, dynamic_ncols=True)  # fmt: skip
        with bar:
            for level in self.levels:
                began = time.perf_counter()
                greedy, samples = [], []
                run = config if level is None else replace(
                    config, env_args={**config.env_args, "level": level}, levels=None
                )  # fmt: skip
                for b in range(batches):
                    greedy += self._play(run, self.greedy, b, batch, 1, batches)
                    played = self._play(run, self.sampled, b, batch, k, batches)
                    samples += [played[i : i + k] for i in range(0, len(played), k)]
                    bar.update(min(batch, config.episodes - b * batch))
                n = config.episodes
                seconds = time.perf_counter() - began
                row = level_card(greedy[:n], samples[:n], config.max_new_tokens, seconds)
                card["levels"]["-" if level is None else str(level)] = row
        write_text(self.out / CARD_FILE, json.dumps(card, indent=2) + "\n")
        write_text(self.out / CARD_TABLE_FILE, card_table(card) + "\n")
        return card

    def _play(
        self,
        config: ProfileConfig,
        policy: Policy,
        b: int,
        batch: int,
        repeats: int,
        batches: int,
    ) -> list[Episode]:
        # Questions b * batch .. of the level's, each in `repeats` neighbouring sub-envs: the
        # part of one vector env of all of them (its shards) that deals them, reset with the
        # seed; each sub-env's tokens from its own generator.
        first = b * batch * repeats
        envs = task_envs(
            config, self.tokenizer, batch * repeats, repeats=repeats, group_repeats=True,
            shards=(first, batches * batch * repeats), **self.rubric.env_options(),
        )  # fmt: skip
        try:
            policy.sub_env_generators = SubEnvGenerators(config.seed, first)
            obs, _ = envs.reset(seed=config.seed)
            return play_episodes(envs, policy, obs)[0]
        finally:
            envs.close()


def _greedy(policy: Policy) -> Policy:
    # The sampling policy's greedy twin: the same model or server, at temperature 0.
    greedy = copy.copy(policy)
    greedy.sampler = policy.sampler.with_settings(temperature=0.0)
    return greedy


def _check_level(config: ProfileConfig, level: int) -> None:
    # The task takes the level (its own error names the range), or says it has none: told
    # from the signature before the env is made, so a dataset task loads nothing to say it.
    entry = gym.spec(config.env).entry_point
    function = task_function(config.env) or (
        load_env_creator(entry) if isinstance(entry, str) else entry
    )
    if "level" not in inspect.signature(function).parameters:
        raise ValueError(
            f"levels (--levels): {config.env} has no levels (it takes no level argument)"
        )
    env = gym.make(config.env, **{**config.env_args, "level": level})
    env.close()
