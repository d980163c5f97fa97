"""``llm-gym rescore`` (issue 74): a run's stored episodes scored again by today's reward. An
unchanged run rescores to the same scores, none changed; a run whose reward version and a
score were changed by hand is reported so, its old scores kept and episodes.jsonl untouched;
bad input is one line each."""

import json

import pytest

from llm_gym.cli import main
from llm_gym.tasks import gsm8k_task, reasoning_gym_task
from tests.gsm8k_fixture import FIXTURE
from tests.train_fixture import keep_torch_threads, train_args  # noqa: F401  (--threads 1)

RUNS = {
    "chain_sum": (["--env-arg", "task=chain_sum", "--env-arg", "level=0", "--answer-format",
                   "last_number"], reasoning_gym_task(task="chain_sum").reward_version),
    "gsm8k": (["--env", "LLMChat-GSM8K-v0", "--split", "test", "--data-dir", str(FIXTURE)],
              gsm8k_task(dataset=[{"question": "q", "answer": "#### 1"}]).reward_version),
}  # fmt: skip


def rollout(tiny_dir, out, run):
    args = ["rollout", *RUNS[run][0], "--model", tiny_dir, "--num-envs", "2", "--episodes", "4",
            "--max-new-tokens", "8", "--dtype", "float32", "--threads", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("run", sorted(RUNS))
def test_an_unchanged_run_rescores_to_its_own_scores(tiny_dir, tmp_path, capsys, run):
    records = rollout(tiny_dir, tmp_path, run)
    version = RUNS[run][1]
    assert [r["reward_version"] for r in records] == [version] * 4
    assert all(isinstance(r["item"]["query"], str) for r in records)
    capsys.readouterr()
    assert main(["rescore", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("rescored 4 of 4 episodes with ") and ": 0 changed" in said
    assert "reward versions: the same" in said
    report = json.loads((tmp_path / "rescore.json").read_text())
    assert (report["changed"], report["rescored"], report["versions_differ"]) == (0, 4, {})
    lines = [json.loads(x) for x in (tmp_path / "rescored.jsonl").read_text().splitlines()]
    assert [x["line"] for x in lines] == [0, 1, 2, 3]
    assert [x["reward_task_now"] for x in lines] == [r["reward_task"] for r in records]
    assert [x["success_now"] for x in lines] == [r["success"] for r in records]


def test_a_run_scored_by_another_version_says_what_changed_and_keeps_the_old(tiny_dir, tmp_path,
                                                                             capsys):  # fmt: skip
    records = rollout(tiny_dir, tmp_path, "chain_sum")
    # The run as an older reward would have left it: version "0", episode 2 paid 0.75 more,
    # and episode 1's right answer unpaid.
    for record in records:
        record["reward_version"] = "0"
    records[2]["reward_task"] += 0.75
    records[1].update(response=f"So it is {records[1]['item']['answer']}", reward_task=0.0,
                      success=False)  # fmt: skip
    stored = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "episodes.jsonl").write_text(stored)
    capsys.readouterr()
    assert main(["rescore", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    version = RUNS["chain_sum"][1]
    assert ": 2 changed" in said and "success 0.000 -> 0.250" in said
    assert f"reward versions differ: 0 -> {version} on 4 episodes" in said
    report = json.loads((tmp_path / "rescore.json").read_text())
    lines = [json.loads(x) for x in (tmp_path / "rescored.jsonl").read_text().splitlines()]
    assert report["changed"] == 2 and lines[1]["success_now"] and lines[1]["reward_task_now"] > 0
    assert report["mean_change"] == pytest.approx((lines[1]["reward_task_now"] - 0.75) / 4)
    assert lines[2]["reward_task"] == records[2]["reward_task"]  # the old score, kept
    assert lines[2]["reward_task_now"] == pytest.approx(records[2]["reward_task"] - 0.75)
    assert {x["reward_version"] for x in lines} == {"0"}
    assert {x["reward_version_now"] for x in lines} == {version}
    assert (tmp_path / "episodes.jsonl").read_text() == stored  # never rewritten


def write_run(folder, config, lines):
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"config": config}))
    (folder / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(folder)


def test_records_without_an_item_are_counted_not_scored(tmp_path, capsys):
    old = {"response": "7", "reward": 0.0, "reward_task": 0.0, "success": False}
    run = write_run(tmp_path / "old", {"env": "LLMChat-GSM8K-v0"}, [old, old])
    assert main(["rescore", run]) == 0
    said = capsys.readouterr().out
    assert said.startswith("rescored 0 of 2 episodes") and "not rescored: 2 episodes" in said
    # An item without the field the reward reads fails that record only, named.
    right = {**old, "response": "<answer>7</answer>", "item": {"query": "q", "answer": "#### 7"}}
    broken = {**old, "item": {"query": "q"}}
    run = write_run(tmp_path / "edited", {"env": "LLMChat-GSM8K-v0"}, [right, broken])
    assert main(["rescore", run]) == 0
    said = capsys.readouterr().out
    assert said.startswith("rescored 1 of 2 episodes") and ": 1 changed" in said
    assert "failed: 1 episodes whose item the reward could not read (line 1: KeyError" in said


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: str(p / "none"), "is not a folder"),
        (lambda p: str(p), "holds no episodes.jsonl"),
        (lambda p: write_run(p / "r", {"env": "LLMChat-GSM8K-v0"}, []), "holds no episodes"),
        (lambda p: (p / "x").mkdir() or (p / "x" / "episodes.jsonl").write_text("{}\n")
         and str(p / "x"), "holds no summary.json or run_config.json"),
        (lambda p: write_run(p / "g", {"env": "LLMChat-TextArena-v0"}, [{}]),
         "LLMChat-TextArena-v0 is not a task env"),
        (lambda p: write_run(p / "j", {"env": "LLMChat-GSM8K-v0", "rubric": "task,judge",
                                       "judge": "default"}, [{}]), "asks no judge again"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(tmp_path, capsys, make, message):
    run = make(tmp_path)
    assert main(["rescore", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not list(tmp_path.rglob("rescored.jsonl"))


def test_a_training_runs_logged_episodes_rescore_to_their_own_scores(tiny_dir, tmp_path, capsys):
    run = tmp_path / "train"
    assert main(train_args(tiny_dir, run, "--log-episodes")) == 0
    logged = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    assert len(logged) == 8 and {r["iteration"] for r in logged} == {0, 1}
    capsys.readouterr()
    assert main(["rescore", str(run)]) == 0  # its config: run_config.json
    said = capsys.readouterr().out
    assert said.startswith("rescored 8 of 8 episodes with LLMChat-ReasoningGym-v0's reward")
    assert ": 0 changed" in said and "reward versions: the same" in said
