"""``llm-gym serve`` against a hostile client (issue 53): a step that hangs, a reference
answer asked for, frames OpenEnv's loop cannot take, HTTP routes without a session, callers
without the API key. Real uvicorn on loopback, OpenEnv's client, raw WebSockets and httpx;
every wait is bounded."""

import json
import threading
import time

import httpx
import pytest
from openenv import GenericEnvClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.integrations.openenv_server import Server

ENV = "LLMChat-Countdown-v0"
ARGS = {"level": 0}


@pytest.fixture(scope="module")
def server():
    served = Server(ENV, ARGS, port=0, max_sessions=2)
    served.start()
    yield served
    served.stop()


def ws_url(server: Server, query: str = "") -> str:
    return f"ws://{server.host}:{server.port}/ws{query}"


def reply(ws, message) -> dict:
    ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(ws.recv(timeout=10))


RELEASE = threading.Event()  # set at the end: the hung tool's thread ends with the test


def nap() -> str:
    """Sleeps (a tool that hangs)."""
    RELEASE.wait(120)
    return "rested"


def test_a_hanging_step_is_an_error_reply_and_frees_its_slot():
    args = {**ARGS, "tools": [nap], "max_turns": 2}
    served = Server(ENV, args, port=0, max_sessions=1, step_timeout=1.0)
    served.start()
    try:
        with connect(ws_url(served), open_timeout=5) as ws:
            assert reply(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
            start = time.monotonic()
            call = '<tool_call>{"name": "nap", "arguments": {}}</tool_call>'
            error = reply(ws, {"type": "step", "data": {"text": call}})["data"]
            assert time.monotonic() - start < 30  # the tool would sleep 120 s
            assert error["code"] == "EXECUTION_ERROR"
            assert "step ran past the step timeout of 1 s (--step-timeout)" in error["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1011
        # The slot is free: the next client is admitted, and stop() returns.
        with GenericEnvClient(base_url=served.url).sync() as client:
            assert client.reset(seed=1).done is False
    finally:
        start = time.monotonic()
        served.stop()
        stopped = time.monotonic() - start
        RELEASE.set()
    assert stopped < 8  # it took 10 s (the thread join's limit) with the step still held


def test_gsm8k_reference_answer_never_leaves_the_server():
    served = Server("LLMChat-GSM8K-v0", {"split": "test"}, port=0, web=True)
    served.start()
    try:
        with GenericEnvClient(base_url=served.url).sync() as client:
            first = client.reset(seed=0)
            assert "answer" not in first.observation["info"], first.observation["info"]
            result = client.step({"text": "#### 1"})
            assert "answer" not in result.observation["info"]
            assert result.observation["info"]["success"] is False  # the rest of info stays
        over_http = httpx.post(f"{served.url}/reset", json={"seed": 0}, timeout=30).json()
        assert "answer" not in over_http["observation"]["info"]
        assert "####" not in json.dumps(over_http)
        web = httpx.post(f"{served.url}/web/reset", json={}, timeout=30)
        assert web.status_code == 409 and "/ws" in web.json()["detail"]
    finally:
        served.stop()
    revealing = Server("LLMChat-GSM8K-v0", {"split": "test"}, port=0, reveal_answers=True)
    revealing.start()
    try:
        with GenericEnvClient(base_url=revealing.url).sync() as client:
            assert "####" in client.reset(seed=0).observation["info"]["answer"]
    finally:
        revealing.stop()


@pytest.mark.parametrize(
    ("frame", "code", "says"),
    [
        ("[1, 2, 3]", "VALIDATION_ERROR", "must be a JSON object"),
        ("5", "VALIDATION_ERROR", "got int"),
        ("null", "VALIDATION_ERROR", "got null"),
        (b"\x00\x01binary", "INVALID_JSON", "a binary frame"),
        (b'{"type": "\xff"}', "INVALID_JSON", "a binary frame"),  # invalid UTF-8
        ("[" * 100_000 + "]" * 100_000, "INVALID_JSON", "nested over"),
        ('{"type": "step", "data": {"text": ' + "[" * 500 + "]" * 500 + "}}",
         "VALIDATION_ERROR", "nest at most"),
        ("{not json", "INVALID_JSON", "invalid JSON"),
    ],
)  # fmt: skip
def test_a_malformed_frame_is_an_error_reply_and_the_session_goes_on(server, frame, code, says):
    with connect(ws_url(server), open_timeout=5, max_size=None) as ws:
        assert reply(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        error = reply(ws, frame)
        assert error["type"] == "error" and error["data"]["code"] == code, error
        assert says in error["data"]["message"]
        result = reply(ws, {"type": "step", "data": {"text": "<answer>1</answer>"}})
        assert result["type"] == "observation" and result["data"]["done"] is True


def test_invalid_utf8_in_a_text_frame_closes_with_1007_and_the_server_goes_on(server):
    # The WebSocket protocol's own rule (RFC 6455 8.1), enforced by uvicorn before the app
    # sees the frame: the connection fails with 1007 (as before this fix); the server goes on.
    with connect(ws_url(server), open_timeout=5) as ws:
        reply(ws, {"type": "reset", "data": {"seed": 0}})
        with ws.protocol_mutex:  # a text frame the sync client would not send itself
            ws.protocol.send_text(b'{"type": "\xff"}')
            ws.send_data()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.sent is not None and closed.value.sent.code == 1007
    with GenericEnvClient(base_url=server.url).sync() as client:
        assert client.reset(seed=0).done is False


def test_a_token_id_past_int32_is_a_validation_error(server):
    with connect(ws_url(server), open_timeout=5) as ws:
        reply(ws, {"type": "reset", "data": {"seed": 0}})
        error = reply(ws, {"type": "step", "data": {"tokens": [2**70]}})["data"]
        assert error["code"] == "VALIDATION_ERROR"
        assert [(e["type"], e["loc"]) for e in error["errors"]] == [
            ("less_than_equal", ["tokens", 0])
        ]


def test_http_step_says_to_use_the_websocket_and_mcp_is_refused(server):
    step = httpx.post(f"{server.url}/step", json={"action": {"text": "1"}}, timeout=10)
    assert step.status_code == 409
    assert step.json()["detail"].startswith("HTTP /step has no session")
    assert "/ws" in step.json()["detail"]
    mcp = httpx.post(f"{server.url}/mcp", json={"jsonrpc": "2.0", "method": "x"}, timeout=10)
    assert mcp.status_code == 404 and "no MCP" in mcp.json()["detail"]


def test_api_key_refuses_callers_without_it():
    served = Server(ENV, ARGS, port=0, api_key="s3cret")
    served.start()
    try:
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200  # open
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = httpx.post(f"{served.url}/reset", json={}, headers=headers, timeout=10)
            assert refused.status_code == 401 and "API key" in refused.json()["detail"]
        assert httpx.get(f"{served.url}/schema", timeout=10).status_code == 401
        with pytest.raises(InvalidStatus) as denied:
            connect(ws_url(served), open_timeout=5)
        assert denied.value.response.status_code == 403  # refused before accept
        with pytest.raises(ConnectionError, match="HTTP 403"):
            with GenericEnvClient(base_url=served.url).sync() as client:
                client.reset(seed=0)
        # OpenEnv's client sends the key as a header; a query parameter works too.
        bearer = {"Authorization": "Bearer s3cret"}
        with GenericEnvClient(base_url=served.url, headers=bearer).sync() as client:
            assert client.reset(seed=0).done is False
        with connect(ws_url(served, "?api_key=s3cret"), open_timeout=5) as ws:
            assert reply(ws, {"type": "reset", "data": {"seed": 0}})["type"] == "observation"
        ok = httpx.post(f"{served.url}/reset", json={}, headers={"X-API-Key": "s3cret"})
        assert ok.status_code == 200
    finally:
        served.stop()


def test_serve_command_wants_its_key_and_warns_when_exposed_without_one():
    import os
    import subprocess
    import sys

    import gymnasium as gym

    command = [sys.executable, "-m", "llm_gym", "serve", ENV, "--port", "0", "--env-arg"]
    command += ["level=0", "--host", "0.0.0.0"]
    env = {**os.environ, "LLM_GYM_API_KEY": ""}
    keyed = subprocess.Popen(
        [*command, "--api-key", "k3y"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    open_ = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = open_.stdout.readline()
        assert line.startswith(f"serving {ENV} at http://0.0.0.0:"), line
        open_.terminate()  # the warning was printed before the line above
        stderr = open_.communicate(timeout=20)[1]
        assert (
            "warning: serving on 0.0.0.0 without --api-key: anyone who reaches this port can "
            "call it"
        ) in stderr.splitlines()
        port = keyed.stdout.readline().split(" at ")[1].split()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}"
        assert httpx.post(f"{url}/reset", json={}, timeout=10).status_code == 401
        with pytest.raises(ConnectionError, match="HTTP 403"):
            gym.make("LLMChat-OpenEnv-v0", base_url=url)
        served = gym.make("LLMChat-OpenEnv-v0", base_url=url, api_key="k3y")
        obs, _ = served.reset(seed=0)
        assert obs["history"][-1]["content"].startswith("Using the numbers")
        served.close()
    finally:
        for process in (keyed, open_):
            process.terminate()
        warned = keyed.communicate(timeout=20)[1]
        open_.communicate(timeout=20)
    assert "warning" not in warned, warned  # a key guards it: no warning


@pytest.mark.browser
def test_web_gives_each_browser_session_its_own_env_within_max_sessions():
    # Two pages in a real headless Chromium (as tests/services/test_serve_web.py drives it).
    from playwright.sync_api import sync_playwright
    from test_serve_web import CHROMIUM, FLAGS, TASK, solve

    served = Server(ENV, ARGS, port=0, web=True, max_sessions=2)
    served.start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            pages, tasks = [], []
            for _ in range(2):
                page = browser.new_context().new_page()
                page.goto(f"{served.url}/web/", timeout=60_000)
                page.get_by_role("button", name="Reset").click()
                page.get_by_text('"numbers"').first.wait_for(timeout=30_000)
                task = TASK.search(page.inner_text("body"))
                pages.append(page)
                tasks.append((int(task.group(1)), [int(n) for n in task.group(2).split(",")]))
            # The first page's step is on its own episode, not on the second page's reset.
            target, numbers = tasks[0]
            pages[0].locator("textarea").first.fill(f"<answer>{solve(numbers, target)}</answer>")
            pages[0].get_by_role("button", name="Run step").click()
            pages[0].get_by_text("reward 1.0").wait_for(timeout=30_000)
            # The two pages hold both slots: a WebSocket session is refused.
            with connect(ws_url(served), open_timeout=5) as ws:
                assert json.loads(ws.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
            pages[1].context.close()  # the tab closes: its session ends, its slot frees
            deadline, admitted = time.monotonic() + 20, False
            while not admitted and time.monotonic() < deadline:
                try:  # a full server answers CAPACITY_REACHED and closes
                    with connect(ws_url(served), open_timeout=5) as ws:
                        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
                        admitted = json.loads(ws.recv(timeout=10))["type"] == "observation"
                except ConnectionClosed:
                    pass
                time.sleep(0.2)
            assert admitted
            browser.close()
    finally:
        served.stop()
