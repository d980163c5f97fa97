"""Training that overlaps sampling: the staleness bound, versions on every episode, the loss
against the sampling version's log-probs, ``llm-gym train --async`` end to end with resume,
and the options' errors."""

import copy
import functools
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from llm_gym.chat import Response
from llm_gym.cli import main
from llm_gym.envs import DatasetChatEnv
from llm_gym.episodes import AsyncEpisodes, Episode
from llm_gym.run.config import RolloutConfig
from llm_gym.train import GRPOConfig, resumed_config
from llm_gym.train.loss import at_policy_tokens
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
            positions = [e.item_index for e in records]
            assert positions == list(range(4 * iteration, 4 * iteration + 4))
            assert all(len(e.versions) == 1 for e in records)  # every turn carries one
            assert staleness(records, iteration, update_epochs=1) <= 1
            policy.version = iteration + 1  # the update reaches the sampler, then is published
            pipeline.release(iteration)
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


def played(*versions):
    return Episode([], ["ok"] * len(versions), 0.0, 0.0, {}, [], list(versions), 0)


def test_staleness_needs_every_turns_version():
    with pytest.raises(ValueError, match="must carry its version"):
        staleness([played(3, None)], 4, 1)
    assert staleness([played(4, 6), played(7)], 4, update_epochs=2) == 2


def test_sampled_log_probs_fill_the_policy_tokens_in_order():
    mask = torch.tensor([[False, True, True, False], [True, False, False, False]])
    old = at_policy_tokens(mask, [np.array([-0.5, -1.5]), np.array([-2.0])])
    assert old.tolist() == [[0.0, -0.5, -1.5, 0.0], [-2.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="response 1 has 1 policy tokens but 2 sampled"):
        at_policy_tokens(mask, [np.array([-0.5, -1.5]), np.array([-2.0, -1.0])])


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
        (["--kl-coef", "0.1", "--kl-target", "0.01", "--ray"], "kl_target (--kl-target: an adap"),
        (["--kl-coef", "0.1", "--lora-rank", "4"], "kl_coef > 0 with lora_rank under --async"),
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


# -- one curriculum and one KL coefficient for every sub-env (issue 42, item 4) -----------


def test_the_shared_curriculum_moves_with_episodes_in_the_order_they_finish():
    from llm_gym.wrappers.curriculum import LevelSchedule

    env_fn = functools.partial(gym.make, "LLMChat-Countdown-v0")
    schedule = LevelSchedule(num_levels=5, level=3, window=2, raise_at=0.8, lower_below=0.2)
    driver = AsyncEpisodes(env_fn, 3, lambda obs: ["<answer>1</answer>"] * len(obs["history"]),
                           seed=0, curriculum=schedule)  # fmt: skip
    try:
        records = [e.record() for e in driver.play(9)]
    finally:
        driver.close()
    # Every answer is wrong: each window of two finished episodes lowers the level by one,
    # and each record says the level its sample was drawn at.
    replay = LevelSchedule(num_levels=5, level=3, window=2, raise_at=0.8, lower_below=0.2)
    levels_after = []
    for record in records:
        assert record["success"] is False
        replay.record([False])
        levels_after.append(replay.level)
    assert schedule.level == replay.level == 0 and levels_after[:4] == [3, 2, 2, 1]
    assert [r["level"] for r in records[:3]] == [3, 3, 3]  # drawn before any finished
    assert all(r["level"] <= 3 for r in records) and records[-1]["level"] < 3
    assert driver.snapshot() == {"level": 0, "successes": list(schedule.successes), "kl_coef": None}


def test_the_shared_kl_controller_is_updated_per_episode_and_each_record_names_its_coef(tiny):
    from llm_gym.policies import TransformersPolicy
    from llm_gym.run.setup import kl_sub_env
    from llm_gym.wrappers import AdaptiveKLController

    model, tokenizer = tiny
    sampling = {"max_new_tokens": 3, "do_sample": True}
    policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=sampling)
    ref = TransformersPolicy(copy.deepcopy(model).requires_grad_(False), tokenizer,
                             input_mode="tokens", generate=False)  # fmt: skip
    with torch.no_grad():  # the reference differs from the policy: the KL is not 0
        for p in ref.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    controller = AdaptiveKLController(0.5, target=1e-4, horizon=4)
    make = functools.partial(gym.make, "LLMChat-ReasoningGym-v0", task="chain_sum",
                             input_mode="tokens", tokenizer=tokenizer,
                             observation_keys=("tokens", "history"))  # fmt: skip
    env_fn = functools.partial(kl_sub_env, make, ref, coef=0.5, estimator="k1",
                               kl_controller=controller)  # fmt: skip
    driver = AsyncEpisodes(env_fn, 2, policy, seed=0, kl_controller=controller)
    try:
        records = [e.record() for e in driver.play(6)]
    finally:
        driver.close()
    # The controller moved with each finished episode, in that order, from what each was
    # charged: replaying the updates gives its coefficient.
    replay = AdaptiveKLController(0.5, target=1e-4, horizon=4)
    assert records[0]["kl_coef"] == 0.5
    for record in records:
        assert record["kl_sum"] > 0
        replay.update([-record["kl_coef"] * record["kl_sum"]])
    assert controller.coef == pytest.approx(replay.coef) and controller.coef > 0.5
    assert len({r["kl_coef"] for r in records}) > 1  # later episodes were charged more
    with pytest.raises(ValueError, match="kl_controller is shared by sub-envs in this process"):
        AsyncEpisodes(env_fn, 2, policy, kl_controller=controller, ray_address="local")


def test_async_trainingkl_sub_env_and_curriculum_resumes_exactly(tiny_dir, tmp_path):
    from llm_gym.train import GRPOTrainer

    def config(out, **changes):
        values = dict(
            model=tiny_dir,
            out=str(out),
            env_args={"task": "chain_sum", "level": 2},
            curriculum=2,
            kl_coef=0.5,
            kl_target=0.01,
            learning_rate=1e-2,
            groups=2,
            group_size=2,
            max_new_tokens=4,
            eval_episodes=0,
            iterations=4,
            save_every=2,
            progress=False,
            asynchronous=True,
            max_staleness=0,
            lr_schedule="constant",
        )  # fmt: skip  (a constant rate: the shorter first run would decay it sooner)
        return GRPOConfig(**{**values, **changes})

    whole, parts = tmp_path / "whole", tmp_path / "parts"
    GRPOTrainer(config(whole)).train()
    GRPOTrainer(config(parts, iterations=2, save_optimizer=True)).train()
    GRPOTrainer(resumed_config(parts, iterations=4)).train()

    def metrics(out):
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("seconds", "tokens_per_second")}
                for r in rows]  # fmt: skip

    expected = metrics(whole)
    assert [row["level"] for row in expected] != [2, 2, 2, 2]  # the curriculum moved
    assert len({row["kl_coef"] for row in expected}) == 4  # the shared coefficient moved
    assert expected[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference
    assert all(row["kl"] > 1e-6 for row in expected[1:])
    for a, b in zip(metrics(parts), expected, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            assert a[key] == pytest.approx(value, abs=1e-6), (b["iteration"], key)


def test_rollout_async_with_a_curriculum_moves_the_level(tiny_dir, tmp_path):
    out = tmp_path / "run"
    argv = [
        "rollout", "--async", "--curriculum", "2", "--env", "LLMChat-Countdown-v0",
        "--env-arg", "level=3", "--model", tiny_dir, "--episodes", "8", "--num-envs", "2",
        "--max-new-tokens", "4", "--out", str(out), "--threads", "1", "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    levels = [record["level"] for record in records]
    # The tiny model never answers: every window of two lowers the next draws' level.
    assert levels[:2] == [3, 3] and levels[-1] < 3 and levels == sorted(levels, reverse=True)
