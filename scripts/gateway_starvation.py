"""How long a second agent waits for a 2-token reply while another agent's ``max_tokens:
1000000000`` request runs on the gateway: the default model, transformers, this machine's
CPU. Prints the seconds, or that no reply came within ``--cap``, beside the same
reply's seconds on an idle gateway measured first in the same run, and their ratio.

    python scripts/gateway_starvation.py [--cap 60] [--threads 1] [--chunk-tokens 16]

``--chunk-tokens 0`` samples each reply in one call (``chunk_tokens=None``): the long request
then holds the sampler until its whole reply is sampled.
"""

import argparse
import threading
import time

import httpx
import openai
import torch

from llm_gym.agents import Gateway
from llm_gym.lm.loading import load_default_model
from llm_gym.policies import TransformersPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=60.0, help="seconds to wait at most")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--chunk-tokens", type=int, default=16, help="0: no chunks")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_default_model()
    kwargs = {"max_new_tokens": 16, "do_sample": True, "temperature": 1.0}
    policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    chunk = args.chunk_tokens or None
    with Gateway(policy, tokenizer, model_name="policy", chunk_tokens=chunk) as gateway:
        count = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy counting goes on: no end-of-text
        huge = {"model": "policy", "prompt": count, "max_tokens": 10**9, "temperature": 0}

        def hog() -> None:  # gives up a little after the second agent's cap
            try:
                httpx.post(f"{gateway.url}/v1/completions", json=huge, timeout=args.cap + 5,
                           headers={"Authorization": "Bearer hog"})  # fmt: skip
            except httpx.TimeoutException:
                pass

        second = openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key="second", max_retries=0, timeout=args.cap
        )

        def reply_seconds() -> float:
            started = time.perf_counter()
            second.completions.create(model="policy", prompt="1 + 1 =", max_tokens=2)
            return time.perf_counter() - started

        reply_seconds()  # warm-up
        idle = reply_seconds()
        print(f"second agent's 2-token reply, idle gateway (baseline): {idle:.2f} s")
        thread = threading.Thread(target=hog, daemon=True)
        thread.start()
        time.sleep(2.0)  # the huge request is sampling
        try:
            busy = reply_seconds()
            print(f"second agent's 2-token reply beside max_tokens 1e9: {busy:.2f} s "
                  f"(ratio to idle: {busy / idle:.1f}x)")  # fmt: skip
        except openai.APITimeoutError:
            print(f"second agent's 2-token reply beside max_tokens 1e9: none within "
                  f"{args.cap:g} s (ratio to idle: over {args.cap / idle:.0f}x)")  # fmt: skip
        thread.join()


if __name__ == "__main__":
    main()
