"""``ChatEnv``: a conversation with a language-model policy as a Gymnasium environment.

The episode is a ``llm_gym.chat.Conversation`` (immutable); the env keeps the current one and
replaces it each step. A step is three public parts, ``read_action`` (check the action, parse
tool calls), ``run_tools`` and ``advance`` (score and extend the conversation, storing
nothing), which ``DatasetChatVectorEnv`` calls itself for N conversations at once; with
``observe`` they are part of the contract ``llm_gym.envs.VectorHooks`` writes down.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.chat.conversation import Conversation, PromptBuilder, TokenPrefixError
from llm_gym.chat.history import History
from llm_gym.chat.templates import resolve_chat_template
from llm_gym.checks import check_choice, check_int, check_reward, check_str
from llm_gym.envs.actions import MASK_KEY, check_action, observation_keys_for, turn_content
from llm_gym.envs.forking import ForkError
from llm_gym.spaces import MAX_TEXT_LENGTH, UnicodeText, history_space, token_space

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llm_gym.rubrics import TaskScore
    from llm_gym.tools.calls import ToolCall
    from llm_gym.tools.toolbox import ToolRecord

__all__ = ["ChatEnv", "MASK_KEY"]


class ActionRead(NamedTuple):
    """A checked action: its ``Response``, ``turn_content`` and tool calls (none: an answer)."""

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
    to the conversation, and the conversation so far becomes the next prompt.

    ## Action Space

    The assistant's turn: a ``str`` (``UnicodeText(max_text_length)``), or in ``"tokens"``
    mode a 1-D ``int64`` array of token ids (``Sequence(Discrete(vocab), stack=True)``),
    appended to the prompt as given, never re-tokenized. Every mode also takes a ``Response``
    (what the policy adapters return) or a dict with a ``"text"`` key.

    ## Observation Space

    A ``Dict`` keyed by ``observation_keys`` (default: just ``input_mode``):

    - ``history``: the conversation so far, a tuple of ``{"role", "content"}`` dicts.
    - ``text``: the prompt rendered with the chat template and generation prompt.
    - ``tokens``: that prompt's ``int64`` token ids.
    - ``policy_mask``: ``int64`` 0/1 per token of ``tokens``, 1 where the policy sampled it.

    In ``"tokens"`` mode each prompt is the previous one's tokens, the tokens the policy
    sampled, then what the env added, checked each step (``TokenPrefixError`` names the turn
    and position). With tools ``policy_mask`` is added to the tokens: a trainer takes its
    loss on the sampled tokens, never on tool output.

    ## Rewards

    Always ``0.0``: ``DatasetChatEnv`` scores with a task's reward, wrappers add others.

    ## Tools

    With ``tools=``, a turn that holds tool calls is no answer (reward ``0.0`` in every env,
    plus ``tool_error_reward`` for each of its calls that failed, so that a turn-level
    advantage blames that turn): the env runs the calls in order (``Toolbox.run``, which
    never raises) and appends the turn verbatim and one ``tool`` message per call, its output
    or an error the model can read.
    The turn without a call is the final answer. ``info["tool_calls"]`` lists the step's
    ``ToolRecord``s as dicts; ``info["num_tool_calls"]`` and ``info["failed_tool_calls"]``
    count the episode's. The model sees the tools in the chat template's ``tools=`` where it
    renders them and the env renders the prompt, else in a block added to the system prompt.

    ## Starting State

    ``[system_prompt?, user query]``, the query from ``reset(options={"query": ...})`` or else
    ``query=``; ``options={"history": [...]}`` starts from a given conversation instead.

    ## Episode End

    With ``max_turns=None`` (default) the episode never ends by itself. With ``max_turns=1``
    the single turn ends it with ``terminated=True`` (the conversation is over); with
    ``max_turns > 1`` reaching the limit returns ``truncated=True``. With tools the final
    answer terminates the episode; a step whose calls go past ``max_tool_calls`` (those calls
    are not run) or reach ``max_turns > 1`` truncates it.

    ## Arguments

    - ``input_mode``: ``"history"`` (default), ``"text"`` or ``"tokens"``.
    - ``query``, ``system_prompt``: the default user query and an optional first message.
    - ``system_role`` / ``user_role`` / ``policy_role``: role names (``"system"``, ``"user"``,
      ``"assistant"``).
    - ``tokenizer``: a transformers tokenizer; required for ``"text"`` and ``"tokens"``.
    - ``template_kwargs``: for ``History.apply_chat_template`` (``chat_template_name=...``).
    - ``max_turns``: assistant turns per episode, or ``None`` for no limit.
    - ``observation_keys``, ``max_text_length``: the observation's keys, the text spaces' limit.
    - ``assistant_prefix``: text that starts every assistant turn (e.g. ``"<think>"``), text
      and tokens modes only: the prompts end with it, so the policy's tokens continue it; the
      history's turn and the text scored are the prefix plus the response.
    - ``tools``: ``llm_gym.tools.Toolbox``'s: ``"python"`` (a sandboxed interpreter), plain
      functions, ``Tool`` or ``MCPTools`` (shut down by ``close()``).
    - ``tool_format``: ``"hermes"`` (default) or ``"markdown"`` (see ``llm_gym.tools.calls``).
    - ``max_tool_calls``: tool calls per episode (default 4).
    - ``tool_error_reward``: added to a turn's reward for each of its calls that failed
      (default 0; a small negative value, as GEM's -0.1 for an invalid move, blames the turn).

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
        tokenizer: PreTrainedTokenizerBase | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        observation_keys: tuple[str, ...] | list[str] | None = None,
        max_text_length: int = MAX_TEXT_LENGTH,
        assistant_prefix: str = "",
        tools: Sequence[Any] | None = None,
        tool_format: str = "hermes",
        max_tool_calls: int = 4,
        tool_error_reward: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        keys = observation_keys_for(input_mode, observation_keys, tools, tokenizer)
        self.max_turns = check_int("max_turns", max_turns, low=1, optional=True)
        self.assistant_prefix = check_str("assistant_prefix", assistant_prefix)
        if assistant_prefix and input_mode == "history":
            raise ValueError(
                "assistant_prefix needs input_mode 'text' or 'tokens' (a history observation "
                f"cannot hold a started assistant turn), got input_mode='history' and "
                f"assistant_prefix={assistant_prefix!r}"
            )
        self.query = check_str("query", query, optional=True)
        self.max_text_length = check_int("max_text_length", max_text_length, low=1)
        self.max_tool_calls = check_int("max_tool_calls", max_tool_calls, 1)
        self.tool_error_reward = check_reward("tool_error_reward", tool_error_reward)
        if self.tool_error_reward > 0 or (self.tool_error_reward and not tools):
            raise ValueError(
                f"tool_error_reward={tool_error_reward!r} "
                + ("would pay for failing: pass a value <= 0" if self.tool_error_reward > 0
                   else "charges failed tool calls, and the env has no tools: pass tools=... "
                   "or leave it 0")
            )  # fmt: skip
        modes = (None, *self.metadata["render_modes"])
        self.render_mode = check_choice("render_mode", render_mode, modes)
        self.input_mode = input_mode
        self.observation_keys = keys
        self.system_prompt = system_prompt
        self.system_role, self.user_role, self.policy_role = system_role, user_role, policy_role
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.toolbox = None
        if tools:
            from llm_gym.tools import Toolbox  # here: envs without tools never import it

            self.toolbox = Toolbox(tools, tool_format)
            rendered_here = tokenizer is not None and input_mode != "history"
            self.system_prompt = _offer_tools(
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
        """Start a conversation (see Starting State)."""
        super().reset(seed=seed)
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        history, info = self._initial_history(options or {})
        (self._conversation,) = self.builder.start([history])
        return self.observe(self._conversation), info

    def step(
        self, action: str | np.ndarray | Response | Mapping[str, Any]
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Append the assistant's turn and run its tool calls; one that raises changes nothing."""
        read = self.read_action(self._conversation, action)
        records = self.run_tools(self._conversation, read.calls)
        outcome = self.advance(self._conversation, read, records)
        self._conversation = outcome.conversation
        if self.render_mode == "human":
            self.render()
        return self.observe(outcome.conversation), *outcome[1:]

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

    def fork(self) -> ChatEnv:
        """An independent env in this one's state, mid-episode or not (``llm_gym.fork`` does
        it through wrappers). The conversation (immutable, so shared), the turn and tool-call
        counts it holds, and the RNG (copied) are the fork's; the tokenizer, the prompt
        builder's caches and the tools are shared, read-only: the sandboxed interpreter keeps
        nothing between calls. ``ForkError`` for tools whose state is a server's (MCP)."""
        if self.toolbox is not None and self.toolbox.server_tools:
            raise ForkError(
                f"{type(self).__name__} cannot fork: its MCP tools {self.toolbox.server_tools} "
                "keep their state in a server process, which cannot be copied"
            )
        other = copy.copy(self)
        other._np_random = copy.deepcopy(self._np_random)
        return other

    @property
    def conversation(self) -> Conversation | None:
        """The episode so far (None before the first reset)."""
        return self._conversation

    @property
    def history(self) -> History | None:
        """A copy of the conversation's messages (None before the first reset)."""
        return None if self._conversation is None else self._conversation.history.copy()

    # -- the parts of a step, shared with the vector env (``VectorHooks``) -------------------

    def read_action(
        self,
        conversation: Conversation | None,
        action: str | np.ndarray | Response | Mapping[str, Any],
    ) -> ActionRead:
        """Check ``action`` against ``conversation`` (``ResetNeeded`` before a reset or after
        the end) and parse its tool calls; changes nothing."""
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

    def run_tools(self, conversation: Conversation, calls: Sequence[ToolCall]) -> list[ToolRecord]:
        """Run ``calls`` in order, as many as the episode's ``max_tool_calls`` still allows;
        one record each. Never raises: a failed call is a record with ``ok=False``."""
        remaining = max(self.max_tool_calls - conversation.tool_calls, 0)
        return [self.toolbox.run(call) for call in calls[:remaining]]

    def advance(
        self,
        conversation: Conversation,
        read: ActionRead,
        records: Sequence[ToolRecord],
        item: Mapping[str, Any] | None = None,
        score: TaskScore | None = None,
    ) -> Outcome:
        """Score the turn ``read`` (with its tool ``records``) against ``item`` and extend
        ``conversation``: the ``Outcome`` (next conversation, reward, terminated, truncated,
        info). Stores nothing, so a vector env can call it for any of its conversations;
        ``score``: the answer's score already computed (a vector env's batch), not again."""
        _, content, calls = read
        turn = conversation.turns + 1
        made = conversation.tool_calls + len(records)
        errors = sum(not r.ok for r in records)
        failed = conversation.failed_tool_calls + errors
        if calls:  # not an answer: the turn verbatim, then one tool message per call that ran
            reward, terminated, info = self.tool_error_reward * errors, False, {}
            # Calls past max_tool_calls did not run. With tools max_turns=1 means nothing
            # (the answer ends the episode); above 1 it bounds the turns.
            over = len(records) < len(calls)
            truncated = over or ((self.max_turns or 0) > 1 and turn >= self.max_turns)
        else:
            if score is None:
                reward, terminated, info = self._score(self.assistant_prefix + content, item)
            else:
                reward, terminated, info = float(score.reward), bool(score.answered), score.info
            truncated = False
            if self.toolbox is not None:
                terminated = True  # with tools, the turn without a call is the final answer
            elif self.max_turns is not None and turn >= self.max_turns and not terminated:
                terminated, truncated = self.max_turns == 1, self.max_turns > 1
        if self.toolbox is not None:
            counts = {"num_tool_calls": made, "failed_tool_calls": failed}
            info = {**info, "tool_calls": [r.as_dict() for r in records], **counts}
        added = [{"role": "tool", "content": record.output} for record in records]
        return self._conclude(
            conversation, read, added, reward, terminated, truncated, info, (made, failed)
        )

    def _conclude(
        self,
        conversation: Conversation,
        read: ActionRead,
        added: Sequence[Mapping[str, str]],
        reward: float,
        terminated: bool,
        truncated: bool,
        info: dict[str, Any],
        tool_calls: tuple[int, int] | None = None,
    ) -> Outcome:
        """The ``Outcome`` of the turn ``read``: ``conversation`` extended with it and the
        messages the env ``added``. In tokens mode a broken token prefix raises
        ``TokenPrefixError``, unless the episode ends here (no prompt follows)."""
        done = terminated or truncated
        extended, problem = self.builder.extend(
            conversation, read.content, read.response.tokens, added,
            reward=reward, version=read.response.version, tool_calls=tool_calls, done=done,
        )  # fmt: skip
        if problem and not done:
            raise TokenPrefixError(f"turn {conversation.turns + 1}: {problem}")
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
        return self._history_for(check_str("options['query']", query)), {}

    def _history_for(self, query: str) -> History:
        history = History()
        if self.system_prompt is not None:
            history.append({"role": self.system_role, "content": self.system_prompt})
        return history.append({"role": self.user_role, "content": query})

    def _score(
        self, response: str, item: Mapping[str, Any] | None
    ) -> tuple[float, bool, dict[str, Any]]:
        """Reward, whether the task is over, and step info for this response."""
        return 0.0, False, {}

    def observe(self, conversation: Conversation) -> dict[str, Any]:
        """The observation of ``conversation``: a fresh dict of the ``observation_keys``."""
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


def _offer_tools(
    toolbox: Any, system_prompt: str | None, template_kwargs: dict, tokenizer: Any, here: bool
) -> str | None:
    """Show the tools to the model as ``ChatEnv``'s Tools says (``here``: the env renders the
    prompt); the system prompt after that."""
    if here:
        name = template_kwargs.get("chat_template_name")
        template = resolve_chat_template(tokenizer, name, template_kwargs.get("chat_template"))
        if "tools" in template:
            template_kwargs["tools"] = toolbox.schemas
            return system_prompt
    block = toolbox.system_prompt()
    return block if not system_prompt else f"{system_prompt}\n\n{block}"
