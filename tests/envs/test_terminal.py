"""The terminal world (``LLMChat-Terminal-v0``): a shell whose calls share the episode's own
workspace and nothing of another's, Harbor's task folders (each oracle scores 1, a wrong answer
0, a hanging verifier killed), what cannot run here refused at load, hostile commands as their
own episode's tool errors, and nothing left running or on disk after an episode."""

import dataclasses
import json
import os
import time
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.cli import main
from llm_gym.envs import fork
from llm_gym.envs.terminal import TerminalEnv
from llm_gym.tasks.harbor import HarborTaskError, TerminalTask, load_harbor_tasks
from llm_gym.tasks.terminal import TERMINAL_FAMILIES, terminal_task
from llm_gym.tools.calls import parse_tool_calls

EXAMPLES = Path(__file__).parents[2] / "examples" / "terminal-tasks"


def bash(command: str) -> str:
    return f"```bash\n{command}\n```"


def output(step) -> str:
    return step[0]["history"][-1]["content"]


def left_running(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie awaiting its reaper) after the
    kernel has had a moment to end a killed PID namespace."""
    for _ in range(100):
        running = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                running.append(pid)
        if not running:
            return []
        time.sleep(0.05)
    return running


def descendants(root: int = 0) -> list[int]:
    """The processes below ``root`` (this test's process), by their parents in /proc: what a
    sandbox leaves running, whatever other tests run beside."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root or os.getpid()]
    while frontier:
        pid = frontier.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        frontier += children
    return found


def command_line(pid: int) -> str:
    """What ``pid`` runs, for a failure's message ("" once it ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_call_sees_the_calls_before_it_and_nothing_of_another_episode():
    one, two = (gym.make("LLMChat-Terminal-v0", level=0) for _ in range(2))
    one.reset(seed=0)
    two.reset(seed=0)  # the same task, side by side
    one.step(bash("echo mine > note.txt && mkdir -p d && echo deep > d/x"))
    assert output(one.step(bash("cat note.txt d/x"))) == "mine\ndeep\n"
    assert "note.txt" not in output(two.step(bash("ls -a; ls /app")))
    # A new episode of the same env starts from its task's files only.
    one.reset(seed=0)
    assert output(one.step(bash("ls"))).split() == ["words.txt"]
    for env in (one, two):
        env.close()


def test_a_vector_envs_sub_envs_have_workspaces_of_their_own():
    envs = gym.make_vec("LLMChat-Terminal-v0", num_envs=2, vectorization_mode="vector_entry_point")
    envs.reset(seed=0)
    obs, *_ = envs.step([bash("echo zero > mine.txt"), bash("echo one > mine.txt")])
    obs, *_ = envs.step([bash("cat mine.txt; ls"), bash("cat mine.txt; ls")])
    first, second = (history[-1]["content"] for history in obs["history"])
    assert first.splitlines()[0] == "zero" and second.splitlines()[0] == "one"
    envs.close()


def test_the_family_oracle_scores_one_and_doing_nothing_zero():
    env = TerminalEnv(level=0)
    for level, families in enumerate(TERMINAL_FAMILIES):
        seen = set()
        for index in range(12):
            task = terminal_task(5, index, level)
            seen.add(task.name.rsplit("-", 1)[1])
            for solve in (True, False):
                env.reset(options={"item": {"task_seed": 5, "task_index": index, "level": level}})
                assert env.unwrapped.instruction == task.instruction
                if solve:
                    env.step(env.oracle_action())
                _, reward, terminated, _, info = env.step("Done.")
                assert terminated and reward == float(solve), (task.name, info)
                assert info["success"] is solve and info["task"] == task.name
        assert seen == {f.__name__.lstrip("_") for f in families}  # every chore drawn
    env.close()


def test_the_docs_example_tasks_load_and_every_oracle_scores_one(capsys):
    tasks = {task.name: task for task in load_harbor_tasks(EXAMPLES)}
    assert sorted(tasks) == ["count-words", "find-and-back-up", "fix-script"]
    words = tasks["count-words"]
    assert words.instruction.startswith("The folder `data`")  # the canary line dropped
    assert sorted(words.files) == ["data/a.txt", "data/b.txt", "data/c.txt"]
    assert words.verifier_timeout == 30.0 and words.workdir == "/app"
    script = tasks["fix-script"]
    assert script.workdir == "/srv/work" and sorted(script.files) == ["numbers.txt", "sum.sh"]
    assert script.env == {"NUMBERS_FILE": "numbers.txt", "GREETING": "hello"}
    assert main(["check-tasks", str(EXAMPLES)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "ok   count-words: reward 1", "ok   find-and-back-up: reward 1",
        "ok   fix-script: reward 1", "3 of 3 tasks score 1 with their solution",
    ]  # fmt: skip


def test_a_wrong_answer_scores_zero_and_reward_json_parts_are_kept():
    env = gym.make("LLMChat-Terminal-v0", tasks=str(EXAMPLES))
    env.reset(options={"item": {"task": "fix-script"}})
    # Runs, prints a sum, but no longer reads the file: half the checks.
    env.step(bash("printf '#!/bin/bash\\necho 108\\n' > sum.sh"))
    _, reward, terminated, _, info = env.step("Fixed.")
    assert terminated and reward == 0.0 and not info["success"]
    assert info["verifier_rewards"] == {"reward": 0.0, "prints_sum": 1.0, "reads_file": 0.0}
    env.reset(options={"item": {"task": "count-words"}})
    _, reward, _, _, info = env.step("The total is 13.")  # said, not written
    assert reward == 0.0 and info["verifier_rewards"] == {"reward": 0.0}
    # Its reward's version names the digest of its tests; its play is no item to rescore.
    words = env.unwrapped.tasks["count-words"]
    assert info["reward_version"] == words.reward_version and "item" not in info
    changed = dataclasses.replace(words, tests={"test.sh": words.tests["test.sh"] + b"\n"})
    assert changed.reward_version != words.reward_version
    env.close()


def _task(folder: Path, dockerfile: str, test: str = "echo 1 > /logs/verifier/reward.txt",
          timeout: float = 5.0) -> Path:  # fmt: skip
    TerminalTask(folder.name, "Do it.", {}, {"test.sh": test.encode()},
                 {"solve.sh": b"true"}, verifier_timeout=timeout).write(folder)  # fmt: skip
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    return folder


def test_a_hanging_verifier_is_killed_at_its_timeout_and_scores_zero(tmp_path):
    _task(tmp_path / "hangs", "FROM ubuntu:24.04\n", "echo 1 > /logs/verifier/reward.txt; "
          "sleep 1000", timeout=1.0)  # fmt: skip
    env = TerminalEnv(str(tmp_path / "hangs"))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Done.")
    assert terminated and reward == 0.0 and not info["success"]
    assert info["verifier_note"] == (
        "tests/test.sh ran past the task's 1 s ([verifier] timeout_sec) and was killed: reward 0"
    )
    assert 1.0 <= info["verifier_seconds"] < 10
    env.close()


@pytest.mark.parametrize(
    "dockerfile, toml, message",
    [
        ("FROM ubuntu:24.04\nWORKDIR /app\nRUN apt-get update && apt-get install -y jq\n", "",
         "task 'needs-image' ({}): Dockerfile line 3 needs an image built ('RUN apt-get update "
         "&& apt-get install -y jq'), and no Docker daemon runs here: only FROM, WORKDIR, COPY "
         "and ENV lines can be played"),
        ("FROM ubuntu:24.04\nCOPY --from=builder /x /app/x\n", "",
         "Dockerfile line 2 needs an image built"),
        ("FROM ubuntu:24.04\nWORKDIR /app\nCOPY tests /etc/tests\n", "",
         "Dockerfile line 3 copies to /etc/tests, outside the workspace /app"),
        ("FROM ubuntu:24.04\nWORKDIR /usr/local/app\n", "",
         "Dockerfile line 2: workdir must be an absolute path outside /usr"),
        ("FROM ubuntu:24.04\n", '[environment]\ndocker_image = "ghcr.io/x/y:1"\n',
         "[environment] docker_image = 'ghcr.io/x/y:1' needs that image"),
        ("FROM ubuntu:24.04\n", "[verifier]\ntimeout_sec = -1\n",
         "[verifier] timeout_sec must be a number > 0, got -1"),
    ],
)  # fmt: skip
def test_what_cannot_run_here_is_refused_at_load_by_name(tmp_path, dockerfile, toml, message):
    folder = tmp_path / "tasks"
    _task(folder / "fine", "FROM ubuntu:24.04\nWORKDIR /app\n")
    bad = _task(folder / "needs-image", dockerfile)
    if toml:
        (bad / "task.toml").write_text(toml)
    with pytest.raises(HarborTaskError) as refused:
        gym.make("LLMChat-Terminal-v0", tasks=str(folder))
    assert message.format(bad) in str(refused.value) and "\n" not in str(refused.value)
    assert main(["check-tasks", str(folder)]) == 2


def test_bad_arguments_are_one_line(tmp_path):
    with pytest.raises(HarborTaskError, match="holds no Harbor task"):
        TerminalEnv(str(tmp_path))
    with pytest.raises(ValueError, match="level must be 0 to 4, got 5"):
        TerminalEnv(level=5)
    with pytest.raises(ValueError, match="level=1 picks a level of the seeded family; tasks="):
        TerminalEnv(str(EXAMPLES), level=1)
    env = TerminalEnv(str(EXAMPLES))
    with pytest.raises(ValueError, match="item's task must be one of the loaded tasks"):
        env.reset(options={"item": {"task": "nope"}})
    assert env.shell is None  # nothing started
    env.close()


HOSTILE = {
    "fork bomb": ":(){ :|:& };:",
    "a file without end": "yes > file",
    "a background job": "sleep 1000 &",
    "a job of its own session": "setsid sleep 1000 & disown",
    "reading /root": "ls /root",
    "a root-only file": "cat /etc/shadow",
    "a socket": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 2)\"",
    "rm -rf /": "rm -rf --no-preserve-root /",
    "writing the system": "echo x > /usr/bin/x",
    "filling the workspace": "for i in 1 2 3; do head -c 15M /dev/zero > f$i; done",
    "a loop": "while true; do :; done",
    "a huge allocation": "python3 -c 'x = bytearray(4 << 30)'",
    "signalling everything it may": "sleep 100 & kill -9 -1; wait; exit 1",
    "a NUL byte": "echo a\x00b",
    "a command too long for an argument": "echo " + "x" * 140_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_command_is_its_own_episodes_tool_error(name):
    env = TerminalEnv(level=0, command_timeout=2, tool_error_reward=-0.1)
    env.reset(seed=0)
    shell = env.shell
    sandbox = descendants(shell._process.pid)  # the server, bubblewrap's init: before the call
    _, reward, terminated, truncated, info = env.step(bash(HOSTILE[name]))
    (call,) = info["tool_calls"]
    assert not call["ok"] and reward == pytest.approx(-0.1) and not (terminated or truncated)
    # The next call works, in the same workspace.
    step = env.step(bash("rm -f f? file; echo still here > ok.txt && cat ok.txt"))
    # The same sandbox (as root, which the calls cannot signal; in a user namespace the calls
    # are the server's user, and one that kills it gets a fresh sandbox, which the output says).
    text = output(step)
    assert step[4]["tool_calls"][0]["ok"]
    assert text == "still here\n" or (os.geteuid() != 0 and text.endswith("\nstill here\n"))
    running = descendants(shell._process.pid)
    env.step("Done.")
    assert env.shell is None and not shell.alive  # the sandbox ended with the episode
    assert sandbox and running  # and everything that ran in it
    assert not left_running({*sandbox, *running})
    env.close()


def test_a_fork_copies_the_workspace_and_goes_its_own_way():
    env = gym.make("LLMChat-Terminal-v0", level=0)
    env.reset(seed=0)
    env.step(bash("echo before > before.txt"))
    other = fork(env)
    assert other.unwrapped.shell.pending and not other.unwrapped.shell.alive  # no sandbox yet
    env.step(bash("echo after > after.txt"))
    assert output(other.step(bash("ls"))).split() == ["before.txt", "words.txt"]
    assert output(env.step(bash("ls"))).split() == ["after.txt", "before.txt", "words.txt"]
    assert other.unwrapped.shell is not env.unwrapped.shell
    # Each verifies its own workspace.
    other.step(bash("wc -l < words.txt > count.txt"))
    assert other.step("Done.")[1] == 1.0 and env.step("Done.")[1] == 0.0
    for e in (env, other):
        e.close()


def test_markdown_bash_blocks_call_only_an_envs_bash_tool():
    text = "Look:\n```bash\nls\n```\n```python\nprint(1)\n```"
    assert [c.name for c in parse_tool_calls(text, "markdown")] == ["python"]
    # Without a shell a block without a language is text, which cannot swallow a python block.
    bare = "```\nfoo\n```python\nprint(1)\n```"
    assert parse_tool_calls(bare, "markdown")[0].arguments == {"code": "print(1)\n"}
    assert [c.name for c in parse_tool_calls(bare, "markdown", ["bash"])] == ["bash"]
    assert [c.name for c in parse_tool_calls(text, "markdown", ["bash", "python"])] == [
        "bash", "python",
    ]  # fmt: skip
    env = TerminalEnv(level=0, tool_format="hermes")
    env.reset(seed=0)
    call = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert output(env.step(call)) == "words.txt\n"
    assert env.oracle_action().startswith('<tool_call>{"name": "bash"')  # the env's format
    assert env.step(env.oracle_action())[4]["tool_calls"][0]["ok"]
    assert env.step("Done.")[1] == 1.0
    env.close()


def test_the_cli_trains_on_the_terminal_with_branches(tiny_dir, tmp_path):
    # The tiny random model writes no command that works; the run's plumbing is the point:
    # sandboxes opened and forked per turn, verified, closed, and the branches logged.
    out = tmp_path / "run"
    before = set(descendants())  # an earlier test's env not yet collected runs on
    args = [
        "train", "--model", tiny_dir, "--env", "LLMChat-Terminal-v0", "--env-arg", "level=0",
        "--env-arg", "max_tool_calls=2", "--iterations", "1", "--groups", "1", "--group-size",
        "2", "--branches", "2", "--advantage", "tree-grpo", "--max-new-tokens", "8",
        "--eval-episodes", "0", "--dtype", "float32", "--threads", "1", "--no-progress",
        "--log-episodes", "--out", str(out),
    ]  # fmt: skip
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 4 and [("branch" in r) for r in records] == [False, False, True, True]
    assert all(r["task"].startswith("terminal-L0-") and r["reward"] <= 0 for r in records)
    left = [command_line(pid) for pid in set(descendants()) - before]
    assert [line for line in left if line] == []  # every sandbox of the run closed


def test_the_curriculum_moves_the_familys_level():
    from llm_gym.wrappers import DifficultyCurriculum

    env = DifficultyCurriculum(gym.make("LLMChat-Terminal-v0", seed=0), window=2)
    levels = []
    for _ in range(6):  # the oracle solves every task: the level rises each full window
        env.reset()
        levels.append(env.unwrapped.level)
        env.step(env.unwrapped.oracle_action())
        assert env.step("Done.")[1] == 1.0
    assert levels == [0, 0, 1, 1, 2, 2] and env.unwrapped.item["level"] == 2
    env.close()
