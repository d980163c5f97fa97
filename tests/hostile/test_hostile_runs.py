"""Runs against a hostile machine (issue 43): two runs into one folder, an --overwrite beside
the user's own folders, sizes the machine cannot hold, a full disk, a folder made read-only or
deleted mid-run, a bad task_config, a tool that never returns. Each ends in one line naming
what is wrong, and loses nothing that was on disk."""

import errno
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest
from train_fixture import keep_torch_threads  # noqa: F401  (fixtures)

from llm_gym.cli import main
from llm_gym.run.budget import available_memory
from llm_gym.run.lock import LOCK_FILE
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.checkpoints import checkpoint_folders, latest_checkpoint, load_checkpoint
from llm_gym.train.run_folder import resume_hint

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def rollout_args(model, out, *extra):
    return ["rollout", "--model", model, "--env-arg", "task=chain_sum", "--num-envs", "2",
            "--episodes", "3", "--max-new-tokens", "4", "--out", str(out), "--threads", "1",
            "--no-progress", *extra]  # fmt: skip


def train_args(model, out, *extra):
    return ["train", "--model", model, "--env-arg", "task=chain_sum", "--iterations", "1",
            "--groups", "1", "--group-size", "2", "--max-new-tokens", "4", "--eval-episodes",
            "0", "--save-every", "1", "--out", str(out), "--threads", "1", "--no-progress",
            *extra]  # fmt: skip


def config(model, out, **changes):
    values = dict(
        model=model, out=str(out), env_args={"task": "chain_sum"}, groups=1, group_size=2,
        max_new_tokens=4, eval_episodes=0, iterations=1, save_every=1, progress=False,
    )  # fmt: skip
    return GRPOConfig(**{**values, **changes})


def one_line_error(err):
    """The error line of a command's stderr, checked to be its only line about the error."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("llm-gym: error: "), err
    return lines[-1]


def spawn(*args, preexec_fn=None):
    return subprocess.Popen(
        [sys.executable, "-m", "llm_gym", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=preexec_fn,
    )


def wait_for(predicate, process, seconds=240):
    deadline = time.monotonic() + seconds
    while not predicate():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the run ended or stalled first:\n{process.communicate()[1]}")
        time.sleep(0.2)


def interrupt(process):
    process.send_signal(signal.SIGINT)
    try:
        return process.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("no exit after SIGINT")


def as_from_a_terminal():
    # A background job inherits SIGINT ignored; a terminal's Ctrl-C raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# -- 5. one run at a time in a folder ---------------------------------------------------


def test_a_second_run_into_a_busy_folder_fails_at_once_naming_the_owner(
    model_dirs, tmp_path, capsys
):
    out = tmp_path / "run"
    first = spawn(
        *rollout_args(model_dirs[0], out, "--episodes", "100000"), preexec_fn=as_from_a_terminal
    )
    episodes = out / "episodes.jsonl"
    wait_for(lambda: episodes.exists() and len(episodes.read_text().splitlines()) >= 2, first)
    owner = json.loads((out / LOCK_FILE).read_text())
    assert (owner["pid"], owner["host"]) == (first.pid, socket.gethostname())
    # Another rollout with --overwrite, and a train into the same folder: refused at once.
    for argv in (
        rollout_args(model_dirs[0], out, "--overwrite"),
        train_args(model_dirs[0], out, "--overwrite"),
    ):
        assert main(argv) == 2
        line = one_line_error(capsys.readouterr().err)
        assert f"--out {out} is in use by another run: process {first.pid}" in line
    assert first.poll() is None  # the first run goes on, its episodes untouched
    assert len(episodes.read_text().splitlines()) >= 2
    assert interrupt(first) and first.returncode == 130
    assert not (out / LOCK_FILE).exists()  # let go at Ctrl-C
    kept = len(episodes.read_text().splitlines())
    assert main(rollout_args(model_dirs[0], out)) == 2  # the folder's own refusal, no lock's
    assert "already holds" in capsys.readouterr().err and not (out / LOCK_FILE).exists()
    assert len(episodes.read_text().splitlines()) == kept  # an error loses nothing either
    assert main(rollout_args(model_dirs[0], out, "--overwrite")) == 0
    assert len(episodes.read_text().splitlines()) == 3 and not (out / LOCK_FILE).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_message(model_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    dead = int(ended.stdout)
    stale = {"pid": dead, "host": socket.gethostname(), "argv": ["llm-gym", "train"]}
    (out / LOCK_FILE).write_text(json.dumps(stale))
    assert main(train_args(model_dirs[0], out)) == 0
    err = capsys.readouterr().err
    assert f"taking over the lock of process {dead}" in err and "no longer running" in err
    assert latest_checkpoint(out).name == "checkpoint-1" and not (out / LOCK_FILE).exists()


# -- 6. --overwrite deletes only what a run wrote -------------------------------------------


def test_overwrite_keeps_the_users_own_folders_beside_the_checkpoints(tiny_dir, tmp_path):
    GRPOTrainer(config(tiny_dir, tmp_path)).train()
    mine = {
        "checkpoint-backup/weights.txt": "a copy I made",
        "checkpoint-notes/notes.txt": "what I saw",
        "checkpoint-7/notes.txt": "named like a checkpoint, holding no run's files",
        "notes.md": "beside the run",
    }
    for name, text in mine.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "checkpoint-3.partial").mkdir()  # an interrupted save's
    (tmp_path / "checkpoint-3.partial" / "model.safetensors").write_bytes(b"half")
    trainer = GRPOTrainer(config(tiny_dir, tmp_path, overwrite=True, iterations=2,
                                 keep_checkpoints=1))  # fmt: skip
    for name in ("checkpoint-1", "checkpoint-3.partial", "metrics.jsonl", "summary.json",
                 "training.png", "report.md"):  # fmt: skip
        assert not (tmp_path / name).exists(), name
    trainer.train()  # its rotation (keep 1) deletes its own checkpoint-1 only
    assert [path.name for path in checkpoint_folders(tmp_path)] == ["checkpoint-2", "checkpoint-7"]
    for name, text in mine.items():
        assert (tmp_path / name).read_text() == text, name


# -- 7. sizes checked before anything is allocated ---------------------------------------------


@pytest.mark.parametrize(
    ("command", "args", "message"),
    [
        ("rollout", ["--num-envs", "100000"],
         r"num_envs=100000 \(--num-envs\) is more than the 4096 sub-envs a run steps at once"),
        ("train", ["--groups", "1000", "--group-size", "100"],
         r"groups × group_size = 1000 × 100 = 100000 \(--groups, --group-size\) is more than "
         "the 4096 sub-envs"),
        ("rollout", ["--episodes", str(10**12)],
         r"--episodes 1000000000000: 1000000000000 episodes kept as records need at least "
         r"1024000\.0 GB \(1\.0 KB each\), more than the .* GB this machine has free; at most "
         r"\d+ fit"),
        # SmolLM2-135M: 8001 tokens of KV cache alone take 369 MB a sequence
        ("rollout", ["--model", "default", "--num-envs", "4096", "--max-new-tokens", "8000"],
         r"--num-envs 4096: 4096 sequences of at least 8001 tokens \(--max-new-tokens 8000\) "
         r"need at least 1712\.8 GB \(418\.0 MB each, with the model 538\.1 MB\), more than "
         r"the .* GB this machine has free; at most \d+ fit"),
        ("train", ["--model", "default", "--groups", "512", "--group-size", "8",
                   "--minibatch-size", "4096", "--max-new-tokens", "8000"],
         r"--minibatch-size 4096: 4096 sequences of at least 8001 tokens \(--max-new-tokens "
         r"8000\) need at least .* GB \(8\.3 GB each, with the model 2\.2 GB\)"),
    ],
)  # fmt: skip
def test_sizes_the_machine_cannot_hold_are_refused_before_anything_loads(
    command, args, message, tmp_path, capsys
):
    make = rollout_args if command == "rollout" else train_args
    argv = make("default", tmp_path / "run") + ["--dtype", "float32"]  # the figures' dtype
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert re.search(message, line), line
    assert not (tmp_path / "run").exists()  # nothing written, no folder left
    # The refusals are sound here: each needs more than the machine has (1.7 TB and up).
    assert available_memory() < 1.7e12


# -- 8. a full disk, a read-only folder, a vanished one ---------------------------------------


def file_size_limit(limit):
    def preexec():
        # RLIMIT_FSIZE needs no privileges: a write past `limit` bytes fails with EFBIG
        # (SIGXFSZ ignored, else it kills the process).
        as_from_a_terminal()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def mount(*args):
    return subprocess.run(["mount", *args], capture_output=True, text=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 120 MB tmpfs (a real ENOSPC), where mounting one is allowed (root)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or not mount("-t", "tmpfs", "-o", "size=120m", "tmpfs", str(folder)):
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE case covers a full disk")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def no_partial_files(out):
    return [p.name for p in out.rglob("*") if "partial" in p.name]


@pytest.mark.parametrize(
    "full", [pytest.param("file size limit", marks=pytest.mark.slow), "tmpfs"]
)  # the two ways a disk fills, a run each (about 8 s): one in the inner loop
def test_a_full_disk_while_training_stops_in_one_line_with_an_interrupted_summary(
    full, tiny_dir, tmp_path, request
):
    # A checkpoint of the tiny model is about 80 MB: the disk takes the first, not the second.
    out = (request.getfixturevalue("small_disk") if full == "tmpfs" else tmp_path) / "run"
    assert main(train_args(tiny_dir, out, "--save-optimizer")) == 0  # resumed exactly below
    limit = file_size_limit(10_000_000) if full == "file size limit" else as_from_a_terminal
    resumed = spawn("train", "--out", str(out), "--resume", "--iterations", "2",
                    preexec_fn=limit)  # fmt: skip
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 1, err
    line = one_line_error(err)
    reason = "File too large" if full == "file size limit" else "No space left on device"
    assert f"could not write {out}/checkpoint-2.partial: {reason}" in line
    assert f"{out}/summary.json marks the run interrupted" in line
    assert f"--resume continues from {out}/checkpoint-1" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iterations"] == 2
    assert reason in (out / "report.md").read_text()
    assert no_partial_files(out) == []  # the half-written checkpoint went
    assert [path.name for path in checkpoint_folders(out)] == ["checkpoint-1"]
    assert load_checkpoint(out / "checkpoint-1")[0]["iteration"] == 1  # whole
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1]


def test_a_full_disk_while_writing_the_rollouts_plot(model_dirs, tmp_path):
    import matplotlib.pyplot  # noqa: F401  (its font cache is written here, not under the limit)

    out = tmp_path / "run"
    process = spawn(*rollout_args(model_dirs[0], out), preexec_fn=file_size_limit(16_000))
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1, err
    line = one_line_error(err)
    assert f"could not write {out}/rollout.png: File too large" in line
    assert f"{out}/summary.json marks the run interrupted" in line
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert sorted(p.name for p in out.iterdir()) == ["episodes.jsonl", "report.md", "summary.json"]
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert [json.loads(line)["episode"] for line in lines] == [0, 1, 2]
    assert "rollout.png" not in (out / "report.md").read_text().split("File too large")[1]


def stops_on_the_second_iteration(trainer, damage):
    sample, calls = trainer.policy, []

    def policy(obs):
        calls.append(1)
        if len(calls) == 2:  # the first checkpoint is written; the second will not be
            damage()
        return sample(obs)

    trainer.policy = policy


def modes_hold(folder):
    """Whether a folder's mode keeps this process out (not for root, who writes through)."""
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").touch()
    except PermissionError:
        return True
    finally:
        folder.chmod(0o755)
    return False


def test_a_folder_made_read_only_mid_run(tiny_dir, tmp_path):
    out = tmp_path / "run"
    if modes_hold(tmp_path / "modes"):
        undo = ["chmod", "755", str(out)]

        def damage():
            out.chmod(0o555)

    else:  # root writes through any mode: a read-only bind mount instead
        probe = tmp_path / "probe"
        probe.mkdir()
        if not mount("--bind", str(probe), str(probe)):
            pytest.skip("as root this needs a read-only bind mount, which is not allowed here")
        subprocess.run(["umount", str(probe)], check=True)
        undo = ["umount", str(out)]

        def damage():  # bound now: the files open for writing stay on the writable mount
            assert mount("--bind", str(out), str(out))
            assert mount("-o", "remount,bind,ro", str(out))

    trainer = GRPOTrainer(config(tiny_dir, out, iterations=3))
    stops_on_the_second_iteration(trainer, damage)
    try:
        with pytest.raises(OSError) as caught:
            trainer.train()
    finally:
        subprocess.run(undo, check=True)
    message = str(caught.value)
    assert caught.value.errno in (errno.EROFS, errno.EACCES) and "\n" not in message
    reason = os.strerror(caught.value.errno)
    assert message.startswith(f"could not write {out}/checkpoint-2.partial: {reason}")
    assert f"the summary {out}/summary.json could not be written either" in message
    assert no_partial_files(out) == [] and [p.name for p in checkpoint_folders(out)] == [
        "checkpoint-1"
    ]
    assert load_checkpoint(out / "checkpoint-1")[0]["iteration"] == 1


def test_a_folder_deleted_mid_run_is_not_made_again(tiny_dir, tmp_path):
    out = tmp_path / "run"
    trainer = GRPOTrainer(config(tiny_dir, out, iterations=3))
    stops_on_the_second_iteration(trainer, lambda: shutil.rmtree(out))
    with pytest.raises(OSError) as caught:
        trainer.train()
    message = str(caught.value)
    assert message.startswith(
        f"could not write {out}/checkpoint-2.partial: No such file or directory (the folder "
        f"{out} does not exist)"
    )
    assert "could not be written either" in message and "\n" not in message
    assert not out.exists()  # no half a run made again where the user deleted it


# -- 11. smaller ones -------------------------------------------------------------------------


def test_ctrl_c_during_the_first_evaluation_does_not_offer_a_resume(tiny_dir, tmp_path):
    out = tmp_path / "run"
    args = train_args(tiny_dir, out, "--eval-episodes", "4000", "--iterations", "2")
    process = spawn(*args, preexec_fn=as_from_a_terminal)
    wait_for(lambda: (out / "run_config.json").exists(), process)  # set up: evaluating
    time.sleep(1.0)
    err = interrupt(process)
    assert process.returncode == 130, err
    assert "nothing to resume" in err and "--resume continues" not in err, err
    assert "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iterations"] == 0
    # What it says holds: there is no checkpoint, and --resume says so.
    assert latest_checkpoint(out) is None
    assert main(["train", "--out", str(out), "--resume"]) == 2
    assert "nothing to resume" in resume_hint(out)


@pytest.mark.parametrize("command", ["train", "rollout"])
def test_sigterm_stops_a_run_as_ctrl_c_does(tiny_dir, tmp_path, command):
    # A scheduler's SIGTERM: what finished is written, the summary marked interrupted, the
    # folder let go, one line, exit 143 (128 + SIGTERM) as the shell reports a killed job.
    out = tmp_path / "run"
    if command == "train":
        args, done = train_args(tiny_dir, out, "--iterations", "1000"), out / "metrics.jsonl"
    else:
        args, done = rollout_args(tiny_dir, out, "--episodes", "100000"), out / "episodes.jsonl"
    process = spawn(*args)
    wait_for(lambda: done.exists() and len(done.read_text().splitlines()) >= 2, process)
    process.terminate()
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 143, err
    lines = [line for line in err.splitlines() if line.startswith("llm-gym:")]
    assert (
        len(lines) == 1 and lines[0].startswith("llm-gym: interrupted; ") and "Traceback" not in err
    )
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert not (out / LOCK_FILE).exists() and not list(out.glob("checkpoint-*.*"))
    if command == "train":
        assert "Stopped by SIGTERM." in (out / "report.md").read_text()


def test_task_config_that_is_not_an_object_names_itself(model_dirs, tmp_path, capsys):
    with pytest.raises(ValueError, match=r"task_config must be a dict .* got 'abc' \(str\)"):
        gym.make("LLMChat-ReasoningGym-v0", task_config="abc")
    assert main(rollout_args(model_dirs[0], tmp_path / "run", "--env-arg", "task_config=abc")) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "task_config must be a dict" in line and "dictionary update" not in line


SLOW_TOOL = """
import functools, json, sys, time
from llm_gym.envs import DatasetChatEnv
from llm_gym.episodes import AsyncEpisodes

SLEEP, MARK, TIMEOUT = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])


def lookup(key: str) -> str:
    '''Look a key up, slowly.

    Args:
        key: What to look up.
    '''
    time.sleep(SLEEP)
    open(MARK, "w").write("the tool's sleep ended")
    return "value"


def policy(obs):
    call = {"name": "lookup", "arguments": {"key": "k"}}
    return [f"<tool_call>{json.dumps(call)}</tool_call>" for _ in obs["history"]]


rows = [{"query": f"question {i}?", "answer": str(i)} for i in range(2)]
env_fn = functools.partial(DatasetChatEnv, rows, shuffle=False, tools=[lookup], max_turns=3)
driver = AsyncEpisodes(env_fn, 2, policy, seed=0, timeout=TIMEOUT)
start = time.monotonic()
try:
    list(driver.play(2))
except TimeoutError as error:
    print(json.dumps({"after": time.monotonic() - start, "error": str(error)}), flush=True)
driver.close()
"""


def test_a_tool_that_never_returns_times_out_and_does_not_hold_up_the_exit(tmp_path):
    script, mark, sleep, timeout = tmp_path / "slow.py", tmp_path / "mark", 60, 3
    script.write_text(textwrap.dedent(SLOW_TOOL))
    process = subprocess.Popen(
        [sys.executable, str(script), str(sleep), str(mark), str(timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=sleep - 10)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the interpreter waited for the tool's threads at exit")
    assert process.returncode == 0, err
    assert not mark.exists()  # it exited while the tool still slept
    result = json.loads(out.strip().splitlines()[-1])
    assert "within timeout=3 s" in result["error"]
    # Raised once nothing answered for `timeout`, not after a second wait for the calls.
    assert result["after"] < 2 * timeout


LINES_UNDER_A_LIMIT = """
import json, resource, signal, sys
from llm_gym.run.files import LineFile, RunWriteError, write_text

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
lines, whole = LineFile(sys.argv[1]), 0
try:
    while True:
        lines.write(json.dumps({"row": whole, "pad": "x" * 20}))
        whole += 1
except RunWriteError as error:
    print(json.dumps({"whole": whole, "error": str(error)}))
try:
    write_text(sys.argv[2], "y" * 1000)
except RunWriteError as error:
    print(json.dumps({"error": str(error)}))
"""


def test_a_line_or_a_file_the_disk_cannot_take_leaves_nothing_half_written(tmp_path):
    lines, whole = tmp_path / "rows.jsonl", tmp_path / "summary.json"
    whole.write_text("the earlier summary")
    result = subprocess.run(
        [sys.executable, "-c", LINES_UNDER_A_LIMIT, str(lines), str(whole)],
        capture_output=True, text=True, env=ENV, check=True,
    )  # fmt: skip
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert first["error"] == f"could not write {lines}: File too large"
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [row["row"] for row in rows] == list(range(first["whole"])) and rows  # whole lines
    assert second["error"] == f"could not write {whole}: File too large"
    assert whole.read_text() == "the earlier summary"  # the previous file, as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "summary.json"]
