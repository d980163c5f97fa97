"""``MaskedCategorical``: TorchRL's ``LLMMaskedCategorical`` for position-level masks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import distributions as D

__all__ = ["MaskedCategorical", "allowed_token_mask"]


class MaskedCategorical(D.Distribution):
    """Categorical over the last dim of ``logits`` at the positions where ``mask`` is True
    (response tokens for SFT, assistant tokens for RLHF, real tokens for generic losses).
    Masked positions give exactly 0 to ``log_prob`` and ``entropy``, so a sequence's
    log-probability is ``dist.log_prob(tokens).sum(-1)`` whatever its padding.

    Args:
        logits: unnormalized log-probabilities, shape ``(*B, T, V)``. Position ``t`` holds the
            distribution of token ``t`` (already shifted so it lines up with the tokens).
        mask: bool, shape ``(*B, T)``; False positions (prompt, padding, other turns) are ignored.
        ignore_index: what ``sample`` and ``mode`` put at masked positions (TorchRL and
            PyTorch's ``cross_entropy`` use -100).

    ``logits`` (as given, not masked), ``mask`` (on the logits' device) and ``ignore_index``
    are kept as attributes.

    >>> logits = torch.zeros(1, 3, 4)
    >>> dist = MaskedCategorical(logits, torch.tensor([[False, True, True]]))
    >>> dist.log_prob(torch.tensor([[7, 0, 1]]))  # position 0 is masked: its value is ignored
    tensor([[ 0.0000, -1.3863, -1.3863]])
    >>> dist.entropy()
    tensor([[0.0000, 1.3863, 1.3863]])
    """

    arg_constraints: dict = {}
    has_enumerate_support = False

    def __init__(self, logits: torch.Tensor, mask: torch.Tensor, *, ignore_index: int = -100):
        if not isinstance(logits, torch.Tensor) or logits.ndim < 2:
            raise ValueError(
                "logits must be a torch.Tensor of shape (*batch, seq_len, vocab), got "
                f"{type(logits).__name__} with shape {tuple(getattr(logits, 'shape', ()))}"
            )
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                "mask must be a bool torch.Tensor, got "
                f"{type(mask).__name__} of dtype {getattr(mask, 'dtype', None)}"
            )
        if mask.shape != logits.shape[:-1]:
            raise ValueError(
                "mask must have the logits' shape without the vocab dim, "
                f"{tuple(logits.shape[:-1])}, got {tuple(mask.shape)}"
            )
        self.logits = logits
        self.mask = mask.to(logits.device)
        self.ignore_index = ignore_index
        self._log_normalizer: torch.Tensor | None = None
        super().__init__(batch_shape=logits.shape[:-1], validate_args=False)

    @property
    def vocab_size(self) -> int:
        """The number of categories (the logits' last dim)."""
        return self.logits.shape[-1]

    @property
    def probs(self) -> torch.Tensor:
        """``softmax(logits)`` at every position, masked or not."""
        return torch.softmax(self.logits, dim=-1)

    def _logsumexp(self) -> torch.Tensor:
        # One pass over the vocab, cached: log_prob and entropy both need it.
        if self._log_normalizer is None:
            self._log_normalizer = torch.logsumexp(self.logits, dim=-1)
        return self._log_normalizer

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """log p(value_t) at each unmasked position, 0 at masked ones. ``value``: ``(*B, T)``."""
        if not isinstance(value, torch.Tensor) or value.shape != self.batch_shape:
            raise ValueError(
                f"value must be a tensor of token ids with shape {tuple(self.batch_shape)}, got "
                f"{type(value).__name__} with shape {tuple(getattr(value, 'shape', ()))}"
            )
        value = value.to(self.logits.device).long()
        # Masked positions may hold anything (padding, -100): only the mask decides.
        checked = value[self.mask]
        if checked.numel() and (checked.min() < 0 or checked.max() >= self.vocab_size):
            raise ValueError(
                f"value holds token ids outside [0, {self.vocab_size}) at unmasked positions: "
                f"min {int(checked.min())}, max {int(checked.max())}"
            )
        safe = value.masked_fill(~self.mask, 0)
        picked = self.logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        log_prob = picked - self._logsumexp()
        return log_prob.masked_fill(~self.mask, 0.0)

    def entropy(self) -> torch.Tensor:
        """Entropy at each unmasked position, 0 at masked ones."""
        log_p = self.logits - self._logsumexp().unsqueeze(-1)
        # 0 * log 0 = 0: -inf logits (banned tokens) must give neither NaN nor NaN gradients.
        finite = log_p.masked_fill(torch.isinf(log_p), 0.0)
        return (-(log_p.exp() * finite).sum(-1)).masked_fill(~self.mask, 0.0)

    def sample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        """Token ids drawn at every position; ``ignore_index`` where the mask is False."""
        with torch.no_grad():
            samples = D.Categorical(logits=self.logits).sample(torch.Size(sample_shape))
        return samples.masked_fill(~self.mask, self.ignore_index)

    @property
    def mode(self) -> torch.Tensor:
        """The most likely token at each position; ``ignore_index`` where the mask is False."""
        return self.logits.argmax(-1).masked_fill(~self.mask, self.ignore_index)

    def __repr__(self) -> str:
        return (
            f"MaskedCategorical(batch_shape={tuple(self.batch_shape)}, vocab={self.vocab_size}, "
            f"unmasked={int(self.mask.sum())})"
        )


def allowed_token_mask(
    allowed_token_ids: Sequence[int] | None, n_actions: int
) -> torch.Tensor | None:
    """A bool mask over ``n_actions`` token ids, True at ``allowed_token_ids`` (None: None),
    which must be a non-empty list of ids in ``[0, n_actions)``."""
    if allowed_token_ids is None:
        return None
    ids = list(allowed_token_ids)
    bad = [
        i
        for i in ids
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n_actions
    ]
    if not ids or bad:
        raise ValueError(
            f"allowed_token_ids must be a non-empty list of token ids in [0, {n_actions}), "
            f"got {'an empty list' if not ids else f'invalid ids {bad[:5]}'}"
        )
    mask = torch.zeros(n_actions, dtype=torch.bool)
    mask[[int(i) for i in ids]] = True
    return mask
