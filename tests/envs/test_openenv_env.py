"""LLMChat-OpenEnv-v0 (issue 39, item 2): any OpenEnv server as a chat env, for real on
127.0.0.1 against the echo env that OpenEnv's own CLI scaffolds (``openenv init``), served with
uvicorn: the server's messages as user turns, its rewards and ends, vector envs of sessions,
and what an unreachable, full or dying server and a refused action do."""

import importlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import SessionChatEnv, VectorHooks

# OpenEnv servers started as commands.
pytestmark = pytest.mark.slow

pytest.importorskip("openenv")

BIN = Path(sys.executable).parent
READY = "My Echo environment ready!"  # the echo env's first observation
ECHO = {"action_field": "message", "observation_field": "echoed_message"}


def echo_reward(text):
    return min(len(text) * 0.1, 1.0)  # the scaffolded echo env's reward


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server process on a free port: ``command`` and then ``--port PORT``; by default
    ``uvicorn server.<module>:app`` of the echo env's folder."""

    def __init__(self, folder, module, log, command=None):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(log, "wb")  # noqa: SIM115  (closed in stop)
        if command is None:
            command = [sys.executable, "-m", "uvicorn", f"server.{module}:app", "--host"]
            command += ["127.0.0.1", "--log-level", "warning"]
        command = [*command, "--port", self.url.rsplit(":", 1)[1]]
        self.process = subprocess.Popen(command, cwd=folder, stdout=self.log, stderr=self.log)

    def wait(self, timeout=180.0):  # three start at once on a 2-core machine
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the server exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"the server did not answer /health in {timeout} s")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The echo env as ``openenv init`` writes it, served twice: 4 sessions (its app.py,
    patched from the scaffold's 1) and 1 session (the scaffold's own, as app_one.py)."""
    # openenv's client imports in seconds (its server side, gradio included): meanwhile.
    importing = threading.Thread(target=importlib.import_module, args=("openenv.core",))
    importing.start()
    root = tmp_path_factory.mktemp("openenv")
    subprocess.run(
        [str(BIN / "openenv"), "init", "my_echo", "--output-dir", str(root)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    folder = root / "my_echo"
    app = folder / "server" / "app.py"
    text = app.read_text()
    (folder / "server" / "app_one.py").write_text(text)
    assert "max_concurrent_envs=1" in text
    app.write_text(text.replace("max_concurrent_envs=1", "max_concurrent_envs=4"))
    started = [Server(folder, "app", root / "app.log"), Server(folder, "app_one", root / "one.log")]
    try:
        ready = [server.wait() for server in started]
        importing.join()
        yield ready
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="module")
def url(servers):
    return servers[0].url


def test_importing_the_envs_does_not_import_openenv():
    code = "import sys, llm_gym, llm_gym.envs; print('openenv' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_echo_env_plays_as_a_chat(url):
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url, max_turns=2, **ECHO)
    obs, info = env.reset(seed=0)
    assert obs == {"history": ({"role": "user", "content": READY},)}
    assert info["task"] == url and info["metadata"] == {}
    assert info["observation"] == {"echoed_message": READY, "message_length": 0}
    obs, reward, terminated, truncated, info = env.step("hello")
    assert (reward, terminated, truncated) == (echo_reward("hello"), False, False)
    assert reward == 0.5
    assert obs["history"][1:] == (
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "hello"},
    )
    assert info["metadata"] == {"original_message": "hello", "step": 1}
    assert info["observation"] == {"echoed_message": "hello", "message_length": 5}
    assert info["invalid_move"] is False
    obs, reward, terminated, truncated, info = env.step("a longer one")
    assert (reward, terminated, truncated) == (1.0, False, True)  # cut at max_turns
    assert obs["history"][-1] == {"role": "assistant", "content": "a longer one"}
    assert info["reward"] == 1.5 and info["metadata"]["step"] == 2  # the episode's total
    with pytest.raises(gym.error.ResetNeeded):
        env.step("more")
    # The stream of episode seeds: a seed replays it, an item names one.
    first = [env.reset(seed=3)[1]["episode_seed"], env.reset()[1]["episode_seed"]]
    again = [env.reset(seed=3)[1]["episode_seed"], env.reset()[1]["episode_seed"]]
    assert again == first and first[0] != first[1]
    assert env.reset(options={"item": {"episode_seed": 7}})[1]["episode_seed"] == 7
    with pytest.raises(ValueError, match="episode_seed >= 0"):
        env.reset(options={"item": {"episode_seed": -1}})
    assert env.step("hi")[1] == 0.2  # the server's session starts afresh on each reset
    env.close()


def test_without_observation_field_the_user_turn_is_the_observation_as_json(url):
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url, action_field="message")
    obs, _ = env.reset(seed=0)
    assert json.loads(obs["history"][-1]["content"]) == {
        "echoed_message": READY,
        "message_length": 0,
    }
    obs = env.step("abc")[0]
    assert json.loads(obs["history"][-1]["content"]) == {
        "echoed_message": "abc",
        "message_length": 3,
    }
    env.close()
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url, observation_field="nope")
    with pytest.raises(ValueError, match=r"observation_field='nope' is not in .*'echoed_message'"):
        env.reset(seed=0)
    env.close()


@pytest.mark.parametrize("mode", ["history", "tokens"])
def test_check_env(url, mode, gpt2_tokenizer):
    tokenizer = gpt2_tokenizer if mode == "tokens" else None
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url, max_turns=3, input_mode=mode,
                   tokenizer=tokenizer, max_text_length=2000, **ECHO)  # fmt: skip
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    if mode == "tokens":  # the greeting's tokens; the policy's ids go to the server as text
        assert gpt2_tokenizer.decode(obs["tokens"]).count(READY) == 1
        action = np.asarray(gpt2_tokenizer.encode(" hi there"), dtype=np.int64)
        obs, reward, *_ = env.step(action)
        assert reward == echo_reward(" hi there")
        assert gpt2_tokenizer.decode(obs["tokens"]).count(" hi there") == 2  # said, echoed
    env.close()


def test_the_vector_env_steps_a_session_per_sub_env(url):
    envs = gym.make_vec("LLMChat-OpenEnv-v0", num_envs=2, base_url=url, max_turns=2, **ECHO)
    assert isinstance(envs.unwrapped, gym.vector.SyncVectorEnv)
    # Its sub-envs are SessionChatEnvs and have all a native vector env reads.
    assert all(isinstance(env.unwrapped, SessionChatEnv) for env in envs.envs)
    assert all(isinstance(env.unwrapped, VectorHooks) for env in envs.envs)
    obs, info = envs.reset(seed=0)
    assert [h[-1]["content"] for h in obs["history"]] == [READY, READY]
    assert info["episode_seed"][0] != info["episode_seed"][1]  # shards of one stream
    obs, rewards, terminated, truncated, info = envs.step(["hi", "hello"])
    assert rewards.tolist() == [0.2, 0.5] and not terminated.any() and not truncated.any()
    assert [h[-1]["content"] for h in obs["history"]] == ["hi", "hello"]
    assert info["metadata"]["step"].tolist() == [1, 1]  # a server session each
    obs, rewards, terminated, truncated, info = envs.step(["x", "a long answer"])
    assert rewards.tolist() == [0.1, 1.0] and truncated.all() and not terminated.any()
    # Reset in the same step: the next episodes' first turns, the last ones in final_obs.
    assert [h[-1]["content"] for h in obs["history"]] == [READY, READY]
    assert [o["history"][-1]["content"] for o in info["final_obs"]] == ["x", "a long answer"]
    envs.close()


def test_an_unreachable_server_is_one_line_naming_the_url_in_seconds():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        gym.make("LLMChat-OpenEnv-v0", base_url=url)
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith(f"OpenEnv server at {url} did not answer") and "\n" not in message
    with pytest.raises(ConnectionError, match=url):
        gym.make_vec("LLMChat-OpenEnv-v0", num_envs=2, base_url=url)
    with pytest.raises(ValueError, match="base_url must be the server's http"):
        gym.make("LLMChat-OpenEnv-v0", base_url="127.0.0.1:8000")


def test_a_full_server_is_retried_then_one_line_and_a_dying_one_too(servers):
    server = servers[1]  # one session at most
    holder = gym.make("LLMChat-OpenEnv-v0", base_url=server.url, **ECHO)
    holder.reset(seed=0)
    other = gym.make("LLMChat-OpenEnv-v0", base_url=server.url, capacity_wait_s=1.0, **ECHO)
    start = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        other.reset(seed=0)
    assert 1.0 <= time.monotonic() - start < 5  # retried for capacity_wait_s, then gave up
    message = str(caught.value)
    assert message.startswith(f"OpenEnv server at {server.url} is full") and "\n" not in message
    assert "CAPACITY_REACHED" in message and "1/1 sessions" in message
    # A session freed while the other waits: the retry gets it.
    holder.close()
    assert other.reset(seed=0)[0]["history"][-1]["content"] == READY
    # The server dies mid-episode: the next step is one line naming the URL, at once, and
    # the env takes no step until a reset (which fails the same way while it is down).
    server.stop()
    start = time.monotonic()
    with pytest.raises(ConnectionError) as caught:
        other.step("hello")
    assert time.monotonic() - start < 5
    message = str(caught.value)
    assert message.startswith(f"OpenEnv server at {server.url} did not answer during step")
    assert "\n" not in message
    with pytest.raises(ConnectionError, match="reset to open a new session"):
        other.step("hello")
    with pytest.raises(ConnectionError, match=server.url):
        other.reset()
    other.close()


def test_an_action_the_server_refuses_is_an_invalid_move(url):
    # The echo env's action has a "message" field and forbids others, so "text" is refused.
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url, action_field="text", max_turns=4)
    for _ in range(2):  # the env goes on after a reset, on the same session
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("hello")
        assert (reward, terminated, truncated) == (0.0, True, False)
        assert info["invalid_move"] is True and info["error_code"] == "VALIDATION_ERROR"
        assert "message: Field required" in info["error"]
        assert "text: Extra inputs are not permitted" in info["error"]
        assert obs["history"][-1] == {"role": "assistant", "content": "hello"}
    env.unwrapped.action_field = "message"  # the session still plays
    env.reset(seed=0)
    assert env.step("hello")[1:3] == (0.5, False)
    env.close()


# llm-gym serve's envs, each in a process of its own: a task with a system prompt; one whose
# step adds several messages (two tool outputs); a multi-turn chat whose step adds none, its
# system prompt given on the command line.
SERVED = {
    "countdown": ("LLMChat-Countdown-v0", {"level": 0}),
    "products": (
        "LLMChat-Products-v0",
        {"level": 0, "tools": ["python"], "tool_format": "markdown", "max_turns": 3},
    ),
    "chat": ("LLMChat-v0", {"query": "Say hi.", "system_prompt": "Be brief.", "max_turns": 2}),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``llm-gym serve ENV_ID --env-arg ...`` of each of ``SERVED``, by name."""
    root = tmp_path_factory.mktemp("serve")
    started = {}
    try:
        for name, (env_id, args) in SERVED.items():
            command = [sys.executable, "-m", "llm_gym", "serve", env_id]
            for key, value in args.items():
                command += ["--env-arg", f"{key}={json.dumps(value)}"]
            started[name] = Server(None, None, root / f"{name}.log", command=command)
        yield {name: server.wait() for name, server in started.items()}
    finally:
        for server in started.values():
            server.stop()


def served_twin(name, seed, **kwargs):
    """The in-process env that ``served[name]`` serves, reset with ``seed``."""
    env_id, args = SERVED[name]
    env = gym.make(env_id, **args, **kwargs)
    return env, env.reset(seed=seed)


def test_a_served_task_starts_with_its_system_prompt_as_in_process(served):
    url = served["countdown"].url
    env = gym.make("LLMChat-OpenEnv-v0", base_url=url)
    obs, info = env.reset(seed=0)
    twin, (twin_obs, _) = served_twin("countdown", info["episode_seed"])
    assert obs["history"] == twin_obs["history"] and len(obs["history"]) == 2
    assert obs["history"][0]["role"] == "system"  # the task's, as the server has it
    obs, reward, terminated, truncated, info = env.step("<answer>1 + 2</answer>")
    expected = twin.step("<answer>1 + 2</answer>")
    assert obs["history"] == expected[0]["history"]
    assert (reward, terminated, truncated) == tuple(expected[1:4])
    # A given episode seed: the server's reset(seed=5), the in-process one's.
    obs, _ = env.reset(options={"item": {"episode_seed": 5}})
    _, (twin_obs, _) = served_twin("countdown", 5)
    assert obs["history"] == twin_obs["history"]
    env.close()
    # The client's own system prompt wins over the server's.
    mine = gym.make("LLMChat-OpenEnv-v0", base_url=url, system_prompt="Mine.")
    obs, _ = mine.reset(options={"item": {"episode_seed": 5}})
    assert obs["history"] == ({"role": "system", "content": "Mine."}, *twin_obs["history"][1:])
    mine.close()


def test_a_step_takes_every_message_the_server_added(served):
    env = gym.make("LLMChat-OpenEnv-v0", base_url=served["products"].url)
    obs, info = env.reset(seed=0)
    twin, (twin_obs, _) = served_twin("products", info["episode_seed"])
    assert obs["history"] == twin_obs["history"]  # its system prompt has the tool block
    two_calls = "```python\nprint(1)\n```\nand\n```python\nprint(2)\n```"
    obs, reward, terminated, truncated, _ = env.step(two_calls)
    expected = twin.step(two_calls)
    assert obs["history"] == expected[0]["history"]
    assert [m["role"] for m in obs["history"][2:]] == ["assistant", "tool", "tool"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    answer = f"It is {twin.unwrapped.item['answer']}"
    obs, reward, terminated, truncated, _ = env.step(answer)
    expected = twin.step(answer)
    assert obs["history"] == expected[0]["history"]
    assert (reward, terminated, truncated) == tuple(expected[1:4]) == (1.0, True, False)
    env.close()


@pytest.mark.parametrize("mode", ["history", "tokens"])
def test_a_served_multi_turn_chat_is_the_in_process_one(served, mode, gpt2_tokenizer):
    # The served env's --env-arg system_prompt comes first; a step the server adds nothing
    # to adds nothing here (the next turn is the assistant's again), and tokens are equal.
    options = {"input_mode": mode, "tokenizer": gpt2_tokenizer} if mode == "tokens" else {}
    env = gym.make("LLMChat-OpenEnv-v0", base_url=served["chat"].url, **options)
    obs, info = env.reset(seed=0)
    twin, (twin_obs, _) = served_twin("chat", info["episode_seed"], **options)
    assert env.unwrapped.history.to_chats() == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
    )
    assert obs.keys() == twin_obs.keys()
    for key in obs:
        np.testing.assert_array_equal(np.asarray(obs[key]), np.asarray(twin_obs[key]))
    for turn, answer in enumerate(["Hi.", "Hi again."], start=1):
        obs, reward, terminated, truncated, _ = env.step(answer)
        expected = twin.step(answer)
        assert env.unwrapped.history.to_chats() == twin.unwrapped.history.to_chats()
        for key in obs:
            np.testing.assert_array_equal(np.asarray(obs[key]), np.asarray(expected[0][key]))
        assert (terminated, truncated) == tuple(expected[2:4]) == (False, turn == 2)
    env.close()
