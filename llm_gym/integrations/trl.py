"""Train with TRL's ``GRPOTrainer`` on any llm_gym env: a ``rollout_func`` and its reward
(docs/integrations.md, "TRL's GRPOTrainer on any llm_gym env", tells what they return,
with an example).
The rollout samples with the trainer's own generator: TRL's vLLM (server or colocate mode)
when the trainer has ``use_vllm=True``, else the trainer's model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch

from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.samplers import Sample, check_token_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    from llm_gym.policies import Policy

__all__ = ["EnvRollout", "TRLVLLMSampler", "env_reward_func", "make_rollout_func"]


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


def make_rollout_func(env_id: str, *, seed: int = 0, **env_kwargs: object) -> EnvRollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays ``env_id`` (made with
    ``env_kwargs``; the first batch's questions come from ``seed``)."""
    return EnvRollout(env_id, seed=seed, **env_kwargs)


class EnvRollout:
    """``make_rollout_func``'s: one episode per prompt, all prompts' turns batched per turn."""

    def __init__(self, env_id: str, *, seed: int = 0, **env_kwargs: object) -> None:
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
                model, tokenizer, input_mode="tokens",
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
