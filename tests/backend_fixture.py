"""What the backend tests share: prompts, the fp32 tolerance README states, and the processes
of vLLM servers (to show that none is left behind). The test run's one server of the default
model is conftest's ``vllm_default``."""

import os
import time

import numpy as np

from llm_gym.samplers import find_vllm_python

FP32_TOLERANCE = 1e-3  # README's: sampler vs scorer log-probs in fp32 (measured: 3e-5)
QUESTIONS = ("What is 2 + 3?", "Name a colour.", "What is 2 + 3?")


def prompts_for(tokenizer, questions=QUESTIONS):
    return [
        np.asarray(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]  # fmt: skip
        )
        for q in questions
    ]


def server_processes() -> dict[int, str]:
    """Every process of a vLLM server (its interpreter's or named ``VLLM::``): pid -> name."""
    python = str(find_vllm_python())
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if command.startswith(python) or command.startswith("VLLM::"):
            found[int(entry)] = command[:120]
    return found


def wait_gone(pids, seconds=20.0) -> dict[int, str]:
    """The processes among ``pids`` still there after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        left = {pid: name for pid, name in server_processes().items() if pid in pids}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
