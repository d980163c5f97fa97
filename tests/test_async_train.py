"""Training that overlaps sampling: the staleness bound, versions on every episode, the loss
against the sampling version's log-probs, ``llm-gym train --async`` end to end with resume,
and the options' errors."""

import functools
import json

import numpy as np
import pytest
import torch

from llm_gym.chat import Response
from llm_gym.cli import main
from llm_gym.envs import DatasetChatEnv
from llm_gym.episodes import AsyncEpisodes
from llm_gym.run.config import RolloutConfig
from llm_gym.train import GRPOConfig
from llm_gym.train.loss import sampled
from llm_gym.train.pipeline import AsyncBatches, staleness

ROWS = [{"query": f"question {i}?"} for i in range(40)]


class VersionedPolicy:
    """Answers with the version the test last published, as a sampler reports its weights'."""

    input_mode = "history"

    def __init__(self):
        self.version = 0

    def __call__(self, obs):
        return [Response("ok", tokens=[5], log_probs=[-1.0], version=self.version)
                for _ in obs["history"]]  # fmt: skip


def batches(max_staleness, timeout=30.0):
    policy = VersionedPolicy()
    driver = AsyncEpisodes(functools.partial(DatasetChatEnv, ROWS), 2, policy, seed=0)
    return AsyncBatches(driver, 4, max_staleness, timeout=timeout), driver, policy


def test_a_batch_is_sampled_ahead_but_never_more_than_max_staleness_updates():
    pipeline, driver, policy = batches(max_staleness=1)
    try:
        first = pipeline.next(0)[0]
        ahead = pipeline.next(1)[0]  # before update 0 is published: sampled ahead by one
        assert staleness(first, 0, 1) == 0 and staleness(ahead, 1, 1) == 1
        for iteration in range(4):
            records = (first, ahead)[iteration] if iteration < 2 else pipeline.next(iteration)[0]
            positions = [r["sample_index"] for r in records]
            assert positions == list(range(4 * iteration, 4 * iteration + 4))
            assert all(len(r["versions"]) == 1 for r in records)  # every turn carries one
            assert staleness(records, iteration, update_epochs=1) <= 1
            policy.version = iteration + 1  # the update reaches the sampler, then is published
            pipeline.publish(iteration)
    finally:
        pipeline.close()
        driver.close()


def test_with_max_staleness_0_nothing_is_sampled_before_the_update():
    pipeline, driver, policy = batches(max_staleness=0, timeout=1.0)
    try:
        assert staleness(pipeline.next(0)[0], 0, 1) == 0
        with pytest.raises(TimeoutError, match="no batch of episodes within 1 s"):
            pipeline.next(1)  # batch 1 waits for update 0, which never comes
    finally:
        pipeline.close()
        driver.close()


def test_staleness_needs_every_turns_version():
    with pytest.raises(ValueError, match="must carry its version"):
        staleness([{"versions": [3, None]}], 4, 1)
    assert staleness([{"versions": [4, 6]}, {"versions": [7]}], 4, update_epochs=2) == 2


def test_sampled_log_probs_fill_the_policy_tokens_in_order():
    mask = torch.tensor([[False, True, True, False], [True, False, False, False]])
    old = sampled(mask, [np.array([-0.5, -1.5]), np.array([-2.0])])
    assert old.tolist() == [[0.0, -0.5, -1.5, 0.0], [-2.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="response 1 has 1 policy tokens but 2 sampled"):
        sampled(mask, [np.array([-0.5, -1.5]), np.array([-2.0, -1.0])])


def train_args(model, out, *extra):
    return [
        "train", "--model", model, "--out", str(out), "--env-arg", "task=chain_sum",
        "--iterations", "3", "--groups", "2", "--group-size", "2", "--max-new-tokens", "4",
        "--eval-episodes", "2", "--save-every", "1", "--threads", "1", "--no-progress",
        "--async", *extra,
    ]  # fmt: skip


def test_train_async_bounds_staleness_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert main(train_args(tiny_dir, out)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert 0 <= row["staleness"] <= 1  # --max-staleness 1, the default
        assert all(row["iteration"] - 1 <= v <= row["iteration"] for v in row["versions"])
        assert np.isfinite(row["loss"]) and row["response_tokens"] == 4.0
    assert rows[0]["staleness"] == 0 and rows[0]["versions"] == [0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["asynchronous"] is True and summary["config"]["max_staleness"] == 1
    assert main(train_args(tiny_dir, out, "--resume", "--iterations", "4")) == 0
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3] and resumed[:3] == rows
    assert resumed[3]["versions"][0] >= 2  # sampled by the resumed weights, or later


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--workers", "2"], "workers=2 (--workers) are Ray actors: pass ray_address (--ray)"),
        (["--curriculum", "4"], "curriculum (--curriculum) is not supported with the asynch"),
        (["--kl-coef", "0.1"], "kl_coef > 0 is not supported with --async/--ray training"),
    ],
)
def test_bad_async_options_get_one_line(tiny_dir, tmp_path, capsys, extra, message):
    assert main(train_args(tiny_dir, tmp_path / "bad", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unreachable_ray_cluster_is_one_line_not_a_hang(tiny_dir, tmp_path, capsys):
    args = train_args(tiny_dir, tmp_path / "ray", "--ray", "127.0.0.1:1")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Ray cluster at --ray 127.0.0.1:1" in err and "refused" in err


def test_max_staleness_must_be_a_count():
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0, got -1"):
        GRPOConfig(max_staleness=-1)
    assert RolloutConfig(ray_address="auto").asynchronous is True  # Ray's workers are async
