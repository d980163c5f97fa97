"""Train a tiny LM with stable-baselines3 PPO, token by token, on a verifiable copy task.

The task is a ``DatasetChatEnv`` over a generated dataset: the user says ``"Repeat: 7"``
and the exact answer is ``"7"`` followed by the end of turn. ``TokenEnv`` turns it into one
token per step (ChatML prompt, a 44-token character-level tokenizer so that a CPU trains it in
about a minute); ``LLMActorCriticPolicy`` puts a 2-layer random-weight LM
(``llm_gym.lm.loading.tiny_model``) in SB3's PPO, with the actions restricted to the ten digits
and EOS (``allowed_token_ids``). Reward: 1.0 for exactly the digit, 0.1 for another single
digit, 0 otherwise; a random policy averages about 0.016. Scoring 1.0 needs the LM to read
the digit in the prompt, copy it and stop.

The mean episode reward is measured before and after training on the same evaluation
episodes (same prompts, same sampling seed), sampling actions from the policy.

Usage::

    python scripts/train_sb3_ppo.py [--timesteps 12288] [--seed 0] [--eval-episodes 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from llm_gym.envs import DatasetChatEnv, TokenEnv
from llm_gym.lm.loading import tiny_model
from llm_gym.policies.sb3 import LLMActorCriticPolicy

DIGITS = "0123456789"
SPECIAL_TOKENS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A 44-token character-level tokenizer: ChatML's markers, a-z, R, digits, space, ':', newline.

    A real fast tokenizer (ChatEnv renders and encodes with it as with any other), small
    enough that the LM head and Adam's state stay tiny on a CPU.
    """
    chars = [*"abcdefghijklmnopqrstuvwxyz", "R", *DIGITS, " ", ":", "\n"]
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>"
    )


class CopyDigitEnv(DatasetChatEnv):
    """``"Repeat: 7"`` -> ``"7"``: 1.0 for exactly the answer, 0.1 for another single digit.

    The 0.1 is GSM8K's rule (a well-formed but wrong answer earns the format reward): it
    teaches "one digit, then stop" early, and the copy is what lifts the reward to 1.0.
    """

    def _score(self, response: str, item: Any) -> tuple[float, bool, dict[str, Any]]:
        # item: the sub-env's in a vector env, None for this env's own episode
        answer = (self.item if item is None else item)["answer"]
        response = response.strip()
        success = response == answer
        reward = 1.0 if success else 0.1 if len(response) == 1 and response in DIGITS else 0.0
        return reward, True, {"success": success, "answer": answer}


def copy_dataset() -> list[dict[str, str]]:
    return [{"query": f"Repeat: {d}", "answer": d} for d in DIGITS]


def make_env(tokenizer: Any, seed: int | None = None) -> TokenEnv:
    task = CopyDigitEnv(copy_dataset(), input_mode="tokens", tokenizer=tokenizer, seed=seed)
    # The task scores a response cut at max_new_tokens as final. SB3 would bootstrap a
    # truncated episode with V(final obs) on top of that score (and learn to run out the
    # length to collect it), so the length limit is made terminal here.
    return TokenEnv(
        task,
        tokenizer=tokenizer,
        max_new_tokens=2,
        max_prompt_length=32,
        terminate_at_max_new_tokens=True,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timesteps", type=int, default=12288, help="PPO env steps (tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--n-steps", type=int, default=64, help="rollout steps per env")
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: small model)")
    parser.add_argument("--save", default=None, help="save the trained agent to this .zip")
    return parser.parse_args(argv)


def mean_reward(agent: PPO, env: Monitor, episodes: int, seed: int) -> float:
    """Mean episode reward over ``episodes`` sampled episodes from a fixed starting seed."""
    env.reset(seed=seed)
    torch.manual_seed(seed)
    rewards, _ = evaluate_policy(
        agent, env, n_eval_episodes=episodes, deterministic=False, return_episode_rewards=True
    )
    return float(np.mean(rewards))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Train; return the mean episode reward before and after, and the wall time."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = char_tokenizer()
    digits = [tokenizer.convert_tokens_to_ids(d) for d in DIGITS]
    model = tiny_model(tokenizer, seed=args.seed)
    envs = make_vec_env(
        make_env, n_envs=args.n_envs, seed=args.seed, env_kwargs={"tokenizer": tokenizer}
    )
    agent = PPO(
        LLMActorCriticPolicy,
        envs,
        n_steps=args.n_steps,
        batch_size=64,
        n_epochs=4,
        learning_rate=args.learning_rate,
        gamma=1.0,
        gae_lambda=1.0,
        ent_coef=0.0,
        seed=args.seed,
        policy_kwargs={"model": model, "allowed_token_ids": [*digits, tokenizer.eos_token_id]},
    )
    eval_env = Monitor(make_env(tokenizer, seed=10_000 + args.seed))
    before = mean_reward(agent, eval_env, args.eval_episodes, seed=10_000 + args.seed)
    start = time.perf_counter()
    agent.learn(total_timesteps=args.timesteps)
    seconds = time.perf_counter() - start
    after = mean_reward(agent, eval_env, args.eval_episodes, seed=10_000 + args.seed)
    print(f"mean episode reward before training: {before:.3f}")
    print(f"mean episode reward after training:  {after:.3f}")
    print(f"({args.timesteps} env steps in {seconds:.0f} s, {args.eval_episodes} eval episodes)")
    if args.save:
        agent.save(args.save)
    return {"before": before, "after": after, "seconds": seconds}


if __name__ == "__main__":
    main()
