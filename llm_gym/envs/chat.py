"""``ChatEnv``: a conversation with a language-model policy as a Gymnasium environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.chat.history import History
from llm_gym.chat.templates import CHAT_TEMPLATES, resolve_chat_template
from llm_gym.envs.actions import check_action, turn_content
from llm_gym.envs.chat_arguments import MASK_KEY, check_chat_settings, observation_keys_for
from llm_gym.envs.turns import TokenPrefixError, next_policy_mask
from llm_gym.spaces import MAX_TEXT_LENGTH, UnicodeText, history_space, token_space

__all__ = ["ActionRead", "ChatEnv", "MASK_KEY", "ResetPlan", "StepPlan"]


class ActionRead(NamedTuple):
    """A checked action (see ``ChatEnv.read_action``)."""

    response: Response
    content: str  # the turn's text, less the end-of-turn token
    calls: list[Any]  # its tool calls (none: the turn is an answer)


class ResetPlan(NamedTuple):
    """A new episode before its prompt is tokenized (see ``ChatEnv.begin_reset``)."""

    history: History
    rendered: str | None  # the chat template's rendering, when an observation needs it
    info: dict[str, Any]


@dataclass(frozen=True)
class StepPlan:
    """A step of a ``ChatEnv``, computed but not yet stored (see ``ChatEnv.plan_step``)."""

    state: tuple[History, str | None, str | None, np.ndarray | None]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    mask: np.ndarray | None = None  # the policy's tokens in the new prompt (tokens mode)
    tool_counts: tuple[int, int] = (0, 0)  # tool calls made and failed this episode


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
        # Shared by forks (a shallow copy), with its caches.
        self.codec = TokenCodec(tokenizer) if tokenizer is not None else None
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
            self._offer_tools(self.toolbox)

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

        # The built-in templates close an assistant turn with the same text whatever came
        # before, so it is rendered once; other templates are rendered in full each step.
        self._fixed_closing = tokenizer is not None and _template(
            tokenizer, self.template_kwargs
        ) in set(CHAT_TEMPLATES.values())
        self._closing: str | None = None
        self._closing_ids: dict[str, np.ndarray] = {}  # closing text -> its token ids
        self._prefix_shared = False  # the rendered system prompt handed to the codec
        self._history: History | None = None
        self._rendered: str | None = None  # the chat template's rendering of _history
        self._text: str | None = None
        self._tokens: np.ndarray | None = None
        self._prefix_ids: np.ndarray | None = None  # assistant_prefix's tokens, when needed
        self._turn, self._done = 0, False
        self._mask: np.ndarray | None = None  # policy's tokens in _tokens
        self._tool_counts = (0, 0)

    def _offer_tools(self, toolbox: Any) -> None:
        # A template that renders tools= gets them there when the env renders the prompt;
        # otherwise (and for history observations, which a policy renders itself) the system
        # prompt lists them.
        rendered_here = self.tokenizer is not None and self.input_mode != "history"
        if rendered_here and "tools" in _template(self.tokenizer, self.template_kwargs):
            self.template_kwargs["tools"] = toolbox.schemas
            return
        block = toolbox.system_prompt()
        self.system_prompt = block if not self.system_prompt else f"{self.system_prompt}\n\n{block}"

    # -- episode -----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.finish_reset(self.begin_reset(seed=seed, options=options))

    def begin_reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> ResetPlan:
        """The first half of ``reset``: seed, draw the episode's conversation and render it.

        A vector env begins the resets of all its finished sub-envs, tokenizes their prompts
        in one batch (``encode_prompts``), then finishes each.
        """
        super().reset(seed=seed)
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        history, info = self._initial_history(options or {})
        return ResetPlan(history, self._render(history) if self._needs_render() else None, info)

    def finish_reset(
        self, plan: ResetPlan, tokens: np.ndarray | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Store a begun reset, with its prompt's ``tokens`` if already encoded."""
        self._history, self._rendered = plan.history, plan.rendered
        self._text = None if plan.rendered is None else plan.rendered + self.assistant_prefix
        self._tokens = None
        if "tokens" in self.observation_keys:
            self._tokens = tokens if tokens is not None else self.encode_prompts([plan.rendered])[0]
        self._turn, self._done = 0, False
        self._tool_counts = (0, 0)
        self._mask = None if self._tokens is None else np.zeros(len(self._tokens), np.bool_)
        return self._observation(), plan.info

    def encode_prompts(self, rendered: Sequence[str]) -> list[np.ndarray]:
        """The token ids of rendered prompts (with ``assistant_prefix``), in one batch."""
        if not self._prefix_shared:
            self._prefix_shared = True
            if self.system_prompt is not None:
                system = History([{"role": self.system_role, "content": self.system_prompt}])
                self.codec.share_prefix(
                    system.apply_chat_template(self.tokenizer, **self.template_kwargs)
                )
        prefix = self._prefix_tokens()
        return [np.concatenate([ids, prefix]) for ids in self.codec.encode_many(rendered)]

    def decode_token_actions(self, actions: Sequence[Any]) -> list[Any]:
        """``actions`` with each 1-D integer array as its ``Response``, all decoded in one
        batch; other actions as given (``check_action`` reads them)."""
        arrays = [
            i
            for i, action in enumerate(actions)
            if isinstance(action, np.ndarray)
            and action.ndim == 1
            and np.issubdtype(action.dtype, np.integer)
        ]
        if not arrays or self.codec is None:
            return list(actions)
        for i in arrays:
            try:  # before decoding: -1 would overflow in the tokenizer
                self.codec.check_ids(actions[i])
            except ValueError as err:
                raise ValueError(f"actions[{i}]: {err}") from None
        texts = self.codec.decode_many([actions[i] for i in arrays])
        out = list(actions)
        for i, text in zip(arrays, texts, strict=True):
            out[i] = Response(text, actions[i])
        return out

    def step(
        self, action: str | np.ndarray | Response | Mapping[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return self.commit_step(self.plan_step(action))

    def plan_step(self, action: str | np.ndarray | Response | Mapping[str, Any]) -> StepPlan:
        """Everything ``step`` would do, computed and checked but not stored.

        A step that raises (a bad action, a reward that rejects its sample, text that cannot
        be tokenized) therefore changes nothing; a vector env plans all its sub-envs' steps
        before it commits any. Tool calls run between the check and the plan (side effects,
        but only of a checked action); a vector env calls the three parts itself, so that
        its sub-envs' calls run concurrently.
        """
        read = self.read_action(action)
        return self.plan_read(read, self.run_tool_calls(read.calls))

    def read_action(self, action: Any) -> ActionRead:
        """The checked action: its ``Response``, the turn's content and its tool calls."""
        if self._history is None or self._done:
            raise gym.error.ResetNeeded(
                "Cannot call ChatEnv.step before reset"
                if self._history is None
                else "ChatEnv.step needs a reset: the episode has ended (terminated or truncated)"
            )
        response = self.check_action(action)
        content = turn_content(response, self.codec)
        calls = self.toolbox.parse(content) if self.toolbox is not None else []
        return ActionRead(response, content, calls)

    def run_tool_calls(self, calls: Sequence[Any]) -> list[Any]:
        """Run ``calls`` in order, as many as this episode's ``max_tool_calls`` still allows;
        one ``ToolRecord`` each. Never raises for what a tool does."""
        remaining = max(self.max_tool_calls - self._tool_counts[0], 0)
        return [self.toolbox.run(call) for call in calls[:remaining]]

    def plan_read(self, read: ActionRead, tool_records: Sequence[Any]) -> StepPlan:
        """The step of a checked action whose calls ran with ``tool_records``."""
        response, content, calls = read
        if calls:
            return self._plan_tool_turn(response, content, len(calls), tool_records)
        reward, terminated, info = self._score(self.assistant_prefix + content)
        state, mask, problem = self._next_state(content, response.tokens)
        truncated = False
        if self.toolbox is not None:
            terminated = True  # with tools, the turn without a call is the final answer
            info = {**info, "tool_calls": [], **self._tool_info(*self._tool_counts)}
        elif self.max_turns is not None and self._turn + 1 >= self.max_turns and not terminated:
            if self.max_turns == 1:
                terminated = True
            else:
                truncated = True
        if problem and not (terminated or truncated):
            raise TokenPrefixError(f"turn {self._turn + 1}: {problem}")
        return StepPlan(
            state, float(reward), bool(terminated), bool(truncated), info, mask, self._tool_counts
        )

    def _plan_tool_turn(
        self, response: Response, content: str, num_calls: int, records: list[Any]
    ) -> StepPlan:
        # The assistant's turn verbatim, then one tool message per call that ran.
        messages = [{"role": "tool", "content": record.output} for record in records]
        state, mask, problem = self._next_state(content, response.tokens, messages)
        made = self._tool_counts[0] + len(records)
        failed = self._tool_counts[1] + sum(not record.ok for record in records)
        over = len(records) < num_calls  # calls past max_tool_calls did not run
        # With tools max_turns=1 means nothing (the answer ends the episode); above 1 it bounds.
        limit = self.max_turns if self.max_turns is not None and self.max_turns > 1 else None
        truncated = over or (limit is not None and self._turn + 1 >= limit)
        if problem and not truncated:
            raise TokenPrefixError(f"turn {self._turn + 1}: {problem}")
        info = {"tool_calls": [r.as_dict() for r in records], **self._tool_info(made, failed)}
        return StepPlan(state, 0.0, False, bool(truncated), info, mask, (made, failed))

    @staticmethod
    def _tool_info(made: int, failed: int) -> dict[str, int]:
        return {"num_tool_calls": made, "failed_tool_calls": failed}

    def close(self) -> None:
        """Shut down the tools' servers (MCP)."""
        if self.toolbox is not None:
            self.toolbox.close()
        super().close()

    def commit_step(
        self, plan: StepPlan
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Store a planned step (nothing here can fail) and return what ``step`` returns."""
        self._history, self._rendered, self._text, self._tokens = plan.state
        self._mask, self._tool_counts = plan.mask, plan.tool_counts
        self._turn += 1
        self._done = plan.terminated or plan.truncated
        if self.render_mode == "human":
            self.render()
        return self._observation(), plan.reward, plan.terminated, plan.truncated, plan.info

    def render(self) -> str | None:
        """``"ansi"``: the conversation as text; ``"human"``: print it."""
        if self._history is None or self.render_mode is None:
            return None
        text = "\n".join(f"[{m['role']}] {m['content']}" for m in self._history)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    @property
    def history(self) -> History | None:
        """A copy of the conversation so far (None before the first reset)."""
        return None if self._history is None else self._history.copy()

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

    def _score(self, response: str) -> tuple[float, bool, dict[str, Any]]:
        """Reward, whether the task is over, and step info for this response."""
        return 0.0, False, {}

    # -- state ---------------------------------------------------------------------------

    def _needs_render(self) -> bool:
        return any(key != "history" for key in self.observation_keys)

    def _render(self, history: History) -> str:
        return history.apply_chat_template(
            self.tokenizer, add_generation_prompt=True, **self.template_kwargs
        )

    def _encode(self, text: str) -> np.ndarray:
        return self.codec.encode(text)

    def _prefix_tokens(self) -> np.ndarray:
        # The assistant's turn starts with the prefix, so every prompt ends with its tokens.
        if self._prefix_ids is None:
            prefix = self.assistant_prefix
            self._prefix_ids = self._encode(prefix) if prefix else np.zeros(0, dtype=np.int64)
        return self._prefix_ids

    def _next_state(
        self, content: str, tokens: np.ndarray | None, added: Sequence[dict[str, str]] = ()
    ) -> tuple[tuple[Any, ...], np.ndarray | None, str | None]:
        """The conversation, rendering, text and tokens after this response and the messages
        the env ``added`` (tool results); the policy mask; what broke the token prefix."""
        # The turn holds the prefix the prompt started it with, then the response.
        prefix = self.assistant_prefix
        turn = prefix + content
        history = self._history.copy().append({"role": self.policy_role, "content": turn})
        history.extend(added)
        if not self._needs_render():
            return (history, None, None, None), None, None
        if self._closing is not None and not added:  # a built-in template: same closing
            closing = self._closing
            rendered = self._rendered + turn + closing
        else:
            rendered = self._render(history)
            body = self._rendered + turn
            # The template closes the turn (and opens the next); that text is all the prompt
            # gains beyond the response itself, so the response is never re-tokenized.
            closing = rendered[len(body) :] if rendered.startswith(body) else None
            if closing is not None and self._fixed_closing and not added:
                self._closing = closing
        # A template that rewrites earlier turns (closing None): only the full rendering is right.
        text = rendered + prefix if closing is None else self._text + content + closing + prefix
        new_tokens = mask = problem = None
        if self._tokens is not None:
            sampled = tokens is not None
            if not sampled:
                tokens = self._encode(content)
            if closing is None:
                new_tokens = self.encode_prompts([rendered])[0]
            else:
                # A sampled response ends with the end-of-turn token the template would add:
                # it is not added twice. Text given as a str is kept as said, its tokens too.
                end = self.codec.end_of_turn(tokens) if sampled else None
                if end is not None and closing.startswith(end):
                    closing = closing[len(end) :]
                if added:  # tool output varies: not worth a cache entry
                    closing_ids = self._encode(closing)
                else:
                    if closing not in self._closing_ids:
                        self._closing_ids[closing] = self._encode(closing)
                    closing_ids = self._closing_ids[closing]
                parts = [self._tokens, tokens, closing_ids, self._prefix_tokens()]
                new_tokens = np.concatenate(parts)
            if self._mask is not None:
                mask, problem = next_policy_mask(self._tokens, self._mask, tokens, new_tokens)
            if not sampled:  # text the env tokenized itself: no sampled tokens to keep
                problem = None
        return (history, rendered, text, new_tokens), mask, problem

    def check_action(self, action: Any) -> Response:
        """The action as a ``Response``, or a clear error naming what was expected."""
        return check_action(action, self.codec, self.input_mode, self.max_text_length)

    def _observation(self) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        for key in self.observation_keys:
            if key == "history":
                obs[key] = self._history.to_chats()
            elif key == "text":
                obs[key] = self._text
            elif key == "tokens":
                obs[key] = self._tokens.copy()
            elif self._mask is None:  # text the env tokenized itself broke the prefix
                obs[key] = np.zeros(len(self._tokens), dtype=np.int64)
            else:
                obs[key] = self._mask.astype(np.int64)
        return obs


def _template(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> str:
    return resolve_chat_template(
        tokenizer, template_kwargs.get("chat_template_name"), template_kwargs.get("chat_template")
    )
