"""``AgentEpisodes``: an agent program as a source of episodes. Each run plays one task item
against a ``Gateway``: the agent calls the model through the OpenAI API with its own episode
key, returns a final answer, the task's reward scores it, and the gateway's record of the
run's calls becomes the episode's training sequences (``segments``).

An agent is a Python callable ``agent(base_url, api_key, item) -> str`` (a coroutine function
too) or a command (a list of arguments) run with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``LLM_GYM_ITEM`` (the item as JSON) in its environment, whose standard output is its answer.
An agent that raises, exits non-zero, runs past ``timeout`` or never calls the model is a
recorded failure (reward 0, its ``error``), and the other runs go on.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from llm_gym.agents.gateway import Gateway
from llm_gym.agents.recording import segments
from llm_gym.checks import check_int, check_number
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.episodes import Episode
from llm_gym.rubrics import TaskScore
from llm_gym.samplers.base import Sampler
from llm_gym.seeding import derive_seed
from llm_gym.tasks.task import Task

__all__ = ["Agent", "AgentEpisodes", "load_agent"]

# agent(base_url, api_key, item) -> the final answer
Agent = Callable[[str, str, dict[str, Any]], str]
_ERROR_CHARS = 2000  # of an agent's error or stderr kept in its episode


def load_agent(spec: str) -> Agent:
    """The agent ``spec`` names: ``module:function`` (imported with the working directory
    on the path, as uvicorn imports apps) or ``path/to/file.py:function``.

    >>> load_agent("json:dumps").__name__
    'dumps'
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"agent must be 'module:function' or 'file.py:function', got {spec!r}")
    where, name = spec.split(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"agent {spec!r}: no file {where}")
        module_name = f"llm_gym_agent_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise ValueError(f"agent {spec!r}: cannot import {where}: {error}") from None
    agent = getattr(module, name, None)
    if not callable(agent):
        raise ValueError(f"agent {spec!r}: {where} has no function {name!r}")
    return agent


class AgentEpisodes:
    """Runs of an agent program over a task's items, through a gateway it owns.

    Args:
        agent: ``agent(base_url, api_key, item) -> answer`` or a command (list of str).
        task: the items and the reward: a ``Task`` or a task env (``DatasetChatEnv``, e.g.
            ``gym.make("LLMChat-Products-v0").unwrapped``).
        sampler: the policy the agent's calls sample from (any ``Sampler``).
        tokenizer: the model's tokenizer.
        group_size: runs of each item (a GRPO group: consecutive episodes).
        num_agents: runs at once.
        timeout: seconds a run may take; past it the run is a failure (a command is killed; a
            callable's thread is left, its later calls refused).
        seed: the items' order: batch ``k`` of ``episodes`` draws from ``(seed, k)``.
        first: the first batch's ``k`` (a resumed run's).
        gateway: a ``Gateway`` over ``sampler`` to use (default: one made and served here on
            loopback, closed by ``close``); ``model_name``: the name the agent asks for.

    The item an agent gets is the task's (its fields after ``field_map``, ``query``
    included) plus ``messages``: the task's prompt as chat messages (its system prompt, which
    says the answer format the reward reads, and the query).

    Attributes:
        seconds: the wall-clock seconds of the last ``episodes`` call.
    """

    def __init__(
        self,
        agent: Agent | Sequence[str],
        task: Task | DatasetChatEnv,
        sampler: Sampler,
        tokenizer: Any,
        *,
        group_size: int = 1,
        num_agents: int = 8,
        timeout: float = 120.0,
        seed: int = 0,
        gateway: Gateway | None = None,
        model_name: str = "policy",
        first: int = 0,
    ) -> None:
        is_command = isinstance(agent, (list, tuple)) and agent and all(
            isinstance(a, str) for a in agent
        )  # fmt: skip
        if not is_command and not callable(agent):
            raise TypeError(
                "agent must be a callable agent(base_url, api_key, item) -> str or a command "
                f"(a list of str), got {type(agent).__name__}"
            )
        self.agent = list(agent) if is_command else agent
        if isinstance(task, Task):
            task = DatasetChatEnv.from_task(task)
        if not isinstance(task, DatasetChatEnv):
            raise TypeError(
                "task must be a Task or a task env (DatasetChatEnv, e.g. gym.make(id).unwrapped)"
                f", got {type(task).__name__}"
            )
        self.env = task
        self.group_size = check_int("group_size", group_size, 1)
        self.num_agents = check_int("num_agents", num_agents, 1)
        self.timeout = check_number("timeout", timeout, 0, strict=True)
        self.seed = check_int("seed", seed, 0)
        self._own_gateway = gateway is None
        self.gateway = gateway or Gateway(sampler, tokenizer, model_name=model_name)
        if self.gateway.url is None:
            self.gateway.serve()
        self.batches, self.seconds = check_int("first", first, 0), 0.0

    def __repr__(self) -> str:
        return f"AgentEpisodes({self.agent!r}, group_size={self.group_size}, {self.gateway!r})"

    def close(self) -> None:
        """Stop the gateway if this object made it."""
        if self._own_gateway:
            self.gateway.close()

    def __enter__(self) -> AgentEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def items(self, count: int, seed: int) -> list[dict[str, Any]]:
        """``count`` items from the task's order at ``seed``, each with its ``messages``."""
        obs, _ = self.env.reset(seed=seed)
        items = []
        for i in range(count):
            if i:
                obs, _ = self.env.reset()
            item = self.env.item
            item["messages"] = [dict(m) for m in obs["history"]]
            items.append(item)
        return items

    def episodes(self, count: int, seed: int | None = None) -> list[Episode]:
        """The episodes of ``count`` runs (``count / group_size`` items, each ``group_size``
        times, consecutive), in order; ``seed``: the items' (default: this batch's)."""
        count = check_int("count", count, 1)
        if count % self.group_size:
            raise ValueError(
                f"count must be a multiple of group_size={self.group_size}, got {count}"
            )
        if seed is None:
            seed = derive_seed(self.seed, self.batches)
            self.batches += 1
        items = self.items(count // self.group_size, seed)
        runs = [item for item in items for _ in range(self.group_size)]
        started = time.perf_counter()
        with ThreadPoolExecutor(self.num_agents, thread_name_prefix="llm_gym-agent") as pool:
            played = list(pool.map(self._run, range(len(runs)), runs))
        self.seconds = time.perf_counter() - started
        return played

    def _run(self, index: int, item: dict[str, Any]) -> Episode:
        key = self.gateway.issue_key()  # the run's own: it owns the episode of that name
        started = time.perf_counter()
        answer, error = self._play(key, item)
        seconds = time.perf_counter() - started
        calls = self.gateway.recorder.pop(key)
        self.gateway.recorder.close(key)  # a run past its time may still call: refused
        self.gateway.revoke_key(key)
        if error is None and not calls:
            error = "the agent made no model call"
        reward, info = 0.0, {"success": False}
        if error is None:
            reward, info = self._score(answer, item)
        return Episode(
            prompt=item["messages"],
            responses=[c.text for c in calls],
            reward=reward,
            reward_task=reward,
            info=info,
            segments=segments(calls),
            versions=[c.version for c in calls],
            num_tokens=sum(len(c.tokens) for c in calls),
            response=answer if error is None else "",
            env_index=index % self.num_agents,
            item_index=index,
            item={k: v for k, v in item.items() if k != "messages"},
            error=error,
            calls=calls,
            seconds=seconds,
        )

    def _play(self, key: str, item: dict[str, Any]) -> tuple[str, str | None]:
        """The agent's answer and None, or "" and why the run failed."""
        url = f"{self.gateway.url}/v1"
        if isinstance(self.agent, list):
            env = {**os.environ, "OPENAI_BASE_URL": url, "OPENAI_API_KEY": key}
            env["LLM_GYM_ITEM"] = json.dumps(item, default=str)
            try:
                done = subprocess.run(
                    self.agent, env=env, capture_output=True, text=True, timeout=self.timeout
                )
            except subprocess.TimeoutExpired:
                return "", f"the agent ran past its time limit ({self.timeout:g} s)"
            except OSError as error:
                return "", f"the agent's command could not start: {error}"
            if done.returncode:
                tail = done.stderr[-_ERROR_CHARS:]
                return "", f"the agent exited with status {done.returncode}: {tail}"
            return done.stdout.strip(), None
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                answer = self.agent(url, key, dict(item))
                if inspect.isawaitable(answer):
                    answer = asyncio.run(_awaited(answer))
                result["answer"] = answer
            except BaseException as error:  # the agent's own failure, recorded
                result["error"] = f"{type(error).__name__}: {error}"[:_ERROR_CHARS]

        thread = threading.Thread(target=run, name=f"llm_gym-agent-{key[-8:]}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            return "", f"the agent ran past its time limit ({self.timeout:g} s)"
        if "error" in result:
            return "", result["error"]
        answer = result.get("answer")
        if not isinstance(answer, str):
            return (
                "",
                f"the agent must return its final answer as a str, got {type(answer).__name__}",
            )
        return answer, None

    def _score(self, answer: str, item: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
        reward = self.env.reward
        if reward is None:
            return 0.0, {"success": False}
        fields = {k: v for k, v in item.items() if k != "messages"}
        score = TaskScore(*reward(answer, fields))
        return float(score.reward), dict(score.info)


async def _awaited(value: Any) -> Any:
    return await value
