"""``llm-gym serve``: llm_gym envs over OpenEnv's protocol, played by OpenEnv's own client
(``GenericEnvClient``) and raw WebSockets on loopback; every wait is bounded."""

import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.request

import gymnasium as gym
import numpy as np
import pytest
from openenv import GenericEnvClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import llm_gym
from llm_gym.integrations.openenv_server import Server

ENV = "LLMChat-Countdown-v0"
ARGS = {"level": 0}


@pytest.fixture(scope="module")
def server():
    served = Server(ENV, ARGS, port=0, max_sessions=4)
    served.start()
    yield served
    served.stop()


def ws_url(server: Server) -> str:
    return f"ws://{server.host}:{server.port}/ws"


def twin(seed: int, **kwargs):
    env = gym.make(ENV, **ARGS, **kwargs)
    return env, env.reset(seed=seed)


def test_reset_and_step_over_the_wire_equal_the_in_process_env(server):
    env, (obs, info) = twin(3)
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(seed=3)
        assert first.observation["history"] == [dict(m) for m in obs["history"]]
        assert first.observation["info"] == info and first.reward is None and not first.done
        assert first.observation["tokens"] is None  # a history-mode env has no tokens key
        answer = f"<answer>{info['answer'] if 'answer' in info else '1 + 1'}</answer>"
        result = client.step({"text": answer})
        expected = env.step(answer)
        assert result.reward == expected[1] and result.done is True
        assert result.observation["terminated"] is expected[2] is True
        assert result.observation["truncated"] is False
        assert result.observation["info"] == json.loads(json.dumps(expected[4]))
        assert result.observation["history"] == [dict(m) for m in expected[0]["history"]]
        state = client.state()
        assert state["step_count"] == 1 and state["env_id"] == ENV


def test_concurrent_sessions_are_isolated(server):
    clients = [GenericEnvClient(base_url=server.url).sync() for _ in range(3)]
    try:
        seeds = [5, 6, 7]
        firsts = [c.reset(seed=s) for c, s in zip(clients, seeds, strict=True)]
        for seed, first in zip(seeds, firsts, strict=True):
            _, (obs, _) = twin(seed)
            assert first.observation["history"][-1] == dict(obs["history"][-1])
        assert len({f.observation["history"][-1]["content"] for f in firsts}) == 3
        # Interleaved steps: each session's reward is its own episode's.
        for client, seed in zip(reversed(clients), reversed(seeds), strict=True):
            env, _ = twin(seed)
            assert (
                client.step({"text": "<answer>2 + 2</answer>"}).reward
                == env.step("<answer>2 + 2</answer>")[1]
            )
    finally:
        for client in clients:
            client.close()


def test_tokens_go_in_as_the_exact_ids(gpt2_tokenizer):
    served = Server(ENV, {**ARGS, "input_mode": "tokens", "tokenizer": gpt2_tokenizer}, port=0)
    served.start()
    try:
        env, (obs, _) = twin(1, input_mode="tokens", tokenizer=gpt2_tokenizer)
        ids = gpt2_tokenizer(" <answer>3 + 4</answer>")["input_ids"]
        with GenericEnvClient(base_url=served.url).sync() as client:
            first = client.reset(seed=1)
            assert first.observation["tokens"] == obs["tokens"].tolist()
            result = client.step({"tokens": ids})
        expected = env.step(np.asarray(ids, dtype=np.int64))
        assert result.reward == expected[1]
        assert result.observation["tokens"] == expected[0]["tokens"].tolist()
        assert result.observation["tokens"][len(obs["tokens"]) :][: len(ids)] == ids
    finally:
        served.stop()


@pytest.mark.parametrize(
    ("action", "loc", "kind"),
    [
        ({"text": 5}, ["text"], "string_type"),
        ({"tokens": ["a"]}, ["tokens", 0], "int_parsing"),
        ({"tokens": [-1]}, ["tokens", 0], "greater_than_equal"),
        ({"txt": "4"}, ["txt"], "extra_forbidden"),
        ({"text": "4", "tokens": [1]}, [], "one_of"),
        ({}, [], "one_of"),
    ],
)
def test_a_malformed_action_is_a_validation_error_naming_the_field(server, action, loc, kind):
    with connect(ws_url(server), open_timeout=5) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": action}))
        error = json.loads(ws.recv(timeout=10))["data"]
        assert error["code"] == "VALIDATION_ERROR"
        assert any(e["type"] == kind and e["loc"] == loc for e in error["errors"]), error
        # The session goes on: a good action is stepped.
        ws.send(json.dumps({"type": "step", "data": {"text": "<answer>1</answer>"}}))
        assert json.loads(ws.recv(timeout=10))["data"]["done"] is True


def test_openenv_client_reports_the_code_and_the_session_goes_on(server):
    with GenericEnvClient(base_url=server.url).sync() as client:
        client.reset(seed=0)
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"text": 5})
        assert client.step({"text": "<answer>1</answer>"}).done is True
        # A step after the end is the env's own error (ResetNeeded), sent as OpenEnv's.
        with pytest.raises(RuntimeError, match="EXECUTION_ERROR"):
            client.step({"text": "again"})
        assert client.reset(seed=0).done is False


def test_a_session_over_max_sessions_gets_capacity_reached():
    served = Server(ENV, ARGS, port=0, max_sessions=1)
    served.start()
    try:
        with GenericEnvClient(base_url=served.url).sync() as first:
            first.reset(seed=0)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                with GenericEnvClient(base_url=served.url).sync() as second:
                    second.reset(seed=0)
        # The first session closed: its slot is free again.
        with GenericEnvClient(base_url=served.url).sync() as third:
            assert third.reset(seed=0).done is False
    finally:
        served.stop()


def admitted(url: str, deadline: float) -> float | None:
    """Seconds until a new session is admitted (a reset answers), or None by ``deadline``; a
    full server answers CAPACITY_REACHED and closes, and the next try waits a little."""
    start = time.monotonic()
    while time.monotonic() - start < deadline:
        try:
            with connect(url, open_timeout=5) as ws:
                ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
                if json.loads(ws.recv(timeout=10))["type"] == "observation":
                    return time.monotonic() - start
        except ConnectionClosed:
            pass
        time.sleep(0.2)
    return None


def test_an_idle_session_is_closed_and_its_slot_freed():
    served = Server(ENV, ARGS, port=0, max_sessions=1, session_timeout=1.0)
    served.start()
    try:
        with connect(ws_url(served), open_timeout=5) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
            assert json.loads(ws.recv(timeout=10))["type"] == "observation"
            start = time.monotonic()
            error = json.loads(ws.recv(timeout=10))  # nothing sent: the server speaks
            assert error["data"]["code"] == "SESSION_ERROR" and "idle" in error["data"]["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1001
            assert 0.9 < time.monotonic() - start < 5
        assert admitted(ws_url(served), deadline=5) is not None
    finally:
        served.stop()


def handshake(host: str, port: int) -> socket.socket:
    """A WebSocket opened by hand, that then never reads or answers a ping (half-open)."""
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert b"101" in sock.recv(1024).split(b"\r\n")[0]
    return sock


def test_vanished_clients_free_their_slots():
    # OpenEnv issue #1000: half-open sockets held sessions until the server refused everyone.
    served = Server(ENV, ARGS, port=0, max_sessions=1, ping_interval=0.5)
    served.start()
    try:
        silent = handshake(served.host, served.port)  # holds the only slot, answers no ping
        time.sleep(0.3)
        with connect(ws_url(served), open_timeout=5) as ws:  # full while it is held
            assert json.loads(ws.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
        waited = admitted(ws_url(served), deadline=10)
        assert waited is not None and waited < 5  # dropped after two missed pings
        silent.close()
        # A client killed mid-episode (its socket closed without a WebSocket close).
        gone = handshake(served.host, served.port)
        gone.close()
        assert admitted(ws_url(served), deadline=5) is not None
    finally:
        served.stop()


def test_a_10_mb_action_is_refused_not_buffered(server):
    big = json.dumps({"type": "step", "data": {"text": "x" * 10_000_000}})
    with connect(ws_url(server), open_timeout=5, max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        ws.recv(timeout=10)
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(big)
            ws.recv(timeout=10)
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
    # Over HTTP the headers say 10 MB: refused before a byte of the body is read.
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.putrequest("POST", "/step")
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(10_000_000))
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 413 and b"over the 1048576 limit" in reply.read()
    conn.close()
    with GenericEnvClient(base_url=server.url).sync() as client:  # the server goes on
        assert client.reset(seed=0).done is False


def test_health_schema_and_metadata(server):
    with urllib.request.urlopen(f"{server.url}/health", timeout=5) as reply:
        assert json.load(reply)["status"] == "healthy"
    with urllib.request.urlopen(f"{server.url}/schema", timeout=5) as reply:
        schema = json.load(reply)
    assert {"text", "tokens"} <= set(schema["action"]["properties"])
    assert {"history", "terminated", "truncated", "info"} <= set(
        schema["observation"]["properties"]
    )


@pytest.mark.slow
def test_serve_command_prints_the_url_and_refuses_bad_ids():
    bad = subprocess.run(
        [sys.executable, "-m", "llm_gym", "serve", "LLMChat-Nope-v0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "llm-gym: error: 'LLMChat-Nope-v0' is not a registered llm_gym env id (llm-gym envs)"
    )
    bad_arg = subprocess.run(
        [sys.executable, "-m", "llm_gym", "serve", ENV, "--env-arg", "level=99"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad_arg.returncode == 2 and "level" in bad_arg.stderr
    assert len(bad_arg.stderr.strip().splitlines()) == 1
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_gym", "serve", ENV, "--port", "0", "--env-arg", "level=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith(f"serving {ENV} at http://127.0.0.1:"), line
        url = line.split(" at ")[1].split()[0]
        with GenericEnvClient(base_url=url).sync() as client:
            assert client.reset(seed=2).observation["history"][-1] == dict(
                twin(2)[1][0]["history"][-1]
            )
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_serve_command_serves_tokens_with_the_models_tokenizer(smollm2_tokenizer):
    command = [sys.executable, "-m", "llm_gym", "serve", ENV, "--port", "0", "--env-arg"]
    command += ["level=0", "--env-arg", "input_mode=tokens", "--tokenizer", "default"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = process.stdout.readline().split(" at ")[1].split()[0]
        with GenericEnvClient(base_url=url).sync() as client:
            first = client.reset(seed=4)
        _, (obs, _) = twin(4, input_mode="tokens", tokenizer=smollm2_tokenizer)
        assert first.observation["tokens"] == obs["tokens"].tolist()
        assert first.observation["text"] is None and first.observation["history"] is None
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_llmchat_openenv_plays_llm_gym_serve_as_the_in_process_env(server):
    # The round trip: a served env played back as a Gymnasium env gives the same episodes.
    envs = gym.make_vec(
        "LLMChat-OpenEnv-v0", num_envs=2, vectorization_mode="vector_entry_point",
        base_url=server.url, seed=0,
    )  # fmt: skip
    try:
        obs, info = envs.reset(seed=0)
        actions = ["<answer>1 + 2</answer>", "<answer>2 * 3</answer>"]
        _, rewards, terminated, _, step_info = envs.step(actions)
        for i, action in enumerate(actions):
            env, (twin_obs, _) = twin(int(info["episode_seed"][i]))
            assert obs["history"][i] == twin_obs["history"]  # its system prompt included
            assert rewards[i] == env.step(action)[1] and terminated[i]
    finally:
        envs.close()


def test_openenvs_private_members_are_reached_only_on_the_pinned_version():
    from pathlib import Path

    from llm_gym.integrations._openenv_private import OPENENV_VERSION, check_openenv_version

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'\nserve = ["openenv=={OPENENV_VERSION}"]\n' in pyproject  # the "serve" extra's pin
    check_openenv_version()  # the installed one: the pin
    with pytest.raises(RuntimeError) as refused:
        check_openenv_version("0.9.1")
    assert str(refused.value) == (
        "llm-gym serve --web reaches members of OpenEnv's server that are not its public API, "
        f"as OpenEnv 0.9.1 has them, and openenv {OPENENV_VERSION} is installed: "
        "pip install openenv==0.9.1"
    )


def test_the_session_table_makes_runs_and_ends_a_servers_sessions():
    import asyncio
    import functools

    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig

    from llm_gym.integrations._openenv_private import ServerSessions
    from llm_gym.integrations.openenv_server import (
        ChatAction,
        ChatObservation,
        ChatState,
        ServedEnv,
    )

    server = HTTPEnvServer(
        functools.partial(ServedEnv, ENV, ARGS), ChatAction, ChatObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=1), env_name=ENV,
        state_cls=ChatState,
    )  # fmt: skip
    table = ServerSessions(server)

    async def play():
        session, env = await table.create()
        assert table.env(session) is env and table.env(None) is None
        observation = await table.run(session, env.reset, 3)
        table.touch(session, step=True)
        active = table.last_activity(session)
        await table.destroy(session)
        return observation, active, table.env(session), table.last_activity(session)

    observation, active, env, ended = asyncio.run(play())
    _, (obs, _) = twin(3)
    assert observation.history == [dict(m) for m in obs["history"]]
    assert isinstance(active, float) and env is None and ended is None
    assert table.metadata(ENV).name == ENV


def test_a_served_episode_refuses_to_fork_in_one_line(server):
    env = gym.make("LLMChat-OpenEnv-v0", base_url=server.url, seed=0)
    try:
        env.reset(seed=0)
        with pytest.raises(llm_gym.ForkError) as refused:
            llm_gym.fork(env)
        assert str(refused.value) == (
            f"OpenEnvChatEnv cannot fork: its episode's state is on the server at {server.url}, "
            "and OpenEnv's protocol offers no snapshot to copy it by"
        )
        assert env.step("<answer>1 + 2</answer>")[2]  # the episode goes on, unharmed
    finally:
        env.close()
