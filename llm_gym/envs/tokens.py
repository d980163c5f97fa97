"""``TokenEnv``: one token per step over any chat task, RL4LMs' design on current Gymnasium,
for classic RL libraries (stable-baselines3, CleanRL, RLlib), which want fixed-shape array
observations and a ``Discrete`` action."""

from __future__ import annotations

import copy
import inspect
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from llm_gym.chat.containers import Response
from llm_gym.checks import check_bool, check_choice, check_int
from llm_gym.envs.chat import ChatEnv

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["TokenEnv", "make_token_env"]


class TokenEnv(gym.Env):
    """Generate a chat task's response token by token; the task scores the finished response.

    ## Description

    RL4LMs' token-level text-generation env with Gymnasium's API. Each episode is one
    assistant turn of ``task_env``: ``reset`` resets the task and shows its prompt tokens;
    each ``step`` appends one token id; at EOS (or after ``max_new_tokens`` tokens) the
    response, with the exact token ids, goes to ``task_env.step`` as a ``Response`` and the
    task's reward comes back. Chat-level wrappers on ``task_env`` (e.g. ``RetrieveKL`` with a
    ``gen_model``) therefore apply to the whole response at the end; ``TokenKLWrapper``
    charges a per-token KL instead.

    ## Action Space

    ``Discrete(vocab_size)``: the id of the next token (``vocab_size = len(tokenizer)``).

    ## Observation Space

    ``Dict({"input_ids": Box(0, vocab_size - 1, (L,), int64), "attention_mask": Box(0, 1,
    (L,), int8)})`` with ``L = max_prompt_length + max_new_tokens``: the prompt followed by
    the tokens generated so far, left-padded with the tokenizer's pad id (mask 0), so the
    last position always holds the latest real token.

    ## Rewards

    0.0 on every step but the last, which gets the task's reward for the whole response
    (GSM8K: 1.0 right, 0.1 wrong answer, 0.0 no answer). The last step's ``info`` holds the
    task's info (``success``, ``answer``, ...) plus ``response_tokens`` and ``response_text``.

    ## Starting State

    The task's prompt, nothing generated. ``reset``'s ``seed`` and ``options`` go to the task
    env; ``info`` is the task's reset info plus ``prompt_length``.

    ## Episode End

    ``terminated=True`` when the action is an EOS token (``eos_token_ids``); ``truncated=True``
    when ``max_new_tokens`` tokens were generated without one. Either way the response is
    scored. Libraries that bootstrap truncated episodes with the final observation's value
    (stable-baselines3 does) would add it to the final score, and a policy learns to run out
    the length to collect it: with them, pass ``terminate_at_max_new_tokens=True``.

    ## Arguments

    - ``task_env``: a single-turn (``max_turns=1``) ``DatasetChatEnv`` (or any ``ChatEnv``),
      possibly wrapped, e.g. ``gym.make("LLMChat-GSM8K-v0", ...)``.
    - ``tokenizer``: the policy's tokenizer; default the task env's. When the task env has
      none or shows no ``"tokens"``, its conversation is rendered with this one.
    - ``max_new_tokens``: the response's length limit (default 64).
    - ``max_prompt_length``: room for the prompt (default 256 tokens).
    - ``truncate_prompt``: a longer prompt keeps its last ``max_prompt_length`` tokens (True)
      or raises a ``ValueError`` at reset (False, default), leaving the env unchanged.
    - ``eos_token_ids``: ids that end the response; default the tokenizer's EOS.
    - ``terminate_at_max_new_tokens``: the length limit ``terminated`` (default False).
    - ``render_mode``: ``"ansi"`` (the prompt and response as text) or ``"human"`` (print it).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> from llm_gym.lm.loading import load_gpt2_tokenizer
    >>> tokenizer = load_gpt2_tokenizer()
    >>> rows = [{"question": "What is 9 * 2?", "answer": "#### 18"}]
    >>> env = gym.make("LLMToken-GSM8K-v0", tokenizer=tokenizer, max_new_tokens=32,
    ...                max_prompt_length=160, dataset=rows)
    >>> obs, info = env.reset(seed=0)
    >>> obs["input_ids"].shape, env.action_space
    ((192,), Discrete(50257))
    >>> for token in tokenizer("<answer>18</answer>")["input_ids"] + [tokenizer.eos_token_id]:
    ...     obs, reward, terminated, truncated, info = env.step(token)
    >>> reward, terminated, truncated, info["success"]
    (1.0, True, False, True)
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        task_env: gym.Env,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_new_tokens: int = 64,
        max_prompt_length: int = 256,
        truncate_prompt: bool = False,
        eos_token_ids: int | list[int] | tuple[int, ...] | None = None,
        terminate_at_max_new_tokens: bool = False,
        render_mode: str | None = None,
    ) -> None:
        task = getattr(task_env, "unwrapped", None)
        if not isinstance(task, ChatEnv):
            raise TypeError(
                "task_env must be a ChatEnv task such as a DatasetChatEnv (possibly "
                f"wrapped), got {type(task).__name__}"
            )
        if task.max_turns != 1:
            raise ValueError(
                "task_env must be single-turn (max_turns=1): a TokenEnv episode is one "
                f"assistant turn, got max_turns={task.max_turns!r}"
            )
        tokenizer = task.tokenizer if tokenizer is None else tokenizer
        if tokenizer is None:
            raise ValueError(
                "TokenEnv needs tokenizer= (the policy's transformers tokenizer), got None and "
                "task_env has none either"
            )
        if task.tokenizer is not None and len(task.tokenizer) != len(tokenizer):
            raise ValueError(
                "tokenizer must be the task env's tokenizer: got one with "
                f"{len(tokenizer)} tokens, task_env's has {len(task.tokenizer)}"
            )
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1)
        self.max_prompt_length = check_int("max_prompt_length", max_prompt_length, low=1)
        self.truncate_prompt = check_bool("truncate_prompt", truncate_prompt)
        self.terminate_at_max_new_tokens = check_bool(
            "terminate_at_max_new_tokens", terminate_at_max_new_tokens
        )
        modes = (None, *self.metadata["render_modes"])
        self.render_mode = check_choice("render_mode", render_mode, modes)
        self.vocab_size = len(tokenizer)
        if eos_token_ids is None:
            eos_token_ids = tokenizer.eos_token_id
        eos = [] if eos_token_ids is None else np.atleast_1d(eos_token_ids).tolist()
        if not eos or not all(isinstance(e, int) and 0 <= e < self.vocab_size for e in eos):
            raise ValueError(
                f"eos_token_ids must be token ids in [0, {self.vocab_size}) (default: the "
                f"tokenizer's eos_token_id), got {eos_token_ids!r}"
            )
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else eos[0])

        self.task_env = task_env
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos)
        self.length = self.max_prompt_length + self.max_new_tokens
        self.observation_space = spaces.Dict(
            attention_mask=spaces.Box(0, 1, (self.length,), np.int8),
            input_ids=spaces.Box(0, self.vocab_size - 1, (self.length,), np.int64),
        )
        self.action_space = spaces.Discrete(self.vocab_size)

        self._input_ids = np.full(self.length, self.pad_token_id, dtype=np.int64)
        self._attention_mask = np.zeros(self.length, dtype=np.int8)
        self._prompt: np.ndarray | None = None
        self._generated: list[int] = []
        self._done = True  # until the first reset

    # -- Gymnasium API -------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Reset the task and show its prompt (see Starting State)."""
        super().reset(seed=seed)
        obs, info = self.task_env.reset(seed=seed, options=options)
        prompt = self._prompt_tokens(obs)
        if len(prompt) > self.max_prompt_length:
            if not self.truncate_prompt:
                raise ValueError(
                    f"the prompt has {len(prompt)} tokens, more than max_prompt_length="
                    f"{self.max_prompt_length}; raise max_prompt_length or pass "
                    "truncate_prompt=True to keep its last tokens"
                )
            prompt = prompt[-self.max_prompt_length :]
        self._prompt, self._generated, self._done = prompt, [], False
        self._input_ids.fill(self.pad_token_id)
        self._attention_mask.fill(0)
        self._input_ids[self.length - len(prompt) :] = prompt
        self._attention_mask[self.length - len(prompt) :] = 1
        if self.render_mode == "human":
            self.render()
        return self._observation(), {**info, "prompt_length": len(prompt)}

    def step(
        self, action: int | np.integer | np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        """Append one token; at the response's end, the task's reward (see Rewards)."""
        if self._done:
            raise gym.error.ResetNeeded(
                "TokenEnv.step needs a reset first: the episode has not started or has ended"
            )
        token = self.check_action(action)
        generated = [*self._generated, token]
        terminated = token in self.eos_token_ids
        truncated = not terminated and len(generated) >= self.max_new_tokens
        if truncated and self.terminate_at_max_new_tokens:
            terminated, truncated = True, False
        reward, info = 0.0, {}
        if terminated or truncated:
            # Scored first, so that a task that rejects the response leaves this env as it was.
            tokens = np.asarray(generated, dtype=np.int64)
            text = self.tokenizer.decode(generated, skip_special_tokens=False)
            _, reward, _, _, task_info = self.task_env.step(Response(text, tokens))
            info = {**task_info, "response_tokens": tokens, "response_text": text}
            self._done = True
        self._generated = generated
        # Shift the window left by one: a pad leaves at the front (there is room for
        # max_new_tokens tokens), the new token enters at the back.
        self._input_ids[:-1] = self._input_ids[1:]
        self._attention_mask[:-1] = self._attention_mask[1:]
        self._input_ids[-1], self._attention_mask[-1] = token, 1
        if self.render_mode == "human":
            self.render()
        return self._observation(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        """``"ansi"``: the prompt and the response so far as text; ``"human"``: print it."""
        if self._prompt is None or self.render_mode is None:
            return None
        ids = [*self._prompt.tolist(), *self._generated]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def fork(self) -> TokenEnv:
        """An independent env in this one's state: the task env forked (``llm_gym.fork``),
        the tokens so far and the RNG copied, the tokenizer shared."""
        from llm_gym.envs.forking import fork

        other = copy.copy(self)
        other.task_env = fork(self.task_env)
        other._np_random = copy.deepcopy(self._np_random)
        other._generated = list(self._generated)
        other._input_ids, other._attention_mask = (
            self._input_ids.copy(),
            self._attention_mask.copy(),
        )
        return other

    def close(self) -> None:
        """Close the task env."""
        self.task_env.close()

    @property
    def response_tokens(self) -> np.ndarray:
        """The tokens generated in the current episode so far (a copy)."""
        return np.asarray(self._generated, dtype=np.int64)

    # -- internals -----------------------------------------------------------------------

    def _prompt_tokens(self, obs: Any) -> np.ndarray:
        task = self.task_env.unwrapped
        if isinstance(obs, dict) and "tokens" in obs:
            return np.asarray(obs["tokens"], dtype=np.int64)
        # The task shows no tokens (history/text mode): render its conversation the way
        # ChatEnv does, with the task's template settings.
        text = task.history.apply_chat_template(
            self.tokenizer, add_generation_prompt=True, **task.template_kwargs
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def check_action(self, action: object) -> int:
        """The action as a token id, or a clear error; NumPy scalars and one-element arrays
        (what SB3 and vector envs hand over) are ok."""
        if isinstance(action, np.ndarray) and action.size == 1 and action.ndim <= 1:
            if np.issubdtype(action.dtype, np.integer):
                action = action.reshape(()).item()
        if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
            raise TypeError(
                f"action must be an int token id in [0, {self.vocab_size}), "
                f"got {type(action).__name__}: {action!r:.60}"
            )
        if not 0 <= action < self.vocab_size:
            raise ValueError(f"action must be a token id in [0, {self.vocab_size}), got {action}")
        return int(action)

    def _observation(self) -> dict[str, np.ndarray]:
        return {"input_ids": self._input_ids.copy(), "attention_mask": self._attention_mask.copy()}


def make_token_env(task: str, **kwargs: object) -> TokenEnv:
    """``TokenEnv`` over the registered chat task ``task``, made in tokens mode and single-turn.

    The entry point of the ``LLMToken-*`` ids (``LLMToken-GSM8K-v0``: ``task=
    "LLMChat-GSM8K-v0"``). ``TokenEnv``'s arguments in ``kwargs`` go to it, all others
    (``split``, ``dataset``, ``seed``, ...) to the task.
    """
    own = {name: kwargs.pop(name) for name in _TOKEN_ENV_ARGUMENTS if name in kwargs}
    if own.get("tokenizer") is None:
        raise ValueError(
            f"a token-level {task} needs tokenizer= (a transformers tokenizer, e.g. "
            "llm_gym.lm.loading.load_gpt2_tokenizer()), got None"
        )
    for key in ("input_mode", "max_turns", "observation_keys"):
        if key in kwargs:
            raise TypeError(f"a token-level {task} sets {key} itself; got {key}=")
    task_env = gym.make(
        task,
        input_mode="tokens",
        tokenizer=own["tokenizer"],
        max_turns=1,
        disable_env_checker=True,
        **kwargs,
    )
    return TokenEnv(task_env, **own)


# TokenEnv's own arguments, after task_env: what make_token_env keeps from the task.
_TOKEN_ENV_ARGUMENTS = tuple(inspect.signature(TokenEnv).parameters)[1:]
