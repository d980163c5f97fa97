"""Any reasoning-gym task as an llm_gym task: generated questions, the task's own verifier.

reasoning-gym (PyPI ``reasoning-gym``, the ``reasoning`` extra) generates 100+ kinds of
questions offline from a seed, scores answers with each task's ``score_answer`` and, for most
tasks, defines a curriculum of difficulty levels. Level ``L`` here is the curriculum at global
level ``L``; ``task_config`` fixes any field whatever the level.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from llm_gym.envs.dataset import DatasetChatEnv, TaskScore
from llm_gym.envs.procedural import ProceduralSource
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.answers import check_answer_format, check_reward, score_answer
from llm_gym.tasks._build import task_env
from llm_gym.tasks.formats import system_prompt

__all__ = ["ReasoningGymTask", "make_reasoning_gym_env", "make_reasoning_gym_vector_env"]

# Questions are drawn by index from a dataset of this size (reasoning-gym seeds each one with
# seed + index, so a large size costs nothing).
_SIZE = 1_000_000
_DESCRIPTION = "The user asks a question, and the Assistant solves it."


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(
            "LLMChat-ReasoningGym-v0 needs reasoning-gym: pip install 'llm-gym[reasoning]' "
            "(or pip install reasoning-gym)"
        ) from error
    return reasoning_gym


class ReasoningGymTask:
    """One reasoning-gym task at a level: questions by ``(seed, index, level)``, and scores.

    Picklable (it holds names and settings; datasets are rebuilt on demand), so async vector
    envs can take it.
    """

    def __init__(self, task: str, task_config: Mapping[str, Any] | None = None) -> None:
        rg = _reasoning_gym()
        datasets = rg.factory.DATASETS
        if task not in datasets:
            raise ValueError(
                f"task must be a reasoning-gym task, one of {sorted(datasets)}; got {task!r}"
            )
        config = dict(task_config or {})
        fields = [
            f.name for f in dataclasses.fields(datasets[task][1]) if f.name not in ("seed", "size")
        ]
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise ValueError(
                f"task_config has keys {unknown} that {task!r} does not take; its keys are {fields}"
            )
        self.task, self.task_config = task, config
        self.num_levels = 1
        if rg.factory.has_curriculum(task):
            curriculum = rg.factory.create_curriculum(task)
            self.num_levels = max(len(a.levels) for a in curriculum.attributes.values())

    def check(self, level: int | None) -> None:
        """Build the dataset at ``level`` once: a config the task rejects fails here, naming
        ``task_config``, not at the first reset."""
        try:
            self._dataset(0, level)
        except (AssertionError, ValueError, TypeError) as error:
            raise ValueError(
                f"task_config {self.task_config} does not fit {self.task!r} at level {level}: "
                f"{error}"
            ) from None

    def __getstate__(self) -> dict[str, Any]:
        return {"task": self.task, "task_config": self.task_config, "num_levels": self.num_levels}

    @functools.lru_cache(maxsize=32)  # noqa: B019 (one task object per env; few (seed, level) pairs)
    def _dataset(self, seed: int, level: int | None) -> Any:
        rg = _reasoning_gym()
        dataset_cls, config_cls = rg.factory.DATASETS[self.task]
        settings = {"seed": seed, "size": _SIZE}
        if level is None:
            config = config_cls(**settings, **self.task_config)
        else:
            curriculum = rg.factory.create_curriculum(self.task)
            curriculum.set_global_level(level)
            config = curriculum.generate_configuration(settings)
            config = dataclasses.replace(config, **self.task_config)
        return dataset_cls(config)

    def question(self, seed: int, index: int, level: int | None) -> dict[str, Any]:
        entry = self._dataset(seed % 2**31, level)[index % _SIZE]
        return {
            "query": entry["question"],
            "answer": str(entry["answer"]),
            "task": self.task,
            "metadata": entry.get("metadata", {}),
        }

    def score(self, answer: str, sample: Mapping[str, Any]) -> float:
        """The task's own ``score_answer`` of ``answer``, in [0, 1]."""
        entry = {
            "question": sample["query"],
            "answer": sample["answer"],
            "metadata": sample["metadata"],
        }
        score_fn = _reasoning_gym().factory.get_score_answer_fn(self.task)
        return float(score_fn(answer, entry))


def _score(
    task: ReasoningGymTask,
    answer_format: str,
    format_reward: float,
    response: str,
    sample: Mapping[str, Any],
) -> TaskScore:
    scores: list[float] = []

    def grade(answer: str) -> float:
        scores.append(task.score(answer, sample))
        return scores[-1]

    score = score_answer(response, answer_format, grade, format_reward=format_reward, numeric=False)
    info = score.info() | {
        "score": scores[-1] if scores else 0.0,
        "answer": sample["answer"],
        "task": sample["task"],
        "metadata": copy.deepcopy(sample["metadata"]),  # fresh: the reset info holds the same
    }
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def make_reasoning_gym_env(
    *,
    task: str = "basic_arithmetic",
    task_config: Mapping[str, Any] | None = None,
    level: int | None = 0,
    answer_format: str = "tags",
    format_reward: float = 0.0,
    seed: int | None = None,
    **env_kwargs: Any,
) -> DatasetChatEnv:
    """A reasoning-gym task: generated questions, scored by the task's own verifier.

    ## Description

    Each episode asks one question that reasoning-gym generates for ``task`` from the seed
    (offline); the policy's extracted answer is scored by the task's ``score_answer``.

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: a ``Dict`` with the prompt as ``history``, ``text`` and/or ``tokens``.

    ## Rewards

    The task's score of the answer, in [0, 1] (1.0 is ``success``); ``format_reward`` (default
    0.0) is the floor for a response that gives an answer, 0.0 without one. ``info`` holds
    TorchRL's parts (``reward_answer``, ``reward_think``, ``reward_right``, ``reward``,
    ``success``), ``score`` (the task's), ``answer`` (the ground truth, a str), ``task`` and
    ``metadata`` (the entry's).

    ## Starting State

    ``[system, user question]``; the reset ``info`` holds ``answer``, ``task`` and
    ``metadata``.

    ## Episode End

    With ``max_turns=1`` (default) the response ends the episode with ``terminated=True``;
    with more turns, the first answer does.

    ## Arguments

    - ``task``: a reasoning-gym task name (``reasoning_gym.factory.DATASETS``).
    - ``task_config``: the task's config fields (e.g. ``{"max_terms": 3}``); they win over
      the level's.
    - ``level``: the curriculum's global level (0, the default, is the easiest; ``set_level``
      changes it); None: the task's own default configuration, as the only level. A task
      without a curriculum has one level.
    - ``answer_format``: ``"tags"`` (default), ``"boxed"``, ``"hash"`` or ``"last_number"``.
    - ``format_reward``: the reward's floor for a well-formed answer.
    - ``seed``: the questions' seed (the sub-envs of a vector env split its questions).
    - ``env_kwargs``: ``DatasetChatEnv``'s other arguments (``repeats``, ``group_repeats``,
      ``input_mode``, ``tokenizer``, ``assistant_prefix``, ``system_prompt``, ...).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-ReasoningGym-v0", task="basic_arithmetic",
    ...                task_config={"max_terms": 2}, seed=0)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(f"<answer>{info['answer']}</answer>")
    >>> reward, info["success"], info["task"]
    (1.0, True, 'basic_arithmetic')
    """
    check_answer_format(answer_format)
    format_reward = check_reward("format_reward", format_reward)
    rg_task = ReasoningGymTask(task, task_config)
    num_levels = rg_task.num_levels if level is not None else 1
    if level is not None and (
        isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < num_levels
    ):
        raise ValueError(
            f"level must be None or an int in [0, {num_levels - 1}] for {task!r}, got {level!r}"
        )
    fixed = level is None or rg_task.num_levels == 1
    rg_task.check(None if fixed else level)

    def generate(seed: int, index: int, current: int) -> dict[str, Any]:
        return rg_task.question(seed, index, None if fixed else current)

    source = ProceduralSource(generate, num_levels=num_levels, level=level or 0, seed=seed)
    reward = functools.partial(_score, rg_task, answer_format, format_reward)
    task_kwargs = {"system_prompt": system_prompt(_DESCRIPTION, answer_format), "reward": reward}
    return task_env(source, task_kwargs, env_kwargs, seed=seed)


def make_reasoning_gym_vector_env(num_envs: int = 1, **kwargs: Any) -> DatasetChatVectorEnv:
    """``LLMChat-ReasoningGym-v0``'s ``vector_entry_point``: N conversations of one task."""
    return DatasetChatVectorEnv(make_reasoning_gym_env(**kwargs), num_envs)
