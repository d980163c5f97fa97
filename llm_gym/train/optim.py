"""The optimizer of a run and its learning rate: torch's fused AdamW, ``MasterAdamW`` over
float32 masters of low-precision weights, and transformers' schedules with their warm-up."""

from __future__ import annotations

from typing import Any

import torch

from llm_gym.checks import check_choice

__all__ = ["TRANSFORMERS_SCHEDULES", "MasterAdamW", "adamw", "lr_scheduler", "warmup_steps"]


# transformers' schedule of each --lr-schedule, warm-up included (TRL's lr_scheduler_type).
TRANSFORMERS_SCHEDULES = {
    "constant": "constant_with_warmup",
    "linear": "linear",
    "cosine": "cosine",
}


def warmup_steps(given: int | None, total_steps: int, schedule: str) -> int:
    """The warm-up's optimizer steps: ``given``, or (None) none for a ``constant`` schedule
    and a tenth of ``total_steps`` rounded down for a decaying one (so a run of fewer than
    ten steps starts at its full rate).

    >>> [warmup_steps(None, n, "cosine") for n in (20, 9)], warmup_steps(5, 20, "cosine")
    ([2, 0], 5)
    >>> warmup_steps(None, 20, "constant"), warmup_steps(3, 20, "constant")
    (0, 3)
    """
    if given is not None:
        return given
    return 0 if schedule == "constant" else total_steps // 10


def lr_scheduler(
    optimizer: torch.optim.Optimizer,
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    done: int = 0,
) -> torch.optim.lr_scheduler.LRScheduler:
    """transformers' ``schedule`` (``LR_SCHEDULES``: ``warmup_steps`` of linear warm-up from 0,
    then held, or decayed to 0 over ``total_steps`` linearly or along a half cosine) over
    ``optimizer``'s learning rate, at step ``done`` (a resumed run's optimizer steps): each
    ``step()`` after the optimizer's moves it on.

    >>> p = torch.nn.Parameter(torch.zeros(1))
    >>> opt = torch.optim.AdamW([p], lr=1.0)
    >>> s = lr_scheduler(opt, "linear", warmup_steps=2, total_steps=6, done=1)
    >>> lrs = [opt.param_groups[0]["lr"]]
    >>> for _ in range(5):
    ...     opt.step(); s.step(); lrs.append(opt.param_groups[0]["lr"])
    >>> lrs
    [0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    """
    from transformers import get_scheduler

    check_choice("lr_schedule", schedule, tuple(TRANSFORMERS_SCHEDULES))
    scheduler = get_scheduler(
        TRANSFORMERS_SCHEDULES[schedule], optimizer, num_warmup_steps=warmup_steps,
        num_training_steps=total_steps,
    )  # fmt: skip
    # At step `done`: each group's rate from its initial one (a restored optimizer keeps it).
    scheduler.last_epoch = done
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["lr"] = group["initial_lr"] * factor(done)
    return scheduler


def adamw(params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """torch's AdamW (its defaults: betas 0.9/0.999, eps 1e-8, weight decay 0.01), fused into
    one kernel wherever torch has one (CUDA, CPU): the loop over parameters and its
    temporaries the size of the weights go. Elsewhere (a device or dtype without the fused
    kernel) torch's default implementation. Weights below float32 (bfloat16, float16) step
    through float32 masters (``MasterAdamW``): AdamW's small steps round away in them."""
    if any(p.dtype in (torch.bfloat16, torch.float16) for p in params):
        return MasterAdamW(params, lr)
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except RuntimeError:  # "fused=True requires all the params to be ... on a supported device"
        return torch.optim.AdamW(params, lr=lr)


class MasterAdamW(torch.optim.Optimizer):
    """AdamW over float32 master copies of low-precision ``params``: each step casts the
    weights' gradients to float32, steps the masters (``adamw``'s, with float32 moments) and
    rounds them back into the weights. A bfloat16 weight near 0.05 moves only by steps above
    2e-4; at lr 1e-6 AdamW's steps are 1e-6, so plain AdamW on bfloat16 weights leaves them
    exactly where they were, step after step (mixed-precision training's master weights,
    Micikevicius et al., 2018). The masters cost 4 bytes a parameter; the state dict holds
    them, so a resumed run goes on from them, not from the rounded weights (a plain AdamW's
    state, from a checkpoint written before the masters, loads too: its moments in float32,
    the masters from the weights).

    >>> w = torch.nn.Parameter(torch.full((4,), 0.05, dtype=torch.bfloat16))
    >>> start = w[0].item()  # bfloat16's 0.05: 0.050048828125
    >>> plain, master = torch.optim.AdamW([w], lr=1e-6), MasterAdamW([w], lr=1e-6)
    >>> for _ in range(300):
    ...     w.grad = torch.ones_like(w)
    ...     plain.step()
    >>> w[0].item() == start  # 300 steps of 1e-6, each rounded away
    True
    >>> for _ in range(300):
    ...     w.grad = torch.ones_like(w)
    ...     master.step()
    >>> round(master.masters[0][0].item(), 6), w[0].item()  # the master's, rounded
    (0.049749, 0.0498046875)
    """

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        self.params = list(params)
        self.masters = [
            torch.nn.Parameter(p.detach().float().clone(), requires_grad=p.requires_grad)
            for p in self.params
        ]
        self.inner = adamw(self.masters, lr)
        # An Optimizer over the weights, for what reads one (schedulers, clip_grad_norm_,
        # torch.distributed.checkpoint, which names the state by the model's parameters); its
        # step is the masters', with the weights' groups' settings (a scheduler's rate).
        super().__init__(self.params, dict(self.inner.defaults))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def _settings(self, source: list[dict], target: list[dict]) -> None:
        # The hyperparameters (lr, initial_lr, betas, ...) of each group, not its params.
        for group, other in zip(source, target, strict=True):
            other.update((key, value) for key, value in group.items() if key != "params")

    def _mirror(self) -> None:
        # Each weight's state is its master's: a reader of `state` (DCP: "has it stepped?")
        # sees the moments.
        for weight, master in zip(self.params, self.masters, strict=True):
            if master in self.inner.state:
                self.state[weight] = self.inner.state[master]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        self._settings(self.param_groups, self.inner.param_groups)
        for weight, master in zip(self.params, self.masters, strict=True):
            master.grad = None if weight.grad is None else weight.grad.float()
        self.inner.step()
        for weight, master in zip(self.params, self.masters, strict=True):
            weight.copy_(master)
        self._mirror()

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer layout over the weights (``{"state": {i: ...}, "param_groups"}``,
        which ``torch.distributed.checkpoint`` maps to the model's parameter names and
        reshards): each weight's AdamW moments and step, and its float32 ``master``."""
        self._settings(self.param_groups, self.inner.param_groups)
        inner = self.inner.state_dict()
        state = {
            i: {**inner["state"].get(i, {}), "master": master.detach()}
            for i, master in enumerate(self.masters)
        }
        return {"state": state, "param_groups": inner["param_groups"]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``state_dict()``'s state; a plain AdamW's (no ``master``) loads its moments, the
        masters then being the weights."""
        state = state_dict["state"]
        with torch.no_grad():
            for i, master in enumerate(self.masters):
                if "master" in state.get(i, {}):
                    master.copy_(state[i]["master"])
        moments = {
            i: {key: value for key, value in entry.items() if key != "master"}
            for i, entry in state.items()
        }
        self.inner.load_state_dict({"state": moments, "param_groups": state_dict["param_groups"]})
        self._settings(self.inner.param_groups, self.param_groups)
        self._mirror()
