"""Precision (issue 51, item 2 and 7): ``--dtype auto`` by the device's instructions, the slow
explicit choice warned once, ``--precision``'s three ways to train (fp32, bf16-mixed under
autocast over float32 weights, bf16 weights through float32 masters), and what sampling and
the reference compute in beside them."""

import warnings

import numpy as np
import pytest
import torch
from conftest import DEVICES
from policy_fixture import scripted_policy

from llm_gym.cli import build_parser
from llm_gym.lm.precision import (
    CPU_BF16_VARIABLE,
    autocast,
    cpu_has_bf16,
    fast_dtype,
    runs_fast,
)
from llm_gym.lm.tensors import LinearLogProbs
from llm_gym.run import setup
from llm_gym.train import GRPOConfig, GRPOTrainer, per_token_advantages
from llm_gym.train.optim import MasterAdamW
from llm_gym.train.update import resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize("forced", [None, "0", "1"])
def test_dtype_auto_is_bfloat16_only_where_the_device_runs_it_fast(forced, monkeypatch):
    if forced is None:
        monkeypatch.delenv(CPU_BF16_VARIABLE, raising=False)
        has_bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    else:  # the switch that runs the suite as on a CPU with (1) or without (0) bfloat16
        monkeypatch.setenv(CPU_BF16_VARIABLE, forced)
        has_bf16 = forced == "1"
    assert cpu_has_bf16() == has_bf16
    assert runs_fast(torch.bfloat16, CPU) == has_bf16
    assert fast_dtype(CPU) == (torch.bfloat16 if has_bf16 else torch.float32)
    assert setup.resolve_dtype("auto", CPU) == fast_dtype(CPU)
    assert runs_fast(torch.float32, CPU)  # float32 runs everywhere
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        assert setup.resolve_dtype("auto", cuda) == (
            torch.bfloat16 if torch.cuda.is_bf16_supported(False) else torch.float32
        )
    with pytest.raises(ValueError, match=r"dtype must be one of \('auto', 'bfloat16'.*got 'half'"):
        setup.resolve_dtype("half", CPU)


def test_the_bf16_switch_refuses_other_values(monkeypatch):
    monkeypatch.setenv(CPU_BF16_VARIABLE, "yes")
    with pytest.raises(ValueError, match="LLM_GYM_CPU_BF16 must be '0', '1' or unset, got 'yes'"):
        setup.resolve_dtype("auto", CPU)


def test_a_slow_explicit_dtype_warns_once(monkeypatch):
    monkeypatch.setattr(setup, "_WARNED", set())
    slow = not runs_fast(torch.bfloat16, CPU)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert setup.resolve_dtype("bfloat16", CPU) == torch.bfloat16
        assert setup.resolve_dtype("float32", CPU) == torch.float32
    messages = [str(w.message) for w in caught]
    if slow:  # this project's AVX2 CPU
        assert len(messages) == 1
        assert messages[0].startswith("dtype 'bfloat16' runs slowly on this cpu")
    else:
        assert messages == []


def test_autocast_lowers_only_below_the_weights_dtype():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with autocast(CPU, torch.bfloat16, torch.float32):
        assert layer(x).dtype == torch.bfloat16
    for dtype, weights in ((None, torch.float32), (torch.float32, torch.float32)):
        with autocast(CPU, dtype, weights):
            assert layer(x).dtype == torch.float32
    with autocast(CPU, torch.bfloat16, torch.bfloat16):  # bfloat16 weights: nothing to do
        assert not torch.is_autocast_enabled("cpu")


def test_resolve_precision_by_device_and_given_weights():
    assert resolve_precision("auto", CPU) == "fp32"  # autocast's casts cost more on a CPU
    assert resolve_precision("auto", CPU, torch.bfloat16) == "bf16"
    assert resolve_precision("bf16-mixed", CPU) == "bf16-mixed"
    with pytest.raises(
        ValueError,
        match="precision 'bf16' trains bfloat16 weights; the model "
        r"given holds torch.float32: pass precision='fp32', 'bf16-mixed' or",
    ):
        resolve_precision("bf16", CPU, torch.float32)
    with pytest.raises(ValueError, match=r"precision must be one of \('auto', 'fp32', 'bf16-mixed"):
        resolve_precision("fp16", CPU)
    with pytest.raises(ValueError, match="precision 'bf16' trains bfloat16 weights, which sample"):
        GRPOConfig(precision="bf16", dtype="float32")
    args = build_parser().parse_args(["train", "--precision", "bf16-mixed"])
    assert args.precision == "bf16-mixed"


def test_linear_log_probs_backward_runs_in_autocast_s_dtype():
    # Under autocast the output layer's products run in bfloat16 forward and backward, as
    # autograd would through an autocast linear; float32's gradients differ by bfloat16's
    # rounding.
    torch.manual_seed(0)
    h, w = torch.randn(64, 32, requires_grad=True), torch.randn(500, 32, requires_grad=True)
    targets, upstream = torch.randint(0, 500, (64,)), torch.randn(64)

    def full() -> torch.Tensor:
        logits = torch.nn.functional.linear(h, w).float()
        return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]

    fp32 = torch.autograd.grad((full() * upstream).sum(), (h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed_full = full()
        fused = LinearLogProbs.apply(h, w, None, targets, 16)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, mixed_full, atol=1e-5, rtol=0)
    mixed = torch.autograd.grad((mixed_full * upstream).sum(), (h, w))
    got = torch.autograd.grad((fused * upstream).sum(), (h, w))
    for g, m, f in zip(got, mixed, fp32, strict=True):
        scale = f.abs().max()
        assert (g - m).abs().max() <= 4e-3 * scale  # chunked: per-chunk sums in float32
        assert (m - f).abs().max() >= 5e-3 * scale  # bfloat16 did round


def trainer(tiny_dir, tmp_path, name, **options):
    # The first step at the full rate (the default schedule of a 20-iteration run warms up
    # from 0).
    settings = {"groups": 1, "group_size": 2, "learning_rate": 1e-3, "warmup_steps": 0} | options
    settings.setdefault("env_args", {"task": "chain_sum"})
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / name), max_new_tokens=4, eval_episodes=0,
        progress=False, **settings,
    )  # fmt: skip
    return GRPOTrainer(config)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_mixed_updates_float32_weights_with_bfloat16_products(tiny_dir, tmp_path, device):
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 256, size=n) for n in (20, 14, 26)]
    masks = [np.arange(len(t)) >= 5 for t in tokens]
    advantages = per_token_advantages(torch.tensor([1.0, -1.0, 0.5]), [len(t) for t in tokens])
    runs = {
        precision: trainer(
            tiny_dir, tmp_path, precision, device=device, precision=precision, dtype="float32"
        )
        for precision in ("fp32", "bf16-mixed")
    }
    mixed = runs["bf16-mixed"]
    assert mixed.precision == "bf16-mixed" and mixed.model.dtype == torch.float32
    assert not isinstance(mixed.optimizer, MasterAdamW)  # float32 weights are the masters
    assert mixed.compute_dtype == torch.float32  # --dtype float32: sampling's
    products = []  # the dtype of a layer's output, each forward of the update
    layer = mixed.model.model.layers[0].self_attn.q_proj
    layer.register_forward_hook(lambda module, args, out: products.append(out.dtype))
    grads = {}
    for precision, run in runs.items():
        run.optimizer.step = lambda: None  # the gradients compared, not AdamW's steps
        row = run.update(tokens, masks, advantages)
        assert np.isfinite(row["loss"]) and row["grad_norm"] > 0
        grads[precision] = [p.grad for p in run.model.parameters()]
    assert products == [torch.bfloat16]  # one micro-batch, under autocast
    assert all(g.dtype == torch.float32 for g in grads["bf16-mixed"])
    scale = max(g.abs().max().item() for g in grads["fp32"])
    diffs = [(a - b).abs().max().item() for a, b in zip(*grads.values(), strict=True)]
    assert 0 < max(diffs) <= 0.05 * scale  # the same update, rounded differently
    for run in runs.values():
        run.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_each_precision_trains_on_the_device(tiny_dir, tmp_path, device, precision):
    # Sampling runs in --dtype (bfloat16: autocast over float32 weights); one iteration on
    # GSM8K answers right and wrong (advantages never all zero) moves the weights in their
    # precision's dtype.
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    run = trainer(
        tiny_dir, tmp_path, "run", device=device, precision=precision, dtype="bfloat16",
        env="LLMChat-GSM8K-v0", env_args={"dataset": rows}, groups=2,
    )  # fmt: skip
    weights = torch.float32 if precision != "bf16" else torch.bfloat16
    assert run.model.dtype == weights and run.policy.compute_dtype == torch.bfloat16
    logits = []
    hook = run.model.lm_head.register_forward_hook(lambda m, a, out: logits.append(out.dtype))
    prompt = run.tokenizer("What is 2 + 3?")["input_ids"]
    assert 1 <= len(run.policy.sample([np.array(prompt)])[0].tokens) <= 4
    hook.remove()
    assert logits and set(logits) == {torch.bfloat16}  # generate's, under autocast
    run.policy = scripted_policy(run.tokenizer, lambda i, _: f"It is {5 + i % 2}")
    before = [p.detach().clone() for p in run.model.parameters()]
    row = run.iteration(0)
    assert row["success"] == 0.5 and np.isfinite(row["loss"]) and row["grad_norm"] > 0
    after = list(run.model.parameters())
    assert all(p.dtype == weights and p.device.type == device for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    run.close()
