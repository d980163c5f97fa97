"""``TextArenaEnv``: one of TextArena's games as a multi-turn chat, and its vector env."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gymnasium.vector import AutoresetMode, SyncVectorEnv

from llm_gym.chat.history import History
from llm_gym.checks import check_choice, check_reward, check_str
from llm_gym.envs.session import EnvResponse, SessionChatEnv, seed_stream
from llm_gym.envs.sharded import PartVectorEnv, sharded_env_fns
from llm_gym.games import Opponent, TextArenaGame, outcome_of
from llm_gym.tasks.task import reward_version

if TYPE_CHECKING:
    from llm_gym.chat.conversation import Conversation

__all__ = ["REWARDS", "TEXTARENA_ID", "TextArenaEnv", "make_textarena_vector_env"]

TEXTARENA_ID = "LLMChat-TextArena-v0"
REWARDS = ("game", "progress", "outcome")  # what a move pays: see TextArenaEnv's Rewards
NO_MESSAGE = "[GAME] Your move."  # the user turn when a move brought the learner no message


class TextArenaEnv(SessionChatEnv):
    """A TextArena game, played by the policy one chat turn per move.

    ## Description

    Each episode is one game of ``game`` (any single-player game of the installed
    ``textarena``: Sudoku, Minesweeper, TowerOfHanoi, GuessTheNumber, Mastermind, FrozenLake,
    Sokoban, Crosswords, ...; or a two-player one against ``opponent``). The game's opening
    messages are the first user turn; each action is the policy's move, which the game reads
    by its own rules (most want the move in square brackets, as its prompt says); the game's
    answer (hints, the board, an invalid-move warning, the opponent's move) is the next user
    turn. The games are TextArena's own: its rules, messages, turn limits and rewards.

    ## Action Space

    As ``ChatEnv``: the move as a ``str`` (or token ids in ``"tokens"`` mode), or a
    ``Response``.

    ## Observation Space

    As ``ChatEnv``: the conversation as ``history``, ``text`` and/or ``tokens`` (and
    ``policy_mask``); in ``"tokens"`` mode each prompt extends the last one's tokens with
    the tokens the policy sampled, the prefix checked every turn.

    ## Rewards

    By ``rewards``: ``"game"`` (the default), ``0.0`` until the game ends, then TextArena's
    reward for the learner's seat: alone, 1 for a win and the game's partial credit otherwise
    (in most games the share solved; an invalid move after its warning ends the game with the
    game's penalty); against an opponent +1 / 0 / -1. ``"progress"`` (one-player games): each
    move pays the change in the game's own measure of progress (the partial credit it would
    pay at that point: GuessTheNumber's closeness of the last valid guess), and the last move
    the rest of the game's reward, so the moves' rewards sum to the game's reward exactly
    (shaping by a potential, which leaves the best play as it was). ``"outcome"`` (one-player
    games; GEM's rewards for games): the winning move pays 1, every other move 0, a lost game
    nothing (TextArena's partial credit left out). In every mode each move the game refuses
    as invalid (with its warning, or the one that ends the game) also pays
    ``invalid_move_reward`` (GEM pays -0.1 for a move it cannot read): credit for each turn,
    which ``llm-gym train --advantage turn-grpo`` (or ``rebn``) gives to that move's tokens.
    A move the game fails on (an exception of TextArena's, such as
    GuessTheNumber's on a 5000-digit guess) is an invalid move of whoever made it, the
    learner or the opponent, never an exception out of ``step``. The last step's ``info``
    has ``outcome`` (``"win"``, ``"draw"``, ``"loss"``, or ``"unfinished"`` when
    ``max_turns`` cut the game), ``success`` (a win), TextArena's ``reason`` and
    ``invalid_move``, the game's ``task`` and ``game_seed``, and ``reward`` (the moves'
    rewards added up: the game's own in ``"game"`` and ``"progress"`` without
    ``invalid_move_reward``; a record keeps it as ``reward_task`` beside KL penalties).

    ## Starting State

    The game's opening for the next item of a seeded stream of games: ``reset(seed=s)``
    restarts the stream ``s`` names (so the same seed replays the same games),
    ``reset(options={"item": {"query": game, "game_seed": k}})`` plays game ``k``. The
    reset ``info`` holds ``task`` (the game id) and ``game_seed``. With ``repeats=G`` each
    game is served ``G`` times in a row (a GRPO group).

    ## Episode End

    Terminated when TextArena ends the game (a win, a loss, its own turn limit, repeated
    invalid moves); truncated after ``max_turns`` moves of the learner (None: no limit
    beyond the game's).

    ## Arguments

    - ``game``: a TextArena game id (``llm-gym envs`` lists them; default
      ``"GuessTheNumber-v0"``). A game that needs data that is not installed (some need
      nltk's word lists) or a hosted judge is refused in one line naming what is missing.
    - ``opponent``: the other seat of a two-player game (``llm_gym.games.TextArenaGame``):
      a callable ``observation -> action`` such as a TextArena agent, a fixed function, or
      ``llm_gym.games.PolicyOpponent`` over a second model or the trained policy itself.
    - ``seat``: the learner's player id in a two-player game (0 moves first).
    - ``rewards``: what each move pays (``REWARDS``; see Rewards): ``"progress"`` needs a
      one-player game whose TextArena class measures it (``_get_percentage_completion``).
    - ``invalid_move_reward``: added to the reward of each move the game refuses (default 0).
    - ``max_turns``: the learner's moves per episode (None: the game's own limit).
    - ``seed``, ``repeats``, ``group_repeats``, ``shard``: the stream of games, as
      ``DatasetChatEnv``'s (``llm_gym.envs.sharded_env_fns`` shards it over sub-envs).
    - ``system_prompt`` and ``**chat_options``: as ``ChatEnv`` (``input_mode``,
      ``tokenizer``, ...); tools are not offered in games.

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0", max_turns=5)
    >>> obs, info = env.reset(seed=3)
    >>> info["task"], obs["history"][0]["content"].splitlines()[0]
    ('GuessTheNumber-v0', '[GAME] You are Player 0. You are playing Guess The Number.')
    >>> low, high, terminated = 1, 20, False
    >>> while not terminated:  # a binary search on the game's hints
    ...     guess = (low + high) // 2
    ...     obs, reward, terminated, truncated, info = env.step(f"[{guess}]")
    ...     hint = obs["history"][-1]["content"]
    ...     low, high = (guess + 1, high) if "higher" in hint else (low, guess - 1)
    ...     print(guess, hint if not terminated else info["outcome"], reward)
    10 [GAME] The target number is higher. 0.0
    15 [GAME] The target number is lower. 0.0
    12 win 1.0
    """

    shares_conversations = False  # a game's state is its own: no DatasetChatVectorEnv
    seed_field = "game_seed"

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        *,
        opponent: Opponent | None = None,
        seat: int = 0,
        rewards: str = "game",
        invalid_move_reward: float = 0.0,
        **options: object,
    ) -> None:
        check_str("game", game)
        check_choice("rewards", rewards, REWARDS)
        invalid_move_reward = check_reward("invalid_move_reward", invalid_move_reward)
        if invalid_move_reward > 0:
            raise ValueError(
                f"invalid_move_reward={invalid_move_reward!r} would pay for a move the game "
                "refuses: pass a value <= 0 (GEM's is -0.1)"
            )
        # The game's own rules pay (TextArena's version), on llm_gym's reading of them.
        options.setdefault("reward_version", reward_version("1", "textarena"))
        super().__init__(seed_stream(self.seed_field, query=game, game=game), **options)
        self.game = game
        self._game = TextArenaGame(game, opponent, seat)
        if rewards != "game" and self._game.players > 1:
            raise ValueError(
                f"rewards={rewards!r} needs a one-player game; {game!r} has an opponent"
            )
        if rewards == "progress" and self._game.progress() is None:
            raise ValueError(
                "rewards='progress' needs a game that measures its progress; "
                f"{game!r} measures none"
            )
        self.rewards, self.invalid_move_reward = rewards, invalid_move_reward
        self._progress = 0.0  # the game's progress after the learner's last move

    def fork(self) -> TextArenaEnv:
        """``DatasetChatEnv.fork``, with the game's state copied (its board, its log, the
        random state it plays with); an opponent is shared."""
        other = super().fork()
        other._game = self._game.fork()
        return other

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """Reset the game at ``item``'s ``game_seed``: its first message as the prompt."""
        seed = int(item["game_seed"])
        self._progress = 0.0
        return self._history_for(self._game.reset(seed)), {"task": self.game, "game_seed": seed}

    def env_response(
        self, conversation: Conversation, text: str, item: Mapping[str, Any]
    ) -> EnvResponse:
        """Play ``text`` as the game's move: the game, not a reward function, decides the end,
        the reward and the next user message (the game's, or the opponent's move)."""
        done = self._game.step(text)
        penalty = self.invalid_move_reward if self._game.refused else 0.0
        if not done:
            reward = 0.0
            if self.rewards == "progress":  # the move's share of the game's reward
                now = self._game.progress() or 0.0
                reward, self._progress = now - self._progress, now
            return EnvResponse(self._game.messages() or NO_MESSAGE, reward + penalty)
        reward, game_info = self._game.result()
        outcome = outcome_of(reward, self._game.players)
        paid = reward  # "game"
        if self.rewards == "progress":  # the rest of the game's reward
            paid = reward - self._progress
        elif self.rewards == "outcome":  # a win or nothing, as GEM pays
            paid = float(outcome == "win")
        info = {"outcome": outcome, "success": outcome == "win"}
        info.update(reason=str(game_info.get("reason", "")))
        info.update(invalid_move=bool(game_info.get("invalid_move", False)))
        return EnvResponse(None, paid + penalty, terminated=True, info=info)

    def end_info(self, item: Mapping[str, Any], cut: bool) -> dict[str, Any]:
        """The episode's record names its game (and, cut by ``max_turns``, an unfinished one)."""
        info = {"task": self.game, "game_seed": item["game_seed"]}
        if cut:
            unfinished = {"outcome": "unfinished", "success": False, "reason": "max_turns"}
            info = {**unfinished, "invalid_move": False, **info}
        return info


def make_textarena_vector_env(
    num_envs: int = 1, shards: tuple[int, int] | None = None, **kwargs: object
) -> SyncVectorEnv:
    """The ``vector_entry_point`` of ``LLMChat-TextArena-v0``: ``num_envs`` games side by
    side, one ``TextArenaEnv`` each on one shard of the stream of games (so ``repeats=G`` with
    ``group_repeats=True`` puts each game in ``G`` neighbouring sub-envs), finished ones
    reset in the same step as ``DatasetChatVectorEnv``'s (``shards=(first, total)``: a
    process's part of a run's, ``PartVectorEnv``).

    >>> envs = make_textarena_vector_env(4, game="GuessTheNumber-v0", repeats=2)
    >>> seeds = envs.reset(seed=0)[1]["game_seed"].tolist()
    >>> seeds[0] == seeds[1] != seeds[2] == seeds[3]
    True
    """
    if kwargs.get("group_repeats") and num_envs % (kwargs.get("repeats") or 1):
        raise ValueError(
            f"num_envs must be a multiple of repeats={kwargs['repeats']} with group_repeats=True "
            f"(each group fills that many sub-envs), got num_envs={num_envs}"
        )
    fns = sharded_env_fns(TEXTARENA_ID, num_envs, shards, **kwargs)
    if shards is None:
        return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
    return PartVectorEnv(fns, first=shards[0])
