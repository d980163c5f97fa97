"""``DatasetChatVectorEnv``: N dataset conversations in one Gymnasium vector env."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import error
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from llm_gym.envs.chat import StepPlan
from llm_gym.envs.dataset import DatasetChatEnv

__all__ = ["DatasetChatVectorEnv", "batch_infos"]


class DatasetChatVectorEnv(VectorEnv):
    """N conversations of one ``DatasetChatEnv`` task, stepped together with batched results.

    Sub-env ``i`` behaves exactly like its own copy of the task reset with seed ``seed + i``
    (Gymnasium's rule), so the prompts equal those of ``gym.make_vec`` in ``"sync"`` and
    ``"async"`` modes; the data is loaded once and shared. Finished conversations reset in
    the same step (``AutoresetMode.SAME_STEP``), so no generation is wasted: their last
    observation and info are in ``info["final_obs"]`` / ``info["final_info"]`` (masks
    ``info["_final_obs"]`` / ``info["_final_info"]``) and the returned observation is the
    new episode's first.

    With ``group_repeats=True`` on the task and ``repeats=G``, sub-envs ``b*G .. b*G+G-1``
    form group ``b``: its members always hold the same sample (a GRPO group side by side),
    drawn from the order that sub-env ``b*G``'s seed defines, each sample once per epoch.
    ``num_envs`` must then be a multiple of ``G``.

    Observations are ``batch_space(single_observation_space, N)``: a dict of N-tuples.
    Actions are a sequence of N responses (``str``, token arrays or ``Response``).

    >>> from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
    >>> rows = [{"query": q} for q in ("a?", "b?", "c?")]
    >>> envs = DatasetChatVectorEnv(DatasetChatEnv(rows), num_envs=2)
    >>> obs, info = envs.reset(seed=0)
    >>> obs, rewards, terminated, truncated, info = envs.step(["x", "y"])
    >>> terminated.tolist(), [o["history"][-1]["content"] for o in info["final_obs"]]
    ([True, True], ['x', 'y'])
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: DatasetChatEnv, num_envs: int) -> None:
        if not isinstance(env, DatasetChatEnv):
            raise TypeError(f"env must be a DatasetChatEnv, got {type(env).__name__}")
        if (
            isinstance(num_envs, bool)
            or not isinstance(num_envs, (int, np.integer))
            or num_envs < 1
        ):
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = int(num_envs)
        self.group_size = env.repeats if env.group_repeats else 1
        if self.num_envs % self.group_size:
            raise ValueError(
                f"num_envs must be a multiple of repeats={env.repeats} with group_repeats=True "
                f"(each group fills that many sub-envs), got num_envs={num_envs}"
            )
        seeds = [None if env.seed is None else env.seed + i for i in range(self.num_envs)]
        self.envs = [env] + [env.fork(seed) for seed in seeds[1:]]
        self.render_mode = env.render_mode
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._out = create_empty_array(self.single_observation_space, self.num_envs)
        self._obs: list[Any] = [None] * self.num_envs
        self._needs_reset = True
        # Groups: each draws raw records from its own fork of the data (never reset by the
        # sub-envs themselves); member i's k-th episode gets the group's k-th record.
        n_groups = self.num_envs // self.group_size
        self._group_sources = [env.source.fork(seeds[g * self.group_size]) for g in range(n_groups)]
        self._group_records: list[dict[int, Any]] = [{} for _ in range(n_groups)]
        self._group_drawn = [0] * n_groups
        self._episode = [0] * self.num_envs

    # -- Gymnasium API ------------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
            seeds = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        elif isinstance(seed, (list, tuple, np.ndarray)):
            seeds = list(seed)
        else:
            raise TypeError(
                "seed must be None, an int or a list of num_envs ints, got "
                f"{type(seed).__name__}: {seed!r:.40}"
            )
        if len(seeds) != self.num_envs:
            raise ValueError(
                f"seed as a list must have num_envs={self.num_envs} entries, got {len(seeds)}"
            )
        if options and self.group_size > 1:
            raise ValueError(
                "options cannot be given with group_repeats=True: each group's sample comes "
                f"from the group's order, got options {sorted(options)}"
            )
        super().reset(seed=seeds[0])
        infos: list[dict[str, Any]] = []
        if self.group_size > 1:
            self._restart_groups(seeds)
        for i, env in enumerate(self.envs):
            if self.group_size > 1:
                self._obs[i], info = env.reset(seed=seeds[i], options=self._group_options(i))
            else:
                self._obs[i], info = env.reset(seed=seeds[i], options=options)
            infos.append(info)
        self._needs_reset = False
        return self._batched_obs(), batch_infos(infos)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self._needs_reset:
            raise error.ResetNeeded("Cannot call DatasetChatVectorEnv.step before reset")
        plans = self._plan(actions)  # every sub-env's step computed before any is stored
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: list[dict[str, Any]] = []
        for i, (env, plan) in enumerate(zip(self.envs, plans, strict=True)):
            obs, rewards[i], terminated[i], truncated[i], info = env.commit_step(plan)
            if terminated[i] or truncated[i]:
                final = {"final_obs": obs, "final_info": info}
                obs, info = self._autoreset(i)
                info = {**final, **info}
            self._obs[i] = obs
            infos.append(info)
        return self._batched_obs(), rewards, terminated, truncated, batch_infos(infos)

    def reset_dataloader(self) -> DatasetChatVectorEnv:
        """Every sub-env (and group) serves from the start of its order again."""
        for env in self.envs:
            env.reset_dataloader()
        for source in self._group_sources:
            source.rewind()
        self._group_records = [{} for _ in self._group_sources]
        self._group_drawn = [0] * len(self._group_sources)
        # The next episode of every sub-env, after an autoreset or a reset, is episode 0.
        self._episode = [-1] * self.num_envs
        return self

    @property
    def level(self) -> int | None:
        """The task's difficulty level (None for data without levels)."""
        return self.envs[0].level

    def set_level(self, level: int) -> None:
        """Draw the next samples of every sub-env and group at ``level``: their sources are
        forks of one procedural source, which share the level."""
        self.envs[0].set_level(level)

    # -- internals ----------------------------------------------------------------------

    def _autoreset(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        if self.group_size == 1:
            return self.envs[i].reset()
        self._episode[i] += 1
        return self.envs[i].reset(options=self._group_options(i))

    def _restart_groups(self, seeds: list[int | None]) -> None:
        # A vector reset starts every group afresh, members aligned on one new record.
        for g, source in enumerate(self._group_sources):
            if seeds[g * self.group_size] is not None:
                source.reseed(seeds[g * self.group_size])
            self._group_records[g] = {}
            members = range(g * self.group_size, (g + 1) * self.group_size)
            for i in members:
                self._episode[i] = self._group_drawn[g]

    def _group_options(self, i: int) -> dict[str, Any]:
        g, k = i // self.group_size, self._episode[i]
        records = self._group_records[g]
        while self._group_drawn[g] <= k:
            records[self._group_drawn[g]] = self._group_sources[g].next_record()
            self._group_drawn[g] += 1
        record = records[k]
        # Members move on at their own pace (multi-turn); a record is kept until all took it.
        lowest = min(self._episode[g * self.group_size : (g + 1) * self.group_size])
        for old in [key for key in records if key < lowest]:
            del records[old]
        return {"sample": record}

    def _plan(self, actions: Sequence[Any]) -> list[StepPlan]:
        if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"actions must be a sequence of {self.num_envs} responses, "
                f"got {type(actions).__name__}"
            )
        if len(actions) != self.num_envs:
            raise ValueError(
                f"actions must hold num_envs={self.num_envs} responses, got {len(actions)}"
            )
        plans = []
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            try:
                plans.append(env.plan_step(action))
            except (TypeError, ValueError, KeyError) as err:
                raise type(err)(f"actions[{i}]: {err}") from err
        return plans

    def _batched_obs(self) -> dict[str, Any]:
        return concatenate(self.single_observation_space, self._obs, self._out)


def batch_infos(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Gymnasium's vector ``info`` from per-env infos, as ``VectorEnv._add_info`` builds it.

    Each key becomes an array over envs (dtype from the first env that has it: bool, int,
    float and NumPy numbers as themselves, anything else, arrays included, ``object``) with a
    boolean mask ``"_key"``; dicts nest. Building each array once is what makes it faster
    than ``_add_info``'s per-env, per-key updates. The KL wrappers stack their per-token
    arrays (one length per response) with it too.

    >>> info = batch_infos([{"a": 1.0}, {}, {"a": 2.0, "b": np.zeros(2)}])
    >>> info["a"].tolist(), info["_a"].tolist(), [None if b is None else b.shape for b in info["b"]]
    ([1.0, 0.0, 2.0], [True, False, True], [None, None, (2,)])
    """
    n = len(infos)
    keys = dict.fromkeys(key for info in infos for key in info)
    out: dict[str, Any] = {}
    for key in keys:
        present = [(i, info[key]) for i, info in enumerate(infos) if key in info]
        first = present[0][1]
        if key != "final_obs" and isinstance(first, dict):
            array: Any = batch_infos([info.get(key, {}) for info in infos])
        else:
            if key != "final_obs" and (
                type(first) in (int, float, bool) or isinstance(first, np.number)
            ):
                array = np.zeros(n, dtype=type(first))
            else:
                array = np.full(n, None, dtype=object)
            for i, value in present:
                array[i] = value
        mask = np.zeros(n, dtype=np.bool_)
        mask[[i for i, _ in present]] = True
        out[key], out[f"_{key}"] = array, mask
    return out
