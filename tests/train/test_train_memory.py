"""The memory-lean update (issue 42, item 1): the taken tokens' log-probs through the output
layer in chunks (``selected_log_probs``, ``LinearLogProbs``), micro-batches by a token
budget, activation checkpointing, each equal to the whole-logits path it replaces."""

import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import DEVICES

from llm_gym.lm.tensors import (
    LinearLogProbs,
    has_prefix,
    left_pad,
    position_ids,
    selected_log_probs,
    token_log_probs,
)
from llm_gym.policies import TransformersPolicy
from llm_gym.train import GRPOConfig, GRPOTrainer, grpo_loss, per_token_advantages
from llm_gym.train.loss import microbatches


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def batch(lengths, prompt=6, seed=0, vocab=49152):
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, vocab, size=n) for n in lengths]
    masks = [np.arange(n) >= prompt for n in lengths]
    return tokens, masks


def padded(tokens, masks, pad_id):
    ids, attention = left_pad(tokens, pad_id, torch.device("cpu"))
    selected = left_pad(masks, False, torch.device("cpu"))[0].bool() & has_prefix(attention)
    return ids, attention, selected


def grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def record_checkpointing(model, modes):
    """Each forward of ``model``'s first decoder layer appends to ``modes`` whether it was
    checkpointed: recomputed in the backward, its MLP runs a second time."""
    layer, calls = model.model.layers[0], []

    def forward(module, args):
        modes.append(False)
        calls.append(0)

    def mlp(module, args):
        calls[-1] += 1
        modes[-1] = calls[-1] > 1

    layer.register_forward_pre_hook(forward)
    layer.mlp.register_forward_pre_hook(mlp)


def close(a, b, rel=1e-5):
    """Gradients equal to ``rel`` of the largest entry (summation order differs)."""
    scale = max(x.abs().max().item() for x in a.values())
    return max((a[k] - b[k]).abs().max().item() for k in a) <= rel * scale


def test_linear_log_probs_equal_the_log_softmax_of_the_whole_logits_and_its_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(101, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(101, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 101, (37,))
    upstream = torch.randn(37, dtype=torch.float64)
    full = torch.log_softmax(hidden @ weight.T + bias, -1).gather(-1, targets[:, None])[:, 0]
    expected = torch.autograd.grad((full * upstream).sum(), (hidden, weight, bias))
    for rows in (1, 5, 37, 100):  # chunk sizes that do and do not divide the rows
        fused = LinearLogProbs.apply(hidden, weight, bias, targets, rows)
        assert fused.dtype == torch.float32
        assert torch.allclose(fused.double(), full, atol=1e-5)
        got = torch.autograd.grad((fused.double() * upstream).sum(), (hidden, weight, bias))
        for g, e in zip(got, expected, strict=True):
            assert torch.allclose(g, e, atol=1e-5), rows


def test_selected_log_probs_equal_get_dist_s_and_so_do_the_gradients(default_model):
    model, tokenizer = default_model
    tokens, masks = batch([40, 25, 33])
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    model.zero_grad()
    dist, ids = scorer.get_dist({"tokens": tuple(tokens)}, mask=masks)
    reference = dist.log_prob(ids).float() * dist.mask
    reference.sum().backward()
    expected = grads(model)
    model.zero_grad()
    ids, attention, selected = padded(tokens, masks, tokenizer.pad_token_id)
    assert torch.equal(selected, dist.mask)
    got = selected_log_probs(model, ids, attention, selected)
    assert got.shape == (3, 40) and got.dtype == torch.float32
    assert torch.allclose(got, reference, atol=1e-5)
    assert (got[~selected] == 0).all() and (got[selected] < 0).all()
    got.sum().backward()
    assert close(grads(model), expected)
    model.zero_grad()


def test_a_model_with_transformed_logits_takes_the_whole_logits_path(tiny):
    model, tokenizer = tiny
    tokens, masks = batch([12, 9], prompt=3, vocab=len(tokenizer))
    ids, attention, selected = padded(tokens, masks, tokenizer.pad_token_id)
    fused = selected_log_probs(model, ids, attention, selected)
    scaled = copy.deepcopy(model)
    scaled.config.final_logit_softcapping = 30.0  # llama ignores it: the logits are the same
    whole = selected_log_probs(scaled, ids, attention, selected)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention.long()).logits
    assert torch.allclose(fused, whole, atol=1e-5)
    expected = token_log_probs(logits, ids, attention).masked_fill(~selected, 0.0)
    assert torch.allclose(whole, expected, atol=1e-4)


def test_entropy_comes_from_the_same_chunks_on_both_paths(tiny):
    # The policy's entropy at each scored position, as the whole logits give it, from the
    # fused chunks (a few rows of logits at a time) and from the whole-logits path alike.
    model, tokenizer = tiny
    tokens, masks = batch([12, 9], prompt=3, vocab=len(tokenizer))
    ids, attention, selected = padded(tokens, masks, tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention.long(),
                       position_ids=position_ids(attention)).logits.float()  # fmt: skip
    log_p = torch.log_softmax(logits[:, :-1], -1)
    whole = torch.zeros(ids.shape)
    whole[:, 1:] = -(log_p.exp() * log_p).sum(-1)
    expected = whole.masked_fill(~selected, 0.0)
    scaled = copy.deepcopy(model)
    scaled.config.final_logit_softcapping = 30.0  # the whole-logits path (llama ignores it)
    for m, chunk_rows in ((model, 3), (model, None), (scaled, None)):
        log_probs, entropy = selected_log_probs(
            m, ids, attention, selected, chunk_rows=chunk_rows, entropy=True
        )
        assert entropy.shape == ids.shape and not entropy.requires_grad
        torch.testing.assert_close(entropy, expected, atol=1e-4, rtol=1e-5)
        assert (entropy[selected] > 0).all() and log_probs.requires_grad


def test_microbatches_hold_the_token_budget_and_every_sequence_once():
    lengths = [700, 20, 30, 650, 25, 700, 5, 300]
    for budget, rows in [(1400, 8), (700, 8), (100, 2), (10_000, 3)]:
        split = microbatches(lengths, budget, rows)
        assert sorted(i for part in split for i in part) == list(range(len(lengths)))
        for part in split:
            longest = max(lengths[i] for i in part)
            assert len(part) <= rows
            assert len(part) == 1 or len(part) * longest <= budget
    assert microbatches([], 10, 2) == []


def trainer(tiny_dir, tmp_path, name, **options):
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / name), env_args={"task": "chain_sum"},
        groups=2, group_size=2, max_new_tokens=4, eval_episodes=0, learning_rate=1e-3,
        progress=False, **options,
    )  # fmt: skip
    return GRPOTrainer(config)


@pytest.mark.parametrize(
    "options",
    [
        {"max_tokens_per_microbatch": 40, "gradient_checkpointing": True},
        {"max_tokens_per_microbatch": 100_000, "minibatch_size": 1},
        {"update_epochs": 2, "max_tokens_per_microbatch": 60},
    ],
)
def test_an_update_is_the_same_whatever_the_split_and_the_checkpointing(
    tiny_dir, tmp_path, options
):
    tokens, masks = batch([30, 12, 25, 18, 7, 40], prompt=5, vocab=256)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    spread = per_token_advantages(advantages, [len(t) for t in tokens])
    epochs = options.get("update_epochs", 1)
    reference = trainer(
        tiny_dir, tmp_path, "whole", gradient_checkpointing=False,
        max_tokens_per_microbatch=100_000, minibatch_size=64, update_epochs=epochs,
    )  # fmt: skip
    lean = trainer(tiny_dir, tmp_path, "lean", **options)
    assert lean.model.is_activation_checkpointing  # enabled unless --no-gradient-checkpointing
    for run in (reference, lean):  # the gradients compared, not AdamW's steps (which
        run.optimizer.step = lambda: None  # turn a 1e-9 gradient's rounding into lr)
    whole = reference.update(tokens, masks, spread)
    split = lean.update(tokens, masks, spread)
    assert split.keys() == whole.keys()  # the loss and the update's diagnostics
    for key, value in whole.items():
        assert split[key] == pytest.approx(value, abs=1e-6, rel=1e-5), key
    assert close(grads(lean.model), grads(reference.model))
    assert not lean.model.training  # back in eval mode for sampling


def test_the_update_s_loss_is_today_s_get_dist_loss(tiny_dir, tmp_path):
    # Today's path, written out: one get_dist forward over the whole batch, the same loss.
    tokens, masks = batch([22, 14, 30, 9], prompt=4, vocab=256)
    advantages = torch.tensor([1.0, -1.0, 0.3, -0.3])
    lean = trainer(tiny_dir, tmp_path, "lean", max_tokens_per_microbatch=50, loss_type="grpo")
    old = copy.deepcopy(lean.model)
    scorer = TransformersPolicy(old, lean.tokenizer, input_mode="tokens", generate=False)
    dist, ids = scorer.get_dist({"tokens": tuple(tokens)}, mask=masks)
    log_probs = dist.log_prob(ids).float()
    loss = grpo_loss(log_probs, log_probs.detach(), dist.mask, advantages, 0.2)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(list(old.parameters()), lean.config.max_grad_norm)  # as it does
    lean.optimizer.step = lambda: None  # keep the gradients to compare, not the step
    spread = per_token_advantages(advantages, [len(t) for t in tokens])
    lean_loss = lean.update(tokens, masks, spread)["loss"]
    assert lean_loss == pytest.approx(loss.item(), abs=1e-6)
    got = {name: p.grad for name, p in lean.model.named_parameters()}
    expected = {name: p.grad for name, p in old.named_parameters()}
    assert close(got, expected)


def spread(values, batch):
    """Each sequence's advantage on each of its tokens, as the update takes them."""
    return per_token_advantages(torch.tensor(values), [len(t) for t in batch[0]])


def test_checkpointing_by_default_only_where_a_micro_batch_is_large(
    tiny_dir, tmp_path, monkeypatch
):
    from llm_gym.lm.tensors import HEAP_MMAP_THRESHOLD, LEAN_MMAP_THRESHOLD
    from llm_gym.train import update

    thresholds = []  # glibc's mmap threshold: lowered for a large update only, then restored
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(update, "set_host_mmap_threshold", thresholds.append)
    lean = trainer(tiny_dir, tmp_path, "auto")
    assert lean.config.gradient_checkpointing is None
    modes = []
    record_checkpointing(lean.model, modes)
    lean.optimizer.step = lambda: None
    small = batch([30, 20], prompt=5, vocab=256)
    lean.update(*small, spread([1.0, -1.0], small))
    large = batch([600, 600, 600, 600], prompt=5, vocab=256)  # 2400 padded tokens
    lean.update(*large, spread([1.0, -1.0, 0.5, -0.5], large))
    assert modes == [False, True] and not lean.model.training
    assert thresholds == [LEAN_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD]
    # A budget of 2048 fills micro-batches of two 700-token sequences (1400 padded tokens):
    # large for that budget, so checkpointed, though under CHECKPOINT_TOKENS.
    tight = trainer(tiny_dir, tmp_path, "tight", max_tokens_per_microbatch=2048)
    modes.clear()
    record_checkpointing(tight.model, modes)
    tight.optimizer.step = lambda: None
    long = batch([700, 700, 700, 700], prompt=5, vocab=256)
    tight.update(*long, spread([1.0, -1.0, 0.5, -0.5], long))
    assert modes == [True, True]
    modes.clear()
    tight.update(*small, spread([1.0, -1.0], small))  # 60 tokens: small for any budget
    assert modes == [False]


def test_freed_tensors_go_back_to_the_system_on_cpu():
    # A fresh process: malloc reuses what a heap already holds before it maps anything.
    code = (
        "import torch, sys\n"
        "from llm_gym.lm.tensors import LEAN_MMAP_THRESHOLD, set_host_mmap_threshold\n"
        "def rss():\n"
        "    return int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "if sys.argv[1] == 'set': assert set_host_mmap_threshold(LEAN_MMAP_THRESHOLD) is True\n"
        "pinned = []\n"
        "for size in (5 << 20, 4 << 20):  # freeing 20 MB raises glibc's own threshold\n"
        "    before, tensors = rss(), []\n"
        "    for _ in range(8):  # each block followed by a small one that stays\n"
        "        tensors.append(torch.ones(size))\n"
        "        pinned.append(torch.ones(256))\n"
        "    del tensors\n"
        "print(rss() - before)\n"
    )  # fmt: skip
    kept = {}
    for mode in ("set", "default"):
        done = subprocess.run(
            [sys.executable, "-c", code, mode], capture_output=True, text=True, check=True
        )
        kept[mode] = int(done.stdout.split()[-1])
    # 8 × 16 MB freed: with the setting none of it stays resident; with glibc's default
    # (its threshold raised to 20 MB by the first round) they came from the heap, and those
    # the small blocks pin stay (measured: 34 MB).
    assert kept["set"] < 5e6 and kept["default"] > 30e6, kept


@pytest.mark.parametrize("device", DEVICES)
def test_on_cuda_checkpointing_follows_the_free_memory(tiny_dir, tmp_path, monkeypatch, device):
    # On CUDA the default checkpoints a micro-batch whose estimated activations, with the
    # gradients and AdamW's state still to come, would not fit in the free memory; the rule
    # runs on any device when asked (by_memory), the free memory given.
    from llm_gym.run.budget import activation_bytes
    from llm_gym.train import update

    lean = trainer(tiny_dir, tmp_path, "memory", device=device)
    assert lean.updater.by_memory == (device == "cuda")
    lean.updater.by_memory = True
    modes = []
    record_checkpointing(lean.model, modes)
    lean.optimizer.step = lambda: None
    tokens, masks = batch([30, 20], prompt=5, vocab=256)
    lengths = [len(t) for t in tokens]
    need = activation_bytes(lean.model.config.to_dict(), 50, 4)  # packed: 30 + 20 tokens
    params = sum(p.numel() for p in lean.model.parameters())
    pending = 4 * params + 8 * params  # the gradients, AdamW's moments before its first step
    cases = [(10**15, False), (0, True)]
    if device == "cpu":  # at the boundary (on CUDA torch's cached memory adds to the free)
        cases += [(2 * (need + pending), False), (need + pending, True)]
    for free, checkpointed in cases:
        monkeypatch.setattr(update, "available_memory", lambda device, free=free: free)
        lean.updater.stepped = False  # before the first step: AdamW's moments still to come
        modes.clear()
        lean.update(tokens, masks, per_token_advantages(torch.tensor([1.0, -1.0]), lengths))
        assert modes == [checkpointed], free
    forced = trainer(tiny_dir, tmp_path, "forced", device=device, gradient_checkpointing=False)
    forced.updater.by_memory = True
    monkeypatch.setattr(update, "available_memory", lambda device: 0)
    forced.optimizer.step = lambda: None
    modes.clear()
    record_checkpointing(forced.model, modes)
    forced.update(tokens, masks, per_token_advantages(torch.tensor([1.0, -1.0]), lengths))
    assert modes == [False]  # the flag still decides when given


def test_a_sharded_run_needs_its_slice_of_the_trained_weights(tiny_dir, monkeypatch):
    # Weights, gradients and AdamW's moments (16 bytes a parameter in float32) are split over
    # the processes; on the CPU the processes of one machine split its memory too.
    from llm_gym.run import budget

    model, params = budget.model_shape(tiny_dir)
    each = budget.per_sequence(model, 64, 4, train=True)
    free = params * 16 // 2 + each + 1000  # half the trained copy and one sequence
    monkeypatch.setattr(budget, "available_memory", lambda device: free)
    batch = [("--minibatch-size", 1, 64, True)]
    config, gpu = GRPOConfig(model=tiny_dir), torch.device("cuda")
    with pytest.raises(ValueError, match="--minibatch-size 1: 1 sequences .* more than the"):
        budget.check_run(config, gpu, batch, train=True)
    budget.check_run(config, gpu, batch, train=True, shards=(2, 2))  # half each: it fits
    with pytest.raises(ValueError, match="--minibatch-size 1"):  # two on one CPU: half the RAM
        budget.check_run(config, torch.device("cpu"), batch, train=True, shards=(2, 2))
    budget.check_run(config, torch.device("cpu"), batch, train=True, shards=(2, 1))


def test_on_the_cpu_activations_beyond_the_weights_are_checkpointed(tmp_path):
    # Issue 75, item 8: a micro-batch far under the token threshold whose activations would
    # outweigh the model's weights is checkpointed (the default model: from about 300 tokens,
    # where 2048 let a GuessTheNumber iteration peak at 5.25 GB; bench_iteration_memory.py).
    from transformers import LlamaConfig, LlamaForCausalLM

    from llm_gym.train.optim import adamw
    from llm_gym.train.update import GRPOUpdate

    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8)
    shape = LlamaConfig(vocab_size=256, num_attention_heads=4, num_key_value_heads=4, **sizes)
    model = LlamaForCausalLM(shape)  # 1.4 MB of weights, 45 KB of activations a token
    update = GRPOUpdate(
        model, adamw(list(model.parameters()), 1e-3), GRPOConfig(out=str(tmp_path)), 0
    )
    assert update.plan(*batch([40, 40], vocab=256)).checkpointed == [True]  # 80 tokens
    assert update.plan(*batch([4], vocab=256)).checkpointed == [False]  # lighter than the weights
