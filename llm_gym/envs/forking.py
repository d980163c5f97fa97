"""Forking an episode: ``fork(env)``, an independent env in the same state, through the whole
wrapper stack, and ``fork_sub_env(envs, i)``, sub-env ``i`` of a vector env as one.

What a fork copies and what it shares is each env's ``fork`` method's to say (``ChatEnv.fork``:
the conversation, the item, the stream's position and the RNG copied; the tokenizer, the
dataset and stateless tools shared read-only); an env whose state is not in this process (a
server's episode) raises ``ForkError``. A wrapper is copied with its own state: what it holds as
plain data (numbers, strings, arrays, lists and dicts of them), its random generators, and the
objects that say how they copy (a ``__copy__``: the KL charge and its controller, the
curriculum's schedule) are copied once for the stack (two wrappers sharing one object share its
copy); anything else (a model, a tokenizer, a scorer) is shared.
"""

from __future__ import annotations

import collections
import copy
import random
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["ForkError", "fork", "fork_sub_env"]

_PLAIN = (type(None), bool, int, float, complex, str, bytes, np.generic)


class ForkError(TypeError):
    """An env that cannot be forked mid-episode: the message names it and says why."""


def fork(env: gym.Env) -> gym.Env:
    """An independent copy of ``env`` in its current state, wrappers and all: stepping it with
    an action gives what stepping ``env`` with that action would have given, and stepping one
    never changes the other (``env.unwrapped.fork()`` forks the env inside; each wrapper is
    copied with its own state, as the module says). ``ForkError``: the env cannot fork.

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-v0", query="2+2?", max_turns=3)
    >>> _ = env.reset(seed=0); _ = env.step("5")
    >>> other = fork(env)
    >>> a, b = env.step("4")[0], other.step("four")[0]
    >>> a["history"][-1]["content"], b["history"][-1]["content"], len(b["history"])
    ('4', 'four', 3)
    """
    if isinstance(env, gym.vector.VectorEnv):
        raise TypeError(
            "env must be a single gymnasium Env; fork sub-env i of a vector env with "
            "fork_sub_env(envs, i)"
        )
    if not isinstance(env, gym.Env):
        raise TypeError(f"env must be a gymnasium Env, got {type(env).__name__}")
    stack = []
    while isinstance(env, gym.Wrapper):
        stack.append(env)
        env = env.env
    method = getattr(env, "fork", None)
    if method is None:
        raise ForkError(
            f"{type(env).__name__} cannot fork: it is not an llm_gym env (no fork() method)"
        )
    forked = method()
    memo: dict[int, Any] = {id(env): forked}
    for wrapper in reversed(stack):  # inside out: an outer wrapper may hold an inner's part
        forked = _fork_wrapper(wrapper, forked, memo)
    return forked


def fork_sub_env(envs: gym.vector.VectorEnv, index: int) -> gym.Env:
    """Sub-env ``index`` of ``envs`` as an independent single env in its current state: the
    native vector env's ``fork_env(index)``, a ``SyncVectorEnv``'s sub-env forked with its
    wrappers (``fork``). The vector env's own wrappers are not part of it."""
    base = envs.unwrapped
    if not isinstance(index, (int, np.integer)) or not 0 <= index < base.num_envs:
        raise ValueError(f"index must be a sub-env index in 0..{base.num_envs - 1}, got {index!r}")
    if hasattr(base, "fork_env"):
        return base.fork_env(int(index))
    if isinstance(getattr(base, "envs", None), (list, tuple)):
        return fork(base.envs[index])
    raise ForkError(
        f"{type(base).__name__} cannot fork a sub-env: its sub-envs are not in this process "
        "(an asynchronous vector env's live in worker processes)"
    )


def _fork_wrapper(wrapper: gym.Wrapper, inner: gym.Env, memo: dict[int, Any]) -> gym.Wrapper:
    other = copy.copy(wrapper)
    memo[id(wrapper)] = other
    for name, value in vars(wrapper).items():
        other.__dict__[name] = inner if name == "env" else _owned(value, memo)
    return other


def _owned(value: Any, memo: dict[int, Any]) -> Any:
    # A wrapper's attribute in the fork: copied if it is the wrapper's own state, else shared.
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, (np.random.Generator, random.Random)) or _plain(value):
        copied = copy.deepcopy(value)
    elif getattr(type(value), "__copy__", None) is not None:
        copied = copy.copy(value)
    else:
        return value
    memo[id(value)] = copied
    return copied


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, np.ndarray):
        return value.dtype != object
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return all(_plain(item) for item in value)
    return False
