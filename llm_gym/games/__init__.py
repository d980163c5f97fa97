"""Games as llm_gym plays them: TextArena's, through ``TextArenaGame`` (``textarena`` is
imported only when a game is made or listed)."""

from llm_gym.games.textarena import (
    GameInfo,
    Opponent,
    PolicyOpponent,
    TextArenaGame,
    game_catalogue,
    game_ids,
    outcome_of,
)

__all__ = [
    "GameInfo",
    "Opponent",
    "PolicyOpponent",
    "TextArenaGame",
    "game_catalogue",
    "game_ids",
    "outcome_of",
]
