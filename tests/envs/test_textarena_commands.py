"""TextArena's games in ``llm-gym rollout`` and ``llm-gym train``: played to their ends, the
summary's win/draw/loss, GRPO groups on one game, flags a game does not take."""

import functools
import json
import re

import gymnasium as gym
import numpy as np
import pytest
from policy_fixture import scripted_policy
from transformers import AutoTokenizer

from llm_gym.cli import main
from llm_gym.episodes import AsyncEpisodes
from llm_gym.run import Rollout, RolloutConfig
from llm_gym.train import GRPOConfig, GRPOTrainer

GAME = ["--env", "LLMChat-TextArena-v0", "--env-arg", "game=GuessTheNumber-v0"]


def guess(prompt: str) -> str:
    """The binary search's next guess in GuessTheNumber (1 to 20) from the conversation."""
    low, high = 1, 20
    guesses = re.findall(r"assistant\n\[(\d+)\]", prompt)
    hints = re.findall(r"The target number is (higher|lower)", prompt)
    for value, hint in zip(map(int, guesses), hints, strict=False):
        low, high = (value + 1, high) if hint == "higher" else (low, value - 1)
    return f"[{(low + high) // 2}]"


def test_rollout_plays_games_to_their_end_and_counts_outcomes(tiny_dir, tmp_path, capsys):
    argv = ["rollout", *GAME, "--env-arg", "max_turns=2", "--model", tiny_dir,
            "--num-envs", "2", "--episodes", "2", "--max-new-tokens", "4",
            "--out", str(tmp_path / "cli"), "--threads", "1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert re.search(r"win / draw / loss / unfinished +\d\.\d{3} / 0\.000 / \d\.\d{3} / ", table)
    config = RolloutConfig(
        env="LLMChat-TextArena-v0", env_args={"game": "GuessTheNumber-v0"}, model=tiny_dir,
        num_envs=2, episodes=4, out=str(tmp_path / "scripted"), progress=False,
    )  # fmt: skip
    rollout = Rollout(config)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    rollout.policy = scripted_policy(tok, lambda i, prompt: guess(prompt) if i == 0 else "[20]")
    summary = rollout.run()
    episodes = [json.loads(line) for line in rollout.episodes_path.open()]
    by_env = {i: [e for e in episodes if e["env_index"] == i] for i in (0, 1)}
    assert all(e["outcome"] == "win" and e["reward"] == 1.0 for e in by_env[0])
    for e in by_env[1]:  # "[20]" again: a warning, then the game is lost to the invalid move
        assert e["outcome"] in ("loss", "win") and len(e["responses"]) <= 3
        assert e["outcome"] == "win" or (e["invalid_move"] and 0.0 <= e["reward"] < 1.0)
    assert summary.outcomes["win"] == sum(e["outcome"] == "win" for e in episodes) / 4
    saved = json.loads((tmp_path / "scripted" / "summary.json").read_text())
    assert saved["task"]["name"] == "GuessTheNumber-v0" and saved["answer_format"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--answer-format", "tags"], "--answer-format applies to tasks that ask for an answer "
                                      "format; LLMChat-TextArena-v0 reads answers in a format"),
        (["--env-arg", "game=Sudokuu-v0"], "game must be a TextArena game id"),
        (["--env-arg", "game=TicTacToe-v0"], "'TicTacToe-v0' does not play with 1 player"),
    ],
)  # fmt: skip
def test_what_a_game_does_not_take_is_one_line(extra, message, tiny_dir, tmp_path, capsys):
    argv = ["rollout", *GAME, "--model", tiny_dir, "--out", str(tmp_path / "run"), *extra]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_train_on_a_game_puts_each_group_on_one_game(tiny_dir, tmp_path):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-TextArena-v0",
        env_args={"game": "GuessTheNumber-v0", "max_turns": 6}, groups=2, group_size=2,
        max_new_tokens=4, eval_episodes=0, progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    assert trainer.multi_turn and trainer.answer_format is None
    seen = []

    def answer(i, prompt):
        seen.append((i, prompt.split("<|im_start|>assistant")[0]))
        return guess(prompt) if i % 2 == 0 else "[20]"  # one of each group searches

    trainer.policy = scripted_policy(trainer.tokenizer, answer)
    row = trainer.iteration(0)
    openings = {i: prompt for i, prompt in seen}
    assert openings[0] == openings[1] and openings[2] == openings[3]  # a group, one game
    assert row["success"] in (0.5, 0.75, 1.0) and 0.5 <= row["reward"] <= 1.0
    assert np.isfinite(row["loss"]) and row["response_tokens"] > 4


def test_async_rollouts_play_the_stream_of_games_the_seed_names(smollm2_tokenizer):
    tok = smollm2_tokenizer
    kwargs = {"game": "GuessTheNumber-v0", "input_mode": "tokens", "tokenizer": tok,
              "observation_keys": ("tokens", "history", "policy_mask")}  # fmt: skip
    env_fn = functools.partial(gym.make, "LLMChat-TextArena-v0", **kwargs)
    policy = scripted_policy(tok, lambda i, prompt: guess(prompt))
    with AsyncEpisodes(env_fn, 3, policy, seed=4, input_mode="tokens") as run:
        records = {e.item_index: e.record() for e in run.play(6)}
    envs = gym.make_vec("LLMChat-TextArena-v0", num_envs=6, game="GuessTheNumber-v0")
    expected = envs.reset(seed=4)[1]["game_seed"].tolist()  # positions 0..5 of one stream
    assert [records[i]["game_seed"] for i in range(6)] == expected
    assert all(r["outcome"] == "win" and r["reward"] == 1.0 for r in records.values())
    assert all(r["policy_mask"].sum() == r["num_tokens"] for r in records.values())


def test_the_summary_gives_code_its_pass_rate():
    from llm_gym.episodes import summarize

    def record(passed, tests, turns):
        success, reward = passed == tests > 0, passed / max(tests, 1)
        return {"tests_passed": passed, "tests": tests, "success": success, "reward": reward,
                "num_tokens": 5, "responses": ["x"] * turns}  # fmt: skip

    summary = summarize([record(7, 7, 1), record(3, 7, 2), record(0, 0, 1), record(4, 4, 2)], 1.0)
    rows = dict(summary.rows())
    assert summary.pass_rate == 0.5 and rows["pass rate (all tests)"] == "0.500"
    assert rows["turns / episode"] == "1.50" and summary.outcomes is None
