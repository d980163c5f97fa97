"""The vLLM server's life: a server that never comes up, one that dies at start-up and one killed
in the middle of a rollout each give a one-line error and leave no process behind; a server
without token ids is refused. Real vLLM servers (marker ``vllm``), except where the point is a
server that is not vLLM."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from backend_fixture import server_processes, wait_gone

from llm_gym.samplers import OpenAISampler, SamplerError, VLLMSampler, find_vllm_python


@pytest.mark.vllm
def test_a_server_that_does_not_come_up_in_time_is_an_error_and_is_stopped(tmp_path):
    before = set(server_processes())
    start = time.monotonic()
    with pytest.raises(
        SamplerError, match=r"did not answer .*/health within 3 s \(startup_timeout\)"
    ):
        VLLMSampler("default", startup_timeout=3, log_path=tmp_path / "log")
    assert time.monotonic() - start < 30
    new = set(server_processes()) - before
    assert wait_gone(new) == {}


@pytest.mark.vllm
def test_a_server_that_dies_at_start_up_names_its_exit_and_log(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "no-such-architecture"}')
    before = set(server_processes())
    with pytest.raises(
        SamplerError, match=r"the vLLM server \(pid \d+\) exited with code 1: .*its log: "
    ):
        VLLMSampler(folder, log_path=tmp_path / "log")
    assert "no-such-architecture" in (tmp_path / "log").read_text()
    assert wait_gone(set(server_processes()) - before) == {}


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


@pytest.mark.vllm
@pytest.mark.parametrize("driver", [[], ["--async"]], ids=["sync", "async"])
def test_killing_the_server_mid_rollout_ends_it_with_one_line_and_no_orphan(tmp_path, driver):
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "llm_gym", "rollout", "--backend", "vllm", "--num-envs", "2",
        "--episodes", "400", "--max-new-tokens", "48", "--out", str(out), "--no-progress",
        *driver,
    ]  # fmt: skip
    others = set(server_processes())  # the test run's own server, if it has started one
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    episodes = out / "episodes.jsonl"
    deadline = time.monotonic() + 240
    while not (episodes.exists() and episodes.read_text().count("\n") >= 2):
        assert run.poll() is None, run.stderr.read()
        assert time.monotonic() < deadline, "no episode finished in 240 s"
        time.sleep(0.5)
    servers = [p for p in children(run.pid) if p in server_processes()]
    assert len(servers) == 1
    session = set(server_processes()) - others  # the server, its engine and its workers
    os.kill(servers[0], signal.SIGKILL)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith(
        f"llm-gym: error: the vLLM server (pid {servers[0]}) exited with code -9"
    )
    assert lines[-1].endswith(f"finished episodes are in {out}/episodes.jsonl")
    records = [json.loads(line) for line in episodes.read_text().splitlines()]
    assert len(records) >= 2 and [r["episode"] for r in records] == list(range(len(records)))
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True
    assert wait_gone(session) == {}


class NoTokenIds(BaseHTTPRequestHandler):
    """An OpenAI-compatible server without vLLM's ``return_token_ids``: text only."""

    reply = {"choices": [{"text": "4", "finish_reason": "stop", "logprobs": None}]}

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._send({"data": [{"id": "plain"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(self.reply)

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Garbage(NoTokenIds):
    reply = {"choices": [{"token_ids": ["4"], "finish_reason": "stop"}]}


@pytest.mark.parametrize(
    ("handler", "match"),
    [
        (NoTokenIds, r"returned no token ids: it needs vLLM's 'return_token_ids' request option"),
        (Garbage, r"answered garbage: expected a list of int token ids, got \"\['4'\]\""),
    ],
)
def test_a_server_without_token_ids_is_refused_when_the_sampler_is_made(handler, match):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(SamplerError, match=match) as caught:
            OpenAISampler(f"http://127.0.0.1:{server.server_port}")
        assert "\n" not in str(caught.value)
    finally:
        server.shutdown()


def test_a_missing_vllm_environment_says_how_to_make_one(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"no vLLM environment at .*: run `bash scripts/setup_vllm.sh`"
    ):
        find_vllm_python(tmp_path / "none" / "python")
    with pytest.raises(FileNotFoundError, match="python="):
        VLLMSampler("default", python=tmp_path / "none" / "python")
