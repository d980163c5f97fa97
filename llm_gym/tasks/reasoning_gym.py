"""reasoning-gym (``LLMChat-ReasoningGym-v0``): any of its 100+ generated tasks, scored by
the task's own verifier, with its curriculum as levels (the ``reasoning`` extra). The reward
is a ``Rubric`` (``answer_rubric``: the gate ``format`` and the reward ``right``)."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from llm_gym.checks import check_reward
from llm_gym.rewards.answers import score_answer, system_prompt
from llm_gym.rubrics import TaskScore, answer_rubric
from llm_gym.sources.procedural import ProceduralSource
from llm_gym.tasks.task import Task, reward_version

__all__ = ["ReasoningGymGenerator", "reasoning_gym_task"]

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


class ReasoningGymGenerator:
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
        if task_config is not None and not isinstance(task_config, Mapping):
            # dict() of a str fails as "dictionary update sequence element #0"
            raise ValueError(
                f"task_config must be a dict of the config fields of {task!r} (a JSON object, e.g. "
                f"--env-arg task_config='{{\"max_terms\": 3}}'), got {task_config!r} "
                f"({type(task_config).__name__})"
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
        """Question ``index`` of ``seed`` at ``level`` (None: the task's own configuration)."""
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
    task: ReasoningGymGenerator,
    answer_format: str,
    format_reward: float,
    response: str,
    item: Mapping[str, Any],
) -> TaskScore:
    scores: list[float] = []

    def grade(answer: str) -> float:
        scores.append(task.score(answer, item))
        return scores[-1]

    score = score_answer(response, answer_format, grade, format_reward=format_reward, numeric=False)
    info = score.info() | {
        "score": scores[-1] if scores else 0.0,
        "answer": item["answer"],
        "task": item["task"],
        "metadata": copy.deepcopy(item["metadata"]),  # fresh: the reset info holds the same
    }
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def reasoning_gym_task(
    *,
    task: str = "basic_arithmetic",
    task_config: Mapping[str, Any] | None = None,
    level: int | None = 0,
    answer_format: str = "tags",
    format_reward: float = 0.0,
) -> Task:
    """A reasoning-gym task: generated questions, scored by the task's own verifier.

    ## Description

    Each episode asks one question that reasoning-gym generates for ``task`` from the seed
    (offline); the task's ``score_answer`` scores the extracted answer.

    ## Rewards

    The task's score of the answer, in [0, 1] (1.0 is ``success``); ``format_reward`` (0.0)
    is the floor for a response that gives an answer, 0.0 without one. The reward is a
    ``Rubric`` (``answer_rubric``): the gate ``format`` (an answer in ``answer_format``) and
    the reward ``right`` (the value above). ``info``: the parts' values, TorchRL's parts,
    ``score`` (the task's), ``answer`` (the ground truth, a str), ``task`` and ``metadata``;
    the reset ``info`` holds the last three.

    ## Arguments

    - ``task``: a reasoning-gym task name (``reasoning_gym.factory.DATASETS``);
      ``task_config``: its config fields (e.g. ``{"max_terms": 3}``), which win over the
      level's.
    - ``level``: the curriculum's global level (0, the easiest, by default; the env's
      ``set_level`` changes it); None: the task's own default configuration as the only
      level. A task without a curriculum has one level.
    - ``answer_format``: ``"tags"`` (default), ``"boxed"``, ``"hash"`` or ``"last_number"``;
      ``format_reward``: the floor for a well-formed answer.

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
    prompt = system_prompt(_DESCRIPTION, answer_format)  # checks answer_format
    format_reward = check_reward("format_reward", format_reward)
    generator = ReasoningGymGenerator(task, task_config)
    num_levels = generator.num_levels if level is not None else 1
    if level is not None and (
        isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < num_levels
    ):
        raise ValueError(
            f"level must be None or an int in [0, {num_levels - 1}] for {task!r}, got {level!r}"
        )
    fixed = level is None or generator.num_levels == 1
    generator.check(None if fixed else level)

    def generate(seed: int, index: int, current: int) -> dict[str, Any]:
        return generator.question(seed, index, None if fixed else current)

    return Task(
        source=ProceduralSource(generate, num_levels=num_levels, level=level or 0),
        prompt=prompt,
        reward=answer_rubric(
            functools.partial(_score, generator, answer_format, format_reward),
            answer_format,
            numeric=False,  # as _score reads the answer
        ),
        answer_format=answer_format,
        reward_version=reward_version("1", "reasoning-gym"),
    )
