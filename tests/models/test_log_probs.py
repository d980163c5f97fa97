"""The log-prob paths: CPU rows, the accelerator window, the compiled kernel and its fallback.

Every path must equal the plain ``log_softmax`` + ``gather`` (within 1e-5 in float32), so
the CUDA paths are checked here on CPU, where their code runs the same.
"""

import shutil
import warnings

import pytest
import torch

from llm_gym.lm import (
    CompiledLogProbs,
    gather_log_probs,
    has_prefix,
    log_probs_of,
    token_log_probs,
)


def plain(logits: torch.Tensor, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The definition: position t's logits score token t + 1; 0 off the scored tokens."""
    full = torch.log_softmax(logits.float(), dim=-1)
    out = torch.zeros(ids.shape)
    out[:, 1:] = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    return out.masked_fill(~has_prefix(attention), 0.0)


def padded_batch(seed: int = 0, vocab: int = 97) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 4, 1, 0, 7]  # a 1-token row scores nothing, an empty row is all padding
    width = max(lengths)
    attention = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        attention[row, width - n :] = True
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g)
    logits = torch.randn(len(lengths), width, vocab, generator=g) * 6
    return logits, ids, attention


def test_window_path_equals_the_row_path_and_the_definition():
    logits, ids, attention = padded_batch()
    expected = plain(logits, ids, attention)
    rows = token_log_probs(logits, ids, attention, window=False)  # the CPU's default
    window = token_log_probs(logits, ids, attention, window=True, compiled=False)
    assert rows.dtype == window.dtype == torch.float32
    assert rows.shape == window.shape == ids.shape
    assert torch.allclose(rows, expected, atol=1e-5, rtol=0)
    assert torch.allclose(window, expected, atol=1e-5, rtol=0)
    # padding and first tokens are exactly 0 on both paths; scored tokens are negative
    scored = has_prefix(attention)
    assert (window[~scored] == 0).all() and (rows[~scored] == 0).all()
    assert (window[scored] < 0).all()


def test_bfloat16_logits_are_scored_in_float32():
    logits, ids, attention = padded_batch(seed=1)
    half = logits.bfloat16()
    expected = plain(half.float(), ids, attention)
    window = token_log_probs(half, ids, attention, window=True, compiled=False)
    assert window.dtype == torch.float32
    assert torch.allclose(window, expected, atol=1e-5, rtol=0)
    assert torch.allclose(token_log_probs(half, ids, attention), expected, atol=1e-5, rtol=0)


def test_eager_chunks_give_the_same_values_as_one_chunk():
    logits, ids, _ = padded_batch(seed=2)
    whole = log_probs_of(logits, ids, compiled=False)
    chunked = log_probs_of(logits, ids, compiled=False, chunk_rows=3)
    assert torch.equal(whole, chunked)
    reference = torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    assert torch.allclose(whole, reference, atol=1e-5, rtol=0)


def test_gather_log_probs_matches_log_softmax_for_2d_logits():
    g = torch.Generator().manual_seed(3)
    logits, targets = torch.randn(6, 50, generator=g) * 4, torch.randint(0, 50, (6,), generator=g)
    expected = torch.log_softmax(logits, -1)[torch.arange(6), targets]
    assert torch.allclose(gather_log_probs(logits, targets), expected, atol=1e-5, rtol=0)
    assert torch.allclose(log_probs_of(logits, targets, compiled=False), expected, atol=1e-5)


def test_log_probs_of_names_mismatched_shapes():
    with pytest.raises(ValueError, match=r"targets must have the logits' leading shape \(2, 3\)"):
        log_probs_of(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_the_compiled_kernel_falls_back_to_eager_with_one_warning(monkeypatch):
    def broken_compile(*args, **kwargs):
        def kernel(*a, **k):
            raise RuntimeError("no triton here")

        return kernel

    monkeypatch.setattr(torch, "compile", broken_compile)
    kernel = CompiledLogProbs()
    logits, ids, _ = padded_batch(seed=4)
    with pytest.warns(RuntimeWarning, match="no triton here"):
        assert kernel(logits, ids) is None  # the caller runs the eager form
    assert kernel.failed
    with warnings.catch_warnings():  # no second warning: the failure is remembered
        warnings.simplefilter("error")
        assert kernel(logits, ids) is None


@pytest.mark.slow
def test_the_compiled_kernel_equals_the_definition_with_changing_shapes():
    """The kernel CUDA runs, compiled here for the CPU (Inductor's C++ backend) when a C
    compiler is present; without one the call must fall back with the same values."""
    kernel = CompiledLogProbs()
    for seed, dtype in ((5, torch.float32), (6, torch.float32), (7, torch.bfloat16)):
        logits, ids, attention = padded_batch(seed=seed, vocab=61 + seed)
        logits = logits[: 5 - seed % 2].to(dtype)  # batch size changes too
        ids, attention = ids[: logits.shape[0]], attention[: logits.shape[0]]
        eager = log_probs_of(logits, ids, compiled=False)
        if shutil.which("cc") or shutil.which("gcc"):
            got = kernel(logits, ids)
            assert not kernel.failed and got.dtype == torch.float32
            assert torch.allclose(got, eager, atol=1e-5, rtol=0)
        else:
            with pytest.warns(RuntimeWarning, match="torch.compile of the log-prob kernel"):
                assert kernel(logits, ids) is None
        with warnings.catch_warnings():  # log_probs_of's shared kernel, compiled or not
            warnings.simplefilter("ignore", RuntimeWarning)
            got = token_log_probs(logits, ids, attention, window=True, compiled=True)
        assert got.dtype == torch.float32
        assert torch.allclose(got, plain(logits.float(), ids, attention), atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_paths_equal_the_cpu_definition():
    logits, ids, attention = padded_batch(seed=8)
    expected = plain(logits, ids, attention)
    for dtype in (torch.float32, torch.bfloat16):
        on_gpu = logits.to("cuda", dtype)
        got = token_log_probs(on_gpu, ids.cuda(), attention.cuda())
        assert got.device.type == "cuda" and got.dtype == torch.float32
        want = expected if dtype == torch.float32 else plain(on_gpu.float().cpu(), ids, attention)
        assert torch.allclose(got.cpu(), want, atol=1e-5, rtol=0)
