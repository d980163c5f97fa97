"""Per-turn overhead of ``LLMChat-GSM8K-v0`` (reset + step, no model) against TorchRL's,
and the vector env's step against one bare forward of the model on its N conversations.

A turn is one episode of the single-turn task: a reset (draw a question, build the prompt)
and a step (append the response, score it). Both libraries get the same GSM8K test
questions in file order and the same prebuilt responses (half right, half wrong), so only
the environments are timed; building TorchRL's action tensordict is left out of its time.

Layouts: a single env, and N conversations at once (llm_gym's native vector env with
SAME_STEP autoreset; TorchRL's GSM8KEnv with ``batch_size=(N,)``). Modes: history, tokens.

TorchRL is not a dependency of llm_gym: unless ``--no-install`` is given, a missing torchrl is
installed with ``pip install torchrl tensordict torch==<the installed torch>`` so that pip
cannot swap torch for another build.

The last column prices the env where a trainer meets it: one vector step (scoring N answers,
resetting N sub-envs: rendering and tokenizing N new prompts) over one forward of the model
(``--device``, ``--dtype``) on the N prompts + responses of that step (target <= 0.20 at
N=128 on a GPU; on a CPU the forward is compute-bound and the ratio is far below).

Usage::

    python scripts/bench_env.py [--data-dir DIR] [--turns 512] [--num-envs 32] [--repeats 5]
        [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

import llm_gym  # noqa: F401  (registers LLMChat-GSM8K-v0)
from llm_gym import Response
from llm_gym.lm import left_pad
from llm_gym.lm.loading import load_default_model
from llm_gym.run.setup import DTYPES, resolve_device, resolve_dtype
from llm_gym.sources import IterableSource

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import describe, ensure_torchrl, synchronize  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"


def median_per_turn(run: Callable[[], int], repeats: int) -> float:
    """Median over ``repeats`` runs of seconds per turn; ``run`` returns its turns."""
    run()  # warm-up: caches, lazy imports, first allocations
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        turns = run()
        times.append((time.perf_counter() - start) / turns)
    return statistics.median(times)


# -- llm_gym --------------------------------------------------------------------------


def llm_gym_single(mode, tokenizer, rows, responses, data_dir, turns):
    env = gym.make(
        "LLMChat-GSM8K-v0",
        data_dir=data_dir,
        split="test",
        shuffle=False,
        input_mode=mode,
        tokenizer=tokenizer if mode == "tokens" else None,
    )
    env.reset(seed=0)
    env.unwrapped.reset_dataloader()
    position = [0]

    def run():
        for _ in range(turns):
            env.reset()
            env.step(responses[position[0] % len(rows)])
            position[0] += 1
        return turns

    return run


def llm_gym_vector(mode, tokenizer, rows, responses, num_envs, turns):
    # A dataloader-style source is one stream shared by the sub-envs, so the questions come
    # in TorchRL's batched order: 0..N-1, then N..2N-1, ...
    envs = gym.make_vec(
        "LLMChat-GSM8K-v0",
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        dataset=IterableSource(rows),
        input_mode=mode,
        tokenizer=tokenizer if mode == "tokens" else None,
    )
    envs.reset(seed=0)
    position = [num_envs]
    steps = max(1, turns // num_envs)

    def run():
        for _ in range(steps):
            start = position[0] - num_envs
            envs.step([responses[(start + i) % len(rows)] for i in range(num_envs)])
            position[0] += num_envs
        return steps * num_envs

    return run


def forward_time(model, tokenizer, rows, responses, num_envs, repeats) -> float:
    """Median seconds of one bare forward on the first ``num_envs`` prompts + responses."""
    env = gym.make(
        "LLMChat-GSM8K-v0", dataset=IterableSource(rows), input_mode="tokens", tokenizer=tokenizer
    )
    env.reset(seed=0)
    env.unwrapped.reset_dataloader()
    sequences = [
        np.concatenate([env.reset()[0]["tokens"], responses[i].tokens]) for i in range(num_envs)
    ]
    ids, mask = left_pad(sequences, tokenizer.pad_token_id or 0, model.device)
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        synchronize(model.device)
        start = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask.long(), use_cache=False)
        synchronize(model.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


# -- TorchRL --------------------------------------------------------------------------


def torchrl_env(mode, tokenizer, data_dir, num_envs):
    import datasets
    import tensordict
    from torch.utils.data import DataLoader
    from torchrl.envs import StepCounter
    from torchrl.envs.llm import GSM8KEnv
    from torchrl.envs.llm.datasets.gsm8k import _collate_fn
    from torchrl.envs.llm.reward.gsm8k import GSM8KRewardParser

    tensordict.set_list_to_stack(True).set()  # TorchRL's LLM envs require it
    # GSM8KEnv itself loads from the Hub; offline, TorchRL's documented route is
    # from_dataloader plus the two transforms GSM8KEnv.__init__ appends.
    data = datasets.load_dataset("json", data_files=str(Path(data_dir) / "test.jsonl"))["train"]
    loader = DataLoader(data, batch_size=1, shuffle=False, collate_fn=_collate_fn)
    env = GSM8KEnv.from_dataloader(
        loader,
        batch_size=(num_envs,),
        input_mode=mode,
        tokenizer=tokenizer if mode == "tokens" else None,
    )
    env.append_transform(StepCounter(max_steps=1))
    env.append_transform(GSM8KRewardParser(tokenizer=tokenizer if mode == "tokens" else None))
    return env


def torchrl_run(mode, tokenizer, responses, data_dir, num_envs, turns):
    from torchrl.data.llm.history import History

    env = torchrl_env(mode, tokenizer, data_dir, num_envs)
    n_rows = len(responses)
    position = [0]
    rounds = max(1, turns // num_envs)

    def act(td):
        batch = [responses[(position[0] + i) % n_rows] for i in range(num_envs)]
        if mode == "history":
            reply = History(
                role=["assistant"] * num_envs,
                content=[r.text for r in batch],
                batch_size=(num_envs,),
            ).unsqueeze(-1)
            td["history"].full = td["history"].prompt.extend(reply, inplace=False, dim=-1)
            td["history"].response = reply
        else:
            prompts = td["tokens"].prompt
            pairs = zip(prompts, batch, strict=True)
            full = [torch.cat([p, torch.as_tensor(r.tokens)]) for p, r in pairs]
            td["tokens"].full = full[0].unsqueeze(0) if num_envs == 1 else full
        return td

    def run():
        elapsed = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            td = env.reset()
            elapsed += time.perf_counter() - start
            td = act(td)  # the policy's work, not the env's: not timed
            start = time.perf_counter()
            env.step(td)
            elapsed += time.perf_counter() - start
            position[0] += num_envs
        run.elapsed = elapsed
        return rounds * num_envs

    return run


def torchrl_per_turn(run: Callable[[], int], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        turns = run()
        times.append(run.elapsed / turns)
    return statistics.median(times)


# -- main -----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_dir = os.environ.get("LLM_GYM_GSM8K_PATH", str(DEFAULT_DATA))
    parser.add_argument("--data-dir", default=default_dir, help="folder with test.jsonl")
    parser.add_argument("--turns", type=int, default=512, help="turns per timed run")
    parser.add_argument("--torchrl-turns", type=int, default=64, help="TorchRL turns per run")
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs; the median counts")
    parser.add_argument("--modes", nargs="+", default=["history", "tokens"])
    parser.add_argument("--no-install", action="store_true", help="never pip-install torchrl")
    parser.add_argument("--no-torchrl", action="store_true", help="time llm_gym only")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = parser.parse_args()

    torchrl_version = None if args.no_torchrl else ensure_torchrl(not args.no_install)
    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    # SmolLM2's tokenizer and ChatML template, offline; the model prices the env step.
    model, tokenizer = load_default_model(device=device, dtype=dtype)
    with open(Path(args.data_dir) / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    responses = []
    for i, row in enumerate(rows):
        truth = row["answer"].rpartition("#### ")[2].strip()
        answer = truth if i % 2 == 0 else truth + "1"
        text = f"<think>Working it out step by step.</think> <answer>{answer}</answer><|im_end|>"
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        responses.append(Response(text, ids))

    print(f"{describe(device, dtype)}, torchrl {torchrl_version or 'not available'}")
    print(f"{len(rows)} GSM8K test questions from {args.data_dir}; median of {args.repeats} runs")
    header = (
        f"{'mode':8} {'layout':10} {'llm_gym us/turn':>16} {'TorchRL us/turn':>16} {'ratio':>8} "
        f"{'step/forward':>12}"
    )
    forward = forward_time(model, tokenizer, rows, responses, args.num_envs, args.repeats)
    print(header)
    print("-" * len(header))
    torchrl_single: dict[str, float] = {}
    for mode in args.modes:
        for num_envs in (1, args.num_envs):
            if num_envs == 1:
                run = llm_gym_single(mode, tokenizer, rows, responses, args.data_dir, args.turns)
            else:
                run = llm_gym_vector(mode, tokenizer, rows, responses, num_envs, args.turns)
            ours = median_per_turn(run, args.repeats)
            theirs, note = None, ""
            if torchrl_version is not None:
                turns = max(args.torchrl_turns, num_envs * 2)
                try:
                    run = torchrl_run(mode, tokenizer, responses, args.data_dir, num_envs, turns)
                    theirs = torchrl_per_turn(run, args.repeats)
                    torchrl_single.setdefault(mode, theirs)
                except Exception as error:  # report TorchRL's failure, keep benchmarking
                    note = f"  * TorchRL N={num_envs} failed ({type(error).__name__}: "
                    note += f"{str(error)[:60]}...); compared with its single env"
                    theirs = torchrl_single.get(mode)
            ratio = f"{ours / theirs:8.4f}" if theirs else f"{'-':>8}"
            theirs_text = f"{theirs * 1e6:16.1f}" if theirs else f"{'-':>16}"
            layout = "single" if num_envs == 1 else f"vector {num_envs}"
            per_forward = f"{ours * num_envs / forward:12.4f}" if num_envs > 1 else f"{'':12}"
            print(
                f"{mode:8} {layout:10} {ours * 1e6:16.1f} {theirs_text} {ratio} {per_forward}"
                f"{note}",
                flush=True,
            )
    print("ratio = llm_gym / TorchRL per-turn time (target <= 0.05, i.e. 1/20)")
    print(
        f"step/forward = one vector step of N={args.num_envs} / one bare forward of its "
        f"{args.num_envs} prompts + responses ({forward * 1e3:.1f} ms; target <= 0.20 on a GPU)"
    )


if __name__ == "__main__":
    main()
