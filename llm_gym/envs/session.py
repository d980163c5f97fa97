"""``SessionChatEnv``: the base of envs that play a session (a game, a server's episode, a
verifiers rollout) rather than score an answer; a subclass writes ``env_response``."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from llm_gym.envs.chat import ActionRead, Outcome
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.seeding import derive_seed
from llm_gym.sources import ProceduralSource

if TYPE_CHECKING:
    from llm_gym.chat.conversation import Conversation
    from llm_gym.rubrics import TaskScore
    from llm_gym.sources.datasets import DatasetLike
    from llm_gym.tools.toolbox import ToolRecord

__all__ = ["EnvResponse", "SessionChatEnv", "seed_stream"]

Messages = str | Sequence[Mapping[str, str]] | None


class EnvResponse(NamedTuple):
    """What the environment answers to the assistant's turn (``SessionChatEnv.env_response``).

    - ``messages``: what follows the turn: a ``str`` (one message in the env's ``user_role``),
      a list of ``{"role", "content"}`` messages (a tool's output, the next user turn), or
      None (nothing, as at the end).
    - ``reward``: the turn's reward.
    - ``terminated``: the environment ended the episode (a win, a loss, the task done).
    - ``truncated``: the environment cut it (its own limit, a failure).
    - ``info``: the step's info (None: empty).
    """

    messages: Messages = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] | None = None


class SessionChatEnv(DatasetChatEnv):
    """A chat in which the environment answers each assistant turn: a session, one turn a step.

    ## Description

    The base of the envs that play something with the policy rather than score one answer
    (``TextArenaEnv``: a game; ``OpenEnvChatEnv``: a server's episode; ``VerifiersChatEnv``: a
    verifiers rollout), as verifiers' ``MultiTurnEnv`` is: a subclass writes one method,
    ``env_response(conversation, text, item)``, what the environment answers to the
    assistant's turn ``text`` (an ``EnvResponse``: the next message(s), the reward, whether
    it ended, info), and, when a session has to be opened, ``episode_start(item)``. This base
    keeps the rest: the turn count, the cut at ``max_turns``, extending the conversation
    (token for token in ``"tokens"`` mode, the prefix checked), the end's info.

    Episodes start from the items of a seeded stream, as ``DatasetChatEnv``'s (a dataset's
    rows, or ``seed_stream``'s: one seed per session); the first user message is the
    item's ``"query"`` unless ``episode_start`` says otherwise. ``env_response`` gets the
    item and the conversation so far and stores nothing of them, so that one instance can
    play many conversations (``DatasetChatVectorEnv``); a subclass with state of its own (a
    game, a server session) sets ``shares_conversations = False``, and its vector env is
    ``sharded_vector_env``'s, one instance per sub-env.

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``; the
    text ``env_response`` gets is the turn as the history holds it (``assistant_prefix``
    first).

    ## Observation Space

    As ``ChatEnv``: the conversation as ``history``, ``text`` and/or ``tokens`` (and
    ``policy_mask``); each prompt is the last one, the policy's turn as sampled and the
    environment's messages.

    ## Rewards

    ``env_response``'s. The last step's ``info`` adds ``end_info(item, cut)`` (default:
    nothing) and ``reward``, the episode's total.

    ## Starting State

    ``episode_start(item)`` (default: ``[system_prompt?, the item's query]``) for the next
    item of the stream, or ``options={"item": {...}}``; with ``seed_field`` set, a given
    item's seed must be an int >= 0. ``reset(seed=s)`` restarts the stream ``s`` names.

    ## Episode End

    Terminated or truncated when ``env_response`` says so; truncated after ``max_turns``
    turns otherwise (None: no limit), when the environment's messages of that turn are
    dropped (the episode ends on the assistant's turn).

    ## Arguments

    - ``dataset``: the items (anything ``DatasetChatEnv`` takes, or ``seed_stream(...)``).
    - ``max_turns``: assistant turns per episode (default None: the environment decides).
    - ``**options``: ``DatasetChatEnv``'s (``seed``, ``repeats``, ``group_repeats``,
      ``shard``, ``system_prompt``, ``input_mode``, ``tokenizer``, ...); tools are not
      offered (the environment is the world).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> from llm_gym.envs import EnvResponse, SessionChatEnv
    >>> class Guess(SessionChatEnv):
    ...     def env_response(self, conversation, text, item):
    ...         right = text.strip().lower() == item["answer"]
    ...         return EnvResponse(None if right else "No, guess again.", float(right), right)
    >>> env = Guess([{"query": "A primary colour?", "answer": "red"}], max_turns=3)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step("blue")
    >>> obs["history"][-1]["content"], reward, terminated, truncated
    ('No, guess again.', 0.0, False, False)
    >>> obs, reward, terminated, truncated, info = env.step("Red")
    >>> reward, terminated, truncated, info
    (1.0, True, False, {'reward': 1.0})
    """

    #: The item field holding a session's seed (``seed_stream``'s); None: items are rows.
    seed_field: str | None = None
    rescorable = False  # the reward is the session's play, not a function of one response

    def __init__(
        self, dataset: DatasetLike, *, max_turns: int | None = None, **options: object
    ) -> None:
        if options.get("tools"):
            name, tools = type(self).__name__, options["tools"]
            raise TypeError(f"{name} plays without tools, got tools={tools!r}")
        if self.seed_field is not None:
            options.setdefault("required_fields", (self.seed_field,))
        super().__init__(dataset, max_turns=max_turns, **options)

    # -- what a subclass writes ---------------------------------------------------------------

    def env_response(
        self, conversation: Conversation, text: str, item: Mapping[str, Any]
    ) -> EnvResponse:
        """What the environment answers to the assistant's turn ``text`` (``assistant_prefix``
        included) in ``conversation`` (the episode before it) of ``item``."""
        raise NotImplementedError(f"{type(self).__name__} must implement env_response")

    def end_info(self, item: Mapping[str, Any], cut: bool) -> dict[str, Any]:
        """Info the episode's last step adds (what its record names: the task, its seed);
        ``cut``: ``max_turns`` ended it, not the environment. Default: none."""
        return {}

    # -- the bookkeeping --------------------------------------------------------------------

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The item of ``options={"item": {...}}`` (with ``seed_field``: an int >= 0 there),
        checked before anything changes, so a bad one leaves the running session as it was."""
        item = super().given_item(options)
        field = self.seed_field
        seed = None if item is None or field is None else item.get(field)
        if (item is not None and field is not None) and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
        ):
            name = type(self).__name__
            raise ValueError(f"{name}'s item needs an int {field} >= 0, got {seed!r}")
        return item

    def advance(
        self, conversation: Conversation, read: ActionRead, records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None, score: TaskScore | None = None,
    ) -> Outcome:  # fmt: skip
        """Play the turn ``read``: ``env_response``'s answer, cut at ``max_turns``, the end's
        info, ``conversation`` extended (``ChatEnv.advance``'s contract; ``score`` unused)."""
        item = self._item if item is None else item
        answer = self.env_response(conversation, self.assistant_prefix + read.content, item)
        if not isinstance(answer, tuple):
            raise TypeError(
                f"{type(self).__name__}.env_response must return an EnvResponse, got "
                f"{type(answer).__name__}"
            )
        answer = EnvResponse(*answer)
        terminated, truncated = bool(answer.terminated), bool(answer.truncated)
        reward, info = float(answer.reward), dict(answer.info or {})
        cut = not (terminated or truncated) and (
            self.max_turns is not None and conversation.turns + 1 >= self.max_turns
        )
        added = [] if cut else self._messages(answer.messages)
        if terminated or truncated or cut:
            info.update(self.end_info(item, cut))
            info.update(self._ended_info(item))  # the reward's version
            info["reward"] = float(sum(conversation.rewards) + reward)
        return self._conclude(conversation, read, added, reward, terminated, truncated or cut, info)

    def _messages(self, messages: Messages) -> list[dict[str, str]]:
        if messages is None:
            return []
        if isinstance(messages, str):
            return [{"role": self.user_role, "content": messages}]
        if isinstance(messages, Sequence) and all(
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m
            for m in messages
        ):
            return [dict(m) for m in messages]
        raise TypeError(
            f"{type(self).__name__}.env_response's messages must be a str, a list of "
            f"{{'role', 'content'}} dicts or None, got {messages!r:.80}"
        )


def seed_stream(field: str, **fields: Any) -> ProceduralSource:
    """A seeded stream of session items ``{**fields, field: k}``, ``k`` an int >= 0 drawn
    from the stream's seed and the item's index (so the same seed replays the same sessions);
    ``fields`` needs a ``"query"``.

    >>> source = seed_stream("game_seed", query="Sudoku-v0")
    >>> source.reseed(0)
    >>> sorted(source.next_item())
    ['game_seed', 'query']
    """
    return ProceduralSource(functools.partial(_seeded_item, field, fields), num_levels=1, level=0)


def _seeded_item(
    field: str, fields: Mapping[str, Any], seed: int, index: int, level: int
) -> dict[str, Any]:
    # Item ``index`` of the stream ``seed`` orders: the seed of one session.
    return {**fields, field: derive_seed(seed, index)}
