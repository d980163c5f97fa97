"""What a reward says of one response (``TaskScore``) and a reward's signature
(``TaskReward``): the contract a task's reward, a ``Rubric`` and its parts all keep."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["TaskReward", "TaskScore"]


class TaskScore(NamedTuple):
    """What a task's reward says of one response.

    ``answered``: whether the response gave an answer, which ends a multi-turn episode
    (``max_turns > 1``); a plain ``(reward, info)`` pair counts as answered.
    """

    reward: float
    info: dict[str, Any]
    answered: bool = True


# reward(response_text, item) -> TaskScore or (reward, info); item is the record after
# field_map, query included.
TaskReward = Callable[[str, Mapping[str, Any]], "TaskScore | tuple[float, dict[str, Any]]"]
