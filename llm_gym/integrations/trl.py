"""Train with TRL's ``GRPOTrainer`` on any llm_gym env, two ways:

- a ``rollout_func`` and its reward (docs/integrations.md, "TRL's GRPOTrainer on any llm_gym
  env", tells what they return, with an example). The rollout samples with the trainer's own
  generator: TRL's vLLM (server or colocate mode) when the trainer has ``use_vllm=True``, else
  the trainer's model;
- an ``environment_factory`` class (docs/integrations.md, "TRL's ``environment_factory``"):
  TRL runs the episode as tool calls, the env's turn being the tool ``act``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np
import torch

from llm_gym.checks import check_int
from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.samplers import Sample, check_token_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    from llm_gym.policies import Policy

__all__ = [
    "EnvRollout",
    "TRLEnvironment",
    "TRLVLLMSampler",
    "env_reward_func",
    "environment_factory",
    "make_rollout_func",
]


def env_reward_func(
    completions: Sequence[Any], env_reward: Sequence[float], **_: object
) -> list[float]:
    """The env's return of each completion, as ``make_rollout_func`` recorded it."""
    if len(env_reward) != len(completions):
        raise ValueError(
            f"env_reward must hold one return per completion, got {len(env_reward)} for "
            f"{len(completions)}: pass make_rollout_func's rollout_func to the trainer"
        )
    return [float(r) for r in env_reward]


def make_rollout_func(
    env_id: str, *, seed: int = 0, compute_dtype: torch.dtype | None = None, **env_kwargs: object
) -> EnvRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays ``env_id`` (made with
    ``env_kwargs``; the first batch's questions come from ``seed``). Without TRL's vLLM the
    trainer's model samples in ``compute_dtype`` (None: its weights'; bfloat16 over float32
    weights samples under autocast, as ``llm-gym train --dtype bfloat16`` does)."""
    return EnvRollout(env_id, seed=seed, compute_dtype=compute_dtype, **env_kwargs)


class EnvRollout:
    """``make_rollout_func``'s: one episode per prompt, all prompts' turns batched per turn."""

    def __init__(
        self,
        env_id: str,
        *,
        seed: int = 0,
        compute_dtype: torch.dtype | None = None,
        **env_kwargs: object,
    ) -> None:
        if compute_dtype is not None and not isinstance(compute_dtype, torch.dtype):
            raise TypeError(f"compute_dtype must be a torch.dtype or None, got {compute_dtype!r}")
        self.compute_dtype = compute_dtype
        self.is_task = gym.spec(env_id).vector_entry_point is not None  # unknown ids fail here
        if not self.is_task:
            env_kwargs.setdefault("max_turns", 1)  # a plain chat: one reply per prompt
        self.env_id, self.seed, self.env_kwargs = env_id, seed, env_kwargs
        self._envs: list[gym.Env] = []
        self._key: tuple[int, int, int] | None = None
        self._fresh = True  # the next reset starts the stream of `seed`

    def __call__(
        self, prompts: Sequence[str | Sequence[Mapping[str, Any]]], trainer: GRPOTrainer
    ) -> dict[str, list]:
        """One episode per prompt with ``trainer``'s model: what TRL's ``rollout_func`` returns."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        tokenizer = trainer.processing_class
        group = trainer.num_generations if model.training else trainer.num_generations_eval
        envs = self._envs_for(len(prompts), group, tokenizer)
        if self.is_task:  # sub-env i seeded seed + i: one order, split (see Shard)
            seeds = [self.seed + i if self._fresh else None for i in range(len(envs))]
            obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]
            self._fresh = False
        else:
            queries = [_query(p) for p in prompts]
            obs = [env.reset(options={"query": q})[0] for env, q in zip(envs, queries, strict=True)]
        args = trainer.args
        if getattr(args, "use_vllm", False):  # TRL's vLLM, with the weights TRL synced
            step = trainer.state.global_step
            sampler = TRLVLLMSampler(trainer.vllm_generation, tokenizer.eos_token_id, step)
            policy: Policy = SamplerPolicy(sampler, tokenizer)
        else:
            policy = TransformersPolicy(
                model, tokenizer, input_mode="tokens", compute_dtype=self.compute_dtype,
                generate_kwargs={"max_new_tokens": args.max_completion_length,
                                 "do_sample": True, "temperature": args.temperature},
            )  # fmt: skip
        return _play(envs, obs, policy)

    def _envs_for(self, n: int, group: int, tokenizer: PreTrainedTokenizerBase) -> list[gym.Env]:
        # One env per prompt; a task's envs split one stream (shard), each group of `group`
        # consecutive envs on one question (repeats). Rebuilt only when the batch changes.
        key = (n, group, id(tokenizer))
        if key != self._key:
            if self.is_task and n % group:
                raise ValueError(
                    f"the trainer's batch of {n} prompts is not whole groups of "
                    f"num_generations={group}"
                )
            kwargs = {**self.env_kwargs, "input_mode": "tokens", "tokenizer": tokenizer}
            kwargs["observation_keys"] = ("tokens", "policy_mask")
            make = [{"shard": (i, n), "repeats": group} if self.is_task else {} for i in range(n)]
            self._envs = [gym.make(self.env_id, **kwargs, **extra) for extra in make]
            if getattr(self._envs[0].unwrapped, "max_turns", 1) is None:
                raise ValueError(
                    f"{self.env_id} runs without max_turns here, so an episode could go on "
                    "forever: pass max_turns=N to make_rollout_func"
                )
            self._key, self._fresh = key, True
        return self._envs


class TRLVLLMSampler:
    """TRL's vLLM generator (a ``GRPOTrainer``'s ``vllm_generation``, server or colocate mode)
    as a ``Sampler``: token ids in through its ``generate``, the ids and log-probs it returns
    out as they are, with TRL's own sampling settings (``temperature``, ``top_p``,
    ``max_completion_length``, ...). In server mode TRL gathers prompts across processes, so
    every process must sample the same number of times.

    Args:
        generation: ``trainer.vllm_generation``.
        eos_token_id: the tokenizer's end of sequence (tells ``"stop"`` from ``"length"``).
        version: the policy version (TRL syncs the weights when its global step changes).
    """

    def __init__(
        self, generation: VLLMGeneration, eos_token_id: int | None, version: int | None = None
    ):
        self.generation, self.eos_token_id, self.version = generation, eos_token_id, version

    def sample(self, prompts: Sequence[np.ndarray]) -> list[Sample]:
        """One ``Sample`` per prompt, from one call of TRL's ``generate``."""
        prompts = check_token_batch("prompts", prompts, min_length=1)
        if not prompts:
            return []
        ids = [prompt.tolist() for prompt in prompts]
        _, completions, log_probs, _ = self.generation.generate(ids, None, 1)
        samples = []
        for i, tokens in enumerate(completions):
            tokens = np.asarray(tokens, dtype=np.int64)
            # logprobs=0: one value a token, the sampled token's own.
            values = None if log_probs is None else [row[0] for row in log_probs[i]]
            values = None if values is None else np.asarray(values, dtype=np.float32)
            stop = len(tokens) > 0 and int(tokens[-1]) == self.eos_token_id
            samples.append(Sample(tokens, values, "stop" if stop else "length", self.version))
        return samples


def _play(envs: list[gym.Env], obs: list[dict], policy: Policy) -> dict[str, list]:
    n = len(envs)
    prompt_ids = [np.asarray(o["tokens"]).tolist() for o in obs]
    completion: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    returns, turns, active = [0.0] * n, [0] * n, list(range(n))
    with torch.no_grad():
        while active:
            responses = policy({"tokens": tuple(obs[i]["tokens"] for i in active)})
            still = []
            for i, response in zip(active, responses, strict=True):
                completion[i] += np.asarray(response.tokens).tolist()
                logprobs[i] += np.asarray(response.log_probs, dtype=float).tolist()
                obs[i], reward, terminated, truncated, _ = envs[i].step(response)
                returns[i] += float(reward)
                turns[i] += 1
                if not (terminated or truncated):
                    # The next prompt continues the exact tokens so far (the env checks it):
                    # what it adds (tool output, the next user turn) is the env's.
                    inserted = obs[i]["tokens"][len(prompt_ids[i]) + len(completion[i]) :]
                    completion[i] += inserted.tolist()
                    logprobs[i] += [0.0] * len(inserted)
                    still.append(i)
            active = still
    out: dict[str, list] = {
        "prompt_ids": prompt_ids,
        "completion_ids": completion,
        "logprobs": logprobs,
        "env_reward": returns,
    }
    if max(turns) > 1:  # the env's mask of the policy's tokens, over the completion
        spans = zip(obs, prompt_ids, completion, strict=True)
        out["env_mask"] = [o["policy_mask"][len(p) : len(p) + len(c)].tolist() for o, p, c in spans]
    return out


def _query(prompt: object) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        users = [m["content"] for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return users[-1]
    raise TypeError(
        f"a prompt must be a str or a conversation with a user message, got {prompt!r:.60}"
    )


# -- TRL's environment_factory ----------------------------------------------------------


def environment_factory(env_id: str, **env_args: object) -> type[TRLEnvironment]:
    """A class for ``GRPOTrainer(environment_factory=...)`` that plays ``env_id``: each
    instance holds one ``gym.make(env_id, **env_args)`` and plays one episode per rollout
    (``TRLEnvironment`` says how). An unknown ``env_id`` fails here; bad ``env_args`` fail
    when the trainer makes its first instance (in its ``__init__``).

    The class is named after ``env_id`` (``LLMChat-TextArena-v0`` gives
    ``LLMChat_TextArena_v0``); TRL logs the env's reward as ``rewards/<class name>/mean``.
    Two factories of one id in a ``dict`` ``environment_factory`` log under one name:
    subclass one (``class Guess(environment_factory(...)): pass``) to tell them apart.

    >>> Guess = environment_factory("LLMChat-TextArena-v0", game="GuessTheNumber-v0")
    >>> Guess.__name__, Guess.env_id, dict(Guess.env_args)
    ('LLMChat_TextArena_v0', 'LLMChat-TextArena-v0', {'game': 'GuessTheNumber-v0'})
    """
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a registered env id (a str), got {env_id!r:.80}")
    gym.spec(env_id)  # an unknown id fails now, naming close ids
    name = re.sub(r"\W", "_", env_id)
    attributes = {
        "env_id": env_id,
        "env_args": MappingProxyType(dict(env_args)),
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"``TRLEnvironment`` of ``gym.make({env_id!r}, **env_args)``.",
    }
    return type(name, (TRLEnvironment,), attributes)


class TRLEnvironment:
    """An llm_gym env as an environment of TRL's ``GRPOTrainer(environment_factory=...)``.

    ## Description

    Make the class with ``environment_factory(env_id, **env_args)``; TRL makes instances
    with no argument, keeps them in a pool and reuses each for one rollout at a time. Each
    instance holds one ``gym.make(env_id, **env_args)`` (history mode: the observation's
    ``history`` is read). A rollout is one episode: ``reset(**row)`` starts it and returns
    the text TRL appends to the row's last user message; the model then plays its turns by
    calling the tool ``act(text)``, each call one ``env.step(text)`` whose reply comes back
    as the tool's result; ``get_reward()`` gives the episode's return, which TRL adds as a
    reward (weight 1, logged as ``rewards/<class name>/mean``).

    TRL makes a tool of every public method but ``reset`` and ``get_reward``: ``act`` is the
    only one (its docstring and signature are the tool's schema in the prompt).

    ## Action Space

    ``act(text: str)``: any text is a move (the env's action, a ``str``), valid or not by the
    env's own rules. Model output is hostile input, so ``act`` never raises: a move after
    the episode's end, or before any ``reset``, returns a line that says so and changes
    nothing; a non-``str`` argument (the JSON value the model wrote) is played as its JSON
    text; a move ``env.step`` refuses by raising (text over the env's ``max_text_length``,
    say) returns a line naming the error and is not played (a step that raises changes
    nothing in llm_gym's envs), and the episode goes on.

    ## Observation Space

    Text. ``reset`` returns the contents of the first observation's ``history`` (the system
    prompt, when the env has one, then the user turn the env poses) joined by blank lines;
    TRL appends it to the row's last user message as is, so it starts with a blank line when
    that message already ends in text. ``act`` returns the contents of the messages the env
    added after the move (the next user turn, a tool's output) joined likewise; a move that
    ends the episode adds, after them (trailing whitespace dropped), the line ``The episode
    is over (finished|cut off at its turn limit): this move's reward is R, the episode's
    return G.``

    ## Rewards

    ``get_reward()`` is the episode's return: the sum of its steps' rewards (``0.0`` until
    a move is made; an episode the model never finished keeps what it earned).

    ## Starting State

    ``reset(**row)`` gets the dataset row (TRL passes every column, ``prompt`` included) and
    reads two columns, ignoring the others (TRL hands them to reward functions):

    - ``seed`` (an int ≥ 0, or None): ``env.reset(seed=seed)``, so rows with one seed play
      one episode: a task env's question (its order for that seed), a game's deal. TRL
      repeats each row ``num_generations`` times, so give rows a seed for a GRPO group to
      share its episode; without one, each instance goes on with its own env's stream
      (unseeded: a group's rollouts see different episodes).
    - ``item`` (a dict, or None): ``options={"item": item}``, the episode's item
      for envs that take one (task envs: the task's fields, such as ``query`` and
      ``answer``; TextArena: ``query`` (the game) and ``game_seed``).

    Without a ``train_dataset`` TRL makes rows of an empty prompt only: each reset is then
    unseeded.

    ## Episode End

    The env's: ``terminated`` or ``truncated`` (``max_turns``) ends it; later moves are
    refused as above. TRL ends a rollout when the model stops calling tools, at
    ``max_tool_calling_iterations`` or when a reply would overflow
    ``max_completion_length`` (TRL then drops the reply from the completion, but the move
    was made and its reward counts).

    ## Example

    >>> Guess = environment_factory("LLMChat-TextArena-v0", game="GuessTheNumber-v0")
    >>> env = Guess()
    >>> print(env.reset(seed=3)[:58])
    [GAME] You are Player 0. You are playing Guess The Number.
    >>> env.act("[10]")
    '[GAME] The target number is higher.'
    >>> print(env.act("[12]"))
    The episode is over (finished): this move's reward is 1.0, the episode's return 1.0.
    >>> env.get_reward()
    1.0
    >>> print(env.act("[13]"))
    The episode is over (return 1.0): this move was not played. Stop calling act.
    """

    env_id: ClassVar[str]
    env_args: ClassVar[Mapping[str, object]]

    def __init__(self) -> None:
        if "env_id" not in dir(type(self)):
            raise TypeError(
                "TRLEnvironment plays one env id: make its class with "
                "llm_gym.integrations.trl.environment_factory(env_id, **env_args)"
            )
        self._env = gym.make(self.env_id, **self.env_args)
        self._started = self._done = False
        self._return = 0.0

    @property
    def env(self) -> gym.Env:
        """The Gymnasium env this instance plays."""
        return self._env

    def reset(self, **row: object) -> str:
        """Start an episode from a dataset row (``seed`` and ``item`` columns, see the
        class) and return its opening text, which TRL appends to the last user message."""
        seed = check_int("reset's row column 'seed'", row.get("seed"), 0, optional=True)
        item = row.get("item")
        if item is not None and not isinstance(item, Mapping):
            raise TypeError(
                "reset's row column 'item' must be a dict of the env's item fields (or "
                f"None), got {type(item).__name__}: {item!r:.80}"
            )
        options = None if item is None else {"item": dict(item)}
        observation, _ = self._env.reset(seed=seed, options=options)
        history = self._history(observation, "reset")
        self._started, self._done, self._return = True, False, 0.0
        text = "\n\n".join(message["content"] for message in history)
        return _separator(row.get("prompt")) + text

    def act(self, text: str) -> str:
        """Take your turn in the environment: send your move and read what it says back.

        Each call is one move of the episode. When the episode ends, the reply says so and
        gives your reward; after that, moves are not played.

        Args:
            text: Your move, exactly as the environment should read it (an answer, a game
                move such as [5], a code block, ...).

        Returns:
            The environment's reply: its next message, or how the episode ended.
        """
        if not self._started:
            return "No episode is running: reset() starts one. This move was not played."
        if self._done:
            return (
                f"The episode is over (return {_number(self._return)}): this move was not "
                "played. Stop calling act."
            )
        if not isinstance(text, str):  # TRL passes the JSON value the model wrote
            text = json.dumps(text, ensure_ascii=False, default=str)
        try:
            observation, reward, terminated, truncated, _ = self._env.step(text)
        except Exception as error:  # any text is a move: never an exception out of a tool
            # A step that raises changes nothing in llm_gym's envs: the episode goes on.
            return (
                f"The environment refused this move ({type(error).__name__}: {str(error):.300}). "
                "It was not played: make another move."
            )
        history = self._history(observation, "step")
        self._return += float(reward)
        last = max((i for i, m in enumerate(history) if m["role"] == "assistant"), default=-1)
        reply = "\n\n".join(message["content"] for message in history[last + 1 :])
        if not (terminated or truncated):
            return reply or "The environment has nothing to add: make your next move."
        self._done = True
        how = "finished" if terminated else "cut off at its turn limit"
        end = (
            f"The episode is over ({how}): this move's reward is {_number(float(reward))}, "
            f"the episode's return {_number(self._return)}."
        )
        return f"{reply.rstrip()}\n\n{end}" if reply.strip() else end

    def get_reward(self) -> float:
        """The episode's return: the sum of its rewards so far (``0.0`` before any move)."""
        return self._return

    def _history(self, observation: Mapping[str, object], call: str) -> Sequence[Mapping[str, str]]:
        history = observation.get("history") if isinstance(observation, Mapping) else None
        if not isinstance(history, Sequence):
            raise ValueError(
                f"{self.env_id}'s {call} observation has no 'history' to read text from (keys "
                f"{list(observation) if isinstance(observation, Mapping) else observation!r:.80}"
                "): drop input_mode from env_args, or pass observation_keys with 'history'"
            )
        return history


def _separator(prompt: object) -> str:
    # TRL appends reset's text to the row's last user message as is.
    if isinstance(prompt, Sequence) and not isinstance(prompt, str) and prompt:
        content = prompt[-1].get("content") if isinstance(prompt[-1], Mapping) else None
        if isinstance(content, str) and content and not content[-1].isspace():
            return "\n\n"
    return ""


def _number(value: float) -> str:
    return repr(round(value, 6))
