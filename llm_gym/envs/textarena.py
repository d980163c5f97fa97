"""``TextArenaEnv``: one of TextArena's games as a multi-turn chat, and its vector env."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from llm_gym.chat.conversation import Conversation, TokenPrefixError
from llm_gym.chat.history import History
from llm_gym.checks import check_str
from llm_gym.envs.chat import ActionRead, Outcome
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.envs.vector import sharded_env_fns
from llm_gym.games import Opponent, TextArenaGame, outcome_of
from llm_gym.sources import ProceduralSource

if TYPE_CHECKING:
    from llm_gym.tools.toolbox import ToolRecord

__all__ = ["TEXTARENA_ID", "TextArenaEnv", "make_textarena_vector_env"]

TEXTARENA_ID = "LLMChat-TextArena-v0"
NO_MESSAGE = "[GAME] Your move."  # the user turn when a move brought the learner no message


def _game_sample(game: str, seed: int, index: int, level: int) -> dict[str, Any]:
    # Sample ``index`` of the stream ``seed`` orders: the TextArena seed of one game.
    (game_seed,) = np.random.SeedSequence((seed, index)).generate_state(1)
    return {"query": game, "game": game, "game_seed": int(game_seed)}


class TextArenaEnv(DatasetChatEnv):
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

    ``0.0`` until the game ends, then TextArena's reward for the learner's seat: alone, 1
    for a win and the game's partial credit otherwise (in most games the share solved; an
    invalid move after its warning ends the game with the game's penalty); against an
    opponent +1 / 0 / -1. A move the game fails on (an exception of TextArena's, such as
    GuessTheNumber's on a 5000-digit guess) is an invalid move of whoever made it, the
    learner or the opponent, never an exception out of ``step``. The last step's ``info``
    has ``outcome`` (``"win"``, ``"draw"``, ``"loss"``, or ``"unfinished"`` when
    ``max_turns`` cut the game), ``success`` (a win), TextArena's ``reason`` and
    ``invalid_move``, the game's ``task`` and ``game_seed``, and ``reward`` (the game's,
    which a record keeps as ``reward_task`` beside KL penalties).

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

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        *,
        opponent: Opponent | None = None,
        seat: int = 0,
        max_turns: int | None = None,
        seed: int | None = None,
        repeats: int | None = 1,
        group_repeats: bool = False,
        shard: tuple[int, int] | None = None,
        system_prompt: str | None = None,
        **chat_options: object,
    ) -> None:
        check_str("game", game)
        if chat_options.get("tools"):
            tools = chat_options["tools"]
            raise TypeError(f"TextArenaEnv plays without tools, got tools={tools!r}")
        self.game = game
        self._game = TextArenaGame(game, opponent, seat)
        source = ProceduralSource(functools.partial(_game_sample, game), num_levels=1, level=0)
        super().__init__(
            source, seed=seed, repeats=repeats, group_repeats=group_repeats, shard=shard,
            required_fields=("game_seed",), system_prompt=system_prompt, max_turns=max_turns,
            **chat_options,
        )  # fmt: skip

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The given item, whose ``game_seed`` must be an int >= 0; checked before anything
        changes, so a bad one leaves the running game as it was."""
        item = super().given_item(options)
        seed = None if item is None else item.get("game_seed")
        if item is not None and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
        ):
            raise ValueError(f"a game's item needs an int game_seed >= 0, got {seed!r}")
        return item

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """Reset the game at ``item``'s ``game_seed``: its first message as the prompt."""
        seed = int(item["game_seed"])
        return self._history_for(self._game.reset(seed)), {"task": self.game, "game_seed": seed}

    def advance(
        self,
        conversation: Conversation,
        read: ActionRead,
        records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """Play the turn as the game's move: the game, not a reward function, decides the end,
        the reward and the next user message (the game's, or the opponent's move)."""
        response, content, _ = read
        turn = conversation.turns + 1
        terminated = self._game.step(self.assistant_prefix + content)
        truncated = not terminated and self.max_turns is not None and turn >= self.max_turns
        reward, info, added = 0.0, {}, []
        if terminated:
            reward, game_info = self._game.result()
            outcome = outcome_of(reward, self._game.players)
            info = {"outcome": outcome, "success": outcome == "win"}
            info.update(reason=str(game_info.get("reason", "")))
            info.update(invalid_move=bool(game_info.get("invalid_move", False)))
        elif truncated:
            info = {"outcome": "unfinished", "success": False, "reason": "max_turns"}
            info.update(invalid_move=False)
        else:
            added = [{"role": self.user_role, "content": self._game.messages() or NO_MESSAGE}]
        done = terminated or truncated
        if done:  # the episode's record names its game and the game's reward
            info.update(task=self.game, game_seed=(item or self._item)["game_seed"])
            info["reward"] = float(reward)
        extended, problem = self.builder.extend(
            conversation, content, response.tokens, added,
            reward=reward, version=response.version, done=done,
        )  # fmt: skip
        if problem and not done:
            raise TokenPrefixError(f"turn {turn}: {problem}")
        return Outcome(extended, float(reward), bool(terminated), bool(truncated), info)


def make_textarena_vector_env(num_envs: int = 1, **kwargs: object) -> SyncVectorEnv:
    """The ``vector_entry_point`` of ``LLMChat-TextArena-v0``: ``num_envs`` games side by
    side, one ``TextArenaEnv`` each on one shard of the stream of games (so ``repeats=G`` with
    ``group_repeats=True`` puts each game in ``G`` neighbouring sub-envs), finished ones
    reset in the same step as ``DatasetChatVectorEnv``'s.

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
    fns = sharded_env_fns(TEXTARENA_ID, num_envs, **kwargs)
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
