"""What a run writes: summary.json (also on Ctrl-C), the table's answer-format hint, the plots'
numbers and files, report.md."""

import json
import struct

import numpy as np
import pytest

from llm_gym.episodes import Summary, summarize
from llm_gym.lm.loading import tiny_model
from llm_gym.run import Rollout, RolloutConfig
from llm_gym.run.plots import episode_groups, plot_rollout, plot_training, running_mean
from llm_gym.run.report import REPORT_FILE, write_report
from llm_gym.run.rollout import format_hint


def png_size(path):
    """(width, height) of a PNG, from its header; fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def episode(reward, success, answered, level=None, answer="12", tokens=5, kl=None):
    return {"reward": reward, "success": success, "reward_answer": float(answered),
            "level": level, "answer": answer, "num_tokens": tokens, "kl_mean": kl}  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smollm2_tokenizer):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_model(smollm2_tokenizer).save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return str(folder)


# -- the numbers the plots draw ---------------------------------------------------------------


def test_groups_by_level_with_counts_and_means():
    items = [episode(1.0, True, 1, level=2), episode(0.0, False, 1, level=0, kl=0.5),
             episode(0.5, False, 0, level=2), episode(1.0, True, 1, level=2)]  # fmt: skip
    name, groups = episode_groups(items)
    assert name == "level" and [g.label for g in groups] == ["0", "2"]
    assert [g.episodes for g in groups] == [1, 3]
    assert groups[1].reward == pytest.approx(2.5 / 3) and groups[1].success == pytest.approx(2 / 3)
    assert groups[1].format_rate == pytest.approx(2 / 3) and groups[1].kl is None
    assert (groups[0].reward, groups[0].success, groups[0].kl) == (0.0, 0.0, 0.5)


def test_groups_without_levels_are_runs_of_episodes_in_order():
    items = [episode(float(i), i % 2 == 0, 1) for i in range(10)]
    name, groups = episode_groups(items, bins=4)
    assert name == "episodes (in run order)"
    assert [g.label for g in groups] == ["0-2", "3-5", "6-8", "9-9"]
    assert [g.episodes for g in groups] == [3, 3, 3, 1]
    assert [g.reward for g in groups] == [1.0, 4.0, 7.0, 9.0]
    assert groups[0].success == pytest.approx(2 / 3)
    assert episode_groups([]) == ("episodes (in run order)", [])


def test_running_mean_uses_the_values_so_far_and_skips_none():
    assert running_mean([1.0, 3.0, 5.0, 7.0], 3).tolist() == [1.0, 2.0, 3.0, 5.0]
    assert running_mean([None, 2.0, None], 2).tolist()[1:] == [2.0, 2.0]
    assert np.isnan(running_mean([None, 2.0], 2)[0])


# -- files: PNGs and report.md ----------------------------------------------------------------


def test_rollout_and_training_plots_are_pngs(tmp_path):
    items = [episode(i % 2, i % 2 == 1, 1, level=i % 3, kl=0.01) for i in range(12)]
    plot_rollout(items, tmp_path / "rollout.png", "chain_sum · tiny")
    plot_rollout([], tmp_path / "empty.png", "nothing finished")
    rows = [{"iteration": i, "reward": 0.1 * i, "success": 0.05 * i, "kl": None,
             "response_tokens": 40 - i, "level": i // 3} for i in range(8)]  # fmt: skip
    plot_training(rows, {"success": 0.1, "reward": 0.2}, {"success": 0.5, "reward": 0.6},
                  tmp_path / "training.png", "chain_sum · tiny · GRPO")  # fmt: skip
    plot_training(rows[:1], None, None, tmp_path / "one.png", "one iteration, no evaluation")
    update = [{**row, "entropy": 2.0 - 0.1 * row["iteration"], "clip_fraction": 0.01,
               "approx_kl": 0.002} for row in rows]  # fmt: skip
    plot_training(update, None, None, tmp_path / "update.png", "with the update's diagnostics")
    for name in ("rollout", "empty", "training", "one", "update"):
        width, height = png_size(tmp_path / f"{name}.png")
        assert 600 <= width <= 1200 and 300 <= height <= 1400, (name, width, height)
    # Panels: the rollout's KL adds one; training's level (it moves) adds one, its KL none.
    assert png_size(tmp_path / "rollout.png")[1] > png_size(tmp_path / "empty.png")[1]
    assert png_size(tmp_path / "training.png")[1] > png_size(tmp_path / "one.png")[1]
    assert png_size(tmp_path / "update.png")[1] > png_size(tmp_path / "training.png")[1]


def test_report_embeds_images_and_lists_numbers(tmp_path):
    (tmp_path / "plots").mkdir()
    image = tmp_path / "plots" / "training.png"
    plot_training([{"iteration": 0, "reward": 0.5, "success": 0.25}], None, None, image, "t")
    path = write_report(tmp_path, "GRPO on chain_sum", {"success after": 0.123456, "kl": None,
                        "a|b": "x"}, [image], ["hint: try X"])  # fmt: skip
    assert path == tmp_path / REPORT_FILE
    text = path.read_text()
    assert text.startswith("# GRPO on chain_sum\n")
    assert "| success after | 0.1235 |" in text and "| kl | n/a |" in text
    assert "| a\\|b | x |" in text and "hint: try X" in text
    assert "![training](plots/training.png)" in text  # relative: the folder can move


# -- finding 10: the answer-format hint --------------------------------------------------------


def test_format_hint_names_last_number_only_for_numeric_answers():
    numeric = [episode(0.0, False, 0, answer=a) for a in ("12", "-3.5", "so 1,200 #### 1,200")]
    hint = format_hint(numeric, "tags", max_new_tokens=256)
    assert hint.startswith("hint: 0% of responses gave an answer in the 'tags' format")
    assert hint.endswith("try --answer-format last_number") and "cut" not in hint
    words = [episode(0.0, False, 0, answer=a) for a in ("12", "(3 + 4) * 2")]
    hint = format_hint(words, "tags", max_new_tokens=256)
    assert (
        "last_number" not in hint
        and "try --answer-format hash or boxed, or a larger --model" in hint
    )
    cut = [episode(0.0, False, 0, tokens=8) for _ in range(3)]
    assert "100% were cut at --max-new-tokens 8: try a larger one" in format_hint(cut, "tags", 8)
    hint = format_hint(numeric, "last_number", 256)
    assert "try --answer-format" not in hint and "rarely writes a number" in hint
    # Enough well-formed answers, no episodes, or no answer part to count: no hint.
    mostly = numeric * 3 + [episode(0.0, False, 1)]
    assert format_hint(mostly, "tags", 256) is not None  # 1 in 10: still near 0
    assert format_hint([*numeric, episode(0.0, False, 1)], "tags", 256) is None
    assert format_hint([], "tags", 256) is None
    assert format_hint([{"reward": 0.0, "num_tokens": 1}], "tags", 256) is None


def test_summary_table_ends_with_the_hint():
    items = [episode(0.0, False, 0) for _ in range(4)]
    summary = summarize(items, 1.0)
    assert summary.hint is None and "hint" not in summary.table()
    hinted = Summary(**{**summary.__dict__, "hint": "hint: try --answer-format last_number"})
    lines = hinted.table().splitlines()
    assert lines[-1] == "hint: try --answer-format last_number"
    assert lines[:-1] == summary.table().splitlines()


# -- finding 9 (and 10, 11 end to end): a rollout's files, also on Ctrl-C --------------------


def test_rollout_names_its_task_and_hints(model_dir, tmp_path):
    config = RolloutConfig(model=model_dir, num_envs=2, episodes=4, max_new_tokens=3,
                           env_args={"task": "chain_sum"}, curriculum=2, seed=3,
                           out=str(tmp_path), progress=False)  # fmt: skip
    summary = Rollout(config).run()
    record = json.loads((tmp_path / "summary.json").read_text())
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").open()]
    assert record["interrupted"] is False and record["env"] == "LLMChat-ReasoningGym-v0"
    assert record["task"] == {"function": "llm_gym.tasks.reasoning_gym:reasoning_gym_task",
                              "name": "chain_sum"}  # fmt: skip
    assert record["levels"] == sorted({e["level"] for e in episodes}) and record["levels"]
    assert record["answer_format"] == "tags"  # the env's: the config says None
    assert (record["model"], record["backend"], record["seed"]) == (model_dir, "transformers", 3)
    # A random tiny model writes no <answer>: the table says what to try.
    assert summary.format_rate == 0.0 and record["summary"]["hint"] == summary.hint
    assert summary.table().splitlines()[-1].startswith("hint: 0% of responses")
    assert "--max-new-tokens 3" in summary.hint and "last_number" in summary.hint
    report = (tmp_path / "report.md").read_text()
    assert "![rollout](rollout.png)" in report and "| task | chain_sum |" in report
    assert f"| episodes | {summary.episodes} |" in report and summary.hint in report
    assert png_size(tmp_path / "rollout.png")[0] >= 600


def test_interrupted_rollout_still_writes_its_summary(model_dir, tmp_path):
    config = RolloutConfig(model=model_dir, num_envs=2, episodes=50, max_new_tokens=2,
                           answer_format="last_number", out=str(tmp_path),
                           progress=False)  # fmt: skip
    rollout = Rollout(config)
    sample, calls = rollout.policy, []

    def interrupted_on_the_second_call(obs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C would, mid-run
        return sample(obs)

    rollout.policy = interrupted_on_the_second_call
    with pytest.raises(KeyboardInterrupt):
        rollout.run()
    record = json.loads((tmp_path / "summary.json").read_text())
    assert record["interrupted"] is True and record["summary"]["episodes"] == 2
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 2
    assert record["env"] == "LLMChat-ReasoningGym-v0" and record["levels"] == [0]
    assert record["task"]["function"] == "llm_gym.tasks.reasoning_gym:reasoning_gym_task"
    assert record["task"]["name"] == "basic_arithmetic"  # as the env reports it
    assert (record["answer_format"], record["model"], record["backend"], record["seed"]) == (
        "last_number", model_dir, "transformers", 0)  # fmt: skip
    assert record["config"]["episodes"] == 50
    assert png_size(tmp_path / "rollout.png")[0] >= 600
    assert "Interrupted after 2 of 50 episodes." in (tmp_path / "report.md").read_text()


def test_the_table_shows_turns_per_episode_for_multi_turn_episodes():
    two_turns = {"responses": ["<tool_call>...", "42"], "reward": 1.0, "num_tokens": 9}
    summary = summarize([two_turns, {**two_turns, "responses": ["42"]}], seconds=1.0)
    assert summary.turns_per_episode == 1.5
    assert ("turns / episode", "1.50") in summary.rows()
    single = summarize([{"responses": ["42"], "reward": 0.0, "num_tokens": 3}], seconds=1.0)
    assert single.turns_per_episode == 1.0 and "turns / episode" not in single.table()
