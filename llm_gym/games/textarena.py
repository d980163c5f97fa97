"""TextArena's games as llm_gym plays them: ``TextArenaGame`` (one game with a random state of
its own, each player's messages as chat turns), ``game_catalogue`` (what the installed
``textarena`` holds and what of it plays here) and ``PolicyOpponent`` (a model as a seat).

TextArena's games draw from the global ``random`` module. Each ``TextArenaGame`` swaps its own
state in around every call into the game, under one lock, so games played side by side (the
sub-envs of a vector env, threads of the async driver) reproduce the games their seeds name.

>>> game = TextArenaGame("GuessTheNumber-v0")
>>> messages = game.reset(seed=3)
>>> "Guess The Number" in messages
True
>>> game.step("[10]")
False
>>> game.messages()
'[GAME] The target number is lower.'
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import random
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "GameInfo",
    "Opponent",
    "PolicyOpponent",
    "TextArenaGame",
    "game_catalogue",
    "game_ids",
    "outcome_of",
]

INSTALL_HINT = "pip install 'llm-gym[games]' (textarena)"
# Registered variants that differ from their base id only in TextArena's observation
# wrappers, which llm_gym replaces with chat turns: the same game here.
_WRAPPER_SUFFIXES = ("-raw", "-train")
# nltk resources by name, where nltk.data.find looks for them.
_NLTK_PATHS = {
    "words": "corpora/words",
    "averaged_perceptron_tagger_eng": "taggers/averaged_perceptron_tagger_eng",
}
_NLTK_HINT = (
    "llm_gym downloads nothing and no package on the registry holds it; run nltk.download() "
    "for it once where there is network, or set NLTK_DATA to a folder that holds it"
)
_RANDOM_LOCK = threading.Lock()  # the global random module, lent to one game at a time
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
Opponent = Callable[[str], str]  # TextArena's Agent: the observation text in, the action out


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as error:
        raise ImportError(f"TextArena's games need textarena: {INSTALL_HINT}") from error
    return textarena


def _registry() -> dict[str, Any]:
    return _textarena().envs.registration.ENV_REGISTRY


def game_ids() -> list[str]:
    """Every game id of the installed ``textarena`` (its wrapper variants left out).

    >>> {"Wordle-v0", "Sudoku-v0", "TicTacToe-v0"} <= set(game_ids())
    True
    """
    return [key for key in _registry() if not key.endswith(_WRAPPER_SUFFIXES)]


@dataclass(frozen=True)
class GameInfo:
    """What the catalogue knows of a game without playing it: ``players`` (1, 2, or None for
    more or a variable number, as its module's TextArena state class says) and ``missing``
    (why it cannot be played here; None: it can)."""

    game: str
    players: int | None
    missing: str | None


def game_catalogue() -> list[GameInfo]:
    """Every game of ``game_ids`` with its players and what it misses here, read from the
    game modules' source without importing them (importing some downloads nltk data)."""
    infos, by_module = [], {}
    for game in game_ids():
        module = _registry()[game].entry_point.split(":")[0]
        if module not in by_module:
            by_module[module] = _read_module(module)
        infos.append(GameInfo(game, *by_module[module]))
    return infos


def _read_module(module: str) -> tuple[int | None, str | None]:
    # A game module's players and what it misses here, from its source (see GameInfo).
    root = Path(_textarena().__file__).parent
    path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
    try:
        source = path.read_text(encoding="utf-8")
        compile(source, str(path), "exec")
    except SyntaxError:
        return None, "its module needs a newer Python"
    except OSError:
        return None, "its module is not in the installed package"
    states = set(re.findall(r"\b(SinglePlayer|TwoPlayer|\w+MultiPlayer)State\(", source))
    players = {frozenset({"SinglePlayer"}): 1, frozenset({"TwoPlayer"}): 2}.get(frozenset(states))
    words = "nltk" in source or "EnglishDictionary" in source
    missing = [name for name in _NLTK_PATHS if words and name in _needed(source)]
    missing = [name for name in missing if not _nltk_has(name)]
    if missing:
        return players, f"needs nltk data {', '.join(map(repr, missing))}, not installed"
    if "OpenRouter" in source:
        return players, "needs an OpenRouter API key and network (its judge is a hosted model)"
    return players, None


def _needed(source: str) -> set[str]:
    # What a module's nltk use reads: the word list, and the tagger where it tags words.
    return {"words"} | ({"averaged_perceptron_tagger_eng"} if "pos_tag" in source else set())


def _nltk_has(name: str) -> bool:
    import nltk

    try:
        nltk.data.find(_NLTK_PATHS.get(name, name))
    except LookupError:
        return False
    return True


class _MissingData(LookupError):
    pass


def _refuse_download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
    # nltk.download while a game is made: there is no network here, so a resource that is
    # not installed is refused by name instead of waiting on a download.
    name = str(info_or_id)
    if _nltk_has(name):
        return True
    raise _MissingData(name)


@contextlib.contextmanager
def _no_downloads() -> Iterator[None]:
    import nltk

    download, nltk.download = nltk.download, _refuse_download
    try:
        yield
    finally:
        nltk.download = download


def _check_id(game: Any) -> str:
    if not isinstance(game, str) or game not in _registry():
        stem = str(game).lower().split("-")[0]
        near = [g for g in game_ids() if g.lower().startswith(stem)]
        hint = f"; did you mean {near[:5]}?" if near else " (llm-gym envs lists them)"
        raise ValueError(f"game must be a TextArena game id (e.g. 'Sudoku-v0'), got {game!r}{hint}")
    return game


def _make(game: str) -> Any:
    ta = _textarena()
    try:
        with _RANDOM_LOCK, _no_downloads():
            env = ta.make(game)
    except LookupError as error:  # a resource nltk looked for and did not find
        found = re.search(r"Resource\s+'?(\w+)", _ANSI.sub("", str(error)))
        name = error.args[0] if isinstance(error, _MissingData) else (found and found.group(1))
        raise ValueError(f"game {game!r} needs nltk data {name!r}: {_NLTK_HINT}") from None
    except (ImportError, SyntaxError, OSError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"game {game!r} cannot be played here: {reason}") from None
    # TextArena's observation wrappers render a player's whole log as one text; llm_gym keeps
    # messages as chat turns instead. Its action wrappers (adding brackets) are the game's.
    while isinstance(env, ta.ObservationWrapper):
        env = env.env
    return env


def outcome_of(reward: float, players: int) -> str:
    """``"win"``, ``"draw"`` or ``"loss"`` for a player's final TextArena reward: in a
    two-player game +1 / 0 / -1; alone, a win is reward 1 (the rest is partial credit).

    >>> outcome_of(1.0, 1), outcome_of(0.6, 1), outcome_of(0.0, 2), outcome_of(-1.0, 2)
    ('win', 'loss', 'draw', 'loss')
    """
    if players == 1:
        return "win" if reward >= 1.0 else "loss"
    return "win" if reward > 0 else "draw" if reward == 0 else "loss"


def _normal(sender: Any, text: Any, kind: Any) -> tuple[Any, str, Any]:
    """A message as ``(sender, text, kind)``. Some games pass ``add_observation``'s arguments
    in the wrong order (Countdown-v0: ``(player, action, kind)`` lands as
    ``(kind, player, action)``); such a message is put back in order."""
    if isinstance(sender, _textarena().ObservationType) and isinstance(kind, str):
        sender, text, kind = text, kind, sender
    return sender, str(text), kind


def _reward_in_order(reward: Any, info: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """The reward as a float. Some games pass ``set_invalid_move``'s reward and reason in the
    wrong order (Countdown-v0, Cryptarithm-v0, Slitherlink-v0: the reward is the reason's text
    and the reason ends with the reward); such a result is put back in order."""
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        return float(reward), info
    head, _, number = str(info.get("reason", "")).rpartition(": ")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"the game's reward is not a number: {reward!r}") from None
    info["reason"] = f"{head}: {reward}" if head else str(reward)
    return value, info


class TextArenaGame:
    """One TextArena game: ``reset`` it, ``step`` the learner's actions (the opponent answers
    in the same call), read the learner's new ``messages``; ``result`` at the end.

    Args:
        game: a TextArena game id (``game_ids``).
        opponent: for a two-player game, the other seat: any ``observation -> action``
            callable (TextArena's agents are such, ``PolicyOpponent`` puts a model there).
            Its observation is TextArena's text of its seat's whole log.
        seat: the learner's player id (0 moves first).

    Raises ``ValueError`` for an unknown game, one that cannot be played here (the data or
    service it needs, in one line), or one whose player count does not fit ``opponent``.
    """

    def __init__(self, game: str, opponent: Opponent | None = None, seat: int = 0) -> None:
        if opponent is not None and not callable(opponent):
            raise TypeError(
                "opponent must be a callable observation -> action (a TextArena agent, a "
                f"function or llm_gym.games.PolicyOpponent), got {type(opponent).__name__}"
            )
        self.players = 1 if opponent is None else 2
        if seat not in range(self.players):
            raise ValueError(f"seat must be 0 or 1 with an opponent, 0 without, got {seat!r}")
        self.game, self.opponent, self.seat = _check_id(game), opponent, seat
        self.declared, missing = _read_module(_registry()[game].entry_point.split(":")[0])
        if missing is not None and missing.startswith("needs nltk"):  # all of it, by name
            raise ValueError(f"game {game!r} {missing}: {_NLTK_HINT}")
        self.env = _make(game)
        self._random = random.Random(0).getstate()
        self._log: list[tuple[int, str]] = []  # the opponent's seat's messages
        self.done = False
        self.refused = False  # whether the game refused the learner's last move
        try:
            if self.declared not in (None, self.players):
                raise AssertionError(f"its state is for {self.declared} players")
            with self._random_state():  # another player count fails here, not at a reset
                self.env.reset(num_players=self.players, seed=0)
        except AssertionError as error:
            need = "leave opponent=None"
            if self.players == 1:
                need = "pass opponent=..." if self.declared == 2 else "it is not played here"
            raise ValueError(
                f"game {game!r} does not play with {self.players} player(s) ({error}): {need}"
            ) from None

    def fork(self) -> TextArenaGame:
        """An independent copy of the game in its current state (TextArena's env deep-copied);
        the opponent is shared (a policy, a model: nothing of the game's state)."""
        return copy.deepcopy(self, {id(self.opponent): self.opponent})

    def reset(self, seed: int) -> str:
        """Start the game ``seed`` names; the learner's first message (after the opponent's
        first move when the learner is player 1)."""
        self._log, self.done, self.refused = [], False, False
        with self._random_state():
            random.seed(seed)
            self.env.reset(num_players=self.players, seed=seed)
        self._play_opponent()
        return self.messages()

    def step(self, action: str) -> bool:
        """Play the learner's ``action``, then the opponent's moves until it is the learner's
        turn again; whether the game is over. ``refused`` then says whether the game refused
        the learner's move as invalid (with a warning, or past its error allowance, the end)."""
        if self.done:
            raise RuntimeError("the game is over: reset it")
        state = self.env.state
        errors = getattr(state, "error_count", 0)
        self._play(action)
        # Read before the opponent moves: its valid move resets the state's error count.
        ended_invalid = self.done and state.game_info.get(self.seat, {}).get("invalid_move")
        self.refused = getattr(state, "error_count", 0) > errors or bool(ended_invalid)
        self._play_opponent()
        return self.done

    def messages(self) -> str:
        """The learner's messages since its last action (its own actions left out: they are
        the assistant's turns), one per line, as TextArena names their senders."""
        new = self._take(self.seat)
        lines = [self._line(sender, text) for sender, text, _ in new if sender != self.seat]
        return "\n".join(lines)

    def result(self) -> tuple[float, dict[str, Any]]:
        """The learner's reward and TextArena's game info for it (``reason``,
        ``invalid_move``, ``turn_count``) once the game is over."""
        with self._random_state():
            rewards, game_info = self.env.close()
        return _reward_in_order(rewards[self.seat], dict(game_info.get(self.seat, {})))

    def progress(self) -> float | None:
        """The game's own measure of how far the learner has come (its partial credit, what
        it pays at an unfinished end: GuessTheNumber's closeness of the last valid guess),
        None for a game that keeps none."""
        measure = getattr(self.env, "_get_percentage_completion", None)
        if measure is None:
            return None
        with self._random_state():
            try:
                return float(measure())
            except Exception:  # a game's measure that fails on its state: none
                return None

    def _take(self, player: int) -> list[tuple[Any, str, Any]]:
        observations = self.env.state.observations
        new, observations[player] = list(observations[player]), []
        return [_normal(*message) for message in new]

    def _line(self, sender: int, text: str) -> str:
        name = "GAME" if sender < 0 else self.env.state.role_mapping.get(sender, f"Player {sender}")
        return f"[{name}] {text}"

    def _play_opponent(self) -> None:
        while not self.done and self.env.state.current_player_id != self.seat:
            other = self.env.state.current_player_id
            if self.opponent is None:
                raise ValueError(
                    f"game {self.game!r} gave the turn to player {other}: it needs an opponent"
                )
            self._log += [(sender, text) for sender, text, _ in self._take(other)]
            observation = "".join(f"\n{self._line(s, t)}" for s, t in self._log)
            action = self.opponent(observation)
            if not isinstance(action, str):
                raise TypeError(f"opponent must return a str action, got {type(action).__name__}")
            self._play(action)

    def _play(self, action: str) -> None:
        """The mover's ``action`` played. A move the game fails on (GuessTheNumber's ``int()``
        of a 5000-digit guess raises ValueError) is that move's invalid move, by TextArena's
        rules: a warning, and past the game's error allowance the end with its penalty."""
        with self._random_state():
            try:
                self.done, _ = self.env.step(action=action)
            except Exception as error:  # the move is a model's: any text at all
                self.done = self._invalid_move(error)

    def _invalid_move(self, error: Exception) -> bool:
        # What the game itself does with a move it rejects: set_invalid_move, then the state's
        # step, which ends the turn (and the game, past the error allowance).
        state = self.env.state
        detail = " ".join(str(error).split())[:200]
        reason = f"The game could not read the move ({type(error).__name__}: {detail})."
        penalty = {}
        if "reward" in inspect.signature(state.set_invalid_move).parameters:
            # A one-player game's penalty: its partial credit, as its own invalid moves pass it
            # (without one, TextArena's default).
            with contextlib.suppress(Exception):
                penalty["reward"] = float(self.env._get_percentage_completion())
        state.set_invalid_move(reason=reason, **penalty)
        done, _ = state.step()
        return bool(done)

    @contextlib.contextmanager
    def _random_state(self) -> Iterator[None]:
        with _RANDOM_LOCK:
            outside = random.getstate()
            random.setstate(self._random)
            try:
                yield
            finally:
                self._random = random.getstate()
                random.setstate(outside)


class PolicyOpponent:
    """A model in the opponent's seat: any llm_gym policy over ``history`` observations (a
    ``TransformersPolicy(model, tokenizer)``, a ``SamplerPolicy``) answers TextArena's
    observation text as a one-message chat. The trained policy itself is self-play: the
    opponent improves with the learner, and only the learner's turns are trained on.

    >>> opponent = PolicyOpponent(lambda obs: [{"text": "[4]"}])
    >>> opponent("[GAME] Your move.")
    '[4]'
    """

    def __init__(self, policy: Callable[[Mapping[str, Any]], Any], system_prompt: str = "") -> None:
        if not callable(policy):
            raise TypeError(f"policy must be callable on observations, got {type(policy).__name__}")
        self.policy, self.system_prompt = policy, system_prompt

    def __call__(self, observation: str) -> str:
        messages = [{"role": "user", "content": observation}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        (response,) = self.policy({"history": (messages,)})
        return response["text"] if isinstance(response, Mapping) else response.text
