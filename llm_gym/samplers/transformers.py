"""The transformers generation backend: ``TransformersSampler`` (``model.generate`` with the
log-probs of the sampled tokens under the raw logits, its settings checked before any
generation; a ``Sampler`` whose token-level ``score`` is the ``Scorer``'s). The policy over it
is ``llm_gym.policies.TransformersPolicy``; TorchRL's ``RolloutFromModel`` generates through
``generate_with_log_probs`` too. The vLLM and OpenAI-compatible backends are ``vllm`` and
``openai`` beside this file."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from llm_gym.checks import check_bool, check_int, check_number
from llm_gym.lm.precision import autocast
from llm_gym.lm.tensors import (
    first_eos_lengths,
    first_id,
    gather_log_probs,
    left_pad,
    selected_log_probs,
)
from llm_gym.samplers.base import Sample, check_token_batch
from llm_gym.seeding import derive_seed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "SubEnvGenerators",
    "TransformersSampler",
    "check_length",
    "generate_with_log_probs",
    "generation_settings",
    "seeded_generator",
]

DEFAULT_MAX_NEW_TOKENS = 256
_GENERATE_ALIASES = {"max_tokens": "max_new_tokens", "n": "num_return_sequences"}
_RESERVED = {
    "return_dict_in_generate": "the policy always asks for a dict output",
    "output_logits": "the policy reads raw logits itself (set return_log_probs instead)",
    "output_scores": "log-probs come from raw logits, not processed scores",
    "output_attentions": "the policy returns Responses, not model internals",
    "output_hidden_states": "the policy returns Responses, not model internals",
    "stop_strings": "a response's length is read from its EOS token; a stop string leaves none",
}


def generation_settings(
    model: PreTrainedModel,
    generate_kwargs: Mapping[str, Any] | None,
    num_samples: int | None,
    generate: bool,
) -> tuple[dict[str, Any], int | None]:
    """Checked ``generate`` kwargs (aliases resolved) and the number of samples per prompt.

    Unknown keys, aliases given twice and settings that would break the log-probs fail here,
    with a message naming the key, not deep inside ``model.generate``.
    """
    if generate_kwargs is not None and not isinstance(generate_kwargs, Mapping):
        raise TypeError(
            f"generate_kwargs must be a dict or None, got {type(generate_kwargs).__name__}"
        )
    kwargs: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in (generate_kwargs or {}).items():
        name = _GENERATE_ALIASES.get(key, key)
        if name in kwargs:
            raise ValueError(
                f"generate_kwargs gives both {given_as[name]!r} and {key!r}, which set {name!r}"
            )
        kwargs[name], given_as[name] = value, key
    unknown = sorted(set(kwargs) - _valid_keys())
    if unknown:
        raise ValueError(
            f"generate_kwargs has unknown keys {unknown}: expected GenerationConfig attributes "
            f"or the aliases {sorted(_GENERATE_ALIASES)}"
        )
    for key, why in _RESERVED.items():
        if key in kwargs:
            raise ValueError(f"generate_kwargs may not set {key!r}: {why}")
    for key in ("max_new_tokens", "min_new_tokens", "max_length"):
        if kwargs.get(key) is not None:
            check_int(f"generate_kwargs[{key!r}]", kwargs[key], 1)
    if kwargs.get("num_beams", 1) != 1:
        raise ValueError(
            f"generate_kwargs['num_beams'] must be 1, got {kwargs['num_beams']}: beam search "
            "reorders sequences, so per-step logits no longer give each sequence's log-probs"
        )
    num_samples = check_int("num_samples", num_samples, 1, optional=True)
    if num_samples is not None and not generate:
        raise ValueError("num_samples applies to generate mode, got it with generate=False")
    n = kwargs.pop("num_return_sequences", None)
    if not generate:  # the kwargs are kept for get_new_version(generate=True)
        return kwargs, None
    if n is not None and num_samples is not None and n != num_samples:
        raise ValueError(f"num_samples={num_samples} differs from generate_kwargs n={n}")
    if num_samples is None and n is not None and n > 1:
        num_samples = n
    if num_samples is not None:
        do_sample = kwargs.get("do_sample", model.generation_config.do_sample)
        if num_samples > 1 and not do_sample:
            raise ValueError(
                f"num_samples={num_samples} needs sampling: set generate_kwargs['do_sample']=True "
                "(greedy decoding gives the same response every time)"
            )
        kwargs["num_return_sequences"] = num_samples
    if "max_length" not in kwargs and model.generation_config.max_new_tokens is None:
        kwargs.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    return kwargs, num_samples


@functools.cache
def _valid_keys() -> frozenset[str]:
    # transformers is imported on first use: this layer is torch-only at import time.
    from transformers import GenerationConfig

    return frozenset(GenerationConfig().to_dict()) - {"transformers_version", "_from_model_config"}


def generate_with_log_probs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    log_probs: bool = True,
    **generate_kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``model.generate`` from left-padded prompts ``(B, L)``: the new tokens ``(B, N)`` and
    float32 log π of each under the raw logits, before temperature, top-k/top-p or penalties
    (None with ``log_probs=False``, which keeps no logits)."""
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        return_dict_in_generate=True,
        output_logits=log_probs,
        **generate_kwargs,
    )
    new = out.sequences[:, input_ids.shape[1] :]
    if not log_probs:
        return new, None
    # One gather per step: log-softmax over a stacked (B, N, V) tensor would copy the logits.
    log_probs = torch.empty(new.shape, dtype=torch.float32, device=new.device)
    for step, logits in enumerate(out.logits):
        log_probs[:, step] = gather_log_probs(logits, new[:, step])
    return new, log_probs


def seeded_generator(seed: int, *key: int) -> torch.Generator:
    """A CPU generator seeded by ``derive_seed(seed, *key, bits=64)`` (keys that differ
    anywhere give independent draws): a trainer's generator of one sub-env in one
    iteration, ``seeded_generator(seed, iteration, sub_env)``, which ``sample(generators=)``
    draws that sub-env's tokens from.

    >>> a, b = seeded_generator(0, 3, 5), seeded_generator(0, 3, 5)
    >>> bool(torch.rand(4, generator=a).equal(torch.rand(4, generator=b)))
    True
    """
    return torch.Generator().manual_seed(derive_seed(seed, *key, bits=64))


class SubEnvGenerators:
    """Each sub-env's own random generator in a run's iteration: sub-env ``i`` of a process
    whose sub-envs start at ``first`` draws from ``seeded_generator(seed, iteration, first +
    i)``, so a sample depends on neither the process that drew it nor the others beside it in
    a batch. A policy holding them (its ``sub_env_generators``) draws each prompt's tokens
    with the generator of the sub-env its observation's ``"env_index"`` names; ``seek``
    moves them to an iteration (a turn after another draws on from where the last left).

    >>> generators = SubEnvGenerators(seed=0, first=4)
    >>> generators.seek(3)
    >>> (a,) = generators.of([1])
    >>> bool(torch.rand(2, generator=a).equal(torch.rand(2, generator=seeded_generator(0, 3, 5))))
    True
    """

    def __init__(self, seed: int, first: int = 0) -> None:
        self.seed, self.first, self.iteration = seed, first, 0
        self._generators: dict[int, torch.Generator] = {}

    def seek(self, iteration: int) -> None:
        """Every sub-env's generator from the beginning of ``iteration``'s draws."""
        self.iteration, self._generators = iteration, {}

    def of(self, sub_envs: Sequence[int]) -> list[torch.Generator]:
        """The generators of ``sub_envs`` (this process's indices)."""
        return [
            self._generators.setdefault(
                i, seeded_generator(self.seed, self.iteration, self.first + i)
            )
            for i in sub_envs
        ]

    def seeds(self, sub_envs: Sequence[int]) -> list[int]:
        """A request seed for each of ``sub_envs``, drawn from its generator: what a server
        samples from."""
        return [int(torch.randint(2**31 - 1, (), generator=g)) for g in self.of(sub_envs)]


_WARPED = ("temperature", "top_k", "top_p", "min_p")  # applied by _RowDraws instead

# Generation's sampling settings that the row draws apply themselves (HF's own warpers, in
# HF's order), and the ones they cannot: refused by name rather than ignored.
_ROW_UNSUPPORTED = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}


class _RowDraws:
    """A logits processor that draws each row's next token from its own generator (inverse
    CDF of the warped distribution, with a uniform in (0, 1]) and leaves only that token
    possible: ``generate`` then runs greedy (``do_sample=False``) and picks it. A row's t-th
    token uses its generator's t-th draw, whatever rows share its batch, so samples do not
    depend on how a batch is split (across processes, or into groups). HF's multinomial draws
    every row from one RNG call, which ties each row's sample to the whole batch."""

    def __init__(self, generators: Sequence[torch.Generator], config: Any) -> None:
        from transformers import (
            LogitsProcessorList,
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        for name, neutral in _ROW_UNSUPPORTED.items():
            value = getattr(config, name, neutral)
            if value is not None and value != neutral:
                raise ValueError(
                    f"generate_kwargs[{name!r}]={value!r} is not applied when each row draws "
                    f"from its own generator (generators=): leave {name} unset"
                )
        self.generators = list(generators)
        self.warpers = LogitsProcessorList()
        if config.temperature is not None and config.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k:
            self.warpers.append(TopKLogitsWarper(config.top_k))
        if config.top_p is not None and config.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(config.top_p))
        if config.min_p is not None:
            self.warpers.append(MinPLogitsWarper(config.min_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if len(self.generators) != scores.shape[0]:
            raise ValueError(
                f"generators must give one generator per generated row ({scores.shape[0]}), "
                f"got {len(self.generators)}"
            )
        probs = self.warpers(input_ids, scores).float().softmax(-1)
        cdf = probs.cumsum(-1)
        # 1 - U[0, 1) is in (0, 1]: the first token whose CDF reaches it has probability > 0.
        uniform = torch.cat([1 - torch.rand(1, generator=g) for g in self.generators])
        target = (uniform.to(cdf.device) * cdf[:, -1]).unsqueeze(1)
        tokens = torch.searchsorted(cdf, target).clamp_(max=scores.shape[1] - 1)
        return torch.full_like(scores, -math.inf).scatter_(1, tokens, 0.0)


def check_length(model: PreTrainedModel, length: int) -> None:
    """A ``ValueError`` when ``length`` tokens are more than ``model`` has positions for."""
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and length > max_positions:
        raise ValueError(
            f"a conversation has {length} tokens, more than the model's "
            f"max_position_embeddings ({max_positions})"
        )


class TransformersSampler:
    """A transformers causal LM as a ``Sampler`` (``sample``: prompt ids in, the sampled ids,
    their log-probs, finish reasons and ``version`` out) with the token-level ``score`` of a
    ``Scorer``. ``llm_gym.policies.TransformersPolicy`` is the policy over env observations
    built on it (its ``.sampler``).

    Args:
        model: a transformers causal LM (``AutoModelForCausalLM``).
        tokenizer: its tokenizer (the pad and end-of-sequence ids when the model's generation
            config has none; its size is checked against the model's embedding).
        generate_kwargs: passed to ``model.generate``; any ``GenerationConfig`` attribute,
            plus the aliases ``max_tokens`` (``max_new_tokens``) and ``n``
            (``num_return_sequences``). ``max_new_tokens`` defaults to 256.
        num_samples: this many samples per prompt, consecutive (needs ``do_sample``).
        return_log_probs: attach log-probs to samples (False: none are computed).
        seed: each ``sample`` call draws from torch's generator seeded with it (the global
            generator state is kept); None: the global generator.
        device: where inputs go; default the model's device.
        compute_dtype: the dtype its forwards compute in, below the weights' (bfloat16 or
            float16 over float32 weights: torch's autocast, as mixed-precision training's
            forward does); None: the weights'.

    ``version`` is the policy version every ``Sample`` carries (a trainer bumps it).
    ``with_settings(temperature=, top_p=, max_new_tokens=, seed=)`` gives a sampler sharing
    the model with some settings changed, for one request.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        generate_kwargs: Mapping[str, Any] | None = None,
        num_samples: int | None = None,
        return_log_probs: bool = True,
        seed: int | None = None,
        device: str | torch.device | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        if not (callable(model) and hasattr(model, "generate") and hasattr(model, "config")):
            raise TypeError(
                "model must be a transformers causal LM (with .generate), got "
                f"{type(model).__name__}"
            )
        if tokenizer is None or not (callable(tokenizer) and hasattr(tokenizer, "decode")):
            raise TypeError(
                f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
            )
        self.vocab_size = model.get_input_embeddings().num_embeddings
        if len(tokenizer) > self.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the model's embedding has only "
                f"{self.vocab_size} rows: model and tokenizer do not match"
            )
        self.model, self.tokenizer, self.version = model, tokenizer, 0
        self.return_log_probs = check_bool("return_log_probs", return_log_probs)
        self.seed = check_int("seed", seed, 0, optional=True)
        self.device = torch.device(device) if device is not None else model.device
        if compute_dtype is not None and not isinstance(compute_dtype, torch.dtype):
            raise TypeError(
                f"compute_dtype must be a torch.dtype or None, got {type(compute_dtype).__name__}"
            )
        self.compute_dtype = compute_dtype
        self.generate_kwargs, self.num_samples = generation_settings(
            model, generate_kwargs, num_samples, True
        )
        self._given_kwargs = dict(generate_kwargs or {})  # what with_settings starts from
        gen = model.generation_config
        self.pad_token_id = first_id(
            self.generate_kwargs.get("pad_token_id"), gen.pad_token_id,
            tokenizer.pad_token_id, tokenizer.eos_token_id, default=0,
        )  # fmt: skip
        eos = self.generate_kwargs.get("eos_token_id", gen.eos_token_id)
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_token_ids = [] if eos is None else [int(e) for e in np.atleast_1d(eos)]

    def __repr__(self) -> str:
        return (
            f"TransformersSampler({type(self.model).__name__}, num_samples={self.num_samples}, "
            f"version={self.version})"
        )

    def with_settings(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> TransformersSampler:
        """A sampler sharing this one's model, starting at its ``version``, with the settings
        given changed (None: this one's); this sampler is left as it was. ``temperature`` 0
        is greedy (``do_sample=False``); ``max_new_tokens`` replaces a ``max_length``."""
        kwargs = dict(self._given_kwargs)
        if temperature is not None:
            check_number("temperature", temperature, 0)
            if temperature == 0:
                kwargs["do_sample"] = False
                kwargs.pop("temperature", None)
            else:
                kwargs.update(do_sample=True, temperature=temperature)
        if top_p is not None:
            kwargs["top_p"] = check_number("top_p", top_p, 0)
        if max_new_tokens is not None:
            for alias in ("max_length", "max_tokens"):
                kwargs.pop(alias, None)
            kwargs["max_new_tokens"] = check_int("max_new_tokens", max_new_tokens, 1)
        configured = type(self)(
            self.model, self.tokenizer, generate_kwargs=kwargs, num_samples=self.num_samples,
            return_log_probs=self.return_log_probs,
            seed=self.seed if seed is None else seed, device=self.device,
            compute_dtype=self.compute_dtype,
        )  # fmt: skip
        configured.version = self.version
        return configured

    def sample(
        self,
        prompts: Sequence[np.ndarray],
        *,
        generators: Sequence[torch.Generator] | None = None,
    ) -> list[Sample]:
        """One ``Sample`` per prompt (``num_samples`` consecutive ones per prompt when set), all
        prompts generated in one left-padded batch with the sampler's ``generate_kwargs``.
        ``generators`` (one per sample, ``seeded_generator``): each sample's tokens are drawn
        from its own generator, so that a sample does not depend on the others in its batch;
        None: HF's sampling, from torch's generator."""
        prompts = check_token_batch("prompts", prompts, self.vocab_size, min_length=1)
        if not prompts:
            return []
        ids, attention = left_pad(prompts, self.pad_token_id, self.device)
        settings = self.generate_kwargs | {"pad_token_id": self.pad_token_id}
        if generators is not None and settings.get(
            "do_sample", self.model.generation_config.do_sample
        ):
            config, _ = self.model._prepare_generation_config(None, **settings)
            settings = {k: v for k, v in settings.items() if k not in _WARPED}
            settings.update(do_sample=False, logits_processor=[_RowDraws(generators, config)])
        with self._no_grad(), self._generator(), self.precision():
            new, log_probs = generate_with_log_probs(
                self.model, ids, attention, log_probs=self.return_log_probs, **settings
            )
            lengths = first_eos_lengths(new, self.eos_token_ids).tolist()
        tokens = new.cpu().numpy()
        log_probs = None if log_probs is None else log_probs.cpu().numpy()
        samples = []
        for row, n in enumerate(lengths):
            stop = n > 0 and int(tokens[row, n - 1]) in self.eos_token_ids
            row_log_probs = None if log_probs is None else log_probs[row, :n]
            finish = "stop" if stop else "length"
            samples.append(Sample(tokens[row, :n], row_log_probs, finish, self.version))
        return samples

    def sit_out(self) -> None:
        """A generation with no prompt of this process's, while the other processes of a
        run sharding the model (FSDP2) generate: one token from a one-token prompt, whose
        forwards gather the weights with theirs until every process has finished
        (transformers' ``synced_gpus``); nothing on a model not sharded."""
        if not getattr(self.model, "_is_fsdp_managed_module", False):
            return
        ids = torch.full((1, 1), self.pad_token_id, dtype=torch.long, device=self.device)
        # Greedy: a draw would move torch's generator, which the run's samples do not share.
        settings = {"pad_token_id": self.pad_token_id, "max_new_tokens": 1, "do_sample": False}
        with self._no_grad(), self.precision():
            generate_with_log_probs(
                self.model, ids, torch.ones_like(ids), log_probs=False, **settings
            )

    def score(
        self, prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """``float32`` log π(response[t] | prompt + response[:t]) of each response's tokens,
        all pairs in one left-padded forward pass over the response window only."""
        prompts = check_token_batch("prompts", prompts, self.vocab_size, min_length=1)
        responses = check_token_batch("responses", responses, self.vocab_size)
        if len(responses) != len(prompts):
            raise ValueError(
                f"responses must have one entry per prompt: got {len(responses)} responses for "
                f"{len(prompts)} prompts"
            )
        if not prompts:
            return []
        keep = max(len(r) for r in responses) + 1
        sequences = [np.concatenate([p, r]) for p, r in zip(prompts, responses, strict=True)]
        log_probs = self.sequence_log_probs(sequences, keep)
        return [log_probs[row, keep - len(r) :] for row, r in enumerate(responses)]

    def sequence_log_probs(self, sequences: Sequence[np.ndarray], keep: int = 0) -> np.ndarray:
        """``(B, keep or T)`` ``float32`` log-probs of the left-padded ``sequences``' last
        ``keep`` tokens (all with ``keep=0``; 0.0 at the first token and padding)."""
        ids, attention = left_pad(sequences, self.pad_token_id, self.device)
        check_length(self.model, ids.shape[1])
        # The window's tokens through the output layer a chunk of rows at a time: a scorer of
        # long responses (a KL wrapper's reference) never holds their (B, keep, V) logits.
        selected = attention.clone()
        if keep:
            selected[:, :-keep] = False
        window = slice(-keep, None) if keep else slice(None)
        # A sharded model's own (llm_gym.train.sharding registers it as an FSDP forward).
        forward = getattr(self.model, "selected_log_probs", None)
        forward = forward or functools.partial(selected_log_probs, self.model)
        with self._no_grad(), self.precision():
            log_probs = forward(ids, attention, selected)
            return log_probs[:, window].cpu().numpy()

    def precision(self) -> contextlib.AbstractContextManager[object]:
        """The context the model's forwards run in: autocast to ``compute_dtype`` where it is
        below the weights' dtype, else nothing."""
        return autocast(self.device, self.compute_dtype, self.model.dtype)

    def _no_grad(self) -> contextlib.AbstractContextManager[object]:
        # inference_mode, but no_grad on an FSDP2 model: the weights it gathers under
        # inference_mode would be inference tensors, which its next gather may not write.
        if getattr(self.model, "_is_fsdp_managed_module", False):
            return torch.no_grad()
        return torch.inference_mode()

    def _generator(self) -> contextlib.AbstractContextManager[None]:
        """A seeded call's own generator state (the global one restored after), else none."""
        return contextlib.nullcontext() if self.seed is None else _seeded(self.seed, self.device)


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    # The model's device's generator too: CUDA sampling draws from it, not the CPU's.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
