"""The gateway's cost: the same agent through ``llm_gym.agents.Gateway``
(the official ``openai`` SDK over HTTP on loopback) against the same calls made on the
sampler directly, at 1 and at 64 agents at once.

Each agent, in a process of its own apart from the gateway's (all agents share one), plays
``--turns`` calls of one conversation: the question, then "Go on." after
each reply (so every call after the first continues the one before, token for token). Every
reply is exactly ``--tokens`` tokens (``min_new_tokens`` = ``max_new_tokens``), so both ways
generate the same number of tokens and their seconds compare directly.

- ``direct``: what a hand-written loop does without a server: ``PromptBuilder`` starts and
  extends the conversations (token-in, token-out) and ``sampler.sample`` takes every agent's
  prompt of a turn in one batch.
- ``gateway``: one thread per agent in the agents' process, each calling
  ``/v1/chat/completions`` with the SDK; the gateway batches the calls in flight and records
  each one.

Reported: tokens/s both ways and their ratio; per call, the gateway's own latency: the
client's seconds less the wait for the sampler (a batch before its own, ``x-queue-seconds``)
and its batch's sampling (``x-sampling-seconds``), p50 and p99. Goals: at most 5% throughput
lost, at most 2 ms p50 added per call.

Run (offline; about 3 minutes on 2 cores)::

    .venv/bin/python scripts/bench_gateway.py
    .venv/bin/python scripts/bench_gateway.py --agents 1,64 --turns 4 --tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import openai
import torch

from llm_gym.agents import Gateway
from llm_gym.chat.conversation import PromptBuilder
from llm_gym.chat.history import History
from llm_gym.lm.loading import load_default_model
from llm_gym.policies import TransformersPolicy

FOLLOW_UP = {"role": "user", "content": "Go on."}


def questions(count: int) -> list[str]:
    return [f"What is {i} + {2 * i + 1}? Explain step by step." for i in range(count)]


def direct(policy: TransformersPolicy, tokenizer, agents: int, turns: int) -> dict:
    builder = PromptBuilder(tokenizer, need_tokens=True)
    start = time.perf_counter()
    histories = [History([{"role": "user", "content": q}]) for q in questions(agents)]
    conversations = builder.start(histories)
    tokens = 0
    for _ in range(turns):
        samples = policy.sample([c.tokens for c in conversations])
        texts = builder.codec.decode_many([s.tokens for s in samples], skip_special_tokens=False)
        extended = []
        for conversation, sample, text in zip(conversations, samples, texts, strict=True):
            end = builder.codec.end_of_turn(sample.tokens)
            said = text[: -len(end)] if end and text.endswith(end) else text
            extended.append(builder.extend(conversation, said, sample.tokens, [FOLLOW_UP])[0])
            tokens += len(sample.tokens)
        conversations = extended
    return {"seconds": time.perf_counter() - start, "tokens": tokens}


def agents_process(url: str, agents: int, turns: int) -> dict:
    """The agents, in a process of their own (as agent programs are): their calls' seconds
    and the gateway's headers, as JSON on stdout."""
    latencies, added, server, tokens, errors = [], [], [], [0], []
    lock = threading.Lock()

    def agent(i: int, question: str) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=f"bench-{i}", max_retries=0)
        messages = [{"role": "user", "content": question}]
        try:
            for _ in range(turns):
                sent = time.perf_counter()
                raw = client.chat.completions.with_raw_response.create(
                    model="policy", messages=messages
                )
                seconds = time.perf_counter() - sent
                reply = raw.parse()
                waited = float(raw.headers["x-queue-seconds"])
                sampling = float(raw.headers["x-sampling-seconds"])
                with lock:
                    latencies.append(seconds)
                    added.append(seconds - waited - sampling)
                    server.append(float(raw.headers["x-gateway-seconds"]))
                    tokens[0] += reply.usage.completion_tokens
                messages += [reply.choices[0].message, FOLLOW_UP]
        except Exception as error:  # reported, not hidden
            errors.append(repr(error))

    threads = [threading.Thread(target=agent, args=(i, q)) for i, q in enumerate(questions(agents))]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "seconds": time.perf_counter() - start, "tokens": tokens[0], "latencies": latencies,
        "added": added, "server": server, "errors": errors,
    }  # fmt: skip


def through_gateway(gateway: Gateway, agents: int, turns: int) -> dict:
    command = [
        sys.executable, __file__, "--client", gateway.url, "--agents", str(agents),
        "--turns", str(turns),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    names = [f"bench-{i}" for i in range(agents)]
    result["continued"] = sum(
        1 for name in names for call in gateway.recorder.calls(name) if call.parent is not None
    )
    for name in names:
        gateway.recorder.pop(name)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--agents", default="1,64", help="comma-separated agent counts")
    parser.add_argument("--turns", type=int, default=6, help="calls per agent")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the agents' process: the URL
    args = parser.parse_args()
    if args.client:
        print(json.dumps(agents_process(args.client, int(args.agents), args.turns)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_default_model()
    sampling = {
        "max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": True,
        "temperature": 1.0,
    }  # fmt: skip
    policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=sampling)
    print(
        f"SmolLM2-135M-Instruct, float32, {torch.get_num_threads()} torch threads on "
        f"{os.cpu_count()} cores; {args.turns} calls per agent, {args.tokens} tokens a reply",
        flush=True,
    )
    rows = []
    with Gateway(policy, tokenizer, model_name="policy") as gateway:
        for agents in [int(a) for a in args.agents.split(",")]:
            # Warm-up both ways: the first batch of this size, the gateway's sampling thread
            # and its batch size.
            direct(policy, tokenizer, agents, 1)
            through_gateway(gateway, agents, 1)
            base = direct(policy, tokenizer, agents, args.turns)
            served = through_gateway(gateway, agents, args.turns)
            rows.append((agents, base, served))
            print(f"  {agents} agents done", flush=True)
    print(
        f"\n{'agents':>6} {'direct tok/s':>12} {'gateway tok/s':>13} {'ratio':>6} "
        f"{'added p50 ms':>12} {'added p99 ms':>12} {'server p50':>10} {'server p99':>10} "
        f"{'call p50 s':>10} {'continued':>9}"
    )
    goals = []
    for agents, base, served in rows:
        if served["errors"]:
            print(f"{agents:>6} gateway errors: {served['errors'][:3]}")
            continue
        direct_rate = base["tokens"] / base["seconds"]
        rate = served["tokens"] / served["seconds"]
        p50, p99 = (1000 * np.percentile(served["added"], q) for q in (50, 99))
        s50, s99 = (1000 * np.percentile(served["server"], q) for q in (50, 99))
        calls = agents * args.turns
        print(
            f"{agents:>6} {direct_rate:12.1f} {rate:13.1f} {rate / direct_rate:6.3f} "
            f"{p50:12.2f} {p99:12.2f} {s50:10.2f} {s99:10.2f} "
            f"{np.median(served['latencies']):10.3f} "
            f"{served['continued']:>4}/{calls - agents}"
        )
        goals.append((agents, 1 - rate / direct_rate, p50, s50))
    print(
        "\n(ratio: gateway tokens/s over direct; added: a call's seconds at the client (the "
        "openai SDK, HTTP, the gateway) less its wait for the sampler and its batch's "
        "sampling; server: of which the gateway's own, from the request's arrival to its "
        "reply (x-gateway-seconds); continued: calls that extended the one before token for "
        "token, of those that could)"
    )
    print(f"\n{'goal':<40} {'value':>8} {'target':>8} met")
    for agents, lost, p50, s50 in goals:
        print(f"{f'throughput lost, {agents} agents':<40} {100 * lost:7.1f}% {'<= 5%':>8} "
              f"{'yes' if lost <= 0.05 else 'NO'}")  # fmt: skip
        print(f"{f'added p50 per call, {agents} agents':<40} {p50:6.2f}ms {'<= 2 ms':>8} "
              f"{'yes' if p50 <= 2.0 else 'NO'}")  # fmt: skip
        print(f"{f'  of which the gateway, {agents} agents':<40} {s50:6.2f}ms")


if __name__ == "__main__":
    main()
