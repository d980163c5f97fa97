"""What the gateway records of an episode: every model call's exact tokens (``Call``), and the
training sequences they make (``segments``: ``llm_gym.episodes.Segment``s).

A call whose prompt extends an earlier call's prompt plus its completion, token for token,
continues that call's sequence: the policy mask is True on the sampled tokens only, and the
tokens between (the template closing the turn, tool results, the next user message) are the
prompt's. A call that extends none (the agent rewrote, summarised or dropped its history)
starts a sequence of its own: an episode of ``k`` segments trains on ``k`` sequences and says
so, never on a re-tokenized history.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from llm_gym.checks import check_int, check_number
from llm_gym.episodes import Segment

__all__ = ["Call", "Recorder", "segments"]


@dataclass(frozen=True)
class Call:
    """One sampled completion of a model call (a call with ``n`` choices records ``n``).

    - ``index``: its place among the episode's calls (choices of one request are consecutive).
    - ``prompt_ids``: the prompt's token ids (the chat template's rendering; a continued
      conversation's earlier turns as they were sampled, never re-tokenized).
    - ``parent``: the index of the call whose prompt and completion ``prompt_ids`` extends
      (``prompt_mask`` then marks those completions' tokens), None: a new segment.
    - ``prompt_mask``: True on the tokens of ``prompt_ids`` the policy sampled (earlier
      completions of the same segment).
    - ``tokens`` / ``log_probs``: the completion as the sampler returned it (cut after a stop
      string, if one came), and each token's log-prob (None from a sampler without them).
    - ``version``: the policy version that sampled it; ``finish_reason``: ``"stop"``,
      ``"length"`` or ``"tool_calls"``; ``text``: the reply's text.
    """

    index: int
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    parent: int | None
    tokens: np.ndarray
    log_probs: np.ndarray | None
    version: int | None
    finish_reason: str
    text: str
    endpoint: str = "chat"


def segments(calls: list[Call]) -> list[Segment]:
    """The training sequences of an episode's ``calls``: one per call that no later call
    extends, each holding the calls it continues.

    >>> a = Call(0, np.array([1, 2]), np.zeros(2, bool), None, np.array([3]), np.array([-0.5]),
    ...          0, "stop", "x")
    >>> b = Call(1, np.array([1, 2, 3, 4]), np.array([0, 0, 1, 0], bool), 0, np.array([5, 6]),
    ...          np.array([-1.0, -2.0]), 1, "stop", "y")
    >>> (seg,) = segments([a, b])
    >>> seg.ids.tolist(), seg.policy_mask.astype(int).tolist(), seg.log_probs.tolist()
    ([1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 1], [-0.5, -1.0, -2.0])
    >>> seg.calls, seg.versions
    ((0, 1), (0, 1))
    """
    by_index = {call.index: call for call in calls}
    extended = {call.parent for call in calls if call.parent is not None}
    out = []
    for call in calls:
        if call.index in extended:
            continue
        path = [call]
        while path[-1].parent is not None:
            path.append(by_index[path[-1].parent])
        path.reverse()
        ids = np.concatenate([call.prompt_ids, call.tokens]).astype(np.int64)
        mask = np.concatenate([call.prompt_mask, np.ones(len(call.tokens), np.bool_)])
        log_probs = None
        if all(c.log_probs is not None for c in path):
            log_probs = np.concatenate([c.log_probs for c in path]).astype(np.float32)
        versions = tuple(c.version for c in path)
        out.append(Segment(ids, mask, log_probs, versions, tuple(c.index for c in path)))
    return out


@dataclass
class _Episode:
    calls: list[Call] = field(default_factory=list)
    next_index: int = 0
    # Per chat choice, newest last: (its request's messages and its reply, normalised; its
    # call; the conversation before the reply), what a later request may extend.
    turns: list[tuple[list, dict, Call, object]] = field(default_factory=list)
    owner: str | None = None  # the API key that opened it
    touched: float = field(default_factory=time.monotonic)  # its last call


class Recorder:
    """The calls of each episode (keyed by the name a request gives), safe across threads.

    Args:
        ttl: seconds an episode is kept after its last call (None: for ever).
        max_episodes: episodes kept at most; past it the one called longest ago goes.

    An episode belongs to the key that opened it (``owner``): ``claim`` says whether a key
    may extend it. Closed names are remembered as long (``ttl``, and at most
    ``4 * max_episodes`` of them).
    """

    def __init__(self, ttl: float | None = 3600.0, max_episodes: int = 1024) -> None:
        self.ttl = None if ttl is None else check_number("ttl", ttl, 0, strict=True)
        self.max_episodes = check_int("max_episodes", max_episodes, 1)
        self._episodes: dict[str, _Episode] = {}  # oldest call first
        self._closed: dict[str, float] = {}
        self._lock = threading.Lock()
        self.expired = 0  # episodes dropped for their age or the cap, for the curious

    def close(self, name: str) -> None:
        """End episode ``name``: its record is dropped and later calls are refused."""
        with self._lock:
            self._episodes.pop(name, None)
            self._closed.pop(name, None)
            self._closed[name] = time.monotonic()
            self._expire()

    def is_closed(self, name: str) -> bool:
        """Whether episode ``name`` was closed."""
        with self._lock:
            self._expire()
            return name in self._closed

    def claim(self, name: str, key: str | None) -> bool:
        """Whether the caller with API key ``key`` may extend episode ``name``: it is not
        recorded yet, or ``key`` opened it, or it is named ``key`` (a key's own episode is
        always its own: one another key opened under that name first is dropped)."""
        with self._lock:
            self._expire()
            episode = self._episodes.get(name)
            if episode is None or episode.owner == key:
                return True
            if name == key:
                del self._episodes[name]
                return True
            return False

    def _open(self, name: str, owner: str | None, admin: bool = False) -> _Episode:
        """The episode ``name`` for ``owner`` (made on its first call; a ``LookupError``
        when another key owns it, unless ``admin``), newest in the order."""
        self._expire()
        episode = self._episodes.pop(name, None)
        if episode is not None and not admin and owner is not None and episode.owner != owner:
            if name != owner:
                self._episodes[name] = episode
                raise LookupError(f"episode {name!r} belongs to another API key")
            episode = None  # opened under this key's name by another: not that one's
        if episode is None:
            episode = _Episode(owner=owner)
            while len(self._episodes) >= self.max_episodes:
                del self._episodes[next(iter(self._episodes))]
                self.expired += 1
        episode.touched = time.monotonic()
        self._episodes[name] = episode
        return episode

    def _expire(self) -> None:
        if self.ttl is not None:
            old = time.monotonic() - self.ttl
            for name in [n for n, e in self._episodes.items() if e.touched < old]:
                del self._episodes[name]
                self.expired += 1
            for name in [n for n, at in self._closed.items() if at < old]:
                del self._closed[name]
        while len(self._closed) > 4 * self.max_episodes:
            del self._closed[next(iter(self._closed))]

    def episode(self, name: str, owner: str | None = None) -> _Episode:
        """The running record of episode ``name`` (made on its first call, by ``owner``)."""
        with self._lock:
            return self._open(name, owner)

    def reserve(self, name: str, count: int, owner: str | None = None, admin: bool = False) -> int:
        """The first of ``count`` consecutive call indices for episode ``name`` (opened by
        ``owner`` if new; a ``LookupError`` if another key owns it, unless ``admin``)."""
        with self._lock:
            episode = self._open(name, owner, admin)
            first, episode.next_index = episode.next_index, episode.next_index + count
            return first

    def add(self, name: str, call: Call, turn: tuple[list, dict, object] | None = None) -> None:
        """Record ``call`` for episode ``name``; ``turn`` (a chat call's request messages,
        reply and conversation) lets later calls extend it."""
        with self._lock:
            episode = self._episodes.get(name)
            if episode is None:  # dropped since its reserve (closed, expired): made anew
                episode = self._open(name, None)
            episode.calls.append(call)
            if turn is not None:
                messages, reply, conversation = turn
                episode.turns.append((messages, reply, call, conversation))

    def extends(self, name: str, messages: list) -> tuple[Call, object, int] | None:
        """The newest chat choice of episode ``name`` that ``messages`` (normalised) continue,
        its messages then its reply first: (its call, its conversation, how many of
        ``messages`` that covers); None if none."""
        with self._lock:
            episode = self._episodes.get(name)
            for before, reply, call, conversation in reversed(episode.turns if episode else []):
                n = len(before)
                if len(messages) > n and messages[n] == reply and messages[:n] == before:
                    return call, conversation, n + 1
        return None

    def calls(self, name: str) -> list[Call]:
        """Episode ``name``'s calls so far, in order (none: an empty list)."""
        with self._lock:
            self._expire()
            episode = self._episodes.get(name)
            return sorted(episode.calls, key=lambda c: c.index) if episode else []

    def pop(self, name: str) -> list[Call]:
        """Episode ``name``'s calls, forgetting the episode (its next call starts afresh)."""
        with self._lock:
            self._expire()
            episode = self._episodes.pop(name, None)
            return sorted(episode.calls, key=lambda c: c.index) if episode else []

    def owner(self, name: str) -> str | None:
        """The API key that opened episode ``name`` (None: no key, or no such episode)."""
        with self._lock:
            episode = self._episodes.get(name)
            return episode.owner if episode else None

    def extends_tokens(self, name: str, prompt: np.ndarray) -> tuple[Call, np.ndarray] | None:
        """The newest completions call of episode ``name`` whose prompt and completion
        ``prompt`` starts with, and the mask of ``prompt`` (True on the sampled tokens)."""
        with self._lock:
            episode = self._episodes.get(name)
            for call in reversed(episode.calls if episode else []):
                head = len(call.prompt_ids) + len(call.tokens)
                if call.endpoint != "completions" or len(prompt) < head:
                    continue
                if np.array_equal(prompt[: len(call.prompt_ids)], call.prompt_ids) and (
                    np.array_equal(prompt[len(call.prompt_ids) : head], call.tokens)
                ):
                    rest = np.zeros(len(prompt) - head, np.bool_)
                    return call, np.concatenate(
                        [call.prompt_mask, np.ones(len(call.tokens), np.bool_), rest]
                    )
        return None

    def names(self) -> list[str]:
        """The episodes with calls recorded and not popped (nor expired)."""
        with self._lock:
            self._expire()
            return list(self._episodes)
