"""``VerifiersChatEnv``: a verifiers environment played as a Gymnasium env.

verifiers (the ``verifiers`` extra) runs an episode itself: its ``rollout`` asks a model
client for each turn. Here the client is the Gymnasium caller: each model call the rollout
makes is an observation, each ``step``'s text is that call's reply, and the rollout's end is
scored by the environment's own rubric. The rollout runs on one background event loop shared
by every env of the process; ``verifiers`` is imported when an env is made.
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.vector import SyncVectorEnv

from llm_gym.chat.history import History
from llm_gym.checks import check_choice, check_number, check_str
from llm_gym.envs.forking import ForkError
from llm_gym.envs.session import EnvResponse, SessionChatEnv
from llm_gym.envs.sharded import sharded_vector_env
from llm_gym.tools.calls import TOOL_FORMATS, chat_messages, parse_tool_calls, with_tools_prompt

if TYPE_CHECKING:
    from verifiers import Environment

    from llm_gym.chat.conversation import Conversation

__all__ = ["VERIFIERS_ID", "VerifiersChatEnv", "make_verifiers_vector_env"]

VERIFIERS_ID = "LLMChat-Verifiers-v0"

# The rollout's ends that are a cut rather than the episode's own end; "max_turns_reached"
# too when the environment has more than one turn (ChatEnv's rule: one turn is the task).
_CUTS = frozenset({"timeout_reached", "prompt_too_long", "max_total_completion_tokens_reached"})


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    """The event loop every env's rollout runs on (a daemon thread of its own)."""
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="llm_gym-verifiers", daemon=True).start()
    return loop


@functools.cache
def _client_class() -> type:
    """verifiers' ``Client`` whose model is the Gymnasium caller: each call puts the prompt
    on the env's queue and waits for ``step`` to answer it."""
    import verifiers as vf
    from verifiers.types import Response, ResponseMessage, ToolCall

    class _PolicyClient(vf.Client):
        def setup_client(self, config: object) -> None:
            raise TypeError("the policy's client is made from its env, not a ClientConfig")

        async def to_native_tool(self, tool: object) -> object:
            return tool

        async def to_native_prompt(self, messages: object) -> tuple[object, dict]:
            return messages, {}

        async def get_native_response(
            self, prompt: object, model: str, sampling_args: object, tools: object = None,
            **kwargs: object,
        ) -> tuple[str, list[dict[str, object]]]:  # fmt: skip
            reply = asyncio.get_running_loop().create_future()
            self.client.put(("call", (prompt, tools or []), reply))
            return await reply

        async def raise_from_native_response(self, response: object) -> None:
            return None

        async def from_native_response(self, response: tuple[str, list]) -> Response:
            text, calls = response
            tool_calls = [ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", **c) for c in calls]
            message = ResponseMessage(
                content=text, tool_calls=tool_calls or None, is_truncated=False,
                finish_reason="tool_calls" if tool_calls else "stop",
            )  # fmt: skip
            return Response(id=uuid.uuid4().hex, created=int(time.time()), model="policy",
                            message=message)  # fmt: skip

        async def close(self) -> None:
            return None

    return _PolicyClient


def _tool_schema(tool: object) -> dict[str, Any]:
    """A verifiers ``Tool`` as the OpenAI function schema llm_gym's tool prompt lists."""
    data = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    function = {key: data[key] for key in ("name", "description", "parameters") if key in data}
    return {"type": "function", "function": function}


class VerifiersChatEnv(SessionChatEnv):
    """A verifiers environment (its dataset, its turns, its rubric) played one turn per step.

    ## Description

    Any environment of verifiers' classic API (``vf.Environment``: ``SingleTurnEnv``,
    ``MultiTurnEnv``, ``ToolEnv``, an installed environment package) as a Gymnasium chat env.
    Each episode is one verifiers ``rollout`` of one dataset row, run by verifiers itself
    (its ``setup_state``, ``env_response``, stop conditions, tools and time limit), where
    the model is the caller of ``step``: each model call of the rollout is an observation
    and each action is that call's reply. When the rollout ends, the environment's rubric
    scores it (``rubric.score_rollout``), as ``vf-eval`` would.

    ## Action Space

    As ``ChatEnv``: the reply as a ``str`` (or token ids in ``"tokens"`` mode), or a
    ``Response``. When the environment offers tools, the reply's hermes ``<tool_call>``
    blocks (``tool_format``) become the reply's OpenAI tool calls; one that cannot be read is
    left in the text.

    ## Observation Space

    As ``ChatEnv``: the conversation as ``history``, ``text`` and/or ``tokens``. The first
    observation is the row's prompt as the rollout sends it (its system prompt and few-shot
    turns included; with tools, a system block listing them in ``tool_format``); each later
    one adds the messages the environment answered (user or tool messages).

    ## Rewards

    ``0.0`` until the rollout ends; then the rubric's weighted reward (``state["reward"]``).
    The last step's ``info`` has ``reward``, ``metrics`` (each reward function's score),
    ``stop_condition``, ``answer`` and ``example_id``; ``error`` when the rollout failed.

    ## Starting State

    The row's first model call. Rows are served as ``DatasetChatEnv`` serves items: a
    seeded order (``reset(seed=s)``), ``repeats`` (GRPO groups), ``shard``;
    ``reset(options={"item": row})`` plays a given row (``prompt``, ``answer``, ``info``).

    ## Episode End

    Terminated when the rollout ends by itself (a single-turn reply, the environment's
    ``final_env_response``, its own stop condition); truncated when it was cut
    (``max_turns`` of the verifiers environment, its time limit, a prompt too long), or
    when it did not answer within ``turn_timeout_s`` (``info["error"]`` says so).

    ## Arguments

    - ``environment``: a ``vf.Environment``, or the id of an installed one (a module with
      ``load_environment``), loaded with ``vf.load_environment(environment, **env_args)``.
    - ``env_args``: the id's ``load_environment`` arguments.
    - ``split``: ``"eval"`` (its eval dataset, else its dataset, as ``vf-eval``) or
      ``"train"``.
    - ``turn_timeout_s``: how long the environment may take to answer a turn (default 60).
    - ``tool_format``: how the policy writes tool calls (``"hermes"``).
    - ``seed``, ``repeats``, ``group_repeats``, ``shard``: the rows' order, as
      ``DatasetChatEnv``'s.
    - ``**chat_options``: as ``ChatEnv`` (``input_mode``, ``tokenizer``, ...); the system
      prompt and tools are the environment's.

    ## Version History

    - v0: Initial version.

    ## Example

    verifiers' own ``ReasoningGymEnv`` (its rubric reads the ``<answer>`` tag):

    >>> import gymnasium as gym, llm_gym, verifiers as vf
    >>> legs = vf.ReasoningGymEnv(gym="leg_counting", num_train_examples=2, num_eval_examples=2)
    >>> env = gym.make("LLMChat-Verifiers-v0", environment=legs)
    >>> obs, info = env.reset(seed=0)
    >>> [m["role"] for m in obs["history"]]
    ['system', 'user']
    >>> entry = legs.rg_dataset[int(info["item_answer"])]  # its rows' answer: an index
    >>> obs, reward, terminated, truncated, info = env.step(f"<answer>{entry['answer']}</answer>")
    >>> reward, terminated, truncated, info["stop_condition"]
    (1.0, True, False, 'max_turns_reached')
    >>> env.close()
    """

    shares_conversations = False  # each env's episode is a rollout of its own

    def __init__(
        self,
        environment: Environment | str,
        *,
        env_args: Mapping[str, object] | None = None,
        split: str = "eval",
        turn_timeout_s: float = 60.0,
        tool_format: str = "hermes",
        **options: object,
    ) -> None:
        check_choice("split", split, ("eval", "train"))
        self.turn_timeout_s = check_number("turn_timeout_s", turn_timeout_s, 0, strict=True)
        self.tool_format = check_choice("tool_format", tool_format, TOOL_FORMATS)
        for option in ("system_prompt", "tools", "max_turns"):
            if options.get(option) is not None:
                raise TypeError(
                    f"VerifiersChatEnv plays the environment's own {option}, got {option}="
                    f"{options[option]!r:.80}"
                )
        self.environment = environment = _environment(environment, env_args)
        rows = environment.get_eval_dataset() if split == "eval" else environment.get_dataset()
        # "query": the row's last message text (the prompt itself is the rollout's to send)
        records = [{**r, "query": _query(r["prompt"])} for r in rows.to_list()]
        if not records:
            raise ValueError(f"the verifiers environment's {split} dataset has no rows")
        super().__init__(records, **options)
        self._calls: queue.Queue = queue.Queue()
        self._rollout: asyncio.Future | None = None  # concurrent.futures.Future in fact
        self._reply: asyncio.Future | None = None  # the model call waiting for ``step``
        self._prompt: list[dict[str, str]] = []  # that call's messages
        self._tools: bool = False

    # -- the rollout ------------------------------------------------------------------------

    async def _run(self, row: Mapping[str, Any], calls: queue.Queue) -> None:
        environment = self.environment
        try:
            state = await environment.rollout(dict(row), _client_class()(calls), "policy")
            if environment.score_rollouts:
                await environment.rubric.score_rollout(state)
            else:
                await environment.rubric.dummy_score_rollout(state)
            await environment.rubric.cleanup(state)
        except BaseException as error:  # cancellation included: the caller reads it
            calls.put(("error", error, None))
            raise
        calls.put(("done", state, None))

    def _stop(self) -> None:
        """Cancel the running rollout, if any (a new reset or ``close``)."""
        rollout, self._rollout = self._rollout, None
        if rollout is not None and not rollout.done():
            rollout.cancel()
        self._reply = None

    def _next(self) -> tuple[str, object, asyncio.Future | None]:
        """The rollout's next event: a model call, its end, or its error; or a timeout."""
        try:
            return self._calls.get(timeout=self.turn_timeout_s)
        except queue.Empty:
            self._stop()
            message = "the verifiers environment did not answer within turn_timeout_s="
            return "error", TimeoutError(f"{message}{self.turn_timeout_s:g}"), None

    def _call_prompt(self, prompt: object, tools: Sequence[object]) -> list[dict[str, str]]:
        self._tools = bool(tools)
        # The rollout's tools, listed as llm_gym's tool envs list them.
        schemas = [_tool_schema(t) for t in tools]
        return with_tools_prompt(chat_messages(prompt), schemas, self.tool_format, self.system_role)

    # -- the session's turns -----------------------------------------------------------------

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The given row (``options={"item": row}``, a row of the environment's dataset
        with its ``prompt``); checked before anything changes."""
        row = options.get("item") if isinstance(options, Mapping) else None
        if isinstance(row, Mapping) and "query" not in row:
            prompt = row.get("prompt")
            if not isinstance(prompt, (list, tuple)) or not prompt:
                raise ValueError(
                    "options['item'] must be a row of the verifiers environment's dataset, "
                    f"with its 'prompt' messages; got fields {sorted(row)}"
                )
            row = {**row, "query": _query(prompt)}
            options = {**options, "item": row}
        return super().given_item(options)

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """Start the rollout of ``item`` (a dataset row) and wait for its first model call."""
        self._stop()
        self._calls = queue.Queue()
        row = {key: value for key, value in item.items() if key != "query"}
        self._rollout = asyncio.run_coroutine_threadsafe(self._run(row, self._calls), _loop())
        kind, value, reply = self._next()
        if kind != "call":
            self._stop()
            why = value if kind == "error" else "it ended before asking the model anything"
            raise RuntimeError(f"the verifiers environment's rollout did not start: {why!r:.300}")
        self._reply = reply
        self._prompt = self._call_prompt(*value)
        info = {"example_id": row.get("example_id"), "item_answer": row.get("answer")}
        info.update(task=row.get("task"), info=row.get("info"))
        return History(self._prompt), info

    def env_response(
        self, conversation: Conversation, text: str, item: Mapping[str, Any]
    ) -> EnvResponse:
        """Answer the rollout's model call with ``text``, and wait for its next call or end."""
        if self._reply is None:
            raise gym.error.ResetNeeded("the verifiers rollout is not running: reset first")
        calls = []
        if self._tools:
            for call in parse_tool_calls(text, self.tool_format):
                if call.error is None:
                    calls.append({"name": call.name, "arguments": json.dumps(call.arguments)})
        reply, self._reply = self._reply, None
        _loop().call_soon_threadsafe(_settle, reply, (text, calls))
        kind, value, next_reply = self._next()
        if kind == "call":
            prompt = self._call_prompt(*value)
            before = len(self._prompt) + 1  # the last call's messages and this reply
            if prompt[: before - 1] != self._prompt:
                self._stop()
                error = "the environment rewrote the conversation (not a prefix)"
                return EnvResponse(prompt[before:], truncated=True, info={"error": error})
            self._reply, self._prompt = next_reply, prompt
            return EnvResponse(prompt[before:])
        if kind != "done":
            error = f"{type(value).__name__}: {value}"[:2000]
            return EnvResponse(None, truncated=True, info={"error": error})
        state = value
        stop = state.get("stop_condition")
        many = getattr(self.environment, "max_turns", -1)
        truncated = stop in _CUTS or (stop == "max_turns_reached" and many != 1)
        info = {"stop_condition": stop, "metrics": dict(state.get("metrics") or {})}
        if state.get("error") is not None:
            info["error"] = repr(state["error"])[:2000]
        final = state.get("final_env_response")
        added = chat_messages(final) if final else None
        reward = float(state.get("reward") or 0.0)
        return EnvResponse(added, reward, not truncated, truncated, info)

    def end_info(self, item: Mapping[str, Any], cut: bool) -> dict[str, Any]:
        """The episode's record names its row's answer and example."""
        return {"answer": (item or {}).get("answer"), "example_id": (item or {}).get("example_id")}

    def fork(self) -> VerifiersChatEnv:
        """Refused (``ForkError``): the episode is a verifiers rollout running in its own
        task, whose state (and its tools' sandboxes) verifiers offers no way to copy."""
        raise ForkError(
            "VerifiersChatEnv cannot fork: its episode is a verifiers rollout running in its "
            "own task, whose state verifiers offers no way to copy"
        )

    def close(self) -> None:
        """Cancel the running rollout (the verifiers environment stays as it is)."""
        self._stop()
        super().close()


def _environment(
    environment: Environment | str, env_args: Mapping[str, object] | None
) -> Environment:
    """``environment``, loaded with ``vf.load_environment`` when it is an id; checked."""
    import verifiers as vf

    if env_args is not None and not isinstance(env_args, Mapping):
        raise TypeError(f"env_args must be a dict or None, got {type(env_args).__name__}")
    if isinstance(environment, str):
        check_str("environment", environment)
        environment = vf.load_environment(environment, **dict(env_args or {}))
    elif env_args:
        raise TypeError("env_args are for an environment id; this environment is made")
    if not isinstance(environment, vf.Environment):
        raise TypeError(
            "environment must be a verifiers Environment or an installed environment's id, "
            f"got {type(environment).__name__}: {environment!r:.80}"
        )
    return environment


def make_verifiers_vector_env(
    num_envs: int = 1,
    *,
    environment: Environment | str,
    env_args: Mapping[str, object] | None = None,
    **kwargs: object,
) -> SyncVectorEnv:
    """The ``vector_entry_point`` of ``LLMChat-Verifiers-v0``: ``num_envs`` rollouts side by
    side, one ``VerifiersChatEnv`` each on one shard of the rows (``repeats=G`` with
    ``group_repeats=True``: each row in ``G`` neighbouring sub-envs), the environment loaded
    once and shared, finished ones reset in the same step as ``DatasetChatVectorEnv``'s.
    ``gym.make_vec("LLMChat-Verifiers-v0", num_envs=4, environment=...)`` calls it."""
    shared = _environment(environment, env_args)
    return sharded_vector_env(VERIFIERS_ID, num_envs, environment=shared, **kwargs)


def _query(prompt: Sequence[object]) -> str:
    return chat_messages(prompt[-1:])[0]["content"]


def _settle(future: asyncio.Future, value: object) -> None:
    if not future.done():  # a cancelled rollout's call is left as it is
        future.set_result(value)
