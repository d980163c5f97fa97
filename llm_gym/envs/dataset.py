"""``DatasetChatEnv``: a ``ChatEnv`` whose user queries come from a task's source, scored by
the task's reward; ``make_task_env`` makes one from a ``Task`` or a task's function."""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from llm_gym.chat.history import History
from llm_gym.checks import check_bool, check_int
from llm_gym.envs.chat import ActionRead, ChatEnv, Outcome
from llm_gym.rubrics import Part, TaskReward, TaskScore, extend_reward
from llm_gym.sources import IndexedSource, IterableSource, Shard, Source
from llm_gym.sources.datasets import is_iterable_dataset, load_records
from llm_gym.tasks.task import FieldMap, Task

if TYPE_CHECKING:
    from llm_gym.chat.conversation import Conversation
    from llm_gym.sources.datasets import DatasetLike
    from llm_gym.tools.toolbox import ToolRecord

__all__ = ["DatasetChatEnv", "QUERY_KEY", "make_task_env", "task_function"]

QUERY_KEY = "query"


class DatasetChatEnv(ChatEnv):
    """A ``ChatEnv`` that starts each episode from the next item of a dataset.

    ## Description

    The Gymnasium form of TorchRL's ``DatasetChatEnv``. Each ``reset`` draws an item, puts
    its ``"query"`` field in the user message (after ``system_prompt``) and returns the
    item's other fields in ``info``. Each step's response is scored by ``reward`` against
    the current item. ``from_task`` serves an ``llm_gym.tasks.Task`` (the registered
    ``LLMChat-<task>-v0`` ids are such envs).

    Items are served in a seeded order (``llm_gym.sources``): each epoch serves every
    item exactly once, ``repeats`` times in a row (a GRPO group), whatever the process.

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: a ``Dict`` with the prompt as ``history``, ``text`` and/or ``tokens``.

    ## Rewards

    ``reward(response_text, item)``'s reward, its info merged into the step's ``info``;
    ``0.0`` and an empty ``info`` without a ``reward``. With ``reward_parts`` the reward is
    ``llm_gym.rubrics.extend_reward(reward, reward_parts, task_weight=...)``: a ``Rubric`` of
    the task's parts and these (an LLM judge, a metric), each part's value in ``info``.
    The step that ends an episode adds ``reward_version`` (the task's) and ``item`` (the
    item it played, after ``field_map``) to ``info``: what ``llm-gym rescore`` scores a
    stored episode again with (no ``item`` where the reward is a play's, not ``rescorable``).

    ## Starting State

    ``[system_prompt?, user query]`` with the query of the next item, or of
    ``options={"item": {...}}`` (a record with the dataset's columns) when given.
    ``reset(seed=s)`` restarts the order that seed ``s`` defines (``s - i`` with
    ``shard=(i, n)``, so that a vector env's ``reset(seed=s)``, which gives sub-env ``i`` the
    seed ``s + i``, puts every shard on one order); ``reset()`` serves the next.

    ## Episode End

    As ``ChatEnv``; ``max_turns`` defaults to 1 here, so one response ends the episode with
    ``terminated=True``. With ``max_turns > 1`` the first answered response (``TaskScore``'s
    ``answered``) terminates the episode, else it is truncated after ``max_turns`` responses.

    ## Arguments

    - ``dataset``: a Hub dataset name (with ``name=`` config and ``split=``), a path to a
      local ``.jsonl``/``.json``/``.parquet`` file or a folder of them, a ``datasets.Dataset``
      (or ``DatasetDict`` with ``split=``), a sequence of dicts, or a ``llm_gym.sources``
      ``Source``. Use ``from_dataloader`` for an iterable such as a ``DataLoader``.
    - ``name`` / ``split``: the Hub config and split (a folder's files are split by name).
    - ``shuffle``: shuffle each epoch (default True); ``seed``: the order's seed (None:
      random, until ``reset(seed=...)``).
    - ``repeats``: serve each item this many times in a row (default 1).
    - ``group_repeats``: in ``DatasetChatVectorEnv``, require ``num_envs`` to be a multiple
      of ``repeats``, so that each item's copies fill consecutive sub-envs in one step (a
      GRPO group side by side); a single env is unaffected.
    - ``shard``: ``(index, count)`` (``llm_gym.sources.Shard``; None: all), so ``count`` envs
      (sub-envs, data-parallel ranks) with one seed split each epoch exactly once. Not for
      ``from_dataloader``.
    - ``field_map``, ``reward``, ``required_fields``, ``answer_format``,
      ``concurrent_reward``, ``reward_version``: the task's, as ``llm_gym.tasks.Task`` says;
      the fields are checked on the first item, so a dataset without them fails here.
    - ``reward_parts``: ``llm_gym.rubrics.Part``s added to the task's reward (default: none);
      ``task_weight``: what the task's own parts pay then (default 1.0; 0: reported as
      metrics, not paid).
    - ``system_prompt``, ``max_turns``: as ``ChatEnv`` (``max_turns`` defaults to 1).
    - ``**chat_options``: ``ChatEnv``'s other arguments (``input_mode``, ``tokenizer``, ...).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> from llm_gym.envs import DatasetChatEnv
    >>> rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    >>> env = DatasetChatEnv(rows, field_map={"question": "query"}, repeats=2, seed=0)
    >>> for _ in range(4):
    ...     obs, info = env.reset()
    ...     print(obs["history"][-1]["content"], info)
    1+1? {'answer': '2'}
    1+1? {'answer': '2'}
    2+2? {'answer': '4'}
    2+2? {'answer': '4'}
    >>> obs, reward, terminated, truncated, info = env.step("4")
    >>> reward, terminated, truncated
    (0.0, True, False)
    """

    # Whether one instance can step many conversations (its steps read only a conversation
    # and its item), as ``DatasetChatVectorEnv`` does; an env with state of its own (a
    # game) says False.
    shares_conversations = True
    # Whether the reward reads only the response and the item, so that a stored episode can
    # be scored again from its record (``llm-gym rescore``); an env whose reward is its play
    # (a game, a sandbox's state) says False, and its records carry no item.
    rescorable = True

    def __init__(
        self,
        dataset: DatasetLike,
        *,
        name: str | None = None,
        split: str | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        repeats: int | None = 1,
        group_repeats: bool = False,
        shard: tuple[int, int] | None = None,
        field_map: FieldMap | None = None,
        reward: TaskReward | None = None,
        required_fields: tuple[str, ...] = (),
        concurrent_reward: bool = False,
        reward_version: str | None = None,
        answer_format: str | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = 1,
        reward_parts: Sequence[Part] = (),
        task_weight: float = 1.0,
        **chat_options: object,
    ) -> None:
        # Cheap checks first, so that bad arguments fail before any data is loaded.
        repeats = check_int("repeats", 1 if repeats is None else repeats, 1)
        check_bool("shuffle", shuffle)
        check_bool("group_repeats", group_repeats)
        self.concurrent_reward = check_bool("concurrent_reward", concurrent_reward)
        sharding = Shard.parse(shard, repeats)
        if field_map is not None and not (isinstance(field_map, Mapping) or callable(field_map)):
            raise TypeError(
                "field_map must be a dict of column renames (e.g. {'question': 'query'}) or a "
                f"function of a record, got {type(field_map).__name__}"
            )
        if reward is not None and not callable(reward):
            raise TypeError(
                "reward must be a function reward(response_text, item) -> (reward, info), "
                f"got {type(reward).__name__}"
            )
        if "query" in chat_options:
            raise TypeError("DatasetChatEnv takes its queries from the dataset, got query=")
        reward_parts = tuple(reward_parts)
        if not all(isinstance(part, Part) for part in reward_parts):
            got = [type(part).__name__ for part in reward_parts]
            raise TypeError(f"reward_parts must be llm_gym.rubrics.Part objects, got {got}")
        if reward_parts or task_weight != 1.0:
            reward = extend_reward(reward, reward_parts, task_weight=task_weight)
        super().__init__(system_prompt=system_prompt, max_turns=max_turns, **chat_options)
        self.reward = reward
        self.required_fields = tuple(required_fields)
        if reward_version is not None and not isinstance(reward_version, str):
            raise TypeError(
                f"reward_version must be a str or None, got {type(reward_version).__name__}"
            )
        self.reward_version = reward_version
        self.answer_format = answer_format
        self.repeats = repeats
        self.group_repeats = group_repeats
        self.field_map = field_map
        self.shard = (sharding.index, sharding.count)
        if isinstance(dataset, Source):
            self._source = dataset.for_shard(sharding)
            if seed is not None:
                self._source.reseed(seed)
        elif is_iterable_dataset(dataset):
            self._source = IterableSource(dataset, repeats=self.repeats)
        else:
            records = load_records(dataset, name=name, split=split)
            self._source = IndexedSource(records, shuffle=shuffle, seed=seed, shard=sharding)
        if isinstance(self._source, IterableSource) and sharding.count > 1:
            raise ValueError(
                f"shard={shard!r} needs an indexable dataset or a procedural task; an "
                "iterable's order is its own (shard the dataloader's sampler instead)"
            )
        if isinstance(self._source, IndexedSource):
            self._check_fields(self._source.data[0])
        self._item: dict[str, Any] | None = None

    @classmethod
    def from_task(cls, task: Task, **kwargs: object) -> DatasetChatEnv:
        """The env serving ``task``: its source, prompt, fields and reward; ``kwargs`` are
        this class's other arguments (``seed``, ``repeats``, ``max_turns``, ``input_mode``,
        ...) and win over the task's, except ``system_prompt=None``, which keeps its prompt.

        >>> from llm_gym.tasks import Task
        >>> env = DatasetChatEnv.from_task(Task([{"query": "2+2?"}], prompt="Be brief."))
        >>> [m["content"] for m in env.reset(seed=0)[0]["history"]]
        ['Be brief.', '2+2?']
        """
        if not isinstance(task, Task):
            raise TypeError(f"task must be an llm_gym.tasks.Task, got {type(task).__name__}")
        given = {k: v for k, v in kwargs.items() if not (k == "system_prompt" and v is None)}
        # A callable source loads the task's data now, when the env is made.
        source = task.source() if callable(task.source) else task.source
        return cls(source, **(dict(task) | given))

    @classmethod
    def from_dataloader(cls, dataloader: Iterable[Any], **kwargs: object) -> DatasetChatEnv:
        """An env whose items come from any iterable, in the iterable's own order (what it
        may yield: ``llm_gym.sources.IterableSource``). ``kwargs`` are this class's arguments
        except ``dataset``, ``name``, ``split``, ``shuffle`` and ``seed``.

        >>> env = DatasetChatEnv.from_dataloader([{"query": ["a", "b"], "id": [0, 1]}])
        >>> [env.reset()[1]["id"] for _ in range(3)]
        [0, 1, 0]
        """
        for key in ("dataset", "name", "split", "shuffle", "seed"):
            if key in kwargs:
                raise TypeError(f"from_dataloader() takes no {key}=: the dataloader decides it")
        return cls(dataset=IterableSource(dataloader), **kwargs)

    # -- data ------------------------------------------------------------------------------

    @property
    def source(self) -> Source:
        """Where the items come from (shared with the forks of this env)."""
        return self._source

    @property
    def task(self) -> Task:
        """The task this env serves: its source, prompt, fields and reward."""
        return Task(
            source=self._source,
            prompt=self.system_prompt,
            reward=self.reward,
            answer_format=self.answer_format,
            field_map=self.field_map,
            required_fields=self.required_fields,
            concurrent_reward=self.concurrent_reward,
            reward_version=self.reward_version,
        )

    @property
    def level(self) -> int | None:
        """The difficulty level of the next items; None for data without levels."""
        return getattr(self._source, "level", None)

    @property
    def epoch_size(self) -> int | None:
        """Episodes in one epoch of the whole stream: every item ``repeats`` times (None
        for procedural tasks and iterables, which have no fixed size)."""
        if not isinstance(self._source, IndexedSource):
            return None
        return len(self._source) * self.repeats

    @property
    def num_levels(self) -> int | None:
        """How many levels the task has (``0 .. num_levels - 1``); None without levels."""
        return getattr(self._source, "num_levels", None)

    def set_level(self, level: int) -> None:
        """Draw the next items at ``level`` (a procedural task's difficulty). The current
        item's remaining repeats keep theirs, so a GRPO group is never split."""
        if self.num_levels is None:
            raise ValueError(
                "this task has no difficulty levels: its data is a fixed dataset, not a "
                "procedural generator"
            )
        self._source.set_level(level)

    def fork(self) -> DatasetChatEnv:
        """``ChatEnv.fork``, with the episode's item and the stream's position copied (the
        data shared: ``Source``'s copy), so the fork's next resets serve what the original's
        would have."""
        other = super().fork()
        other._source = copy.copy(self._source)
        other._item = copy.deepcopy(self._item)
        return other

    @property
    def item(self) -> dict[str, Any] | None:
        """The current episode's item after ``field_map`` (None before the first reset)."""
        return None if self._item is None else dict(self._item)

    def reset_dataloader(self) -> DatasetChatEnv:
        """Serve from the start of the order again (same seed), as TorchRL's method does."""
        self._source.rewind()
        return self

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode from the next item, or ``options={"item": {...}}``; ``seed``
        restarts the order it defines."""
        given = self.given_item(options)  # checked before reseeding: a bad one changes nothing
        if seed is not None:
            self._source.reseed(self._order_seed(seed))
        return super().reset(seed=seed, options={"item": given} if given else None)

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The item ``options`` gives (``{"item": {...}}``, mapped and checked), or None;
        raises before anything changes."""
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        unknown = sorted(set(options or {}) - {"item"})
        if unknown:
            raise ValueError(f"options may hold ['item'], got unknown keys {unknown}")
        return self._map(options["item"]) if options and "item" in options else None

    def _initial_history(self, options: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        self._item = options.get("item") or self.next_item()
        return self.episode_start(self._item)

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """The first prompt of ``item``'s episode and the reset info (the item's fields)."""
        info = {key: value for key, value in item.items() if key != QUERY_KEY}
        return self._history_for(item[QUERY_KEY]), info

    def advance(
        self,
        conversation: Conversation,
        read: ActionRead,
        records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None,
        score: TaskScore | None = None,
    ) -> Outcome:
        """``ChatEnv.advance``; the step that ends the episode also says the reward's version
        and, where ``rescorable``, the item played (``info["reward_version"]``,
        ``info["item"]``)."""
        outcome = super().advance(conversation, read, records, item, score)
        if not (outcome.terminated or outcome.truncated):
            return outcome
        return outcome._replace(info={**outcome.info, **self._ended_info(item)})

    def _ended_info(self, item: Mapping[str, Any] | None) -> dict[str, Any]:
        # What the step that ends an episode adds to its info (this class's Rewards section).
        ended: dict[str, Any] = {}
        if self.reward_version is not None:  # unversioned: no key
            ended["reward_version"] = self.reward_version
        if self.rescorable:
            ended["item"] = dict((self._item if item is None else item) or {})
        return ended

    def score(self, response: str, item: Mapping[str, Any]) -> TaskScore:
        """``response`` (the whole assistant text, ``assistant_prefix`` included) scored
        against ``item`` by this env's reward, as a step would: what ``llm-gym rescore``
        calls on a stored episode.

        >>> env = DatasetChatEnv([{"query": "1+1?", "answer": "2"}],
        ...                      reward=lambda text, item: (float(text == item["answer"]), {}))
        >>> env.score("2", {"answer": "2"}).reward, env.score("3", {"answer": "2"}).reward
        (1.0, 0.0)
        """
        reward, answered, info = self._score(response, item)
        return TaskScore(reward, info, answered)

    def _score(
        self, response: str, item: Mapping[str, Any] | None
    ) -> tuple[float, bool, dict[str, Any]]:
        if self.reward is None:
            return 0.0, False, {}
        result = self.reward(response, self._item if item is None else item)
        if not isinstance(result, tuple) or len(result) not in (2, 3):
            raise TypeError(
                "reward must return (reward, info) or a TaskScore, got "
                f"{type(result).__name__}: {result!r:.80}"
            )
        score = TaskScore(*result)
        return float(score.reward), bool(score.answered), score.info

    def next_item(self, source: Source | None = None) -> dict[str, Any]:
        """The next item of ``source`` (default: this env's), mapped to the env's fields."""
        return self._map((self._source if source is None else source).next_item())

    def _order_seed(self, seed: Any) -> int:
        seed, index = check_int("seed", seed, 0), self.shard[0]
        if seed < index:
            raise ValueError(
                f"seed must be >= the shard index {index} (shard={self.shard}: reset(seed=s) "
                f"orders by s - {index}, as a vector env seeds sub-env i with s + i), got {seed}"
            )
        return seed - index

    def _map(self, record: Any) -> dict[str, Any]:
        if not isinstance(record, Mapping):
            raise TypeError(f"an item must be a dict of fields, got {type(record).__name__}")
        if self.field_map is None:
            item = dict(record)
        elif isinstance(self.field_map, Mapping):
            missing = [column for column in self.field_map if column not in record]
            if missing:
                raise KeyError(
                    f"field_map names columns {missing} that the item does not have; "
                    f"its columns are {list(record)}"
                )
            item = {self.field_map.get(key, key): value for key, value in record.items()}
        else:
            item = self.field_map(record)
            if not isinstance(item, Mapping):
                raise TypeError(f"field_map must return a dict, got {type(item).__name__}")
            item = dict(item)
        query = item.get(QUERY_KEY)
        if not isinstance(query, str):
            got = "no such field" if QUERY_KEY not in item else type(query).__name__
            raise KeyError(
                f"each item needs a str {QUERY_KEY!r} field (rename a column with "
                f"field_map={{'question': 'query'}}); got {got}, fields {sorted(item)}"
            )
        return item

    def _check_fields(self, first: Any) -> None:
        # Fail at construction, naming the argument, rather than at the first reset.
        try:
            item = self._map(first)
        except KeyError as error:
            raise ValueError(f"dataset's items do not fit: {error.args[0]}") from None
        missing = [name for name in self.required_fields if name not in item]
        if missing:
            raise ValueError(
                f"dataset's items lack the fields {missing} the task's reward reads; its "
                f"fields are {sorted(item)} (rename a column with field_map=...)"
            )


def make_task_env(
    task_factory: str | Callable[..., Task] | Task, **kwargs: object
) -> DatasetChatEnv:
    """The env of a task: ``task_factory`` (a ``Task``, a function returning one, or its
    ``"module:function"`` path) is called with the arguments it declares, and
    ``DatasetChatEnv.from_task`` gets the rest. Each ``LLMChat-<task>-v0`` id is this
    function with the task's function (``llm_gym.register_task``).

    >>> env = make_task_env("llm_gym.tasks.countdown:countdown_task", level=0, seed=0)
    >>> env.level, env.reset(seed=0)[1]["target"] == env.item["target"]
    (0, True)
    """
    if isinstance(task_factory, str):
        module, _, name = task_factory.partition(":")
        task_factory = getattr(importlib.import_module(module), name)
    if isinstance(task_factory, Task):
        return DatasetChatEnv.from_task(task_factory, **kwargs)
    if not callable(task_factory):
        raise TypeError(
            f"task_factory must be a Task, a function returning one or its 'module:function' "
            f"path, got {type(task_factory).__name__}"
        )
    # The function's own parameters make the task; everything else configures the env.
    own = inspect.signature(task_factory).parameters
    task = task_factory(**{k: v for k, v in kwargs.items() if k in own})
    return DatasetChatEnv.from_task(task, **{k: v for k, v in kwargs.items() if k not in own})


def task_function(env_id: str) -> Callable[..., Any] | None:
    """The task function ``env_id`` makes its env with (``register_task``'s), imported but
    not called (no data loads); None for an env that is not a task's.

    >>> task_function("LLMChat-Countdown-v0").__name__, task_function("LLMChat-v0")
    ('countdown_task', None)
    """
    spec = gym.spec(env_id)
    if "task" in spec.kwargs:  # a token-level env over a task env (LLMToken-*)
        return task_function(spec.kwargs["task"])
    factory = spec.kwargs.get("task_factory")
    return load_env_creator(factory) if isinstance(factory, str) else factory
