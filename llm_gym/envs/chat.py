"""``ChatEnv``: a conversation with a language-model policy as a Gymnasium environment.

The episode is a ``llm_gym.chat.Conversation`` (immutable); the env keeps the current one and
replaces it each step. A step is three parts, ``_read`` (check the action, parse tool calls),
``_run_tools`` and ``_advance`` (score and extend the conversation, storing nothing), which
``DatasetChatVectorEnv`` calls itself for N conversations at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.chat.conversation import Conversation, PromptBuilder, TokenPrefixError
from llm_gym.chat.history import History
from llm_gym.envs.actions import check_action, turn_content
from llm_gym.envs.chat_arguments import (
    MASK_KEY,
    check_chat_settings,
    observation_keys_for,
    offer_tools,
)
from llm_gym.spaces import MAX_TEXT_LENGTH, UnicodeText, history_space, token_space

__all__ = ["ChatEnv", "MASK_KEY"]


class ActionRead(NamedTuple):
    """A checked action: its ``Response``, the turn's text less the end-of-turn token, and
    its tool calls (none: the turn is an answer)."""

    response: Response
    content: str
    calls: list[Any]


class Outcome(NamedTuple):
    """A step computed but not stored: the next conversation and what ``step`` returns."""

    conversation: Conversation
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class ChatEnv(gym.Env):
    """A chat between a user query and the policy, one assistant turn per step.

    ## Description

    The Gymnasium form of TorchRL's ``ChatEnv``. Each episode starts from a user query
    (optionally after a system prompt); each action is the assistant's reply, which is appended
    to the conversation, and the conversation so far becomes the next prompt. ``ChatEnv`` gives
    no reward itself: ``DatasetChatEnv`` scores with a task's reward, or wrappers add one.

    ## Action Space

    The assistant's turn: a ``str`` in ``"history"``/``"text"`` modes
    (``UnicodeText(max_text_length)``) or a 1-D ``int64`` array of token ids in ``"tokens"``
    mode (``Sequence(Discrete(vocab), stack=True)``). A ``Response`` carrying ``text``,
    ``tokens`` and ``log_probs`` (what the policy adapters return) or a dict with a ``"text"``
    key is accepted in every mode. Token ids are appended to the prompt exactly as given,
    never decoded and re-tokenized.

    ## Observation Space

    A ``Dict`` keyed by ``observation_keys`` (default: just ``input_mode``):

    | key         | value                                                           |
    |-------------|-----------------------------------------------------------------|
    | ``history`` | tuple of ``{"role", "content"}`` dicts, the conversation so far |
    | ``text``    | the prompt rendered with the chat template and generation prompt |
    | ``tokens``  | ``int64`` token ids of that prompt                              |
    | ``policy_mask`` | ``int64`` 0/1 per token of ``tokens``: 1 where the policy sampled it |

    ## Rewards

    Always ``0.0`` (``DatasetChatEnv`` takes a task's reward). A turn that calls tools gets
    ``0.0`` in every env: it is not an answer.

    ## Tools

    With ``tools=``, a turn that holds tool calls (``tool_format``) is not scored: the env runs
    the calls in order, appends the turn verbatim and one ``tool`` message per call (its
    output, or an error the model can read: bad JSON, an unknown tool, wrong arguments, a tool
    that raised; never an exception out of ``step``), and the episode goes on. The turn
    without a call is the final answer. ``info["tool_calls"]`` lists the step's calls (name,
    arguments, ok, output truncated to ``llm_gym.tools.MAX_OUTPUT_CHARS``, seconds);
    ``info["num_tool_calls"]``/``["failed_tool_calls"]`` count the episode's. The tools reach
    the model through the chat template's ``tools=`` where it renders them and the env renders
    the prompt, else as a block appended to the system prompt.

    In ``"tokens"`` mode every prompt is the previous prompt's tokens, then the tokens the
    policy sampled (never re-tokenized), then what the env added; this is checked each step
    (``TokenPrefixError`` names the turn and position), and the observation's ``policy_mask``
    (1 on the tokens the policy sampled; added to ``observation_keys`` with tools in tokens
    mode, or ask for it) lets a trainer take its loss on those, never on tool output.

    ## Starting State

    ``[system_prompt?, user query]``. The query comes from ``reset(options={"query": ...})``,
    otherwise from the ``query=`` argument; ``options={"history": [...]}`` starts from a given
    conversation instead.

    ## Episode End

    With ``max_turns=None`` (default) the episode never ends by itself. With ``max_turns=1``
    the single turn ends it with ``terminated=True`` (the conversation is over); with
    ``max_turns > 1`` reaching the limit returns ``truncated=True``. With tools the final
    answer terminates the episode; a step whose calls go past ``max_tool_calls`` (those calls
    are not run) or reach ``max_turns > 1`` truncates it.

    ## Arguments

    - ``input_mode``: ``"history"`` (default), ``"text"`` or ``"tokens"``.
    - ``query``: default user query for ``reset``.
    - ``system_prompt``: optional first message, with role ``system_role``.
    - ``system_role`` / ``user_role`` / ``policy_role``: role names (``"system"``, ``"user"``,
      ``"assistant"``).
    - ``tokenizer``: a transformers tokenizer; required for ``"text"`` and ``"tokens"``.
    - ``template_kwargs``: passed to ``History.apply_chat_template`` (e.g.
      ``chat_template_name="qwen"``, ``chat_template=...``).
    - ``max_turns``: assistant turns per episode, or ``None`` for no limit.
    - ``observation_keys``: which of history/text/tokens to expose (text/tokens need a tokenizer).
    - ``max_text_length``: length limit of the text spaces.
    - ``assistant_prefix``: text that starts every assistant turn (e.g. ``"<think>"``): the
      text and tokens prompts end with it, so the policy's tokens continue it; the turn in
      the history and the text scored are the prefix plus the response. Text and tokens
      modes only (a history observation cannot hold a started turn).
    - ``tools``: a list of ``"python"`` (the sandboxed ``llm_gym.tools.PythonInterpreter``),
      plain functions with type hints and a docstring, ``llm_gym.tools.Tool`` or
      ``llm_gym.tools.MCPTools(command=[...])`` (shut down by ``close()``).
    - ``tool_format``: ``"hermes"`` (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
      default) or ``"markdown"`` (```` ```python ```` blocks run by the ``python`` tool).
    - ``max_tool_calls``: tool calls per episode (default 4).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-v0", query="What is 2+2?", system_prompt="Be brief.")
    >>> obs, info = env.reset(seed=0)
    >>> [m["role"] for m in obs["history"]]
    ['system', 'user']
    >>> obs, reward, terminated, truncated, info = env.step("4")
    >>> obs["history"][-1], reward, terminated, truncated
    ({'role': 'assistant', 'content': '4'}, 0.0, False, False)
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    def __init__(
        self,
        input_mode: str = "history",
        *,
        query: str | None = None,
        system_prompt: str | None = None,
        system_role: str = "system",
        user_role: str = "user",
        policy_role: str = "assistant",
        tokenizer: Any = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        observation_keys: tuple[str, ...] | list[str] | None = None,
        max_text_length: int = MAX_TEXT_LENGTH,
        assistant_prefix: str = "",
        tools: Sequence[Any] | None = None,
        tool_format: str = "hermes",
        max_tool_calls: int = 4,
        render_mode: str | None = None,
    ) -> None:
        keys = observation_keys_for(input_mode, observation_keys, tools, tokenizer)
        check_chat_settings(
            input_mode=input_mode,
            max_turns=max_turns,
            assistant_prefix=assistant_prefix,
            query=query,
            max_text_length=max_text_length,
            max_tool_calls=max_tool_calls,
            render_mode=render_mode,
            render_modes=self.metadata["render_modes"],
        )
        self.input_mode = input_mode
        self.observation_keys = keys
        self.query = query
        self.system_prompt = system_prompt
        self.system_role, self.user_role, self.policy_role = system_role, user_role, policy_role
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.max_turns = max_turns
        self.max_text_length = max_text_length
        self.assistant_prefix = assistant_prefix
        self.render_mode = render_mode
        self.max_tool_calls = max_tool_calls
        self.toolbox = None
        if tools:
            from llm_gym.tools import Toolbox  # here: envs without tools never import it

            self.toolbox = Toolbox(tools, tool_format)
            rendered_here = tokenizer is not None and input_mode != "history"
            self.system_prompt = offer_tools(
                self.toolbox, self.system_prompt, self.template_kwargs, tokenizer, rendered_here
            )

        key_spaces: dict[str, spaces.Space] = {
            "history": history_space(max_text_length),
            "text": UnicodeText(max_text_length),
        }
        if tokenizer is not None:
            key_spaces["tokens"] = token_space(len(tokenizer))
            key_spaces[MASK_KEY] = token_space(2)
        self.observation_space = spaces.Dict({key: key_spaces[key] for key in keys})
        self.action_space = (
            key_spaces["tokens"] if input_mode == "tokens" else UnicodeText(max_text_length)
        )

        system = None
        if self.system_prompt is not None:  # tools may have added one
            system = {"role": system_role, "content": self.system_prompt}
        self.builder = PromptBuilder(
            tokenizer if keys != ("history",) else None,
            self.template_kwargs,
            need_tokens="tokens" in keys,
            assistant_prefix=assistant_prefix,
            policy_role=policy_role,
            system_prompt=system,
        )
        # One codec for reading actions and building prompts: its caches serve both.
        self.codec = self.builder.codec
        if self.codec is None and tokenizer is not None:
            self.codec = TokenCodec(tokenizer)
        self._conversation: Conversation | None = None

    # -- Gymnasium API -----------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        history, info = self._initial_history(options or {})
        (self._conversation,) = self.builder.start([history])
        return self._observation(self._conversation), info

    def step(
        self, action: str | np.ndarray | Response | Mapping[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        # Computed and checked before anything is stored: a step that raises changes nothing.
        read = self._read(self._conversation, action)
        records = self._run_tools(self._conversation, read.calls)
        outcome = self._advance(self._conversation, read, records)
        self._conversation = outcome.conversation
        if self.render_mode == "human":
            self.render()
        return self._observation(outcome.conversation), *outcome[1:]

    def render(self) -> str | None:
        """``"ansi"``: the conversation as text; ``"human"``: print it."""
        if self._conversation is None or self.render_mode is None:
            return None
        text = "\n".join(f"[{m['role']}] {m['content']}" for m in self._conversation.history)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        """Shut down the tools' servers (MCP)."""
        if self.toolbox is not None:
            self.toolbox.close()
        super().close()

    @property
    def conversation(self) -> Conversation | None:
        """The episode so far (None before the first reset)."""
        return self._conversation

    @property
    def history(self) -> History | None:
        """A copy of the conversation's messages (None before the first reset)."""
        return None if self._conversation is None else self._conversation.history.copy()

    # -- the parts of a step, shared with the vector env ------------------------------------

    def _read(self, conversation: Conversation | None, action: Any) -> ActionRead:
        if conversation is None or conversation.done:
            raise gym.error.ResetNeeded(
                "Cannot call ChatEnv.step before reset"
                if conversation is None
                else "ChatEnv.step needs a reset: the episode has ended (terminated or truncated)"
            )
        response = check_action(action, self.codec, self.input_mode, self.max_text_length)
        content = turn_content(response, self.codec)
        calls = self.toolbox.parse(content) if self.toolbox is not None else []
        return ActionRead(response, content, calls)

    def _run_tools(self, conversation: Conversation, calls: Sequence[Any]) -> list[Any]:
        # In order, as many as this episode's max_tool_calls still allows; never raises.
        remaining = max(self.max_tool_calls - conversation.tool_calls, 0)
        return [self.toolbox.run(call) for call in calls[:remaining]]

    def _advance(
        self,
        conversation: Conversation,
        read: ActionRead,
        records: Sequence[Any],
        sample: Mapping[str, Any] | None = None,
    ) -> Outcome:
        response, content, calls = read
        version = response.version
        turn = conversation.turns + 1
        if calls:  # the turn verbatim, then one tool message per call that ran
            made = conversation.tool_calls + len(records)
            failed = conversation.failed_tool_calls + sum(not r.ok for r in records)
            over = len(records) < len(calls)  # calls past max_tool_calls did not run
            # With tools max_turns=1 means nothing (the answer ends the episode); above 1 it
            # bounds the turns.
            limit = self.max_turns if self.max_turns is not None and self.max_turns > 1 else None
            truncated = over or (limit is not None and turn >= limit)
            messages = [{"role": "tool", "content": record.output} for record in records]
            extended, problem = self.builder.extend(
                conversation, content, response.tokens, messages,
                version=version, tool_calls=(made, failed), done=truncated,
            )  # fmt: skip
            if problem and not truncated:
                raise TokenPrefixError(f"turn {turn}: {problem}")
            counts = {"num_tool_calls": made, "failed_tool_calls": failed}
            info = {"tool_calls": [r.as_dict() for r in records], **counts}
            return Outcome(extended, 0.0, False, bool(truncated), info)
        reward, terminated, info = self._score(self.assistant_prefix + content, sample)
        truncated = False
        if self.toolbox is not None:
            terminated = True  # with tools, the turn without a call is the final answer
            made, failed = conversation.tool_calls, conversation.failed_tool_calls
            info = {**info, "tool_calls": [], "num_tool_calls": made, "failed_tool_calls": failed}
        elif self.max_turns is not None and turn >= self.max_turns and not terminated:
            terminated, truncated = self.max_turns == 1, self.max_turns > 1
        extended, problem = self.builder.extend(
            conversation, content, response.tokens,
            reward=reward, version=version, done=terminated or truncated,
        )  # fmt: skip
        if problem and not (terminated or truncated):
            raise TokenPrefixError(f"turn {turn}: {problem}")
        return Outcome(extended, float(reward), bool(terminated), bool(truncated), info)

    # -- hooks for subclasses ------------------------------------------------------------

    def _initial_history(self, options: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """The conversation an episode starts from, and the reset ``info``."""
        unknown = sorted(set(options) - {"history", "query"})
        if unknown:
            raise ValueError(f"options may hold 'query' or 'history', got unknown keys {unknown}")
        if "history" in options:
            return History(options["history"]), {}
        query = options.get("query", self.query)
        if query is None:
            raise ValueError(
                "reset needs a user query: pass options={'query': '...'} or ChatEnv(query=...)"
            )
        if not isinstance(query, str):
            raise TypeError(f"options['query'] must be a str, got {type(query).__name__}")
        return self._history_for(query), {}

    def _history_for(self, query: str) -> History:
        history = History()
        if self.system_prompt is not None:
            history.append({"role": self.system_role, "content": self.system_prompt})
        return history.append({"role": self.user_role, "content": query})

    def _score(
        self, response: str, sample: Mapping[str, Any] | None
    ) -> tuple[float, bool, dict[str, Any]]:
        """Reward, whether the task is over, and step info for this response."""
        return 0.0, False, {}

    def _observation(self, conversation: Conversation) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        for key in self.observation_keys:
            if key == "history":
                obs[key] = conversation.history.to_chats()
            elif key == "text":
                obs[key] = conversation.text
            elif key == "tokens":
                obs[key] = conversation.tokens.copy()
            elif conversation.policy_mask is None:  # text the env tokenized itself
                obs[key] = np.zeros(len(conversation.tokens), dtype=np.int64)
            else:
                obs[key] = conversation.policy_mask.astype(np.int64)
        return obs
