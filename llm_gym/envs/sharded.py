"""Vector envs of separate sub-env instances, each on one shard of a stream of items (envs
that hold state of their own: a game, a sandbox, a server session), and a process's part of
such a run-wide vector env (``PartVectorEnv``): what the native vector envs of the session
envs are made of."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from llm_gym.checks import check_int

__all__ = ["PartVectorEnv", "sharded_env_fns", "sharded_vector_env"]


def sharded_env_fns(
    env_id: str, num_envs: int, shards: tuple[int, int] | None = None, **kwargs: object
) -> list[Callable[[], gym.Env]]:
    """``num_envs`` constructors of ``env_id`` for ``SyncVectorEnv`` or ``AsyncVectorEnv``,
    constructor ``i`` with ``shard=(i, num_envs)``, so they split one stream of items as
    ``DatasetChatVectorEnv``'s sub-envs do (``gym.make_vec`` in those modes gives every
    sub-env the same arguments, so each would shuffle the whole dataset on its own);
    ``shards=(first, total)``: these are sub-envs ``first ..`` of ``total`` (a process's part
    of a run's), constructor ``i`` with ``shard=(first + i, total)``.

    >>> from gymnasium.vector import SyncVectorEnv
    >>> fns = sharded_env_fns("LLMChat-Countdown-v0", 2, level=0)
    >>> envs = SyncVectorEnv(fns)
    >>> [env.unwrapped.shard for env in envs.envs]
    [(0, 2), (1, 2)]
    >>> [f.keywords["shard"] for f in sharded_env_fns("LLMChat-Countdown-v0", 2, (2, 4))]
    [(2, 4), (3, 4)]
    """
    check_int("num_envs", num_envs, 1)
    if "shard" in kwargs:
        raise TypeError("sharded_env_fns() sets each sub-env's shard itself, got shard=")
    first, total = _part(shards, num_envs)
    return [
        functools.partial(gym.make, env_id, shard=(first + i, total), **kwargs)
        for i in range(num_envs)
    ]


def sharded_vector_env(
    env_id: str, num_envs: int, shards: tuple[int, int] | None = None, **kwargs: object
) -> SyncVectorEnv:
    """``num_envs`` sub-envs of ``env_id`` side by side, each its own instance on one shard of
    the stream of items (``sharded_env_fns``), for envs that hold state of their own (a
    server session, a rollout), finished ones reset in the same step as
    ``DatasetChatVectorEnv``'s; ``repeats=G`` with ``group_repeats=True`` puts each item in
    ``G`` neighbouring sub-envs. The sub-envs are made at once: one that fails to start
    closes those made before it. ``shards=(first, total)``: a process's part of a run's
    sub-envs, which ``reset(seed=s)`` seeds as the run's one vector env would
    (``PartVectorEnv``)."""
    if kwargs.get("group_repeats") and num_envs % (kwargs.get("repeats") or 1):
        raise ValueError(
            f"num_envs must be a multiple of repeats={kwargs['repeats']} with group_repeats=True "
            f"(each group fills that many sub-envs), got num_envs={num_envs}"
        )
    envs: list[gym.Env] = []
    try:
        envs.extend(make() for make in sharded_env_fns(env_id, num_envs, shards, **kwargs))
    except BaseException:
        for env in envs:
            env.close()
        raise
    made = [functools.partial(_made, env) for env in envs]
    if shards is None:
        return SyncVectorEnv(made, autoreset_mode=AutoresetMode.SAME_STEP)
    return PartVectorEnv(made, first=shards[0])


class PartVectorEnv(SyncVectorEnv):
    """Sub-envs ``first ..`` of a run's vector env of sharded sub-envs (a process's part):
    ``reset(seed=s)`` seeds sub-env ``i`` with ``s + first + i``, as the whole one seeds it,
    so that each plays the item it would play there. SAME_STEP autoreset."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], first: int) -> None:
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self.first = first

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """As ``SyncVectorEnv.reset``, an int ``seed`` counted from the run's first sub-env."""
        if isinstance(seed, int):
            seed = [seed + self.first + i for i in range(self.num_envs)]
        return super().reset(seed=seed, options=options)


def _part(shards: tuple[int, int] | None, num_envs: int) -> tuple[int, int]:
    # (first, total) of num_envs sub-envs among a run's: all of them without shards.
    if shards is None:
        return 0, num_envs
    if not (
        isinstance(shards, (tuple, list)) and len(shards) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shards)
        and 0 <= shards[0] and shards[0] + num_envs <= shards[1]
    ):  # fmt: skip
        raise ValueError(
            f"shards must be (first, total), ints with 0 <= first and first + num_envs <= total "
            f"(num_envs={num_envs}), got {shards!r}"
        )
    return int(shards[0]), int(shards[1])


def _made(env: gym.Env) -> gym.Env:
    return env
