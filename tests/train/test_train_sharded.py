"""``llm-gym train`` across processes (issue 52), on the CPU over gloo: the run of two
processes, each with its half of the groups and its half of every weight (FSDP2), is the run
of one; its checkpoints resume exactly on two processes (``torchrun ... -m llm_gym``) and,
resharded, on one; its weights are an ordinary model folder; two "machines" on the loopback
run it too; uneven groups are refused in one line."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import DIGIT_ROWS as ROWS
from safetensors.torch import load_file

from llm_gym.cli import main

# Trainings in fresh interpreters, under torchrun: minutes on two cores.
pytestmark = pytest.mark.slow


def train_args(model, out, *extra):
    return [
        "train", "--model", model, "--out", str(out), "--env", "LLMChat-GSM8K-v0",
        "--env-arg", f"dataset={json.dumps(ROWS)}", "--iterations", "2", "--groups", "2",
        "--group-size", "4", "--max-new-tokens", "1", "--learning-rate", "0.01",
        "--eval-episodes", "4", "--save-every", "1", "--no-progress", *extra,
    ]  # fmt: skip


def llm_gym(*args, launcher=()):
    # A fresh interpreter, as a user runs it (torchrun's children are such processes).
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, *launcher, "-m", "llm_gym", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def finished(process):
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(folder):
    return load_file(folder / "model.safetensors")


def assert_same_run(a, b, atol):
    # The same samples (rewards, successes, lengths), the same update, the same weights.
    for x, y in zip(rows(a), rows(b), strict=True):
        for key in ("reward", "success", "response_tokens", "loss", "grad_norm", "entropy"):
            assert x[key] == pytest.approx(y[key], abs=1e-4), key
    wa, wb = weights(a / "checkpoint-2"), weights(b / "checkpoint-2")
    assert sorted(wa) == sorted(wb)
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= atol


# What every run compared with the one-process run passes.
SHARED = ("--save-optimizer", "--scale-rewards", "batch")


@pytest.fixture(scope="module")
def runs(digits, tmp_path_factory):
    """The run in one process and in two (``--nproc-per-node 2``), started together; their
    advantages divided by the whole batch's reward std (each process's own would differ)."""
    base = tmp_path_factory.mktemp("runs")
    one = llm_gym(*train_args(digits, base / "one", *SHARED, "--threads", "1"))
    two = llm_gym(*train_args(digits, base / "two", *SHARED, "--nproc-per-node", "2"))
    return finished(one), base / "one", finished(two), base / "two"


def test_two_processes_train_as_one(runs, digits):
    _, one, said, two = runs
    first = rows(one)
    # The groups answered right and wrong: the update had something to learn from.
    assert 0 < first[0]["success"] < 1 and all(r["grad_norm"] > 0 for r in first)
    assert_same_run(one, two, atol=1e-5)
    start = weights(Path(digits))
    moved = weights(two / "checkpoint-2")
    assert max((moved[k] - start[k]).abs().max().item() for k in start) > 1e-3
    summary = json.loads((two / "summary.json").read_text())
    assert (summary["world_size"], summary["sharding"]) == (2, "fsdp2")
    alone = json.loads((one / "summary.json").read_text())
    assert (alone["world_size"], alone["sharding"]) == (1, None)
    assert summary["packing"] is alone["packing"] is True  # FSDP's wrapped class packs too
    assert summary["before"] == alone["before"] and summary["after"] == alone["after"]
    # The first process says what one process says, once.
    assert said.count("greedy success on held-out questions") == 1
    # Each process wrote its shards of AdamW's state; the first, the rest.
    names = sorted(p.name for p in (two / "checkpoint-1" / "optimizer").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_lora_trains_across_processes_as_in_one(digits, tmp_path):
    # The frozen base sharded with its adapters; a peft model generates through its inner
    # model, whose root weights (embedding, output layer) the shards gather for it.
    lora = (*SHARED, "--lora-rank", "4", "--learning-rate", "0.05")
    one = llm_gym(*train_args(digits, tmp_path / "one", *lora, "--threads", "1"))
    two = llm_gym(*train_args(digits, tmp_path / "two", *lora, "--nproc-per-node", "2"))
    finished(one), finished(two)
    for x, y in zip(rows(tmp_path / "one"), rows(tmp_path / "two"), strict=True):
        for key in ("reward", "success", "response_tokens", "loss", "grad_norm"):
            assert x[key] == pytest.approx(y[key], abs=1e-4), key
    assert rows(tmp_path / "two")[-1]["grad_norm"] > 0  # the adapters learned something
    name = "adapter_model.safetensors"
    a = load_file(tmp_path / "one" / "checkpoint-2" / name)
    b = load_file(tmp_path / "two" / "checkpoint-2" / name)
    assert sorted(a) == sorted(b) and all("lora_" in k for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5


def test_bf16_mixed_computes_alike_on_one_process_and_two(digits, tmp_path):
    # The same autocast over float32 weights at every world size. FSDP's bfloat16 parameter
    # policy casts the norms' weights too, where autocast multiplies by them in float32: with
    # weights other than 1 its second epoch's loss was -0.0759 on two processes against
    # -0.0865 on one.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(digits)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" in name:
                weight.copy_(1 + 0.37 * torch.randn(weight.shape, generator=generator))
    model.save_pretrained(tmp_path / "model")
    AutoTokenizer.from_pretrained(digits).save_pretrained(tmp_path / "model")
    mixed = (*SHARED, "--precision", "bf16-mixed", "--iterations", "3", "--update-epochs", "2")
    runs = [
        llm_gym(*train_args(tmp_path / "model", tmp_path / name, *mixed, *extra))
        for name, extra in (("one", ["--threads", "1"]), ("two", ["--nproc-per-node", "2"]))
    ]
    for run in runs:
        finished(run)
    for x, y in zip(rows(tmp_path / "one"), rows(tmp_path / "two"), strict=True):
        assert (x["reward"], x["success"]) == (y["reward"], y["success"])
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6)
        assert x["approx_kl"] == pytest.approx(y["approx_kl"], abs=1e-6)
    assert rows(tmp_path / "two")[1]["approx_kl"] > 1e-3  # a second epoch off its samples
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["precision"] == "bf16-mixed" and summary["world_size"] == 2


def test_the_sharded_runs_weights_are_an_ordinary_model_folder(runs):
    from transformers import AutoModelForCausalLM

    _, _, _, two = runs
    model = AutoModelForCausalLM.from_pretrained(two / "checkpoint-2")
    saved = weights(two / "checkpoint-2")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert not model.lm_head.weight.equal(model.model.embed_tokens.weight)  # untied, both kept


def resumable(run, tmp_path, name):
    # The run's folder as it stood after its first checkpoint.
    out = tmp_path / name
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoint-2")
    return out


def test_a_sharded_run_resumes_exactly_under_torchrun_and_resharded_in_one_process(
    runs, digits, tmp_path
):
    _, _, _, two = runs
    again, alone = resumable(two, tmp_path, "again"), resumable(two, tmp_path, "alone")
    # `torchrun ... -m llm_gym train` runs the very job llm-gym's own launcher runs.
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    resumed = llm_gym(*train_args(digits, again, "--resume"), launcher=launcher)
    # One process reads the two processes' optimizer shards (DCP reshards them).
    single = llm_gym(*train_args(digits, alone, "--resume", "--threads", "1"))
    finished(resumed), finished(single)
    end, exact = weights(two / "checkpoint-2"), weights(again / "checkpoint-2")
    assert all(torch.equal(end[k], exact[k]) for k in end)  # bit for bit
    timing = {"seconds", "tokens_per_second"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in rows(again)] == [
        {k: v for k, v in r.items() if k not in timing} for r in rows(two)
    ]
    assert_same_run(two, alone, atol=1e-5)


def test_two_machines_on_the_loopback_train_as_one_process(runs, digits, tmp_path):
    _, one, _, _ = runs
    port, out = free_port(), tmp_path / "nodes"
    nodes = [
        llm_gym(*train_args(digits, out, *SHARED, "--nnodes", "2", "--node-rank", str(rank),
                            "--master-addr", "127.0.0.1", "--master-port", str(port)))
        for rank in (0, 1)
    ]  # fmt: skip
    for node in nodes:
        finished(node)
    assert_same_run(one, out, atol=1e-5)
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2


def rank_processes(launcher):
    # The launcher's children, by their RANK.
    found = {}
    for pid in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True,
                              text=True).stdout.split():  # fmt: skip
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next(v for v in environ if v.startswith(b"RANK="))
        found[int(rank.split(b"=")[1])] = int(pid)
    return found


# How a user or the machine stops a run of two processes: the exit code, and the one line.
STOPS = {
    "ctrl-c": (130, "llm-gym: interrupted; finished iterations are in"),
    "sigterm": (143, "llm-gym: interrupted; finished iterations are in"),
    "a rank killed": (137, "llm-gym: error: process 1 of the run was killed by SIGKILL; finished"),
    "the launcher killed": (-9, "llm-gym: interrupted; finished iterations are in"),
}


@pytest.mark.parametrize("how", STOPS)
def test_a_two_process_run_stops_as_one_process_does(digits, tmp_path, how):
    # Stopped mid-run (a checkpoint an iteration, so maybe mid-save): one line, the summary
    # marked interrupted, no half-written checkpoint, no lock, no process left running.
    out = tmp_path / "run"
    args = train_args(digits, out, "--iterations", "500", "--eval-episodes", "0",
                      "--nproc-per-node", "2")  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "llm_gym", *args]
    launcher = subprocess.Popen(
        command, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 300
    while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.stderr.read()
        time.sleep(0.1)
    ranks = rank_processes(launcher)
    assert sorted(ranks) == [0, 1]
    if how == "ctrl-c":  # a terminal's Ctrl-C: the whole process group
        os.killpg(launcher.pid, signal.SIGINT)
    elif how == "sigterm":  # a scheduler's
        launcher.terminate()
    elif how == "a rank killed":
        os.kill(ranks[1], signal.SIGKILL)
    else:  # the ranks see their parent gone
        launcher.kill()
    code, line = STOPS[how]
    err = launcher.communicate(timeout=120)[1]  # stderr closes when the ranks have exited too
    assert launcher.returncode == code, err
    said = [x for x in err.splitlines() if x.startswith("llm-gym:") and "note:" not in x]
    assert len(said) == 1 and said[0].startswith(line) and "Traceback" not in err, err
    assert "--resume continues from" in said[0]
    for pid in ranks.values():  # gone, not left running alone
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["iterations"] >= 3
    left = sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".")))
    assert left and all(name.split("-")[-1].isdigit() for name in left), left
    # no .partial, no .deleting, no .llm-gym.lock


def test_uneven_groups_and_bad_launch_flags_are_one_line(digits, tmp_path, capsys):
    cases = [
        (["--groups", "3", "--nproc-per-node", "2"],
         "--groups 3 does not divide by the 2 processes of the run (--nproc-per-node 2 x "
         "--nnodes 1)"),
        (["--nnodes", "2"], "--nnodes 2 needs --master-addr"),
        (["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1"],
         "--node-rank 2 must be below --nnodes 2"),
    ]  # fmt: skip
    with socket.socket() as taken:  # a port another program listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for flags in (["--master-addr", "127.0.0.1"], []):  # across machines, or on this one
            cases.append((
                ["--nproc-per-node", "2", *flags, "--master-port", str(port)],
                f"--master-port {port} on 127.0.0.1 cannot be taken for the rendezvous "
                "(Address already in use): pass a free port",
            ))  # fmt: skip
        for extra, message in cases:
            assert main(train_args(digits, tmp_path / "x", *extra)) == 2
            err = capsys.readouterr().err
            assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()  # refused before anything started


def test_what_a_sharded_run_does_not_do_yet_is_refused_by_name(digits, tmp_path, monkeypatch):
    # Under a launcher (WORLD_SIZE), before any process group or model.
    from llm_gym.train import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("WORLD_SIZE", "2")
    config = GRPOConfig(
        model=digits, out=str(tmp_path), asynchronous=True, kl_coef=0.1, kl_target=0.1
    )
    with pytest.raises(ValueError, match="does not go with --async, --kl-target yet"):
        GRPOTrainer(config)
    with pytest.raises(ValueError, match="--groups 3 does not divide by the 2 processes"):
        GRPOTrainer(GRPOConfig(model=digits, out=str(tmp_path), groups=3))
    assert not any(tmp_path.iterdir())


@pytest.mark.vllm
def test_two_processes_sample_from_one_vllm_server_that_the_first_keeps_in_sync(digits, tmp_path):
    # The first process starts the server; both sample from it; after each update the first
    # gathers the weights whole, writes them and has the server load them, the other waits.
    out = tmp_path / "vllm"
    args = train_args(digits, out, "--backend", "vllm", "--nproc-per-node", "2",
                      "--eval-episodes", "0", "--save-every", "2")  # fmt: skip
    finished(llm_gym(*args))
    ran = rows(out)
    assert [r["versions"] for r in ran] == [[0], [1]]  # every episode: the last update's
    assert all(r["sync_seconds"] > 0 for r in ran) and 0 < ran[0]["success"] < 1
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["world_size"], summary["backend"]) == (2, "vllm")
    # The served copy holds the last update, which moved the weights from the start.
    served, final = weights(out / "served-model"), weights(out / "checkpoint-2")
    assert all(torch.equal(final[k], served[k]) for k in final)
    start = weights(Path(digits))
    assert max((final[k] - start[k]).abs().max().item() for k in start) > 1e-3


# A game of several turns an episode, from the state (issue 72): tree-grpo's branches,
# VinePPO's continuations, and the held-out games greedy.
GAME = (
    "--env", "LLMChat-TextArena-v0", "--env-arg", "game=GuessTheNumber-v0", "--env-arg",
    "max_turns=3", "--env-arg", "rewards=outcome", "--env-arg", "invalid_move_reward=-0.1",
    "--gamma", "0.9", "--log-episodes", "--groups", "2", "--group-size", "2",
    "--max-new-tokens", "4", "--save-every", "1", "--save-optimizer", "--eval-episodes", "4",
    "--dtype", "float32", "--no-progress",
)  # fmt: skip
TREE_CREDITS = {
    "tree-grpo": ("--branches", "2", "--advantage", "tree-grpo"),
    "vine": ("--advantage", "vine", "--vine-rollouts", "2"),
}


def episode_records(out):
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("credit", sorted(TREE_CREDITS))
def test_two_processes_play_a_game_from_the_state_as_one_does(tiny_dir, tmp_path, credit):
    # Each process plays its group, generating (its model's shard gathered) as often as the
    # other, whose games may last more turns (test_sharding.py makes them); the branches'
    # places, their streams and VinePPO's continuations are the run's, whichever process
    # plays them.
    game = ("--model", tiny_dir, *GAME, *TREE_CREDITS[credit], "--iterations", "2")
    one = llm_gym("train", "--out", str(tmp_path / "one"), *game, "--threads", "1")
    two = llm_gym("train", "--out", str(tmp_path / "two"), *game, "--nproc-per-node", "2")
    finished(one), finished(two)
    a, b = episode_records(tmp_path / "one"), episode_records(tmp_path / "two")
    assert len(a) == len(b) == 2 * 2 * (2 + (2 if credit == "tree-grpo" else 0))
    keys = ("responses", "reward", "branch", "turn_values", "game_seed")
    assert [{k: r.get(k) for k in keys} for r in a] == [{k: r.get(k) for k in keys} for r in b]
    assert any(r["branch"]["turn"] > 0 for r in b if "branch" in r) or credit == "vine"
    for x, y in zip(rows(tmp_path / "one"), rows(tmp_path / "two"), strict=True):
        for key in ("reward", "success", "sampled_tokens", "loss", "grad_norm"):
            assert x[key] == pytest.approx(y[key], abs=1e-4), key
    before, after = (json.loads((tmp_path / out / "summary.json").read_text())
                     for out in ("one", "two"))  # fmt: skip
    assert before["before"] == after["before"] and before["after"] == after["after"]
    assert after["world_size"] == 2
    if credit != "tree-grpo":
        return
    # Resumed on two processes from its first checkpoint, the run plays and trains the same
    # episodes to the same weights.
    parts = resumable(tmp_path / "two", tmp_path, "parts")
    finished(llm_gym("train", "--out", str(parts), "--resume", "--no-progress",
                     "--nproc-per-node", "2"))  # fmt: skip
    assert [r["responses"] for r in episode_records(parts)] == [r["responses"] for r in b]
    exact, end = weights(parts / "checkpoint-2"), weights(tmp_path / "two" / "checkpoint-2")
    assert all(torch.equal(end[k], exact[k]) for k in end)
