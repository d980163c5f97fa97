"""``DatasetChatVectorEnv``: N dataset conversations in one Gymnasium vector env."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium import error
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.conversation import Conversation, PromptBuilder
from llm_gym.chat.history import History
from llm_gym.checks import check_int
from llm_gym.envs.actions import decode_token_actions
from llm_gym.envs.chat import ActionRead, Outcome
from llm_gym.envs.dataset import make_task_env
from llm_gym.rubrics import Rubric, TaskReward, TaskScore
from llm_gym.sources import Shard, Source

if TYPE_CHECKING:
    from llm_gym.chat.containers import Response
    from llm_gym.tools.calls import ToolCall
    from llm_gym.tools.toolbox import ToolRecord

__all__ = [
    "DatasetChatVectorEnv",
    "VectorHooks",
    "batch_infos",
    "make_task_vector_env",
    "single_env",
]


@runtime_checkable
class VectorHooks(Protocol):
    """Everything ``DatasetChatVectorEnv`` reads of its single env, to step N conversations
    of it at once: ``DatasetChatEnv`` and its subclasses (``SessionChatEnv``'s) have all of it.

    None of the methods store anything on the env: the vector env keeps the N conversations
    and items itself, and calls them for any of them.

    - ``given_item(options)``: the item of ``reset(options={"item": ...})``, checked
      (raises before anything changes), or None.
    - ``next_item(source)``: the next item of ``source`` (a sub-env's shard).
    - ``episode_start(item)``: the first prompt (a ``History``) and the reset info.
    - ``read_action(conversation, action)``: the checked action and its tool calls.
    - ``run_tools(conversation, calls)``: one record per call run; never raises.
    - ``advance(conversation, read, records, item, score=)``: the ``Outcome`` of the turn
      (``score``: the answer's ``TaskScore`` when the vector env scored the batch).
    - ``observe(conversation)``: the observation dict.
    - ``set_level(level)``, ``close()``: as ``DatasetChatEnv``'s.

    The settings it reads: ``builder`` (starts the N prompts in one batch), ``codec``
    (decodes N token actions in one batch), ``reward`` (a ``Rubric`` scores the batch),
    ``assistant_prefix``, ``concurrent_reward``, ``shares_conversations``, the stream's
    ``source``, ``shard``, ``repeats``, ``group_repeats``, ``epoch_size``, ``level``,
    ``num_levels``, and the spaces and ``render_mode``.
    """

    shares_conversations: bool
    repeats: int
    group_repeats: bool
    shard: tuple[int, int]
    concurrent_reward: bool
    reward: TaskReward | None
    assistant_prefix: str
    builder: PromptBuilder
    codec: TokenCodec | None
    observation_space: gym.Space
    action_space: gym.Space
    render_mode: str | None

    @property
    def source(self) -> Source: ...

    @property
    def epoch_size(self) -> int | None: ...

    @property
    def level(self) -> int | None: ...

    @property
    def num_levels(self) -> int | None: ...

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None: ...

    def next_item(self, source: Source | None = None) -> dict[str, Any]: ...

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]: ...

    def read_action(
        self, conversation: Conversation | None, action: str | np.ndarray | Response | Mapping
    ) -> ActionRead: ...

    def run_tools(
        self, conversation: Conversation, calls: Sequence[ToolCall]
    ) -> list[ToolRecord]: ...

    def advance(
        self, conversation: Conversation, read: ActionRead, records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None, score: TaskScore | None = None,
    ) -> Outcome: ...  # fmt: skip

    def observe(self, conversation: Conversation) -> dict[str, Any]: ...

    def set_level(self, level: int) -> None: ...

    def close(self) -> None: ...


# The protocol's members, for the error that names what an env lacks.
_HOOKS = (*VectorHooks.__annotations__, *(k for k in vars(VectorHooks) if not k.startswith("_")))


def single_env(envs: gym.vector.VectorEnv) -> gym.Env:
    """The single env holding the settings of ``envs``' task, through any vector wrappers: the
    native vector env's ``single_env``, else the first sub-env of a ``SyncVectorEnv`` (a
    game's vector env)."""
    base = envs.unwrapped
    return getattr(base, "single_env", None) or base.envs[0].unwrapped


class DatasetChatVectorEnv(VectorEnv):
    """N conversations of one ``DatasetChatEnv`` task, stepped together with batched results.

    The sub-envs share one seeded stream of items, as TorchRL's batched env draws each
    batch from one dataloader: sub-env ``i`` serves its shard ``(i, N)``, so every epoch
    holds every item exactly ``repeats`` times across sub-envs, and ``reset(seed=s)`` puts
    every shard on one order as ``DatasetChatEnv``'s Starting State says (so
    ``sharded_env_fns`` copies see the same prompts). Finished conversations reset in the same step
    (``AutoresetMode.SAME_STEP``): their last observation and info are in
    ``info["final_obs"]`` / ``info["final_info"]`` and the returned observation is the new
    episode's first.

    With ``repeats=G`` and ``num_envs`` a multiple of ``G`` (which ``group_repeats=True``
    on the task requires), sub-envs ``b*G .. b*G+G-1`` always hold the same item, each
    episode: a GRPO group side by side. Otherwise an item's copies may span two steps.

    ``shards=(first, total)``: these N sub-envs are sub-envs ``first .. first + N - 1`` of a
    vector env of ``total`` (a process's part of one run split across processes): they serve
    exactly the items those sub-envs would, so the split does not change what is played.

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

    def __init__(
        self, env: VectorHooks, num_envs: int, shards: tuple[int, int] | None = None
    ) -> None:
        if not isinstance(env, VectorHooks):
            lacks = [name for name in _HOOKS if not hasattr(env, name)]
            raise TypeError(
                f"env must be a DatasetChatEnv, got {type(env).__name__} (a single env has all "
                f"of llm_gym.envs.VectorHooks; it lacks {', '.join(lacks[:4])}"
                f"{', ...' if len(lacks) > 4 else ''})"
            )
        if not env.shares_conversations:
            raise TypeError(
                f"env must be able to step many conversations, and a {type(env).__name__} "
                "holds state of its own: use SyncVectorEnv (gym.make_vec's vector entry point)"
            )
        self.num_envs = check_int("num_envs", num_envs, 1)
        self.group_size = env.repeats if env.group_repeats else 1
        if self.num_envs % self.group_size:
            raise ValueError(
                f"num_envs must be a multiple of repeats={env.repeats} with group_repeats=True "
                f"(each group fills that many sub-envs), got num_envs={num_envs}"
            )
        if env.shard != (0, 1):
            raise ValueError(
                f"env must serve the whole stream (shard=None) to be split among the sub-envs, "
                f"got shard={env.shard}"
            )
        first, total = self._check_shards(shards)
        # One env holds the task's settings; each sub-env is a shard of its source and a
        # conversation, stepped here together.
        self.single_env: VectorHooks = env
        self.shards = (first, total)
        self.sources = [
            env.source.for_shard(Shard(first + i, total, env.repeats)) for i in range(self.num_envs)
        ]
        self._conversations: list[Conversation | None] = [None] * self.num_envs
        self._items: list[dict[str, Any] | None] = [None] * self.num_envs
        self.render_mode = env.render_mode
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._out = create_empty_array(self.single_observation_space, self.num_envs)
        self._pool: ThreadPoolExecutor | None = None  # runs tool calls; made on first use

    def _check_shards(self, shards: tuple[int, int] | None) -> tuple[int, int]:
        if shards is None:
            return 0, self.num_envs
        ok = (
            isinstance(shards, (tuple, list)) and len(shards) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in shards)
            and 0 <= shards[0] and shards[0] + self.num_envs <= shards[1]
            and shards[0] % self.group_size == 0 and shards[1] % self.group_size == 0
        )  # fmt: skip
        if not ok:
            raise ValueError(
                f"shards must be (first, total), ints with 0 <= first and first + num_envs <= "
                f"total, both multiples of the group size {self.group_size}; got {shards!r} "
                f"with num_envs={self.num_envs}"
            )
        return int(shards[0]), int(shards[1])

    # -- Gymnasium API ------------------------------------------------------------------

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset every sub-env (sub-env ``i`` seeded ``seed + i``, one order split N ways)."""
        seeds = self._seeds(seed)
        given = self.single_env.given_item(options)  # checked before anything changes
        super().reset(seed=seeds[0])
        for i, s in enumerate(seeds):
            if s is not None:  # sub-env i orders by seed[i] - i: seeds s, s+1, ... share one
                self.sources[i].reseed(s - i)
        infos = self._start(range(self.num_envs), given)
        return self._batched_obs(), batch_infos(infos)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the N conversations with ``actions`` at once; finished ones reset in the same
        step (their last observation and info in ``info["final_obs"]``/``["final_info"]``)."""
        if self._conversations[0] is None:
            raise error.ResetNeeded("Cannot call DatasetChatVectorEnv.step before reset")
        outcomes = self._outcomes(actions)  # every sub-env's step computed before any is stored
        rewards = np.array([o.reward for o in outcomes], dtype=np.float64)
        terminated = np.array([o.terminated for o in outcomes], dtype=np.bool_)
        truncated = np.array([o.truncated for o in outcomes], dtype=np.bool_)
        infos = [o.info for o in outcomes]
        self._conversations = [o.conversation for o in outcomes]
        done = np.flatnonzero(terminated | truncated).tolist()
        finals = [self.single_env.observe(self._conversations[i]) for i in done]
        started = self._start(done)
        for i, final, info in zip(done, finals, started, strict=True):
            infos[i] = {"final_obs": final, "final_info": infos[i], **info}
        return self._batched_obs(), rewards, terminated, truncated, batch_infos(infos)

    def reset_dataloader(self) -> DatasetChatVectorEnv:
        """Every sub-env serves from the start of its shard of the order again."""
        for source in self.sources:
            source.rewind()
        return self

    def state_dict(self) -> dict[str, Any]:
        """Where each sub-env's stream is: ``positions[i]``, how many items sub-env ``i``'s
        shard of the seed's order has served (the current one included); None for a source
        that cannot say (one whose order is not a function of its seed)."""
        return {"positions": [getattr(source, "position", None) for source in self.sources]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put each sub-env's stream at ``state["positions"]``: the next reset (without a
        seed, after one with the run's) serves the items from there on."""
        positions = list(state["positions"])
        if len(positions) != self.num_envs or None in positions:
            raise ValueError(
                f"state['positions'] must hold a position for each of the {self.num_envs} "
                f"sub-envs, got {positions!r}"
            )
        if not all(hasattr(source, "seek") for source in self.sources):
            raise ValueError("this env's sources cannot seek: their stream cannot be resumed")
        for source, position in zip(self.sources, positions, strict=True):
            source.seek(position)

    def fork_env(self, index: int) -> gym.Env:
        """Sub-env ``index`` as an independent single env in its state: the task's env forked
        (``ChatEnv.fork``) holding its conversation, item and a copy of its stream
        (``llm_gym.fork_sub_env`` for any vector env)."""
        index = check_int("index", index, 0, self.num_envs - 1)
        if self._conversations[index] is None:
            raise error.ResetNeeded("Cannot fork a sub-env of DatasetChatVectorEnv before reset")
        env = self.single_env.fork()
        env._conversation = self._conversations[index]
        env._item = copy.deepcopy(self._items[index])
        env._source = copy.copy(self.sources[index])
        return env

    def branch(self, index: int, count: int) -> DatasetChatVectorEnv:
        """A new vector env of ``count`` sub-envs, each in sub-env ``index``'s state (its
        conversation, item and stream position), stepped apart from this one: ``count``
        continuations of one episode side by side (a branched group, VinePPO's values). The
        task's settings and data are shared, read-only; the new env's sub-envs are one group.

        >>> from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
        >>> rows = [{"query": "a?"}, {"query": "b?"}]
        >>> envs = DatasetChatVectorEnv(DatasetChatEnv(rows, max_turns=3), num_envs=2)
        >>> _ = envs.reset(seed=0); _ = envs.step(["x", "y"])
        >>> branches = envs.branch(1, 3)
        >>> obs, *_ = branches.step(["p", "q", "r"])
        >>> [[m["content"] for m in h[1:]] for h in obs["history"]]
        [['y', 'p'], ['y', 'q'], ['y', 'r']]
        >>> [m["content"] for m in envs.conversations[1].history][1:]
        ['y']
        """
        index = check_int("index", index, 0, self.num_envs - 1)
        count = check_int("count", count, 1)
        env = self.fork_env(index)
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.num_envs, other.group_size, other.single_env = count, 1, env
        other.shards = (0, count)
        other.sources = [copy.copy(env._source) for _ in range(count)]
        other._conversations = [env._conversation] * count  # immutable: shared
        other._items = [copy.deepcopy(env._item) for _ in range(count)]
        other.observation_space = batch_space(other.single_observation_space, count)
        other.action_space = batch_space(other.single_action_space, count)
        other._out = create_empty_array(other.single_observation_space, count)
        other._pool = None
        return other

    @property
    def conversations(self) -> tuple[Conversation | None, ...]:
        """Each sub-env's episode so far (None before the first reset)."""
        return tuple(self._conversations)

    @property
    def items(self) -> tuple[dict[str, Any] | None, ...]:
        """Each sub-env's current item (None before the first reset)."""
        return tuple(None if s is None else dict(s) for s in self._items)

    @property
    def epoch_size(self) -> int | None:
        """Episodes in one epoch, split among the sub-envs (None without a fixed size)."""
        return self.single_env.epoch_size

    @property
    def level(self) -> int | None:
        """The task's difficulty level (None for data without levels)."""
        return self.single_env.level

    @property
    def num_levels(self) -> int | None:
        """How many levels the task has; None without levels."""
        return self.single_env.num_levels

    def set_level(self, level: int) -> None:
        """Draw the next items of every sub-env at ``level``: their sources are forks of
        one procedural source, which share the level."""
        self.single_env.set_level(level)

    def close_extras(self, **kwargs: object) -> None:
        """Stop the tool threads and the tools' servers."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.single_env.close()

    # -- internals ----------------------------------------------------------------------

    def _seeds(self, seed: Any) -> list[int | None]:
        if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
            return [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        if not isinstance(seed, (list, tuple, np.ndarray)):
            raise TypeError(
                "seed must be None, an int or a list of num_envs ints, got "
                f"{type(seed).__name__}: {seed!r:.40}"
            )
        if len(seed) != self.num_envs:
            raise ValueError(
                f"seed as a list must have num_envs={self.num_envs} entries, got {len(seed)}"
            )
        for i, s in enumerate(seed):
            if s is not None and (
                isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < i
            ):
                raise ValueError(
                    f"seed[{i}] must be None or an int >= {i} (sub-env {i} orders by "
                    f"seed[{i}] - {i}, so that seeds s, s+1, ... share one order), got {s!r}"
                )
        return [None if s is None else int(s) for s in seed]

    def _start(self, indices: Sequence[int], given: dict[str, Any] | None = None) -> list[dict]:
        """Start a new episode in each of ``indices``; their prompts are tokenized in one
        batch (a repeated prompt, as in a GRPO group, once). The reset infos."""
        items = [given or self.single_env.next_item(self.sources[i]) for i in indices]
        starts = [self.single_env.episode_start(item) for item in items]
        conversations = self.single_env.builder.start([history for history, _ in starts])
        for i, item, conversation in zip(indices, items, conversations, strict=True):
            self._items[i], self._conversations[i] = item, conversation
        return [info for _, info in starts]

    def _outcomes(self, actions: Sequence[Any]) -> list[Any]:
        if isinstance(actions, (str, bytes)) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"actions must be a sequence of {self.num_envs} responses, "
                f"got {type(actions).__name__}"
            )
        if len(actions) != self.num_envs:
            raise ValueError(
                f"actions must hold num_envs={self.num_envs} responses, got {len(actions)}"
            )
        env, conversations = self.single_env, self._conversations
        actions = decode_token_actions(actions, env.codec)  # one batch for all N
        reads = [
            _indexed(i, env.read_action, conversations[i], action)
            for i, action in enumerate(actions)
        ]
        records = self._run_tools(reads)  # after every action was checked
        scores = self._rubric_scores(reads)
        steps = [
            functools.partial(
                _indexed, i, env.advance, conversations[i], read, records[i], self._items[i],
                **({} if scores[i] is None else {"score": scores[i]}),
            )
            for i, read in enumerate(reads)
        ]  # fmt: skip
        if env.concurrent_reward and self.num_envs > 1:  # e.g. code run in the sandbox
            return list(self._threads().map(_call, steps))
        return [step() for step in steps]

    def _rubric_scores(self, reads: Sequence[ActionRead]) -> list[TaskScore | None]:
        """With a ``Rubric`` reward, the answers of this step scored in one ``score_batch``
        (its async parts, an LLM judge, run concurrently and batched across sub-envs), a
        GRPO group's group parts over the group when all its members answer in this step;
        None for each sub-env that is not scored here (a tool call, another reward)."""
        env = self.single_env
        scores: list[TaskScore | None] = [None] * len(reads)
        if not isinstance(env.reward, Rubric):
            return scores
        answering = [i for i, read in enumerate(reads) if not read.calls]
        if not answering:
            return scores
        position = {i: k for k, i in enumerate(answering)}
        size = self.group_size
        groups = [
            [position[i] for i in range(start, start + size)]
            for start in range(0, len(reads), size)
            if size > 1 and all(i in position for i in range(start, start + size))
        ]
        texts = [env.assistant_prefix + reads[i].content for i in answering]
        items = [self._items[i] for i in answering]
        for i, score in zip(answering, env.reward.score_batch(texts, items, groups=groups),
                            strict=True):  # fmt: skip
            scores[i] = score
        return scores

    def _run_tools(self, reads: Sequence[Any]) -> list[list[Any]]:
        """Every sub-env's tool calls, sub-envs concurrently (each one's calls in order):
        N calls of t seconds take about t, not N t."""
        records: list[list[Any]] = [[] for _ in reads]
        busy = [i for i, read in enumerate(reads) if read.calls]
        if not busy:
            return records
        run = self.single_env.run_tools
        ran = self._threads().map(lambda i: run(self._conversations[i], reads[i].calls), busy)
        for i, result in zip(busy, ran, strict=True):
            records[i] = result
        return records

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_envs, thread_name_prefix="llm_gym-env")
        return self._pool

    def _batched_obs(self) -> dict[str, Any]:
        obs = [self.single_env.observe(conversation) for conversation in self._conversations]
        return concatenate(self.single_observation_space, obs, self._out)


def _call(function: Callable[[], Any]) -> Any:
    return function()


def _indexed(i: int, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # A sub-env's error names the sub-env.
    try:
        return function(*args, **kwargs)
    except (TypeError, ValueError, KeyError) as err:
        raise type(err)(f"actions[{i}]: {err}") from err


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


def make_task_vector_env(
    num_envs: int = 1, shards: tuple[int, int] | None = None, **kwargs: object
) -> DatasetChatVectorEnv:
    """The ``vector_entry_point`` of every task's env id: ``num_envs`` conversations of
    ``make_task_env(**kwargs)`` (``shards``: ``DatasetChatVectorEnv``'s).

    >>> envs = make_task_vector_env(2, task_factory="llm_gym.tasks:countdown_task", level=0)
    >>> envs.reset(seed=0)[1]["target"].shape
    (2,)
    """
    return DatasetChatVectorEnv(make_task_env(**kwargs), num_envs, shards)
