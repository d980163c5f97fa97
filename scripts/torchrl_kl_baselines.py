"""TorchRL's KL transforms on bench_kl.py's conversations: the baselines it times (D, F, H).

Each builder returns ``(call, prepare)``: ``prepare()`` builds the transform's input (not
timed) and ``call(td)`` runs the transform under ``torch.inference_mode()`` and returns what
the benchmark checks. TorchRL's transforms do not turn autograd off themselves (its
``Collector.rollout`` runs under ``no_grad``), and recording the forward would only slow them.
TorchRL is not a dependency of llm_gym; this module is imported only when it is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensordict
import torch
from tensordict import TensorDict, lazy_stack
from torchrl.envs.llm.transforms.kl import KLRewardTransform, RetrieveKL
from torchrl.modules.llm import TransformersWrapper

__all__ = ["history_check", "kl_reward_transform", "retrieve_kl_tokens", "retrieve_kl_history"]

Builder = tuple[Callable[[Any], Any], Callable[[], Any]]

tensordict.set_list_to_stack(True).set()  # TorchRL's LLM stack requires it


def _wrapper(model: Any, tokenizer: Any, input_mode: str, key: str = "log_probs") -> Any:
    # device=: TorchRL's wrapper moves the tokens it is given to the model's device only when
    # told to; without it a CUDA model gets CPU tokens ("index is on cpu, different from other
    # tensors on cuda:0" in the embedding). The baselines' inputs are CPU data, as ours are.
    return TransformersWrapper(
        model,
        tokenizer=tokenizer,
        input_mode=input_mode,
        generate=False,
        return_log_probs=True,
        pad_output=False,
        log_probs_key=key,
        device=model.device,
    )


def _jagged(values: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.nested_tensor(values, layout=torch.jagged)


def kl_reward_transform(
    model: Any, tokenizer: Any, rows: list[dict], prompts: list[np.ndarray], responses: list
) -> Builder:
    """D: ``KLRewardTransform`` (generator log-probs come with the data, one ref forward)."""
    import datasets
    from torch.utils.data import DataLoader
    from torchrl.envs.llm import GSM8KEnv
    from torchrl.envs.llm.datasets.gsm8k import _collate_fn

    # device=: the transform moves its input there for the call (its I/O policy).
    transform = KLRewardTransform(
        _wrapper(model, tokenizer, "tokens"), coef=0.1, tokenizer=tokenizer, device=model.device
    )
    # The transform reads its action key from its parent env's input mode, so it needs one.
    # TorchRL's GSM8KEnv in tokens mode cannot reset with batch_size=(N,) N>1 (it lazy-stacks
    # ragged prompt tokens), so the transform sits on a batch_size=(1,) env and is called on
    # the N-conversation tensordict directly.
    loader = DataLoader(
        datasets.Dataset.from_list(rows), batch_size=1, shuffle=False, collate_fn=_collate_fn
    )
    env = GSM8KEnv.from_dataloader(
        loader, batch_size=(1,), input_mode="tokens", tokenizer=tokenizer
    )
    env.append_transform(transform)

    prompt_ids = [torch.as_tensor(p) for p in prompts]
    pairs = list(zip(prompt_ids, responses, strict=True))
    full = [torch.cat([p, torch.as_tensor(r.tokens)]) for p, r in pairs]
    # The generator's log-probs over the full sequence (TorchRL's key ("log_probs", "full")),
    # zeros on the prompt, which assistant-only masking ignores.
    gen = [
        torch.cat([torch.zeros(len(p)), torch.as_tensor(r.log_probs, dtype=torch.float32)])
        for p, r in pairs
    ]
    masks = [torch.ones(len(f), dtype=torch.bool) for f in full]

    def prepare() -> Any:
        # Ragged rows as jagged nested tensors: KLRewardTransform reads its action with a
        # plain get(), which fails on a lazy stack of ragged tensors (TorchRL's usual form).
        return TensorDict(
            {
                ("tokens", "prompt"): _jagged(prompt_ids),
                ("tokens", "full"): _jagged(full),
                ("masks", "all_attention_mask"): _jagged(masks),
                ("log_probs", "full"): _jagged(gen),
                ("next", "reward"): torch.zeros(len(full), 1, 1),
            },
            batch_size=(len(full),),
        )

    def call(td: Any) -> list[np.ndarray]:
        with torch.inference_mode():
            out = transform(td)
        kl = out["next"].get("kl_penalty").unbind(0)
        return [k.squeeze(-1)[len(p) :].cpu().numpy() for k, p in zip(kl, prompt_ids, strict=True)]

    return call, prepare


def _lazy_rows(rows: Sequence[dict[Any, Any]]) -> Any:
    # A lazy stack of per-conversation tensordicts: how TorchRL holds ragged LLM data.
    return lazy_stack([TensorDict({**row, ("next", "reward"): torch.zeros(1, 1)}) for row in rows])


def retrieve_kl_tokens(model: Any, tokenizer: Any, full: list[np.ndarray]) -> Builder:
    """F: ``RetrieveKL`` (generator and reference forwards) in tokens mode, where TorchRL
    needs ``assistant_only=False``: KL over every token."""
    transform = RetrieveKL(
        _wrapper(model, tokenizer, "tokens", "log_probs"),
        _wrapper(model, tokenizer, "tokens", "ref_log_probs"),
        assistant_only=False,
        device=model.device,
    )
    ids = [torch.as_tensor(f) for f in full]

    def prepare() -> Any:
        return _lazy_rows(
            [
                {("tokens", "full"): f, ("masks", "all_attention_mask"): torch.ones_like(f).bool()}
                for f in ids
            ]
        )

    def call(td: Any) -> list[np.ndarray]:
        with torch.inference_mode():
            out = transform(td)
        return [k.cpu().numpy() for k in out["next"].get("kl_penalty", as_list=True)]

    return call, prepare


def retrieve_kl_history(model: Any, tokenizer: Any, chats: list[list[dict]]) -> Builder:
    """H: ``RetrieveKL`` in history mode with ``assistant_only=True`` (both libraries'
    default): each conversation is rendered with the chat template and tokenized in the call.
    ``call`` returns the reference log-probs over the full conversation, 0 off the assistant's
    tokens."""
    from torchrl.data.llm import History
    from torchrl.modules.llm.policies.common import ChatHistory

    transform = RetrieveKL(
        _wrapper(model, tokenizer, "history", "log_probs"),
        _wrapper(model, tokenizer, "history", "ref_log_probs"),
        assistant_only=True,
        tokenizer=tokenizer,
        device=model.device,
    )

    def prepare() -> Any:
        return _lazy_rows(
            [{"history": ChatHistory(full=History.from_chats([chat])[0])} for chat in chats]
        )

    def call(td: Any) -> list[np.ndarray]:
        with torch.inference_mode():
            out = transform(td)
        ref = out["next"].get(("ref_log_probs", "full"), as_list=True)
        return [r.cpu().numpy() for r in ref]

    return call, prepare


def history_check(ours: list[np.ndarray], theirs: list[np.ndarray]) -> str:
    """Our response's reference log-probs against the end of TorchRL's full-conversation ones,
    on the tokens TorchRL counts as the assistant's (non-zero there)."""
    diffs, counted, total = [], 0, 0
    for mine, full in zip(ours, theirs, strict=True):
        tail = full[-len(mine) :]
        kept = tail != 0
        diffs.append(float(np.max(np.abs(mine[kept] - tail[kept]), initial=0.0)))
        counted, total = counted + int(kept.sum()), total + len(mine)
    return (
        f"RetrieveKL history ref log-probs llm_gym vs TorchRL {max(diffs):.1e} on the "
        f"{counted} of our {total} response tokens TorchRL charges"
    )
