"""A short ChatEnv demo: the default model answers a few GSM8K questions in tokens mode.

Run: ``.venv/bin/python scripts/chat_demo.py [--n 3] [--max-new-tokens 96]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import numpy as np
import torch

import llm_gym
from llm_gym.models import load_default_model

SYSTEM = "You are a helpful assistant. Solve the problem, then give the final number."


def gsm8k_questions(n: int) -> list[str]:
    folder = Path(
        os.environ.get("LLM_GYM_GSM8K_PATH", Path(__file__).parents[2] / "shared/data/gsm8k")
    )
    with open(folder / "test.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["question"] for line in itertools.islice(f, n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()

    model, tokenizer = load_default_model()
    env = llm_gym.ChatEnv(
        "tokens",
        tokenizer=tokenizer,
        system_prompt=SYSTEM,
        max_turns=1,
        observation_keys=("tokens", "history"),
    )
    for question in gsm8k_questions(args.n):
        obs, _ = env.reset(options={"query": question})
        prompt = torch.as_tensor(obs["tokens"])[None]
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False)
        sampled = out[0, prompt.shape[1] :].numpy().astype(np.int64)
        text = tokenizer.decode(sampled, skip_special_tokens=True)
        obs, reward, terminated, truncated, _ = env.step(llm_gym.Response(text, sampled))
        print(
            f"Q: {question}\nA: {obs['history'][-1]['content']}\n"
            f"   ({len(sampled)} tokens, terminated={terminated})\n"
        )


if __name__ == "__main__":
    main()
