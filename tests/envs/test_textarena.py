"""LLMChat-TextArena-v0: TextArena's games through ChatEnv's contract, with TextArena's own
rules, messages and rewards; seeds that replay a game; opponents; what cannot be played here."""

import random

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import DatasetChatVectorEnv, SessionChatEnv, VectorHooks
from llm_gym.envs.textarena import TextArenaEnv
from llm_gym.games import PolicyOpponent, TextArenaGame, game_catalogue

GUESS = "GuessTheNumber-v0"


def binary_search(env, seed):
    """Play GuessTheNumber by its hints; the guesses, the last step."""
    obs, _ = env.reset(seed=seed)
    low, high, guesses, terminated = 1, 20, [], False
    while not terminated:
        guesses.append((low + high) // 2)
        obs, reward, terminated, truncated, info = env.step(f"[{guesses[-1]}]")
        hint = obs["history"][-1]["content"]
        low, high = (guesses[-1] + 1, high) if "higher" in hint else (low, guesses[-1] - 1)
    return guesses, (obs, reward, terminated, truncated, info)


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_check_env_in_every_observation_mode(mode, smollm2_tokenizer):
    tokenizer = smollm2_tokenizer if mode != "history" else None
    env = gym.make("LLMChat-TextArena-v0", game="Minesweeper-v0-small", input_mode=mode,
                   tokenizer=tokenizer, max_turns=4)  # fmt: skip
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert info["task"] == "Minesweeper-v0-small" and list(obs) == [mode]


def test_a_game_is_played_to_its_end_by_textarenas_rules():
    env = gym.make("LLMChat-TextArena-v0", game=GUESS)
    guesses, (obs, reward, terminated, truncated, info) = binary_search(env, seed=3)
    assert guesses == [10, 15, 12] and (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome"] == "win" and info["success"] and not info["invalid_move"]
    assert "Congratulations" in info["reason"]
    # The game's version pays; its play is no item a reward could score again.
    assert info["reward_version"].startswith("1+textarena ") and "item" not in info
    roles = [m["role"] for m in obs["history"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert obs["history"][2]["content"] == "[GAME] The target number is higher."


@pytest.mark.parametrize("guesses, end", [([2, 19, 10, 15, 12], 1.0), ([2, 5, 5, 5], None)])
def test_progress_rewards_pay_each_move_its_share_of_the_games_reward(guesses, end):
    # Target 12 of 1..20: each guess pays the change in its closeness, 1 - |guess - 12| / 19;
    # the last, the rest of the game's reward (a win's 1; three invalid repeats end a game
    # with its partial credit), so the moves add up to the game's reward.
    env = gym.make("LLMChat-TextArena-v0", game=GUESS, rewards="progress")
    plain = gym.make("LLMChat-TextArena-v0", game=GUESS)
    env.reset(seed=3), plain.reset(seed=3)
    paid, closeness, last = [], 0.0, None
    for guess in guesses:
        _, reward, terminated, _, info = env.step(f"[{guess}]")
        _, game_reward, plain_end, _, plain_info = plain.step(f"[{guess}]")
        paid.append(reward)
        if not terminated:
            if guess not in guesses[: len(paid) - 1]:  # a repeat moves nothing
                now = 1 - abs(guess - 12) / 19
                assert reward == pytest.approx(now - closeness)
                closeness = now
            else:
                assert reward == 0.0
            assert game_reward == 0.0 and not plain_end
        else:
            last = info
    assert plain_end and last["reward"] == plain_info["reward"] == game_reward
    assert sum(paid) == pytest.approx(game_reward) and game_reward == (end or closeness)
    assert paid[1] > 0 and paid[3] < 0 if end else True  # 19 closer than 2; 15 further than 10
    with pytest.raises(ValueError, match="rewards='progress' needs a one-player game"):
        TextArenaEnv("TicTacToe-v0", opponent=lambda observation: "[0]", rewards="progress")


@pytest.mark.parametrize("rewards", ["game", "progress", "outcome"])
def test_each_move_the_game_refuses_pays_the_invalid_move_reward(rewards):
    # Target 12: a repeat and a move without brackets are each refused with a warning (the
    # game goes on), two refusals in a row end it. Each refused move pays -0.25 beside what
    # the mode pays; "outcome" pays the win 1 and nothing else, the others as without it.
    plain = gym.make("LLMChat-TextArena-v0", game=GUESS, rewards=rewards)
    env = gym.make("LLMChat-TextArena-v0", game=GUESS, rewards=rewards, invalid_move_reward=-0.25)
    won = ["[2]", "[2]", "[19]", "twelve", "[10]", "[12]"]
    lost = ["[2]", "[2]", "no"]
    for moves, outcome in ((won, "win"), (lost, "loss")):
        env.reset(seed=3), plain.reset(seed=3)
        for i, move in enumerate(moves):
            _, reward, end, _, info = env.step(move)
            _, plain_reward, plain_end, _, _ = plain.step(move)
            refused = move in ("twelve", "no") or moves[:i].count(move) > 0
            assert end == plain_end == (i == len(moves) - 1)
            assert reward == pytest.approx(plain_reward - 0.25 * refused), (move, rewards)
            if rewards == "outcome":
                assert plain_reward == (1.0 if end and outcome == "win" else 0.0)
        assert info["outcome"] == outcome and info["invalid_move"] == (outcome == "loss")
    with pytest.raises(
        ValueError, match=r"rewards must be one of \('game', 'progress', 'outcome'\)"
    ):
        TextArenaEnv(GUESS, rewards="dense")
    with pytest.raises(TypeError, match="invalid_move_reward must be an int or float, got str"):
        TextArenaEnv(GUESS, invalid_move_reward="-0.1")
    with pytest.raises(ValueError, match="rewards='outcome' needs a one-player game"):
        TextArenaEnv("TicTacToe-v0", opponent=lambda observation: "[0]", rewards="outcome")


def test_the_same_seed_replays_the_same_game_and_another_seed_another():
    env = gym.make("LLMChat-TextArena-v0", game=GUESS)
    targets = {}
    for seed in (0, 1, 2, 0):
        guesses, _ = binary_search(env, seed)
        targets.setdefault(seed, guesses)
        assert targets[seed] == guesses  # seed 0 again: the same game
    assert len({tuple(g) for g in targets.values()}) == 3
    _, first = env.reset(seed=5)
    _, again = env.reset(options={"item": {"query": GUESS, "game_seed": first["game_seed"]}})
    assert again == first


def test_games_side_by_side_keep_their_own_randomness():
    # Blackjack deals from the random module in every step: interleaving two games (threads,
    # sub-envs) changes neither one's cards, nor the random state outside the games.
    moves = ["[hit]", "[stand]"]

    def play(*seeds):
        envs = [gym.make("LLMChat-TextArena-v0", game="Blackjack-v0") for _ in seeds]
        logs = [[env.reset(seed=seed)[0]["history"][-1]["content"]]
                for env, seed in zip(envs, seeds, strict=True)]  # fmt: skip
        for move in moves:
            for env, log in zip(envs, logs, strict=True):
                if not env.unwrapped.conversation.done:
                    log.append(env.step(move)[0]["history"][-1]["content"])
        return logs

    random.seed(7)
    together = play(0, 1)
    after = random.random()
    assert together == [*play(0), *play(1)] and together[0] != together[1]
    random.seed(7)
    assert random.random() == after
    assert all("Hand" in log[0] or "hand" in log[0] for log in together)


def test_an_invalid_move_is_warned_then_ends_the_game():
    env = gym.make("LLMChat-TextArena-v0", game=GUESS)
    env.reset(seed=3)
    obs, reward, terminated, _, _ = env.step("ten")
    assert (reward, terminated) == (0.0, False)
    assert "invalid move" in obs["history"][-1]["content"].lower()
    _, reward, terminated, _, info = env.step("still no brackets")
    assert terminated and info["invalid_move"] and info["outcome"] == "loss"
    assert reward == 0.0  # TextArena's partial credit: no guess was made


def test_max_turns_truncates_an_unfinished_game():
    env = gym.make("LLMChat-TextArena-v0", game=GUESS, max_turns=2)
    env.reset(seed=3)
    env.step("[1]")
    _, reward, terminated, truncated, info = env.step("[2]")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info == {"outcome": "unfinished", "success": False, "reason": "max_turns",
                    "invalid_move": False, "task": GUESS, "game_seed": 1576890651,
                    "reward": 0.0, "reward_version": env.unwrapped.reward_version}  # fmt: skip


def test_tokens_mode_keeps_the_prefix_and_masks_only_the_policys_tokens(smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = gym.make("LLMChat-TextArena-v0", game=GUESS, input_mode="tokens", tokenizer=tok,
                   observation_keys=("tokens", "policy_mask", "history"))  # fmt: skip
    obs, _ = env.reset(seed=3)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = []
    for guess in ("[10]", "[15]"):
        ids = np.array(tok.encode(guess, add_special_tokens=False) + [end])
        before = obs["tokens"]
        obs, *_ = env.step(ids)
        assert np.array_equal(obs["tokens"][: len(before)], before)  # the prefix, as sampled
        assert np.array_equal(obs["tokens"][len(before) : len(before) + len(ids)], ids)
        sampled.append(len(ids))
    assert obs["policy_mask"].sum() == sum(sampled)
    assert obs["history"][-1]["content"] == "[GAME] The target number is lower."
    assert tok.decode(obs["tokens"]).count("The target number is") == 2


def test_a_two_player_game_against_a_fixed_opponent():
    def opponent(observation):  # TextArena's text of its seat's whole log: the centre, else 8
        return "[4]" if "'[4]'" in observation.split("Available Moves")[-1] else "[8]"

    env = gym.make("LLMChat-TextArena-v0", game="TicTacToe-v0", opponent=opponent)
    obs, _ = env.reset(seed=0)
    assert "As Player 0, you will be 'O'" in obs["history"][0]["content"]
    obs, reward, terminated, _, _ = env.step("[0]")
    assert (reward, terminated) == (0.0, False)
    assert "[Player 1] [4]" in obs["history"][-1]["content"]
    env.step("[1]")  # the opponent takes 8 (4 is gone)
    _, reward, terminated, _, info = env.step("[2]")  # 0, 1, 2: a row
    assert (reward, terminated, info["outcome"], info["success"]) == (1.0, True, "win", True)


def test_the_learner_may_take_the_second_seat_and_lose():
    moves = iter(["[0]", "[1]", "[2]"])
    env = gym.make("LLMChat-TextArena-v0", game="TicTacToe-v0", seat=1,
                   opponent=lambda obs: next(moves))  # fmt: skip
    obs, _ = env.reset(seed=0)
    assert "[Player 0] [0]" in obs["history"][0]["content"]  # the opponent moved first
    env.step("[4]")
    _, reward, terminated, _, info = env.step("[5]")
    assert (reward, terminated, info["outcome"]) == (-1.0, True, "loss")


def test_self_play_through_a_policy_opponent(tiny):
    from llm_gym.policies import TransformersPolicy

    model, tok = tiny
    greedy = {"max_new_tokens": 4, "do_sample": False}
    policy = TransformersPolicy(model, tok, input_mode="history", generate_kwargs=greedy)
    seen = []

    def recorded(obs):
        seen.append(obs["history"][0][-1]["content"])
        return policy(obs)

    env = gym.make("LLMChat-TextArena-v0", game="TicTacToe-v0", opponent=PolicyOpponent(recorded))
    env.reset(seed=0)
    obs, _, terminated, _, info = env.step("[4]")
    assert 1 <= len(seen) <= 2 and "[Player 0] [4]" in seen[0]
    assert all(later.startswith(seen[0]) for later in seen[1:])  # its seat's growing log
    # The tiny model's move is TextArena's to judge: on the board, or a second invalid move
    # (after the warning) that loses the game for it.
    last = obs["history"][-1]["content"]
    assert "[Player 1]" in last or (terminated and info["outcome"] == "win")


def test_the_vector_env_puts_each_game_in_a_group_of_sub_envs():
    envs = gym.make_vec("LLMChat-TextArena-v0", num_envs=4, vectorization_mode="vector_entry_point",
                        game=GUESS, repeats=2, group_repeats=True)  # fmt: skip
    assert all(isinstance(env.unwrapped, SessionChatEnv) for env in envs.envs)
    assert all(isinstance(env.unwrapped, VectorHooks) for env in envs.envs)
    _, info = envs.reset(seed=0)
    seeds = info["game_seed"].tolist()
    assert seeds[0] == seeds[1] != seeds[2] == seeds[3]
    _, rewards, terminated, _, info = envs.step(["[10]", "ten", "[10]", "[10]"])
    assert rewards.tolist() == [0.0] * 4 and not terminated.any()
    _, _, terminated, _, info = envs.step(["[15]", "nope", "[15]", "[15]"])
    assert terminated.tolist() == [False, True, False, False]  # two invalid moves end game 1
    assert info["final_info"]["outcome"][1] == "loss"
    with pytest.raises(ValueError, match="num_envs must be a multiple of repeats=2"):
        gym.make_vec("LLMChat-TextArena-v0", num_envs=3, repeats=2, group_repeats=True)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"game must be a TextArena game id .*'Sudokuu-v0'"):
        TextArenaEnv("Sudokuu-v0")
    with pytest.raises(ValueError, match=r"'TicTacToe-v0' does not play with 1 player.*opponent="):
        TextArenaEnv("TicTacToe-v0")
    with pytest.raises(ValueError, match=r"'Sudoku-v0' does not play with 2 player.*opponent=None"):
        TextArenaEnv("Sudoku-v0", opponent=lambda obs: "[1]")
    with pytest.raises(TypeError, match="opponent must be a callable"):
        TextArenaEnv("TicTacToe-v0", opponent="random")
    with pytest.raises(ValueError, match="seat must be 0 or 1 with an opponent"):
        TextArenaEnv("TicTacToe-v0", opponent=lambda obs: "[1]", seat=2)
    with pytest.raises(TypeError, match="plays without tools"):
        TextArenaEnv(GUESS, tools=["python"])
    with pytest.raises(TypeError, match="a TextArenaEnv holds state of its own"):
        DatasetChatVectorEnv(TextArenaEnv(GUESS), 2)
    env = TextArenaEnv(GUESS)
    obs, _ = env.reset(seed=3)
    with pytest.raises(ValueError, match="needs an int game_seed >= 0, got 'x'"):
        env.reset(options={"item": {"query": GUESS, "game_seed": "x"}})
    _, reward, terminated, _, info = env.step("[12]")  # the game of seed 3 goes on
    assert (reward, terminated, info["game_seed"]) == (1.0, True, 1576890651)
    env = TextArenaEnv("TicTacToe-v0", opponent=lambda obs: 4)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="opponent must return a str action, got int"):
        env.step("[0]")


def test_a_game_needing_nltk_data_is_refused_by_name(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # nothing installed there
    with pytest.raises(ValueError, match=r"^game 'Hangman-v0' needs nltk data 'words', not in"):
        TextArenaEnv("Hangman-v0")
    with pytest.raises(ValueError, match=r"'words', 'averaged_perceptron_tagger_eng', not inst"):
        TextArenaEnv("Wordle-v0")
    with pytest.raises(ValueError, match=r"'SecretMafia-v0' does not play .* not played here"):
        TextArenaEnv("SecretMafia-v0")
    missing = {info.game: info.missing for info in game_catalogue()}
    assert missing["Wordle-v0"] == (
        "needs nltk data 'words', 'averaged_perceptron_tagger_eng', not installed"
    )
    assert missing[GUESS] is None and "API key" in missing["TwentyQuestions-v0"]


def test_a_message_in_the_wrong_order_is_put_back():
    # Countdown-v0 passes add_observation's arguments positionally in the wrong order.
    game = TextArenaGame("Countdown-v0")
    game.reset(seed=0)
    game.step("[1 + 2]")
    assert "ObservationType" not in game.messages()


def test_a_result_in_the_wrong_order_is_put_back():
    # Countdown-v0 passes set_invalid_move's reward and reason in the wrong order.
    game = TextArenaGame("Countdown-v0")
    game.reset(seed=0)
    while not game.done:
        game.step("no move")
    reward, info = game.result()
    assert 0.0 < reward < 1.0 and info["reason"].startswith("Invalid Move: Invalid action format")


def test_the_catalogue_agrees_with_the_games():
    catalogue = {info.game: info for info in game_catalogue()}
    assert catalogue[GUESS].players == 1 and catalogue["TicTacToe-v0"].players == 2
    families = {}
    for info in catalogue.values():  # the first id of each family that plays here
        if info.missing is None and info.players in (1, 2):
            families.setdefault((info.game.split("-")[0], info.players), info.game)
    assert len(families) > 50
    for game in [g for (_, players), g in families.items() if players == 1]:
        played = TextArenaGame(game)
        assert played.reset(seed=0).startswith("[GAME] "), game  # the learner's opening
        played.step("[1]")  # a move each game reads by its own rules (most: invalid)
        assert played.done or played.messages().startswith("[GAME] "), game
        while not played.done:  # invalid moves end every game (after TextArena's warning)
            played.step("no move")
        reward, info = played.result()
        assert isinstance(reward, float) and -1.0 <= reward <= 1.0, (game, reward)
        assert isinstance(info["reason"], str), game
