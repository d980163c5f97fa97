"""``--report-to``: what a run wrote to TensorBoard, W&B, Trackio and MLflow, read back by each
tracker's own reader, a resumed run continuing each, a failing tracker dropped with a warning,
and the one-line errors."""

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from llm_gym.cli import main
from llm_gym.run.config import RolloutConfig
from llm_gym.run.trackers import TRACKERS, TRACKERS_FILE, Trackers, scalars
from llm_gym.train import GRPOConfig, GRPOTrainer


def metrics(out: Path) -> dict[tuple[str, int], float]:
    """Every number of ``metrics.jsonl``, by (name, iteration)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {(k, row["iteration"]): v for row in rows for k, v in scalars(row).items()}


def tensorboard_scalars(out: Path) -> tuple[dict[tuple[str, int], float], list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    read = {(t, e.step): e.value for t in tags["scalars"] for e in events.Scalars(t)}
    return read, tags["images"]


def wandb_records(path: Path):
    """The records of a W&B run file, parsed with W&B's own protobuf ``Record`` (wandb 0.31
    ships no Python reader of its files): LevelDB's log format, 32 KiB blocks of chunks each
    under a 7-byte header (checksum, length, type), after the file's 7-byte ``:W&B`` header."""
    from wandb.proto import wandb_internal_pb2

    data, block, position, chunk = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's padding
            position += left
            continue
        chunk += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def wandb_history(out: Path) -> tuple[dict[tuple[str, int], object], set[str]]:
    """Every logged value of the run's offline W&B runs by (key, step), and their run ids."""
    read, ids = {}, set()
    for path in sorted(out.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}  # fmt: skip
                step = items.pop("_step")
                read.update({(k, step): v for k, v in items.items() if not k.startswith("_")})
    return read, ids


def in_a_subprocess(code: str, env: dict[str, str]) -> object:
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_tracker_reads_back_every_metric_and_a_resumed_run_continues_it(tiny_dir, tmp_path):
    env = {
        **os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "WANDB_SILENT": "true",
    }  # fmt: skip
    out = tmp_path / "run"
    args = [
        "train", "--model", tiny_dir, "--out", str(out), "--env-arg", "task=chain_sum",
        "--iterations", "2", "--groups", "1", "--group-size", "2", "--max-new-tokens", "4",
        "--eval-episodes", "2", "--save-every", "1", "--threads", "1", "--no-progress",
        "--report-to", "all",
    ]  # fmt: skip
    for extra in ([], ["--resume", "--iterations", "3"]):
        # In tmp_path: MLflow keeps a SQLite store's artifacts in ./mlruns.
        command = [sys.executable, "-m", "llm_gym", *args, *extra]
        subprocess.run(command, env=env, check=True, cwd=tmp_path)
    expected = metrics(out)
    assert {step for _, step in expected} == {0, 1, 2} and ("parts/right", 2) in expected
    summary = json.loads((out / "summary.json").read_text())
    ending = {("after/success", 3): summary["after"]["success"], ("iterations", 3): 3.0}

    read, images = tensorboard_scalars(out)
    assert {key: read[key] for key in expected} == pytest.approx(expected)
    assert {key: read[key] for key in ending} == pytest.approx(ending)
    assert images == ["training"]

    read, ids = wandb_history(out)
    assert {key: read[key] for key in expected} == pytest.approx(expected)
    assert {key: read[key] for key in ending} == pytest.approx(ending)
    assert read[("training/_type", 3)] == "image-file"  # the plot, as W&B keeps an image
    # The resumed run logged into the same W&B run: one id, the one trackers.json keeps.
    saved = json.loads((out / TRACKERS_FILE).read_text())
    assert ids == {saved["wandb"]["id"]} and len(list(out.glob("wandb/offline-run-*"))) == 2

    name = saved["trackio"]["name"]  # the folder's name and a suffix of its own
    logs = in_a_subprocess(
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps([S.get_runs('llm-gym'), S.get_logs('llm-gym', {name!r})]))",
        env,
    )
    runs, rows = logs
    read = {(k, row["step"]): v for row in rows for k, v in row.items() if k != "step"}
    assert runs == [name] and name.startswith("run-")  # resumed, not a second run
    assert {key: read[key] for key in expected} == pytest.approx(expected)
    assert read[("after/success", 3)] == pytest.approx(summary["after"]["success"])

    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("llm-gym").experiment_id])
    assert run.info.run_id == saved["mlflow"]["run_id"] and run.info.run_name == "run"
    assert run.info.status == "FINISHED" and run.data.params["learning_rate"] == "5e-05"
    read = {(name, m.step): m.value for name, _ in expected
            for m in client.get_metric_history(run.info.run_id, name)}  # fmt: skip
    assert {key: read[key] for key in expected} == pytest.approx(expected)
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["training.png"]


@pytest.mark.slow  # a training and a rollout (the inner loop keeps the errors' test)
def test_tensorboard_gets_a_runs_rows_and_a_rollouts_episodes(tiny_dir, tmp_path):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / "train"), env_args={"task": "chain_sum"},
        iterations=2, groups=1, group_size=2, max_new_tokens=4, eval_episodes=0,
        progress=False, report_to="tensorboard",
    )  # fmt: skip
    assert config.report_to == ["tensorboard"]
    GRPOTrainer(config).train()
    read, images = tensorboard_scalars(tmp_path / "train")
    expected = metrics(tmp_path / "train")
    assert {key: read[key] for key in expected} == pytest.approx(expected)
    assert images == ["training"] and read[("iterations", 2)] == 2.0

    from llm_gym.run.rollout import Rollout

    out = tmp_path / "rollout"
    rollout = RolloutConfig(
        model=tiny_dir, out=str(out), env_args={"task": "chain_sum"}, episodes=4,
        num_envs=2, max_new_tokens=4, progress=False, report_to="tensorboard",
    )  # fmt: skip
    summary = Rollout(rollout).run()
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    read, images = tensorboard_scalars(out)
    assert [read[("num_tokens", r["episode"])] for r in records] == [4.0] * 4
    assert [read[("reward", r["episode"])] for r in records] == [r["reward"] for r in records]
    assert read[("episodes", 4)] == summary.episodes == 4 and images == ["rollout"]


@pytest.mark.slow  # MLflow builds its SQLite store
def test_a_tracker_failing_mid_run_is_dropped_with_a_warning(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)  # MLflow keeps a SQLite store's artifacts in ./mlruns
    trackers = Trackers(["mlflow", "tensorboard"], tmp_path, {"seed": 0})
    trackers.log({"reward": 0.5}, 0)
    # The MLflow run deleted under the run: MLflow refuses to log into it.
    MlflowClient().delete_run(trackers.ids["mlflow"]["run_id"])
    with pytest.warns(RuntimeWarning, match="--report-to mlflow failed .*MlflowException"):
        trackers.log({"reward": 0.75}, 1)
    assert list(trackers.open_) == ["tensorboard"]
    trackers.finish({"after": {"success": 1.0}}, 2)
    read, _ = tensorboard_scalars(tmp_path)
    assert read == {("reward", 0): 0.5, ("reward", 1): 0.75, ("after/success", 2): 1.0}


def test_report_to_names_what_is_wrong_or_missing(tiny_dir, tmp_path, monkeypatch, capsys):
    assert main(["train", "--report-to", "comet", "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert "report_to (--report-to) takes none, all or comma-separated names of" in message
    assert "got 'comet'" in message and not (tmp_path / "run_config.json").exists()
    assert GRPOConfig(report_to="all").report_to == list(TRACKERS)
    assert GRPOConfig().report_to == []  # none by default

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else found(name)
    )
    with pytest.raises(ValueError, match=r"'wandb' is not installed: pip install 'llm-gym\["):
        GRPOConfig(report_to="tensorboard,wandb")


@pytest.mark.slow  # MLflow builds its SQLite store
def test_a_resume_keeps_the_ids_of_every_tracker_the_run_used(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    first = Trackers(["mlflow"], tmp_path, {"seed": 0})
    run_id = first.ids["mlflow"]["run_id"]
    first.finish({}, 1)
    Trackers(["tensorboard"], tmp_path, {"seed": 0}, start=1).finish({}, 2)
    assert json.loads((tmp_path / TRACKERS_FILE).read_text())["mlflow"]["run_id"] == run_id
    again = Trackers(["mlflow"], tmp_path, {"seed": 0}, start=2)
    assert again.ids["mlflow"]["run_id"] == run_id  # the same MLflow run, not a new one
    again.finish({}, 3)


def test_an_unreachable_mlflow_server_is_one_warning_naming_it(tmp_path, monkeypatch):
    import socket

    with socket.socket() as closed:  # a port nobody listens on once this one is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.warns(RuntimeWarning) as warned:
        trackers = Trackers(["mlflow", "tensorboard"], tmp_path, {"seed": 0})
    (warning,) = [w for w in warned if "mlflow" in str(w.message)]
    assert str(warning.message).startswith(
        f"--report-to mlflow could not start (ConnectionError: its tracking server at {uri} "
        "did not answer within 3 s ("
    )
    assert list(trackers.open_) == ["tensorboard"]  # the run goes on with the others
    trackers.finish({}, 0)


TRACKIO_TWINS = """
import json, sys
from pathlib import Path
from llm_gym.run.trackers import Trackers

root = Path(sys.argv[1])
x, y = root / "x" / "demo", root / "y" / "demo"
for out in (x, y):
    out.mkdir(parents=True)
a = Trackers(["trackio"], x, {"out": str(x)})
for step in (0, 1):
    a.log({"reward": step}, step)
a.finish({}, 2)
b = Trackers(["trackio"], y, {"out": str(y)})
for step in (0, 1, 2, 3):
    b.log({"reward": 10 + step}, step)
b.finish({}, 4)
c = Trackers(["trackio"], x, {"out": str(x)}, start=2)
for step in (2, 3):
    c.log({"reward": step}, step)
c.finish({}, 4)
print(json.dumps([c.ids["trackio"]["name"], b.ids["trackio"]["name"]]))
"""


@pytest.mark.slow  # Trackio starts its storage in a process of its own
def test_two_runs_whose_folders_share_a_name_keep_their_own_trackio_runs(tmp_path):
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", TRACKIO_TWINS, str(tmp_path)], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    x, y = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("[")))
    assert x != y and x.startswith("demo-") and y.startswith("demo-")
    logs = in_a_subprocess(
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps([S.get_logs('llm-gym', {x!r}), S.get_logs('llm-gym', {y!r})]))",
        env,
    )
    steps = [[(row["step"], row["reward"]) for row in rows if "reward" in row] for rows in logs]
    assert steps[0] == [(0, 0), (1, 1), (2, 2), (3, 3)]  # x's own, resumed into its own run
    assert steps[1] == [(0, 10), (1, 11), (2, 12), (3, 13)]  # y's untouched


STOPPED_AND_RESUMED = """
import json, sys
from pathlib import Path
from llm_gym.run.trackers import Trackers

out = Path(sys.argv[1])
names = ["mlflow", "trackio", "tensorboard"]
# Five iterations, a checkpoint every two: stopped after three rows (the last checkpoint holds
# two), resumed from the checkpoint with values of its own (+10).
first = Trackers(names, out, {"seed": 0}, hold=True)
for step in range(3):
    first.log({"reward": float(step)}, step)
    if step + 1 == 2:
        first.commit(2)
first.finish({"interrupted": True, "after": {"success": 0.5}}, 3)
again = Trackers(names, out, {"seed": 0}, start=2, hold=True)
for step in range(2, 5):
    again.log({"reward": 10.0 + step}, step)
    if step + 1 == 4:
        again.commit(4)
again.finish({"interrupted": False, "after": {"success": 1.0}}, 5)
print(json.dumps(again.ids))
"""


@pytest.mark.slow  # MLflow builds its SQLite store, Trackio starts its own
def test_a_resumed_run_logs_each_iteration_once_the_resumed_value_winning(tmp_path):
    env = {
        **os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", STOPPED_AND_RESUMED, str(out)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, check=True)  # fmt: skip
    ids = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    expected = [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0), (4, 14.0)]

    from mlflow import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    history = client.get_metric_history(ids["mlflow"]["run_id"], "reward")
    assert sorted((m.step, m.value) for m in history) == expected
    ending = client.get_metric_history(ids["mlflow"]["run_id"], "after/success")
    assert [(m.step, m.value) for m in ending] == [(5, 1.0)]  # the stop's summary: no step

    name = ids["trackio"]["name"]
    rows = in_a_subprocess(
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; "
        f"print(json.dumps(S.get_logs('llm-gym', {name!r})))",
        env,
    )
    assert [(row["step"], row["reward"]) for row in rows if "reward" in row] == expected
    read, _ = tensorboard_scalars(out)
    assert sorted((step, value) for (key, step), value in read.items() if key == "reward") == (
        expected
    )
