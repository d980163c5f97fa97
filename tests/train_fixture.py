"""What the training tests share: the command line of a small run of the tiny model, and
torch's thread count put back after each test (its ``--threads 1`` sets it in-process)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def train_args(model, out, *extra):
    return [
        "train", "--model", model, "--out", str(out),
        "--env-arg", "task=chain_sum",
        "--iterations", "2", "--groups", "2", "--group-size", "2",
        "--max-new-tokens", "4", "--eval-episodes", "4", "--save-every", "1",
        "--threads", "1", "--no-progress", *extra,
    ]  # fmt: skip
