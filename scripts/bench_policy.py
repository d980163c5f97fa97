"""Benchmark TransformersPolicy against bare transformers calls on the same batch.

Two ratios, on SmolLM2-135M-Instruct and 16 GSM8K test questions (GSM8K system prompt):

- generate: the policy's new tokens/s over raw ``model.generate``'s (target >= 0.95);
- log-prob mode: the policy's time to score the 16 conversations over one bare forward pass
  on the same left-padded batch (target <= 1.10).

The two sides of each ratio run interleaved (alternating which goes first) for several rounds
and the medians are compared, since a shared machine is noisy.

CUDA is synchronised around every timed call; the device and dtype are printed first.

Run: ``.venv/bin/python scripts/bench_policy.py [--rounds 7] [--max-new-tokens 64] [--threads 2]
[--n 64] [--device cuda] [--dtype bfloat16]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from llm_gym import History
from llm_gym.lm.loading import load_default_model
from llm_gym.policies import TransformersPolicy
from llm_gym.run.setup import DTYPES, resolve_device, resolve_dtype
from llm_gym.tasks import GSM8K_SYSTEM_PROMPT

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import describe, synchronize  # noqa: E402


def gsm8k_questions(n: int) -> list[str]:
    default = Path(__file__).resolve().parents[2] / "shared/data/gsm8k"
    folder = Path(os.environ.get("LLM_GYM_GSM8K_PATH", default))
    with open(folder / "test.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["question"] for line in itertools.islice(f, n)]


def left_pad(rows: list[np.ndarray], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.as_tensor(row)
        mask[i, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def interleaved(a: Callable[[], object], b: Callable[[], object], rounds: int) -> dict[str, list]:
    """Wall and CPU seconds per call of ``a`` and ``b``, alternating which runs first.

    CPU time (all threads of this process) is reported beside wall time: other processes on a
    shared machine stretch the wall time of whichever call they overlap, much less its CPU time.
    """
    a(), b()  # warm-up
    times: dict[str, list] = {"a_wall": [], "a_cpu": [], "b_wall": [], "b_cpu": []}
    for i in range(rounds):
        for fn, name in ((a, "a"), (b, "b")) if i % 2 == 0 else ((b, "b"), (a, "a")):
            synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            synchronize()
            times[f"{name}_wall"].append(time.perf_counter() - wall)
            times[f"{name}_cpu"].append(time.process_time() - cpu)
    return times


class OwnTime:
    """Seconds a policy call spends outside one model method: the adapter's own work.

    The method (``generate`` or ``forward``) is wrapped on the model instance; the time inside
    it is subtracted from the call's. Unlike a ratio of two separately timed calls, this does
    not depend on the machine being as busy during both.
    """

    def __init__(self, model: torch.nn.Module, method: str, call: Callable[[], object]) -> None:
        self.inside, self.own = 0.0, []
        inner = getattr(model, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.inside += time.perf_counter() - start

        setattr(model, method, timed)
        self._call = call

    def __call__(self) -> None:
        self.inside, start = 0.0, time.perf_counter()
        self._call()
        self.own.append(time.perf_counter() - start - self.inside)


def compare_greedy(
    raw: torch.Tensor, responses: list, eos_id: int, *, exact: bool
) -> tuple[int, int]:
    """The tokens raw ``generate`` produced (each row up to its first EOS) and how many rows
    equal the policy's ``responses``. In float32 every row must be equal: the policy then
    does raw generate's work, token for token. Below it (bf16 on a GPU), two kernels' logits
    differ by rounding, and greedy decoding follows the other branch at a near-tie; the
    benchmark still compares like with like as long as both generate about as many tokens,
    so the totals must be within 10%."""
    raw_tokens, same = 0, 0
    for row, response in zip(raw, responses, strict=True):
        ends = (row == eos_id).nonzero()
        n = int(ends[0]) + 1 if len(ends) else len(row)
        raw_tokens += n
        equal = np.array_equal(row[:n].cpu().numpy(), response.tokens)
        same += equal
        assert equal or not exact, "policy and raw generate differ in float32"
    policy_tokens = sum(len(r.tokens) for r in responses)
    assert abs(policy_tokens - raw_tokens) <= 0.1 * raw_tokens, (
        f"policy and raw generate differ in length: {policy_tokens} against {raw_tokens} tokens"
    )
    return raw_tokens, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="GSM8K questions in the batch")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    model, tokenizer = load_default_model(device=device, dtype=dtype)
    print(describe(device, dtype))
    system = {"role": "system", "content": GSM8K_SYSTEM_PROMPT}
    histories = [(system, {"role": "user", "content": q}) for q in gsm8k_questions(args.n)]
    obs = {"history": tuple(histories)}
    gen_kwargs = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    policy = TransformersPolicy(model, tokenizer, generate_kwargs=gen_kwargs)
    pad_id, eos_id = policy.pad_token_id, tokenizer.eos_token_id

    # The same left-padded prompt batch the policy builds, for raw generate.
    prompts = [
        History(h).apply_chat_template(tokenizer, add_generation_prompt=True, tokenize=True)
        for h in histories
    ]
    prompt_ids, prompt_mask = left_pad(prompts, pad_id, model.device)

    def raw_generate() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, pad_token_id=pad_id, **gen_kwargs
            )

    responses = policy(obs)
    raw = raw_generate()[:, prompt_ids.shape[1] :]
    raw_tokens, same = compare_greedy(raw, responses, eos_id, exact=dtype == torch.float32)
    if same < len(responses):
        differ = len(responses) - same
        print(f"note: {differ} of {len(responses)} greedy responses differ from raw generate's "
              f"({args.dtype}: a near-tie's argmax can flip between kernels)")  # fmt: skip
    policy_tokens = sum(len(r.tokens) for r in responses)

    policy_call = OwnTime(model, "generate", lambda: policy(obs))
    t = interleaved(policy_call, raw_generate, args.rounds)
    print(
        f"batch: {args.n} GSM8K prompts, {policy_tokens} new tokens "
        f"(greedy, at most {args.max_new_tokens} each)"
    )
    _report("generate", "policy", "raw generate", t)
    for clock in ("wall", "cpu"):
        policy_rate = policy_tokens / statistics.median(t[f"a_{clock}"])
        raw_rate = raw_tokens / statistics.median(t[f"b_{clock}"])
        print(
            f"generate throughput ({clock}): policy {policy_rate:.1f} vs raw {raw_rate:.1f} "
            f"new tok/s, ratio {policy_rate / raw_rate:.3f}, paired {1 / _paired(t, clock):.3f} "
            "(target >= 0.95)"
        )
    _report_own("generate", policy_call.own[1:], t["b_wall"])  # [0]: warm-up

    scorer = policy.get_new_version(generate=False)
    full_ids, full_mask = left_pad(
        [np.concatenate([p, r.tokens]) for p, r in zip(prompts, responses, strict=True)],
        pad_id,
        model.device,
    )

    def bare_forward() -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=full_ids, attention_mask=full_mask).logits

    scorer_call = OwnTime(model, "forward", lambda: scorer(obs, responses))
    t = interleaved(scorer_call, bare_forward, args.rounds)
    print(f"log-prob batch: {tuple(full_ids.shape)} prompt + response tokens")
    _report("log-prob", "policy", "bare forward", t)
    for clock in ("wall", "cpu"):
        ratio = statistics.median(t[f"a_{clock}"]) / statistics.median(t[f"b_{clock}"])
        print(
            f"log-prob time ratio ({clock}) policy/bare forward: {ratio:.3f}, "
            f"paired {_paired(t, clock):.3f} (target <= 1.10)"
        )
    _report_own("log-prob", scorer_call.own[1:], t["b_wall"])  # [0]: warm-up


def _report(what: str, a: str, b: str, t: dict[str, list]) -> None:
    for key, name in (("a", a), ("b", b)):
        print(f"  {what} {name:>12}: wall {_fmt(t[key + '_wall'])}; cpu {_fmt(t[key + '_cpu'])}")


def _paired(t: dict[str, list], clock: str) -> float:
    """Median over rounds of a/b: each pair ran back to back, so slow drifts cancel."""
    return statistics.median(a / b for a, b in zip(t[f"a_{clock}"], t[f"b_{clock}"], strict=True))


def _report_own(what: str, own: list[float], raw: list[float]) -> None:
    share = statistics.median(own) / statistics.median(raw)
    print(
        f"  {what} policy's own work outside the model call: {_fmt(own)} "
        f"= {100 * share:.1f}% of the bare call"
    )


def _fmt(times: list[float]) -> str:
    return f"median {statistics.median(times):.3f}s of [{', '.join(f'{t:.2f}' for t in times)}]"


if __name__ == "__main__":
    main()
