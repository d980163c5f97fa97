"""Padding-free packing (issue 51, item 4): a micro-batch's sequences in one row, positions
restarting per sequence, each attending to itself only; the log-probs, the gradients and a
whole iteration equal the padded update's."""

import copy

import numpy as np
import pytest
import torch
from conftest import DEVICES
from policy_fixture import scripted_policy

from llm_gym.lm.packing import PACKED_SDPA, pack, supports_packing, use_packed_sdpa
from llm_gym.lm.tensors import has_prefix, left_pad, selected_log_probs
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.loss import microbatches

CPU = torch.device("cpu")


def batch(lengths, prompt=4, seed=0, vocab=49152):
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(0, vocab, size=n) for n in lengths]
    masks = [np.arange(n) >= prompt for n in lengths]
    return tokens, masks


def test_pack_lays_out_each_sequence_and_maps_back_to_the_padded_layout():
    tokens = [np.array([1, 2, 3, 4]), np.array([5]), np.array([6, 7])]
    packed = pack(tokens, CPU)
    assert packed.ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 0, 1]]
    assert packed.cu_seq_lens.tolist() == [0, 4, 5, 7] and packed.max_length == 4
    ids, _ = left_pad(tokens, 0, CPU)
    assert torch.equal(packed.unpad(packed.ids), ids)  # 0 is the padding here too
    assert torch.equal(packed.pad(ids), packed.ids)
    for bad in ([], [np.array([1]), np.array([], dtype=int)]):
        with pytest.raises(ValueError, match="sequences must be one or more sequences of at"):
            pack(bad, CPU)


def test_microbatches_count_real_tokens_when_packed():
    lengths = [50, 700, 120, 650, 300, 90, 80]
    # Padded: rows × the longest <= 1400; packed: the sum, so fewer, fuller forwards.
    assert microbatches(lengths, 1400, 8) == [[0, 6, 5, 2], [4, 3], [1]]
    assert microbatches(lengths, 1400, 8, packed=True) == [[0, 6, 5, 2, 4, 3], [1]]
    assert microbatches(lengths, 1400, 3, packed=True) == [[0, 6, 5], [2, 4, 3], [1]]


def test_packed_log_probs_and_gradients_equal_the_padded_ones(default_model):
    # SmolLM2-135M: grouped-query attention (9 heads over 3), on SDPA, switched to
    # packed_sdpa; the output layer by chunks (LinearLogProbs).
    model = copy.deepcopy(default_model[0])
    assert model.config._attn_implementation == "sdpa" and supports_packing(model)
    tokens, masks = batch([30, 12, 25, 7])
    ids, attention = left_pad(tokens, 0, CPU)
    selected = left_pad(masks, False, CPU)[0].bool() & has_prefix(attention)
    results = {}
    for name in ("padded", "sdpa-mask", "packed_sdpa"):
        if name == "packed_sdpa":
            use_packed_sdpa(model)
            assert model.config._attn_implementation == PACKED_SDPA
        model.zero_grad()
        packed = None if name == "padded" else pack(tokens, CPU)
        log_probs, entropy = selected_log_probs(
            model, ids, attention, selected, packed=packed, entropy=True
        )
        (log_probs.sum()).backward()
        results[name] = (log_probs, entropy, [p.grad.clone() for p in model.parameters()])
    reference = results["padded"]
    assert (reference[0] != 0).sum() == selected.sum()
    for name in ("sdpa-mask", "packed_sdpa"):  # transformers' block mask; packed_sdpa's spans
        log_probs, entropy, grads = results[name]
        torch.testing.assert_close(log_probs, reference[0], atol=2e-5, rtol=0)
        # Entropies reach ~4.3 nats: float32's rounding is relative (2.7e-5 seen on AVX-512).
        torch.testing.assert_close(entropy, reference[1], atol=2e-5, rtol=1e-5)
        scale = max(g.abs().max() for g in reference[2])
        diffs = [(a - b).abs().max() for a, b in zip(grads, reference[2], strict=True)]
        assert max(diffs) <= 1e-4 * scale
    # Sampling (a padded batch) is SDPA's, unchanged.
    with torch.no_grad():
        again = selected_log_probs(model, ids, attention, selected)
    torch.testing.assert_close(again, reference[0], atol=1e-6, rtol=0)


def run(tiny_dir, tmp_path, device, packing, **options):
    rows = [{"question": "What is 2 + 3?", "answer": "#### 5"}]
    config = GRPOConfig(
        model=tiny_dir, out=str(tmp_path / f"packing-{packing}"), env="LLMChat-GSM8K-v0",
        env_args={"dataset": rows}, groups=2, group_size=4, max_new_tokens=8, eval_episodes=0,
        device=device, learning_rate=1e-3, packing=packing, progress=False, warmup_steps=0,
        loss_type="grpo", overlong_cache=0, **options,
    )  # fmt: skip
    # grpo: under dapo's scale one embedding weight's gradient is near 0, where AdamW's first
    # step (about lr times its sign) turns the two paths' rounding into 6e-5.
    trainer = GRPOTrainer(config)
    # Responses of different lengths, right and wrong: ragged rows, advantages never all 0.
    answers = ["It is 5", "6", "The answer is 5, surely", "It is 7 or so"]
    trainer.policy = scripted_policy(trainer.tokenizer, lambda i, _: answers[i % 4])
    return trainer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [{}, {"update_epochs": 2, "kl_loss_coef": 0.1}])
def test_an_iteration_packed_ends_with_the_padded_weights(tiny_dir, tmp_path, device, options):
    trainers = [run(tiny_dir, tmp_path, device, packing, **options) for packing in (True, False)]
    assert [t.updater.packing for t in trainers] == [True, False]
    rows = [t.iteration(0) for t in trainers]
    assert rows[0]["grad_norm"] > 0
    for key in ("loss", "grad_norm", "approx_kl", "entropy", "clip_fraction"):
        assert rows[0][key] == pytest.approx(rows[1][key], abs=1e-5, rel=1e-4), key
    packed, padded = (list(t.model.parameters()) for t in trainers)
    assert any(not torch.equal(a, b) for a, b in zip(packed, padded, strict=True))  # two paths
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for trainer in trainers:
        trainer.close()


def test_only_plain_causal_attention_is_packed_by_sdpa():
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    sizes = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 32}  # fmt: skip
    plain = LlamaForCausalLM(LlamaConfig(**sizes, attn_implementation="sdpa"))
    windowed = MistralForCausalLM(
        MistralConfig(**sizes, sliding_window=4, attn_implementation="sdpa")
    )
    eager = LlamaForCausalLM(LlamaConfig(**sizes, attn_implementation="eager"))
    remote = type("RemoteLlama", (LlamaForCausalLM,), {"__module__": "transformers_modules.x"})
    custom = remote(LlamaConfig(**sizes, attn_implementation="sdpa"))  # trust_remote_code's
    assert [supports_packing(m) for m in (plain, windowed, eager, custom)] == [
        True, False, False, False,
    ]  # fmt: skip
    use_packed_sdpa(eager)  # only SDPA is switched
    assert eager.config._attn_implementation == "eager"
