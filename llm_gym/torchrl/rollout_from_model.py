"""``RolloutFromModel``: token-level RLHF rollouts of a causal LM, TorchRL's recipe in plain torch:
each generated token is one step of an episode, ready for GAE and PPO."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from llm_gym.checks import check_bool, check_int, check_number, check_tensor
from llm_gym.lm.tensors import (
    first_eos_lengths,
    first_id,
    forward_logits,
    left_pad,
    token_log_probs,
)
from llm_gym.samplers import Scorer, is_scorer, response_log_probs
from llm_gym.samplers.transformers import generate_with_log_probs, generation_settings
from llm_gym.wrappers.controllers import KLController

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["RolloutFromModel"]

_LENGTH_KEYS = ("max_new_tokens", "max_tokens", "max_length", "min_length")


class PromptBatch(Protocol):
    """A batch given as an object with attributes, like TorchRL's ``PromptData`` (a dict with
    these keys also does): ``input_ids`` ``(B, L)``, ``prompt_rindex`` ``(B,)``, and
    ``attention_mask`` ``(B, L)`` where the label baseline needs it."""

    input_ids: torch.Tensor | np.ndarray | Sequence[Sequence[int]]
    prompt_rindex: torch.Tensor | np.ndarray | Sequence[int]


class RolloutFromModel:
    """Token-level rollouts of a causal LM against a reward model and a reference model:
    TorchRL's ``RolloutFromModel`` without TensorDict.

    ``batch`` is a dict (or an object with these attributes, like TorchRL's ``PromptData``):
    ``input_ids`` ``(B, L)``, right-padded; ``prompt_rindex`` ``(B,)``, the prompt length of
    each row (generation continues from ``input_ids[i, :rindex]``; what follows, e.g. a
    reference completion, is not shown to the model); ``attention_mask`` ``(B, L)``, needed
    for the label baseline. With ``M = max_new_tokens`` and ``W = L + M``, the rollout holds:

    - ``action`` ``(B, M)`` int64: the generated tokens, ``pad_token_id`` after a row ended;
    - ``input_ids`` / ``attention_mask`` ``(B, M, W)``: the prompt plus the first ``t``
      generated tokens at step ``t``, right-padded;
    - ``sample_log_prob`` ``(B, M, 1)`` float32: log π(action) under the raw logits;
    - ``mask`` ``(B, M)`` bool: the real steps (up to and including each row's last token);
    - ``next``: ``input_ids`` / ``attention_mask`` (the state after the step), ``done``,
      ``terminated`` ``(B, M, 1)`` bool, and ``reward = reward_raw + reward_kl``, ``(B, M, 1)``.

    A row ends at its first EOS (``terminated``) or after ``M`` tokens: ``done`` is True on
    that last token, where ``reward_raw`` holds the clipped score; later steps are padding
    (zero reward and log-prob, ``mask`` False).

    Args:
        model: a transformers causal LM that generates the responses.
        ref_model: the frozen reference: a causal LM, or a log-prob policy reading token ids
            (``TransformersPolicy(..., generate=False, input_mode="tokens")``, a
            ``RayLogProbModel``).
        reward_model: called as ``reward_model(input_ids=, attention_mask=)`` on ``(B, W)``
            sequences; returns one score per row: a ``(B,)`` or ``(B, 1)`` tensor, an output
            with ``.logits``, or TorchRL's ``(rewards, end_scores)`` (the last item is used).
        kl_coef: defaults to ``kl_scheduler.coef`` given a scheduler, else 0.1 (TorchRL's).
        max_new_tokens: ``M``, the episode length.
        score_clip: scores are clipped to ``[-score_clip, score_clip]``.
        kl_scheduler: a controller of ``llm_gym.wrappers.controllers``, fed by
            ``step_scheduler()``.
        num_steps: keep only the last ``num_steps`` KL values for the scheduler.
        tokenizer: the last source of EOS and pad ids, after ``generate_kwargs`` and
            ``model.generation_config``; the pad id falls back to the first EOS id.
        label_baseline: subtract the score of the batch's own ``input_ids`` (prompt plus
            reference completion) before clipping, as TorchRL does; False for prompt-only
            batches.
        generate_kwargs: ``GenerationConfig`` settings (default ``do_sample=True``); the
            length is ``max_new_tokens``.

    >>> from llm_gym.lm.loading import tiny_model
    >>> model = tiny_model(vocab_size=32)
    >>> reward = lambda input_ids, attention_mask: attention_mask.sum(-1).float()
    >>> rollout = RolloutFromModel(model, model, reward, max_new_tokens=4, label_baseline=False)
    >>> batch = {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 31]]), "prompt_rindex": [3, 2]}
    >>> out = rollout(batch)
    >>> out["action"].shape, out["input_ids"].shape, out["next"]["reward"].shape
    (torch.Size([2, 4]), torch.Size([2, 4, 7]), torch.Size([2, 4, 1]))
    >>> bool(out["next"]["reward_kl"].eq(0).all())  # ref_model is the model itself
    True
    """

    def __init__(
        self,
        model: PreTrainedModel,
        ref_model: PreTrainedModel | Scorer,
        reward_model: Callable[..., object],
        kl_coef: float | None = None,
        max_new_tokens: int = 50,
        score_clip: float = 10.0,
        kl_scheduler: KLController | None = None,
        num_steps: int | None = None,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        label_baseline: bool = True,
        generate_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not (callable(model) and hasattr(model, "generate") and hasattr(model, "config")):
            raise TypeError(
                "model must be a transformers causal LM (with .generate), got "
                f"{type(model).__name__}"
            )
        if not callable(ref_model):
            raise TypeError(
                "ref_model must be a causal LM or a log-prob policy, got "
                f"{type(ref_model).__name__}"
            )
        if is_scorer(ref_model) and getattr(ref_model, "input_mode", None) != "tokens":
            raise ValueError(
                "a log-prob policy as ref_model must read token ids (input_mode='tokens'), got "
                f"input_mode={getattr(ref_model, 'input_mode', None)!r}"
            )
        if not callable(reward_model):
            raise TypeError(f"reward_model must be callable, got {type(reward_model).__name__}")
        check_int("max_new_tokens", max_new_tokens, 1)
        check_int("num_steps", num_steps, 1, optional=True)
        if not isinstance(score_clip, (int, float)) or not score_clip > 0:
            raise ValueError(f"score_clip must be a number > 0 (inf: no clip), got {score_clip!r}")
        check_number("kl_coef", kl_coef, 0, optional=True)
        if kl_scheduler is not None and not isinstance(kl_scheduler, KLController):
            raise TypeError(
                "kl_scheduler must be a KL controller (llm_gym.wrappers.controllers), got "
                f"{type(kl_scheduler).__name__}"
            )
        if kl_scheduler is None:
            kl_coef = 0.1 if kl_coef is None else kl_coef
        elif kl_coef is None:
            kl_coef = kl_scheduler.coef  # TorchRL's controllers set the model's coef at start
        elif not math.isclose(kl_coef, kl_scheduler.coef):
            raise ValueError(
                f"kl_coef={kl_coef} differs from kl_scheduler.coef={kl_scheduler.coef}: the "
                "scheduler recovers the KL by dividing by its own coef, so leave kl_coef unset"
            )
        check_bool("label_baseline", label_baseline)
        for key in _LENGTH_KEYS:
            if key in (generate_kwargs or {}):
                raise ValueError(
                    f"generate_kwargs may not set {key!r}: the length is max_new_tokens "
                    f"({max_new_tokens}), the episode length of every row"
                )
        kwargs, samples = generation_settings(model, generate_kwargs, None, True)
        kwargs.pop("max_new_tokens", None)  # a default the policy helper adds; ours is M
        if samples not in (None, 1):
            raise ValueError(f"generate_kwargs asks for {samples} samples per prompt; use 1")

        self.model = model
        self.ref_model = ref_model
        self.reward_model = reward_model
        self.kl_coef = float(kl_coef)
        self.max_new_tokens = max_new_tokens
        self.score_clip = float(score_clip)
        self.kl_scheduler = kl_scheduler
        self.label_baseline = label_baseline
        gen = model.generation_config
        eos = kwargs.get("eos_token_id", gen.eos_token_id)
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        self.eos_token_ids = [] if eos is None else [int(e) for e in np.atleast_1d(eos)]
        self.pad_token_id = first_id(
            kwargs.get("pad_token_id"), gen.pad_token_id,
            getattr(tokenizer, "pad_token_id", None), eos, default=-1,
        )  # fmt: skip
        if self.pad_token_id < 0:
            raise ValueError(
                "no pad or EOS token id: the model's generation_config has none; pass "
                "tokenizer= or generate_kwargs={'pad_token_id': ...}"
            )
        self.generate_kwargs = {"do_sample": True, **kwargs, "pad_token_id": self.pad_token_id}
        self.generate_kwargs["eos_token_id"] = self.eos_token_ids or None
        # TorchRL keeps the last num_steps values (a deque) or all of them (a list).
        self._kl_queue: collections.deque[float] = collections.deque(maxlen=num_steps)

    def __repr__(self) -> str:
        return (
            f"RolloutFromModel({type(self.model).__name__}, kl_coef={self.kl_coef:.6g}, "
            f"max_new_tokens={self.max_new_tokens}, score_clip={self.score_clip})"
        )

    # -- public API ------------------------------------------------------------------------

    def __call__(self, batch: Mapping[str, object] | PromptBatch) -> dict[str, Any]:
        """Generate responses for ``batch`` and return the rollout dict."""
        generated, log_probs, log_ratio = self.generate(batch)
        return self.create_rollout(batch, generated, log_probs, log_ratio)

    rollout_from_data = __call__  # TorchRL's name

    @torch.no_grad()
    def generate(
        self, batch: Mapping[str, object] | PromptBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample up to ``max_new_tokens`` per prompt.

        Returns ``generated`` ``(B, L + M)``: each prompt followed by its response, right-padded
        with ``pad_token_id``; ``log_probs`` ``(B, M, 1)``: log π of each generated token under
        the raw logits (0 after the response); ``log_ratio`` ``(B, M)``: ``log p - log q`` of
        each generated token under ``model`` and ``ref_model`` (0 after the response).
        """
        input_ids, _, rindex = _read_batch(batch, _device(self.model), self.label_baseline)
        batch_size, length = input_ids.shape
        m = self.max_new_tokens
        # Left-pad the prompts: decoder-only models generate from the right edge.
        rows = [row[:end] for row, end in zip(input_ids.tolist(), rindex.tolist(), strict=True)]
        prompts, left_mask = left_pad(rows, self.pad_token_id, input_ids.device)
        new, log_probs = generate_with_log_probs(
            self.model, prompts, left_mask, max_new_tokens=m, **self.generate_kwargs
        )
        lengths = first_eos_lengths(new, self.eos_token_ids)
        steps = new.shape[1]  # generate stops early when every row has ended
        real = torch.arange(steps, device=new.device) < lengths[:, None]

        in_prompt = torch.arange(length, device=input_ids.device) < rindex[:, None]
        prompt_only = torch.where(in_prompt, input_ids, self.pad_token_id)
        generated = F.pad(prompt_only, (0, m), value=self.pad_token_id)
        index = rindex[:, None] + torch.arange(steps, device=new.device)
        generated.scatter_(1, index, torch.where(real, new, self.pad_token_id))
        log_probs = F.pad(torch.where(real, log_probs, 0.0), (0, m - steps))
        return generated, log_probs.unsqueeze(-1), self._log_ratio(generated, rindex, lengths)

    @torch.no_grad()
    def create_rollout(
        self,
        batch: Mapping[str, object] | PromptBatch,
        generated: torch.Tensor,
        log_probs: torch.Tensor,
        log_ratio: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The rollout dict for ``generate``'s output (``log_ratio`` is computed if None).

        Appends the rollout's mean KL reward to the values ``step_scheduler`` will use.
        """
        input_ids, attention_mask, rindex = _read_batch(
            batch, _device(self.model), self.label_baseline
        )
        batch_size, length = input_ids.shape
        m = self.max_new_tokens
        shaped = f" for this batch and max_new_tokens={m}"
        generated = check_tensor("generated", generated, (batch_size, length + m), shaped)
        log_probs = check_tensor("log_probs", log_probs, (batch_size, m, 1), shaped)
        device = generated.device
        steps = torch.arange(m, device=device)
        action = generated.gather(1, rindex[:, None] + steps)
        lengths = first_eos_lengths(action, self.eos_token_ids)
        valid = steps < lengths[:, None]
        if log_ratio is None:
            log_ratio = self._log_ratio(generated, rindex, lengths)
        log_ratio = check_tensor("log_ratio", log_ratio, (batch_size, m), shaped)
        done = (steps == (lengths - 1)[:, None]).unsqueeze(-1)
        eos = torch.tensor(self.eos_token_ids, dtype=torch.long, device=device)
        terminated = done & torch.isin(action, eos).unsqueeze(-1)  # the last token is an EOS

        # State at step t: the prompt plus the first min(t, length) generated tokens.
        shown = torch.minimum(torch.arange(m + 1, device=device), lengths[:, None])
        visible = torch.arange(length + m, device=device) < (rindex[:, None] + shown)[..., None]
        states = torch.where(visible, generated[:, None, :], self.pad_token_id)

        score = self._score(states[:, -1], visible[:, -1])
        if self.label_baseline:
            score = score - self._score(input_ids, attention_mask)
        clipped = score.clamp(-self.score_clip, self.score_clip)
        reward_raw = clipped[:, None, None] * done
        reward_kl = torch.where(valid, -self.kl_coef * log_ratio.float(), 0.0).unsqueeze(-1)
        self._kl_queue.append(float(reward_kl.mean()))
        return {
            "action": action,
            "input_ids": states[:, :-1],
            "attention_mask": visible[:, :-1],
            "sample_log_prob": torch.where(valid.unsqueeze(-1), log_probs.float(), 0.0),
            "mask": valid,
            "next": {
                "input_ids": states[:, 1:],
                "attention_mask": visible[:, 1:],
                "done": done,
                "terminated": terminated,
                "reward": reward_raw + reward_kl,
                "reward_raw": reward_raw,
                "reward_kl": reward_kl,
            },
        }

    create_rollout_td = create_rollout  # TorchRL's name

    def step_scheduler(self) -> float:
        """Update ``kl_coef`` from the KL rewards collected since the last call; return it."""
        if self.kl_scheduler is None:
            raise RuntimeError("step_scheduler needs a kl_scheduler; this rollout has none")
        if not self._kl_queue:
            raise RuntimeError("step_scheduler: no rollout was collected since the last update")
        self.kl_coef = float(self.kl_scheduler.update(list(self._kl_queue)))
        self._kl_queue.clear()
        return self.kl_coef

    # -- helpers -------------------------------------------------------------------------

    def _log_ratio(
        self, generated: torch.Tensor, rindex: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """``log p - log q`` of each generated token (0 after the response), ``(B, M)``."""
        log_p = _log_probs(self.model, generated, rindex, lengths, self.max_new_tokens)
        log_q = _log_probs(self.ref_model, generated, rindex, lengths, self.max_new_tokens)
        return log_p - log_q.to(log_p.device)

    def _score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.reward_model(input_ids=input_ids, attention_mask=attention_mask.long())
        if hasattr(out, "logits"):
            out = out.logits
        elif isinstance(out, (tuple, list)):
            out = out[-1]  # TorchRL's reward models return (rewards, end_scores)
        # A tensor as is; else a copy (B scores), never a torch view of a read-only array.
        scores = out if isinstance(out, torch.Tensor) else torch.tensor(np.asarray(out))
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.shape != input_ids.shape[:1]:
            raise ValueError(
                f"reward_model must return one score per sequence, shape ({input_ids.shape[0]},),"
                f" got shape {tuple(scores.shape)}"
            )
        return scores.float().to(input_ids.device)


def _device(model: PreTrainedModel) -> torch.device:
    device = getattr(model, "device", None)
    return device if isinstance(device, torch.device) else next(model.parameters()).device


def _log_probs(
    model: PreTrainedModel | Scorer,
    generated: torch.Tensor,
    rindex: torch.Tensor,
    lengths: torch.Tensor,
    m: int,
) -> torch.Tensor:
    """log π of the ``m`` tokens after each prompt under a causal LM or a log-prob policy,
    ``(B, m)``, 0 after the response (``lengths`` tokens)."""
    if is_scorer(model):
        return _policy_log_probs(model, generated, rindex, lengths, m)
    device = _device(model)
    ids, rindex, lengths = generated.to(device), rindex.to(device), lengths.to(device)
    width = int((rindex + lengths).max())
    real = torch.arange(width, device=device) < (rindex + lengths)[:, None]
    # Generated tokens are predicted from the shortest prompt's last token on (right
    # padding): only the logits of that window are computed.
    start = int(rindex.min()) - 1
    logits = forward_logits(model, ids[:, :width], real, width - start)
    log_probs = token_log_probs(logits, ids[:, start:width], real[:, start:])
    steps = torch.arange(m, device=device)
    source = (rindex[:, None] + steps - start).clamp(max=width - start - 1)
    return torch.where(steps < lengths[:, None], log_probs.gather(1, source), 0.0)


def _policy_log_probs(
    policy: Scorer, generated: torch.Tensor, rindex: torch.Tensor, lengths: torch.Tensor, m: int
) -> torch.Tensor:
    rows = generated.cpu().numpy()
    spans = zip(rows, rindex.tolist(), (rindex + lengths).tolist(), strict=True)
    prompts, responses = zip(
        *[(row[:start], row[start:end]) for row, start, end in spans], strict=True
    )
    try:
        scored = response_log_probs(policy, {"tokens": prompts}, list(responses), batched=True)
    except AttributeError as error:  # an output without .log_probs.response
        raise ValueError(
            f"ref_model must return one LogProbOutput per sequence, got: {error}"
        ) from error
    if [v.shape for v in scored] != [r.shape for r in responses]:
        raise ValueError(
            "ref_model must return one LogProbOutput per sequence with log_probs.response of "
            f"the response's length {[len(r) for r in responses]}, got shapes "
            f"{[v.shape for v in scored]}"
        )
    # Padded in numpy: a scorer's arrays may be read-only (Ray's zero-copy results, frozen
    # buffers), and torch.as_tensor on one warns; this one copy is all it takes.
    log_q = np.zeros((len(scored), m), dtype=np.float32)
    for row, values in enumerate(scored):
        log_q[row, : len(values)] = values
    return torch.from_numpy(log_q)


def _read_batch(
    batch: Mapping[str, object] | PromptBatch, device: torch.device, label_baseline: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``prompt_rindex`` of a batch, checked."""
    fields = {}
    for key in ("input_ids", "attention_mask", "prompt_rindex"):
        value = batch.get(key) if isinstance(batch, Mapping) else getattr(batch, key, None)
        fields[key] = None if value is None else torch.as_tensor(value, device=device)
    input_ids, attention_mask, rindex = fields.values()
    if input_ids is None or rindex is None:
        raise KeyError(
            "batch must hold 'input_ids' (B, L) and 'prompt_rindex' (B,), got "
            f"{sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__}"
        )
    if input_ids.ndim != 2 or input_ids.numel() == 0 or input_ids.is_floating_point():
        raise ValueError(
            "batch['input_ids'] must be a non-empty (B, L) integer tensor, got dtype "
            f"{input_ids.dtype} and shape {tuple(input_ids.shape)}"
        )
    batch_size, length = input_ids.shape
    out_of_range = bool(((rindex < 1) | (rindex > length)).any())
    if rindex.shape != (batch_size,) or rindex.is_floating_point() or out_of_range:
        raise ValueError(
            f"batch['prompt_rindex'] must be ({batch_size},) integers in [1, {length}] (one "
            f"prompt length per row, at most input_ids' width), got {rindex.tolist()} "
            f"({rindex.dtype})"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"batch['attention_mask'] must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask is None and label_baseline:
        raise KeyError(
            "batch has no 'attention_mask', needed to score its reference completion "
            "(label_baseline=True); pass label_baseline=False for prompt-only batches"
        )
    return input_ids.long(), attention_mask, rindex.long()
