"""A CleanRL-style GRPO loop on ``LLMChat-GSM8K-v0``: plain Gymnasium, one file, no trainer.

Each iteration: the native vector env holds ``--groups`` GSM8K questions, each asked
``--group-size`` times side by side (``repeats=G, group_repeats=True``); ``TransformersPolicy``
samples one response per sub-env in one batch (generate mode, with the exact tokens and their
log-probs); the env scores them; advantages are group-relative, ``(r - mean_g) / (std_g +
eps)``; ``get_dist(mask="prompt")`` re-scores the responses with gradients; the loss is GRPO's
clipped surrogate, averaged over each response's tokens. SAME_STEP autoreset hands back the
next questions in the same ``step``, so no generation is wasted.

Usage::

    python scripts/cleanrl_loop.py --model default --iterations 20       # SmolLM2-135M
    python scripts/cleanrl_loop.py --model tiny --iterations 2           # random 2-layer LM
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch

import llm_gym  # noqa: F401  (registers LLMChat-GSM8K-v0)
from llm_gym import TransformersPolicy
from llm_gym.models import load_gpt2_tokenizer, load_model, tiny_model


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default", help="'default', 'tiny' or a folder")
    parser.add_argument("--data-dir", default=None, help="GSM8K folder (else $LLM_GYM_GSM8K_PATH)")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--groups", type=int, default=2, help="questions per iteration")
    parser.add_argument("--group-size", type=int, default=4, help="responses per question")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--update-epochs", type=int, default=1, help="updates per batch")
    parser.add_argument("--clip-coef", type=float, default=0.2)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def group_advantages(rewards: np.ndarray, group_size: int, eps: float = 1e-4) -> np.ndarray:
    """GRPO's advantages: each reward standardized within its group of ``group_size``."""
    groups = rewards.reshape(-1, group_size)
    mean, std = groups.mean(1, keepdims=True), groups.std(1, keepdims=True)
    return ((groups - mean) / (std + eps)).reshape(-1)


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
) -> torch.Tensor:
    """GRPO's clipped surrogate: per token, averaged over each response, then over responses.

    ``log_probs``/``old_log_probs``/``mask`` are ``(B, T)``; ``advantages`` is ``(B,)``.
    """
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_coef, 1 + clip_coef) * adv)
    per_response = (surrogate * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return -per_response.mean()


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run the loop; return one dict of statistics per iteration."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.model == "tiny":
        tokenizer = load_gpt2_tokenizer()
        model = tiny_model(tokenizer, seed=args.seed)
    else:
        model, tokenizer = load_model(args.model)
    n_envs = args.groups * args.group_size
    envs = gym.make_vec(
        "LLMChat-GSM8K-v0",
        num_envs=n_envs,
        vectorization_mode="vector_entry_point",
        data_dir=args.data_dir,
        repeats=args.group_size,
        group_repeats=True,
        seed=args.seed,
    )
    sampler = TransformersPolicy(
        model,
        tokenizer,
        generate_kwargs={
            "max_new_tokens": args.max_new_tokens,
            "do_sample": True,
            "temperature": args.temperature,
        },
    )
    scorer = sampler.get_new_version(generate=False)  # same model object: it is trained
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    stats = []
    obs, _ = envs.reset(seed=args.seed)
    for iteration in range(args.iterations):
        start = time.perf_counter()
        model.eval()
        responses = sampler(obs)  # one Response per sub-env, sampled in one batch
        next_obs, rewards, _, _, info = envs.step(responses)
        advantages = torch.as_tensor(
            group_advantages(rewards, args.group_size), dtype=torch.float32
        )

        for _ in range(args.update_epochs):
            dist, ids = scorer.get_dist(obs, responses, mask="prompt")
            log_probs = dist.log_prob(ids)  # (B, T): response tokens only, 0 elsewhere
            mask = dist.mask
            old = torch.zeros_like(log_probs)
            for row, response in enumerate(responses):  # responses end each left-padded row
                n = len(response.log_probs)
                old[row, ids.shape[1] - n :] = torch.as_tensor(response.log_probs)
            loss = grpo_loss(log_probs, old, mask, advantages, args.clip_coef)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()

        with torch.no_grad():  # how far the sampler's log-probs are from the re-scored ones
            logprob_gap = ((log_probs - old).abs() * mask).sum() / mask.sum().clamp(min=1)
        row = {
            "iteration": iteration,
            "reward": float(rewards.mean()),
            "success": float(np.mean(info["final_info"]["success"])),
            "loss": loss.item(),
            "response_tokens": float(np.mean([len(r.tokens) for r in responses])),
            "logprob_gap": float(logprob_gap),
            "seconds": time.perf_counter() - start,
        }
        stats.append(row)
        print(
            " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
        )
        obs = next_obs  # SAME_STEP autoreset: the next questions' prompts
    envs.close()
    return stats


if __name__ == "__main__":
    main()
