"""``llm-gym train``: GRPO's math, a run end to end with a tiny model (metrics, plot,
checkpoint, resume), the KL penalty in bfloat16, CUDA, tools and the loss's options (the
errors a run refuses: ``test_train_errors.py``)."""

import json

import numpy as np
import pytest
import torch
from conftest import DEVICES
from policy_fixture import scripted_policy
from train_fixture import keep_torch_threads, train_args  # noqa: F401  (fixture)

from llm_gym.chat import Response
from llm_gym.cli import main
from llm_gym.episodes import Episode, EpisodeSource, Segment, ran_out
from llm_gym.lm.precision import runs_fast
from llm_gym.train import (
    GRPOConfig,
    GRPOTrainer,
    group_advantages,
    grpo_loss,
    per_token_advantages,
)
from llm_gym.train.loss import trained_segments
from llm_gym.train.optim import MasterAdamW, adamw

CPU = torch.device("cpu")


# -- the math ---------------------------------------------------------------------------


def test_group_advantages_standardize_within_each_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.1, 1.0])
    adv = group_advantages(rewards, 3)
    first = np.array([1.0, 0.0, 0.0])
    expected = (first - first.mean()) / (first.std(ddof=1) + 1e-4)  # Bessel, as TRL
    assert adv[:3].tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    assert adv[3:].sum().item() == pytest.approx(0.0, abs=1e-5)
    assert group_advantages(torch.ones(4), 2).tolist() == [0.0] * 4  # nothing to learn


def test_grpo_loss_clips_the_ratio_and_averages_per_response():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0]])  # ratios e^0.5, e^-0.5
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -1.0])
    # Row 0: ratio 1.65 > 1.2 with a positive advantage: clipped to 1.2 per token.
    # Row 1: ratio 0.61 < 0.8 with a negative advantage: min(-0.61, -0.8) = -0.8.
    loss = grpo_loss(new, old, mask, adv, clip_coef=0.2)
    assert loss.item() == pytest.approx(-(1.2 + -0.8) / 2)
    # Unclipped, the gradient flows: d(-loss)/d(new[0, 0]) = ratio * adv / 2 tokens / 2 rows.
    new = torch.zeros(2, 3, requires_grad=True)
    grpo_loss(new, old, mask, adv, clip_coef=0.2).backward()
    assert new.grad[0, 0].item() == pytest.approx(-0.25) and new.grad[0, 2].item() == 0.0


# -- a run ------------------------------------------------------------------------------


def test_train_writes_metrics_plot_checkpoint_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert main(train_args(tiny_dir, out)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    for row in rows:
        # The seeded tiny model writes 4 tokens of noise: no answer, no EOS. Without KL the
        # return is the task's reward (a row mixing the two would differ).
        assert row["success"] == 0.0 and row["response_tokens"] == 4.0
        assert row["reward"] == row["task_reward"] and row["kl"] is None is row["kl_coef"]
        assert row["level"] == 0 and row["tokens_per_second"] > 0 and np.isfinite(row["loss"])
    assert "tool_calls_per_episode" not in rows[0]  # tool metrics only with tools
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    # AdamW's state by torch.distributed.checkpoint (what any world size loads back).
    optimizer = out / "checkpoint-1" / "optimizer"
    assert state["iteration"] == 2 and (optimizer / ".metadata").is_file()
    weights = (out / "checkpoint-1" / "model.safetensors").stat().st_size
    assert sum(f.stat().st_size for f in optimizer.iterdir()) > 1.9 * weights  # two moments
    last = torch.load(out / "checkpoint-2" / "rng_state.pt", weights_only=True)
    assert set(last) == {"torch_rng", "cuda_rng"}
    assert not (out / "checkpoint-2" / "optimizer").exists()
    # the run's last checkpoint: the weights alone
    assert (out / "checkpoint-2" / "model.safetensors").is_file()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["before"]) == {"success", "reward", "response_tokens"}
    assert summary["config"]["iterations"] == 2 and summary["interrupted"] is False
    assert summary["env"] == "LLMChat-ReasoningGym-v0" and summary["task"]["name"] == "chain_sum"
    assert summary["levels"] == [0] and summary["answer_format"] == "last_number"
    # What --precision auto and --dtype auto came to on this CPU, and packing on.
    assert (summary["precision"], summary["packing"]) == ("fp32", True)
    assert summary["dtype"] == ("bfloat16" if runs_fast(torch.bfloat16, CPU) else "float32")
    assert summary["config"]["precision"] == summary["config"]["dtype"] == "auto"
    report = (out / "report.md").read_text()
    assert "![training](training.png)" in report and "| greedy success before |" in report

    # A second run in the same folder is refused; --resume continues the curves.
    assert main(train_args(tiny_dir, out)) == 2
    assert main(train_args(tiny_dir, out, "--resume", "--iterations", "3")) == 0
    resumed = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in resumed] == [0, 1, 2] and resumed[:2] == rows
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    after = json.loads((out / "summary.json").read_text())
    assert after["before"] == summary["before"]  # measured once, before the first iteration


def test_train_with_trls_loss_variants_logs_the_update_and_resumes(tiny_dir, tmp_path):
    out = tmp_path / "run"
    # The KL penalty (--kl-coef) makes the tiny model's rewards differ, so that it updates;
    # float32 pinned, since bfloat16 rounds the tiny second epoch's change away.
    variant = ["--loss-type", "dapo", "--clip-coef-high", "0.28", "--kl-loss-coef", "0.04",
               "--update-epochs", "2", "--eval-episodes", "0", "--kl-coef", "0.5",
               "--dtype", "float32"]  # fmt: skip
    assert main(train_args(tiny_dir, out, *variant)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # the second epoch's: its ratios moved off 1, and off the reference
        assert row["entropy"] > 0 and row["approx_kl"] > 0 and row["grad_norm"] >= 0
        assert row["reference_kl"] > 0
        parts = row["clip_fraction_low"] + row["clip_fraction_high"]
        assert row["clip_fraction"] == pytest.approx(parts) and 0 <= parts <= 1
    saved = json.loads((out / "run_config.json").read_text())
    assert (saved["loss_type"], saved["clip_coef_high"], saved["kl_loss_coef"]) == (
        "dapo", 0.28, 0.04)  # fmt: skip
    assert main(train_args(tiny_dir, out, "--resume", "--iterations", "3")) == 0
    resumed = json.loads((out / "summary.json").read_text())["config"]
    assert (resumed["loss_type"], resumed["iterations"]) == ("dapo", 3)


def test_an_update_moves_the_policy_toward_the_better_response(tiny_dir, tmp_path):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"},
        groups=1, group_size=2, max_new_tokens=4, eval_episodes=0,
        learning_rate=1e-2, progress=False, warmup_steps=0,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    obs, _ = trainer.envs.reset(seed=0)
    responses = trainer.policy(obs)
    with torch.no_grad():
        dist, ids = trainer.scorer.get_dist(obs, responses, mask="prompt")
        before = (dist.log_prob(ids).sum(-1)).tolist()
    prompts = obs["tokens"]
    tokens = [np.concatenate([p, r.tokens]) for p, r in zip(prompts, responses, strict=True)]
    masks = [np.arange(len(t)) >= len(p) for t, p in zip(tokens, prompts, strict=True)]
    advantages = per_token_advantages(torch.tensor([1.0, -1.0]), [len(t) for t in tokens])
    trainer.update(tokens, masks, advantages)
    with torch.no_grad():
        dist, ids = trainer.scorer.get_dist(obs, responses, mask="prompt")
        after = (dist.log_prob(ids).sum(-1)).tolist()
    assert after[0] > before[0] and after[1] < before[1]


def test_a_metrics_row_holds_the_iterations_values(tiny_dir, tmp_path):
    # GSM8K on one question; in each group of two, one response is right, one wrong.
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=2, group_size=2, max_new_tokens=8, eval_episodes=0, progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    tok = trainer.tokenizer
    trainer.policy = scripted_policy(tok, lambda i, _: f"It is {5 + i % 2}")
    row = trainer.iteration(0)
    lengths = [len(tok(f"It is {n}", add_special_tokens=False)["input_ids"]) + 1 for n in (5, 6)]
    assert row["success"] == 0.5  # right (1.0) and wrong (0.1) in each group: last_number
    assert row["reward"] == row["task_reward"] == pytest.approx((1.0 + 0.1) / 2)
    assert row["response_tokens"] == np.mean(lengths) and row["kl"] is None
    assert row["loss"] == pytest.approx(0.0, abs=1e-6)  # ratio 1: -mean(advantages) = 0


class GivenEpisodes:
    """An episode source of given batches: any object with ``episodes`` and ``close``."""

    def __init__(self, *batches):
        self.batches, self.closed = list(batches), False

    def episodes(self, count):
        batch = self.batches.pop(0)
        assert len(batch) == count
        return batch

    def close(self):
        self.closed = True


def given(reward, *segments):
    tokens = sum(int(s.policy_mask.sum()) for s in segments)
    prompt = [{"role": "user", "content": "2+2?"}]
    return Episode(prompt, ["4"], reward, reward, {"success": reward > 0}, list(segments),
                   [0], tokens)  # fmt: skip


def test_an_iteration_trains_on_any_episode_source(tiny_dir, tmp_path):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"},
        groups=1, group_size=2, max_new_tokens=4, eval_episodes=0, progress=False, warmup_steps=0,
        overlong_cache=0,  # the rewards as given
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    one = Segment(np.array([5, 6, 7, 8]), np.array([False, False, True, True]), None)
    two = Segment(np.array([5, 9, 10]), np.array([False, True, True]), None)
    # The first episode has two segments (an agent's): each trains with its advantage.
    source = GivenEpisodes([given(1.0, one, two), given(0.0, one)])
    assert isinstance(source, EpisodeSource)
    trainer.source = source
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    row = trainer.iteration(0)
    advantages = group_advantages(torch.tensor([1.0, 0.0]), 2)
    # Ratio 1 on every token: each of the three sequences weighs -its advantage / 3.
    expected = -(2 * advantages[0] + advantages[1]).item() / 3
    assert row["loss"] == pytest.approx(expected, abs=1e-6) and expected != 0.0
    assert (row["reward"], row["task_reward"], row["success"]) == (0.5, 0.5, 0.5)
    assert row["response_tokens"] == (4 + 2) / 2 and row["versions"] == [0]
    params = list(trainer.model.parameters())
    assert any(not torch.equal(w, p) for w, p in zip(weights, params, strict=True))
    trainer.close()
    assert source.closed


def test_kl_penalty_in_bfloat16_compares_like_with_like(tiny_dir, tmp_path):
    # The reference is the starting model: before the first update the policy's re-scored
    # log-probs and the reference's come from the same forward, so the KL is exactly 0.
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"}, groups=1,
        group_size=2, max_new_tokens=4, eval_episodes=0, kl_coef=0.1, kl_target=1.0, kl_horizon=1,
        dtype="bfloat16", progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    # --precision auto on the CPU: float32 weights; sampling, the re-scoring and the
    # reference (float32 weights too) compute in bfloat16 under autocast.
    assert trainer.model.dtype == trainer.reference.model.dtype == torch.float32
    assert trainer.scorer.compute_dtype == trainer.reference.compute_dtype == torch.bfloat16
    assert trainer.policy.compute_dtype == torch.bfloat16
    row = trainer.iteration(0)
    assert row["kl"] == 0.0 and row["kl_coef"] == 0.1
    assert row["reward"] == row["task_reward"]
    assert trainer.envs.coef == pytest.approx(0.1 * 0.8)  # adaptive: KL 0 < target, -20%


@pytest.mark.parametrize("device", DEVICES)
def test_an_iteration_on_the_device_updates_the_weights(tiny_dir, tmp_path, device):
    # GSM8K on one question; in each group one response is right and one wrong, so the
    # advantages are ±0.7, never all zero, and the update must move the weights.
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=2, group_size=2, max_new_tokens=4, eval_episodes=2, device=device,
        learning_rate=1e-3, progress=False, warmup_steps=0,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    assert trainer.optimizer.defaults["fused"] is True  # torch's fused AdamW, on either
    trainer.policy = scripted_policy(trainer.tokenizer, lambda i, _: f"It is {5 + i % 2}")
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    row = trainer.iteration(0)
    assert row["success"] == 0.5 and np.isfinite(row["loss"]) and row["grad_norm"] > 0
    params = list(trainer.model.parameters())
    assert any(not torch.equal(w, p) for w, p in zip(weights, params, strict=True))  # updated
    assert all(p.device.type == device for p in params)
    result = trainer.evaluate()  # two greedy episodes of at most 4 tokens, on the device
    assert set(result) == {"success", "reward", "response_tokens"}
    assert result["success"] in (0.0, 0.5, 1.0) and 1 <= result["response_tokens"] <= 4
    trainer.close()


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_is_fused_and_steps_as_torchs_loop(device):
    torch.manual_seed(0)
    fused_param = torch.nn.Parameter(torch.randn(64, 32, device=device))
    loop_param = torch.nn.Parameter(fused_param.detach().clone())
    fused = adamw([fused_param], 1e-2)
    loop = torch.optim.AdamW([loop_param], lr=1e-2, foreach=False)
    assert fused.defaults["fused"] is True and fused.defaults["weight_decay"] == 0.01
    for _ in range(5):
        grad = torch.randn(64, 32, device=device)
        fused_param.grad, loop_param.grad = grad.clone(), grad.clone()
        fused.step()
        loop.step()
    assert not torch.equal(fused_param, torch.zeros_like(fused_param))
    torch.testing.assert_close(fused_param, loop_param, atol=1e-6, rtol=1e-5)


def test_bfloat16_weights_learn_as_float32_masters_would(tiny_dir, tmp_path):
    # 100 steps at lr 1e-6: plain AdamW on bfloat16 weights rounds every step away; the
    # trainer's optimizer keeps float32 masters, so its weights are the float32 run's, rounded.
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"}, groups=1,
        group_size=2, max_new_tokens=4, eval_episodes=0, precision="bf16", learning_rate=1e-6,
        progress=False, warmup_steps=0,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    assert isinstance(trainer.optimizer, MasterAdamW)
    # --dtype auto: bfloat16 weights sample in bfloat16, whatever the CPU.
    assert trainer.model.dtype == trainer.policy.compute_dtype == torch.bfloat16
    params = [p for p in trainer.model.parameters() if p.requires_grad][:4]
    start = [p.detach().clone() for p in params]
    reference = [torch.nn.Parameter(p.detach().float().clone()) for p in params]
    float32 = torch.optim.AdamW(reference, lr=1e-6)
    plain = [torch.nn.Parameter(p.detach().clone()) for p in params]
    plain_adamw = torch.optim.AdamW(plain, lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=generator).to(p.dtype) for p in params]
    for _ in range(100):
        for weight in trainer.model.parameters():
            weight.grad = torch.zeros_like(weight)
        for weight, ref, bare, grad in zip(params, reference, plain, grads, strict=True):
            weight.grad, ref.grad, bare.grad = grad.clone(), grad.float(), grad.clone()
        trainer.optimizer.step()
        float32.step()
        plain_adamw.step()
    for weight, ref, bare, before in zip(params, reference, plain, start, strict=True):
        assert weight.dtype == torch.bfloat16
        assert torch.equal(weight, ref.to(torch.bfloat16))  # the masters' run, rounded
        # Plain AdamW: most weights never moved (only those near 0, whose spacing is finer).
        assert (bare == before).float().mean() > 0.5
        assert not torch.equal(bare, ref.to(torch.bfloat16))
    assert any(not torch.equal(w, b) for w, b in zip(params, start, strict=True))
    trainer.close()


def test_master_adamw_resumes_from_its_masters(tmp_path):
    # A checkpoint's optimizer state holds the float32 masters: a resumed optimizer steps on
    # exactly as the uninterrupted one, not from the rounded bfloat16 weights.
    torch.manual_seed(0)
    grads = [torch.randn(8, 4).to(torch.bfloat16) for _ in range(5)]
    weights = torch.nn.Parameter(torch.randn(8, 4).to(torch.bfloat16))
    whole = MasterAdamW([weights], lr=1e-3)
    for grad in grads[:3]:
        weights.grad = grad.clone()
        whole.step()
    torch.save(whole.state_dict(), tmp_path / "optimizer.pt")
    resumed_weights = torch.nn.Parameter(weights.detach().clone())
    resumed = MasterAdamW([resumed_weights], lr=1e-3)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    assert torch.equal(resumed.masters[0], whole.masters[0])
    assert not torch.equal(resumed.masters[0], weights.detach().float())  # finer than bf16
    for grad in grads[3:]:
        weights.grad, resumed_weights.grad = grad.clone(), grad.clone()
        whole.step()
        resumed.step()
    assert torch.equal(resumed_weights, weights) and torch.equal(
        resumed.masters[0], whole.masters[0]
    )
    # A plain AdamW's state (a checkpoint from before the masters): its moments, in float32,
    # and masters that start from the weights.
    plain = torch.optim.AdamW([weights], lr=1e-3)
    weights.grad = grads[0].clone()
    plain.step()
    older = MasterAdamW([weights], lr=1e-3)
    older.load_state_dict(plain.state_dict())
    moment = older.inner.state[older.masters[0]]["exp_avg"]
    assert moment.dtype == torch.float32 and torch.equal(
        moment, plain.state[weights]["exp_avg"].float()
    )
    assert torch.equal(older.masters[0], weights.detach().float())


# -- tools ------------------------------------------------------------------------------


def calls_then_answers(tok):
    """In every sub-env: call the python tool (print 7), then, once it answered, answer 7."""

    def answer(i, prompt):
        called = "<|im_start|>tool" in prompt
        return "The answer is 7" if called else TOOL_CALL

    return scripted_policy(tok, answer)


TOOL_CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(7)"}}</tool_call>'


def test_train_with_tools_plays_multi_turn_episodes(tiny_dir, tmp_path):
    out = tmp_path / "run"
    assert main(train_args(tiny_dir, out, "--tools", "python", "--max-tool-calls", "1")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["tools"] == ["python"] and summary["config"]["max_tool_calls"] == 1
    # A scripted policy plays each episode in two turns: one tool call, then the answer.
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / "scripted"), env_args={"task": "chain_sum"},
        iterations=2, groups=1, group_size=2, max_new_tokens=4, eval_episodes=2,
        tools=["python"], max_tool_calls=1, progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    trainer.policy = calls_then_answers(trainer.tokenizer)
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "scripted/metrics.jsonl").open()]
    assert [r["iteration"] for r in rows] == [0, 1]
    for row in rows:
        assert row["tool_calls_per_episode"] == 1.0 and row["failed_tool_share"] == 0.0
    # The held-out evaluation plays tool episodes too, and counts their calls.
    before = trainer.evaluate(policy=calls_then_answers(trainer.tokenizer))
    assert before["tool_calls_per_episode"] == 1.0


def test_tool_episodes_are_trained_on_the_policys_tokens_only(tiny_dir, tmp_path):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"}, groups=1,
        group_size=2, max_new_tokens=4, eval_episodes=0, tools=["python"], progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    tok = trainer.tokenizer
    trainer.policy = calls_then_answers(tok)
    row = trainer.iteration(0)
    script = (TOOL_CALL, "The answer is 7")
    policy_tokens = sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in script)
    # The tool's output and the template's framing are in the conversation, not in the loss.
    assert row["response_tokens"] == policy_tokens
    assert row["tool_calls_per_episode"] == 1.0 and row["failed_tool_share"] == 0.0
    assert np.isfinite(row["loss"])


def calls_answering(tok, *calls):
    """A scripted policy whose k-th call answers sub-env i with ``calls[k][i]`` (the last
    call's answers from then on), and the count of its calls."""
    made = []

    def answer(i, _):
        return f"It is {calls[min(len(made) - 1, len(calls) - 1)][i]}"

    policy = scripted_policy(tok, answer)

    def counted(batch):
        made.append(1)
        return policy(batch)

    return counted, made


def dynamic_trainer(tiny_dir, tmp_path, refills):
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=2, group_size=2, max_new_tokens=8, eval_episodes=0, progress=False,
        dynamic_sampling=refills,
    )  # fmt: skip
    return GRPOTrainer(config)


def test_dynamic_sampling_replaces_the_groups_whose_rewards_are_all_equal(tiny_dir, tmp_path):
    trainer = dynamic_trainer(tiny_dir, tmp_path, refills=2)
    # First batch: group 0 all right (nothing to learn), group 1 split; then every group split.
    trainer.policy, made = calls_answering(trainer.tokenizer, [5, 5, 5, 6], [5, 6, 5, 6])
    row = trainer.iteration(0)
    assert len(made) == 2  # one refill found the group it needed
    assert (row["sampled_episodes"], row["dropped_groups"]) == (8, 1)
    assert row["zero_variance_groups"] == 0.0 and row["success"] == 0.5
    trainer.lock.release()


def test_dynamic_sampling_keeps_flat_groups_when_its_refills_find_too_few(tiny_dir, tmp_path):
    trainer = dynamic_trainer(tiny_dir, tmp_path, refills=2)
    trainer.policy, made = calls_answering(trainer.tokenizer, [5, 5, 6, 6])
    row = trainer.iteration(0)
    assert len(made) == 3  # the batch and both refills, every group of them flat
    assert (row["sampled_episodes"], row["dropped_groups"]) == (12, 4)
    assert row["zero_variance_groups"] == 1.0 and row["loss"] == 0.0
    trainer.lock.release()


def test_dynamic_sampling_is_refused_where_it_cannot_refill(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="dynamic_sampling .* with --async"):
        GRPOConfig(model=tiny_dir, out=str(tmp_path), asynchronous=True, dynamic_sampling=1)
    with pytest.raises(ValueError, match="does not go with --dynamic-sampling"):
        GRPOConfig(dynamic_sampling=1).check_world(2)


@pytest.mark.parametrize("cache", [0, 6])
def test_the_overlong_penalty_tells_right_answers_apart_by_length(tiny_dir, tmp_path, cache):
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=1, group_size=2, max_new_tokens=12, eval_episodes=0, progress=False,
        overlong_cache=cache,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    answers = ["It is 5", "Well, well, well: it is 5"]  # both right; the second runs long
    trainer.policy = scripted_policy(trainer.tokenizer, lambda i, _: answers[i])
    row = trainer.iteration(0)
    assert row["success"] == 1.0 and row["reward"] == 1.0  # the row tells the env's reward
    assert (row["loss"] != 0.0) == bool(cache)  # the penalty alone makes the advantages differ
    trainer.lock.release()


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_mask_truncated_leaves_the_cut_response_out_of_the_loss(tiny_dir, tmp_path, mask_truncated):
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=1, group_size=2, max_new_tokens=4, eval_episodes=0, progress=False,
        mask_truncated=mask_truncated, dtype="float32", overlong_cache=0,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    tok = trainer.tokenizer
    right = tok("5", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    cut = tok("Well, well, well, well", add_special_tokens=False)["input_ids"][:4]  # no EOS

    def policy(batch):
        return [Response(tok.decode(ids), np.array(ids)) for ids in (right, cut)]

    trainer.policy = policy
    row = trainer.iteration(0)
    assert (row["success"], row["truncated_share"]) == (0.5, 0.5)
    a = group_advantages(torch.tensor([1.0, 0.0]), 2)[0].item()  # +a right, -a cut
    # dapo at ratio 1: minus the advantages summed over the tokens the loss counts, over them.
    n = len(right)
    expected = -a if mask_truncated else -(a * n - a * len(cut)) / (n + len(cut))
    assert row["loss"] == pytest.approx(expected, abs=1e-6)
    trainer.lock.release()


def test_an_iteration_with_no_token_in_the_loss_says_so_and_moves_nothing(tiny_dir, tmp_path):
    # --mask-truncated with every response cut: no entropy, no loss (null, not 0), the
    # adaptive entropy coefficient where it was, and a note in the report.
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=1, group_size=2, max_new_tokens=4, eval_episodes=0, progress=False,
        mask_truncated=True, dtype="float32", overlong_cache=0, entropy_coef=0.015,
        entropy_target=100.0, entropy_coef_delta=0.005,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    tok = trainer.tokenizer
    cuts = [tok(text, add_special_tokens=False)["input_ids"][:4]
            for text in ("Well, well, well, well", "So so so so so")]  # fmt: skip
    trainer.policy = lambda batch: [Response(tok.decode(ids), np.array(ids)) for ids in cuts]
    row = trainer.iteration(0)
    assert row["truncated_share"] == 1.0 and row["trained_tokens"] == 0
    assert row["loss"] is None and row["entropy"] is None and row["approx_kl"] is None
    assert row["entropy_coef"] == 0.015  # not raised on an entropy of nothing
    trainer.write([row], None, 1.0)
    report = (tmp_path / "report.md").read_text()
    assert "Iterations 0 trained on no token: every response was left out of the loss" in report
    trainer.lock.release()


def test_overlong_auto_is_a_sixth_of_a_single_turn_budget_and_the_default(tiny_dir, tmp_path):
    from llm_gym.cli import build_parser

    assert build_parser().parse_args(["train"]).overlong_cache is None
    for flag, value in (("auto", None), ("5", 5), ("0", 0)):
        args = build_parser().parse_args(["train", "--overlong-cache", flag])
        assert args.overlong_cache == value
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env_args={"task": "chain_sum"}, groups=1,
        group_size=2, max_new_tokens=18, eval_episodes=0, progress=False,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    assert (trainer.multi_turn, trainer.overlong) == (False, 3)
    trainer.close()
    trainer.lock.release()


def test_trained_segments_mask_the_episodes_the_budget_cut():
    def episode(ids, mask):
        segment = Segment(np.array(ids), np.array(mask), None)
        return given(1.0, segment)

    eos = 2
    whole = episode([5, 6, 7, eos], [False, True, True, True])  # ended by EOS
    cut = episode([5, 6, 7, 8], [False, True, True, True])  # 3 tokens, no EOS
    segments, masks, index = trained_segments([whole, cut], 3, eos)
    assert index == [0, 1] and [s.ids.tolist() for s in segments] == [[5, 6, 7, eos], [5, 6, 7, 8]]
    assert [m.tolist() for m in masks] == [[False, True, True, True], [False] * 4]
    _, kept, _ = trained_segments([whole, cut])  # no budget given: every mask as it is
    assert [m.tolist() for m in kept] == [[False, True, True, True]] * 2
    assert not ran_out(whole, 3, eos) and ran_out(cut, 3, eos) and not ran_out(cut, 4, eos)


@pytest.mark.parametrize("loss_type", ["sapo", "luspo", "vespo"])
def test_trls_newer_losses_train_an_iteration(tiny_dir, tmp_path, loss_type):
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    level = "sequence" if loss_type == "luspo" else "token"
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path), env="LLMChat-GSM8K-v0", env_args={"dataset": rows},
        groups=1, group_size=2, max_new_tokens=8, eval_episodes=0, progress=False, warmup_steps=0,
        loss_type=loss_type, importance_sampling_level=level, learning_rate=1e-2,
        dtype="float32",
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    trainer.policy = scripted_policy(trainer.tokenizer, lambda i, _: f"It is {5 + i}")
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    row = trainer.iteration(0)
    # A right and a wrong answer of equal lengths, advantages ±a, ratio 1 (one epoch): sapo's
    # gate is sigmoid(0) · 4 / τ = 2 / τ, τ 1.0 for a > 0 and 1.05 below; luspo's sums cancel;
    # vespo's φ(1) = 1 weighs the log-probs (-a Σ log π + a Σ log π', not 0).
    a = group_advantages(torch.tensor([1.0, 0.1]), 2)[0].item()
    expected = {"sapo": -(2 / 1.0 - 2 / 1.05) * a / 2, "luspo": 0.0}.get(loss_type)
    if expected is not None:
        assert row["loss"] == pytest.approx(expected, abs=1e-6)
    else:
        assert np.isfinite(row["loss"]) and row["loss"] != 0.0
    params = trainer.model.parameters()
    assert any(not torch.equal(w, p) for w, p in zip(weights, params, strict=True))
    trainer.lock.release()
