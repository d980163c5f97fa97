"""``TransformersPolicy``: the Gymnasium form of TorchRL's ``TransformersWrapper``, and how a
policy reads its inputs (``Encoder``: a ChatEnv ``dict`` keyed by input mode, a vector env's
holding a tuple per key; observations in, token ids out), which ``SamplerPolicy`` shares."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import LogProbs, Masks, Response, Tokens
from llm_gym.chat.history import History
from llm_gym.chat.templates import get_chat_template
from llm_gym.checks import check_bool, check_choice
from llm_gym.lm.tensors import forward_logits, has_prefix, left_pad
from llm_gym.policies.distributions import MaskedCategorical
from llm_gym.samplers import LogProbOutput, Sample, check_token_ids
from llm_gym.samplers.base import ScoredResponse
from llm_gym.samplers.transformers import (
    SubEnvGenerators,
    TransformersSampler,
    check_length,
    generation_settings,
)
from llm_gym.spaces import INPUT_MODES

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Encoder", "LogProbOutput", "TransformersPolicy"]

# get_dist mask names; the second of each pair is TorchRL's name for the use case.
DIST_MASKS = {"prompt": "prompt", "sft": "prompt", "assistant": "assistant", "rlhf": "assistant"}
DIST_MASKS |= {"attention": "attention", "generic": "attention"}


@dataclass
class Encoded:
    """One conversation as token ids: ``prompt_length`` is where the response starts (None when
    the input gives no split); ``assistant_mask`` marks the assistant's tokens (None when the
    input cannot tell)."""

    ids: np.ndarray
    prompt_length: int | None = None
    assistant_mask: np.ndarray | None = None


def _messages(value: object) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(m, Mapping) for m in value)
    )


def _describe(value: object) -> str:
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


def check_tokenizer(tokenizer: object) -> None:
    """A ``TypeError`` unless ``tokenizer`` looks like a transformers tokenizer."""
    if tokenizer is None or not (callable(tokenizer) and hasattr(tokenizer, "decode")):
        raise TypeError(
            f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
        )


def split_observation(
    obs: object, input_mode: str
) -> tuple[list[History | str | np.ndarray], bool]:
    """The per-conversation values under ``obs[input_mode]``, and whether ``obs`` was a batch."""
    if not isinstance(obs, Mapping):
        raise TypeError(
            f"obs must be a dict observation keyed by input mode (e.g. {{{input_mode!r}: ...}}), "
            f"got {type(obs).__name__}"
        )
    if input_mode not in obs:
        raise ValueError(
            f"obs has no {input_mode!r} key (the policy's input_mode); got keys {sorted(obs)}. "
            "Create the env with the same input_mode or observation_keys including it."
        )
    value = obs[input_mode]
    if input_mode == "history":
        if isinstance(value, History) or _messages(value):
            return [History(value) if not isinstance(value, History) else value], False
        if isinstance(value, (list, tuple)) and len(value) == 0:
            raise ValueError("obs['history'] is empty: expected at least one message")
        if isinstance(value, (list, tuple)) and all(
            isinstance(h, History) or _messages(h) for h in value
        ):
            return [h if isinstance(h, History) else History(h) for h in value], True
        raise TypeError(
            "obs['history'] must be a tuple of {'role', 'content'} dicts (or a tuple of such "
            f"tuples for a batch), got {_describe(value)}"
        )
    if input_mode == "text":
        if isinstance(value, str):
            return [value], False
        if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) for t in value):
            return list(value), True
        raise TypeError(
            f"obs['text'] must be a str (or a tuple of str for a batch), got {_describe(value)}"
        )
    rows = (isinstance(value, np.ndarray) and value.ndim == 2) or (
        isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, np.integer))
    )
    if rows:
        return [check_token_ids("obs['tokens']", row) for row in value], True
    return [check_token_ids("obs['tokens']", value)], False


def split_responses(
    responses: ScoredResponse | Sequence[ScoredResponse] | None, n: int, batched: bool
) -> list[ScoredResponse | None]:
    """One response (or None) per conversation, checked against the observation's batch."""
    if responses is None:
        return [None] * n
    if not batched:
        return [responses]
    if not isinstance(responses, (list, tuple)):
        raise TypeError(
            f"responses must be a list with one response per observation ({n}) for a batched "
            f"observation, got {type(responses).__name__}"
        )
    if len(responses) != n:
        raise ValueError(
            f"responses must have one entry per observation: got {len(responses)} responses "
            f"for {n} observations"
        )
    return list(responses)


class Encoder:
    """Chat template and tokenizer settings shared by every conversation of a policy."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        template_kwargs: Mapping[str, Any],
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.template_kwargs = {k: v for k, v in template_kwargs.items() if v is not None}
        self.codec = TokenCodec(tokenizer)

    def render(self, history: History, *, generation_prompt: bool) -> dict[str, np.ndarray]:
        """Token ids and assistant mask of ``history`` under the policy's template."""
        return history.apply_chat_template(
            self.tokenizer,
            add_generation_prompt=generation_prompt,
            return_assistant_tokens_mask=True,
            **self.template_kwargs,
        )

    def prompts(self, values: Sequence[History | str | np.ndarray]) -> list[np.ndarray]:
        """Token ids to generate from (generation prompt included); texts tokenized in a batch."""
        texts: dict[int, str] = {}
        for i, value in enumerate(values):
            if isinstance(value, History):
                texts[i] = value.apply_chat_template(
                    self.tokenizer, add_generation_prompt=True, **self.template_kwargs
                )
            elif isinstance(value, str):
                texts[i] = value
        encoded = dict(zip(texts, self.codec.encode_many(list(texts.values())), strict=True))
        return [self._checked(Encoded(encoded.get(i, v))).ids for i, v in enumerate(values)]

    def scored(self, value: History | str | np.ndarray, response: ScoredResponse | None) -> Encoded:
        """A conversation to score: prompt plus response, or a whole conversation."""
        if response is not None and not isinstance(response, (Response, str, np.ndarray)):
            raise TypeError(
                "each response must be a Response, a str or a 1-D int64 array of token ids, "
                f"got {type(response).__name__}"
            )
        tokens = response.tokens if isinstance(response, Response) else None
        if isinstance(response, np.ndarray):
            tokens = check_token_ids("response", response)
        text = response.text if isinstance(response, Response) else response
        if isinstance(value, History) and tokens is None:
            # A whole conversation; a text response is its last turn, closed by the template.
            if response is not None:
                value = value.copy().append({"role": "assistant", "content": text})
            return self._checked(self._full_history(value))
        if response is None:
            return self._checked(Encoded(self._ids(value)))
        tokens = self.codec.encode(text) if tokens is None else tokens
        if isinstance(value, History):
            rendered = self.render(value, generation_prompt=True)
            prompt, mask = rendered["input_ids"], rendered["assistant_masks"]
        else:
            prompt = self._ids(value)
            mask = np.zeros(len(prompt), bool)
        mask = np.concatenate([mask, np.ones(len(tokens), bool)])
        return self._checked(Encoded(np.concatenate([prompt, tokens]), len(prompt), mask))

    def _ids(self, value: str | np.ndarray) -> np.ndarray:
        return self.codec.encode(value) if isinstance(value, str) else value

    def _full_history(self, history: History) -> Encoded:
        rendered = self.render(history, generation_prompt=False)
        ids, mask = rendered["input_ids"], rendered["assistant_masks"]
        prompt_length = None
        if len(history) > 1 and history.roles[-1] == "assistant":
            # The response is the last assistant turn: what the full rendering adds to the
            # prompt rendered with its generation prompt.
            prompt_ids = self.render(history[:-1], generation_prompt=True)["input_ids"]
            if np.array_equal(ids[: len(prompt_ids)], prompt_ids):
                prompt_length = len(prompt_ids)
        return Encoded(ids, prompt_length, mask)

    def _checked(self, encoded: Encoded) -> Encoded:
        if encoded.ids.size == 0:
            raise ValueError("a conversation encodes to 0 tokens: nothing to feed the model")
        check_token_ids("a conversation (obs and responses)", encoded.ids, self.vocab_size)
        return encoded


def dist_mask(
    mask: str | np.ndarray | torch.Tensor | Sequence[np.ndarray],
    encoded: list[Encoded],
    attention: torch.Tensor,
) -> torch.Tensor:
    """The ``(B, T)`` bool mask ``mask`` names (or gives), in the padded layout of ``attention``."""
    batch, width = attention.shape
    if isinstance(mask, str):
        kind = DIST_MASKS[check_choice("mask", mask, DIST_MASKS)]
        if kind == "attention":
            return attention
        rows = []
        for i, enc in enumerate(encoded):
            if kind == "assistant" and enc.assistant_mask is None:
                raise ValueError(
                    f"mask='assistant' needs to know the assistant's tokens, unknown for "
                    f"conversation {i}: give history input or the responses"
                )
            if kind == "prompt" and enc.prompt_length is None:
                raise ValueError(
                    f"mask='prompt' needs to know where the response starts, unknown for "
                    f"conversation {i}: pass the prompt as obs and the responses separately"
                )
            prompt = np.arange(len(enc.ids)) >= (enc.prompt_length or 0)
            rows.append(enc.assistant_mask if kind == "assistant" else prompt)
        mask = rows
    if isinstance(mask, (list, tuple)):
        if len(mask) != batch:
            raise ValueError(
                f"mask must have one entry per conversation ({batch}), got {len(mask)}"
            )
        padded = np.zeros((batch, width), dtype=bool)
        for i, (row, enc) in enumerate(zip(mask, encoded, strict=True)):
            row = np.asarray(row)
            if row.shape != enc.ids.shape or row.dtype != bool:
                raise ValueError(
                    f"mask[{i}] must be a bool array of the conversation's length "
                    f"{len(enc.ids)}, got dtype {row.dtype} and shape {row.shape}"
                )
            padded[i, width - len(row) :] = row
        mask = padded
    mask = torch.as_tensor(mask, device=attention.device)
    if mask.dtype != torch.bool or mask.shape != (batch, width):
        raise ValueError(
            f"a custom mask must be bool with the padded shape {(batch, width)}, got dtype "
            f"{mask.dtype} and shape {tuple(mask.shape)}"
        )
    return mask & attention


# Constructor arguments get_new_version copies from the policy's attributes of the same name.
_ARGUMENTS = ("model", "tokenizer", "input_mode", "generate", "return_log_probs", "pad_output")
_ARGUMENTS += ("num_samples", "chat_template_name", "chat_template", "device", "compute_dtype")
_SAMPLE_COUNTS = ("n", "num_return_sequences")  # a scorer samples nothing


class TransformersPolicy:
    """A transformers causal LM as a policy over ChatEnv observations, over a
    ``TransformersSampler`` (``.sampler``, which holds the model, the generation settings and
    ``version``): ``sample`` and ``score`` are the sampler's, so the policy is a ``Sampler`` and
    a ``Scorer`` too. docs/policies.md says what each mode returns and shows one stepping a
    ChatEnv.

    Generate mode (default): ``policy(obs)`` gives a ``Response`` (a list for a vector env's
    batch; ``num_samples=k``: k per observation). Log-prob mode (``generate=False``):
    ``policy(obs, responses=None)`` gives a ``LogProbOutput`` per conversation, where ``obs``
    is the prompt and ``responses`` the replies (``Response``, whose exact tokens are used,
    ``str`` or token array), or ``obs`` is a whole conversation. The policy never switches the
    model between train and eval mode; that stays the caller's.

    Args:
        model: a transformers causal LM (``AutoModelForCausalLM``).
        tokenizer: its tokenizer (needed to render chat templates, tokenize and decode).
        input_mode: which observation key to read: ``"history"``, ``"text"`` or ``"tokens"``.
        generate: the call generates responses (True) or scores given ones (False).
        generate_kwargs: passed to ``model.generate``; any ``GenerationConfig`` attribute,
            plus the aliases ``max_tokens`` (``max_new_tokens``) and ``n``
            (``num_return_sequences``). ``max_new_tokens`` defaults to 256.
        return_log_probs: attach log-probs to samples (must be True in log-prob mode).
        pad_output: log-prob mode only: one left-padded ``(B, T)`` output for a batch instead
            of a list of unpadded ones. Responses are never padded.
        num_samples: generate this many Responses per observation (needs ``do_sample``).
        chat_template_name / chat_template: the template for ``"history"`` inputs (default:
            chosen from the tokenizer, as ChatEnv does; pass the env's ``template_kwargs``).
        device: where inputs go; default the model's device.
        compute_dtype: the dtype its forwards compute in (autocast below the weights' dtype;
            None: the weights').
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        input_mode: str = "history",
        generate: bool = True,
        generate_kwargs: Mapping[str, Any] | None = None,
        return_log_probs: bool = True,
        pad_output: bool = False,
        num_samples: int | None = None,
        chat_template_name: str | None = None,
        chat_template: str | None = None,
        device: str | torch.device | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        check_tokenizer(tokenizer)
        self.input_mode = check_choice("input_mode", input_mode, INPUT_MODES)
        self.generate = check_bool("generate", generate)
        self.pad_output = check_bool("pad_output", pad_output)
        check_bool("return_log_probs", return_log_probs)
        if not generate and not return_log_probs:
            raise ValueError("return_log_probs must be True when generate=False (log-prob mode)")
        if chat_template_name is not None:
            get_chat_template(chat_template_name)  # validates the name
        self.chat_template_name, self.chat_template = chat_template_name, chat_template
        self._given_kwargs = dict(generate_kwargs or {})  # get_new_version starts from them
        if not generate:  # the kwargs are checked and kept for get_new_version(generate=True)
            generation_settings(model, generate_kwargs, num_samples, generate)
            generate_kwargs = {
                k: v for k, v in self._given_kwargs.items() if k not in _SAMPLE_COUNTS
            }
        self.sampler = TransformersSampler(
            model, tokenizer, generate_kwargs=generate_kwargs, num_samples=num_samples,
            return_log_probs=return_log_probs, device=device, compute_dtype=compute_dtype,
        )  # fmt: skip
        template = {"chat_template_name": chat_template_name, "chat_template": chat_template}
        self._encoder = Encoder(tokenizer, self.vocab_size, template)
        # A trainer's generator per sub-env, which draws each response (None: torch's RNG).
        self.sub_env_generators: SubEnvGenerators | None = None

    def __repr__(self) -> str:
        return (
            f"TransformersPolicy({type(self.model).__name__}, input_mode={self.input_mode!r}, "
            f"generate={self.generate}, num_samples={self.num_samples}, version={self.version})"
        )

    # -- what the sampler holds --------------------------------------------------------------

    model = property(lambda self: self.sampler.model, doc="The transformers model.")
    tokenizer = property(lambda self: self.sampler.tokenizer, doc="The model's tokenizer.")
    device = property(lambda self: self.sampler.device, doc="Where inputs go.")
    compute_dtype = property(lambda self: self.sampler.compute_dtype, doc="Its forwards' dtype.")
    vocab_size = property(lambda self: self.sampler.vocab_size, doc="The embedding's rows.")
    num_samples = property(lambda self: self.sampler.num_samples, doc="Samples per prompt.")
    return_log_probs = property(lambda self: self.sampler.return_log_probs)
    generate_kwargs = property(lambda self: self.sampler.generate_kwargs)
    pad_token_id = property(lambda self: self.sampler.pad_token_id)
    eos_token_ids = property(lambda self: self.sampler.eos_token_ids)

    @property
    def version(self) -> int | None:
        """The policy version its samples carry: the sampler's (one counter for both)."""
        return self.sampler.version

    @version.setter
    def version(self, value: int | None) -> None:
        self.sampler.version = value

    # -- token level: the Sampler and Scorer protocols, by the sampler ----------------------

    def sample(
        self,
        prompts: Sequence[np.ndarray],
        *,
        generators: Sequence[torch.Generator] | None = None,
    ) -> list[Sample]:
        """The sampler's ``sample``: one ``Sample`` per prompt (``num_samples`` consecutive
        ones per prompt when set), all generated in one left-padded batch."""
        return self.sampler.sample(prompts, generators=generators)

    def score(
        self, prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The sampler's ``score``: ``float32`` log-probs of each response's tokens given its
        prompt, in one forward pass."""
        return self.sampler.score(prompts, responses)

    def with_settings(self, **overrides: Any) -> TransformersPolicy:
        """A policy over ``self.sampler.with_settings(**overrides)`` (``temperature``,
        ``top_p``, ``max_new_tokens``, ``seed``), sharing the model and the rest; this policy
        is left as it was."""
        policy = copy.copy(self)
        policy.sampler = self.sampler.with_settings(**overrides)
        return policy

    # -- observation level -------------------------------------------------------------------

    def __call__(
        self,
        obs: Mapping[str, Any],
        responses: ScoredResponse | Sequence[ScoredResponse] | None = None,
        *,
        response_only: bool = False,
        generators: Sequence[torch.Generator] | None = None,
    ) -> Response | list[Response] | list[list[Response]] | LogProbOutput | list[LogProbOutput]:
        """Generate mode: Response(s) for ``obs``. Log-prob mode: score ``obs`` (+ responses).

        ``response_only=True`` (log-prob mode, with ``responses``): logits for the response
        positions only (``log_probs.prompt`` and ``.full`` are None); the vocabulary projection
        over the prompt costs as much as the rest of the forward pass on a small model.
        ``generators`` (generate mode): one per response, each drawing its response's tokens
        (``TransformersSampler.sample``'s).
        """
        values, batched = split_observation(obs, self.input_mode)
        if self.generate:
            if responses is not None:
                raise RuntimeError(
                    "this policy generates (generate=True) and takes no responses; to score "
                    "responses use policy.get_new_version(generate=False)"
                )
            if generators is None and self.sub_env_generators is not None and "env_index" in obs:
                generators = self.sub_env_generators.of(obs["env_index"])
            samples = self.sample(self._encoder.prompts(values), generators=generators)
            rows = [s.tokens for s in samples]
            texts = self._encoder.codec.decode_many(rows, skip_special_tokens=False)
            results = [
                Response(text, s.tokens, s.log_probs, s.version)
                for text, s in zip(texts, samples, strict=True)
            ]
            if self.num_samples is not None:
                k = self.num_samples
                results = [results[i * k : (i + 1) * k] for i in range(len(values))]
            return results if batched else results[0]
        if response_only and (responses is None or self.pad_output):
            raise ValueError(
                "response_only=True needs responses (the prompt as obs and the replies to "
                f"score) and pad_output=False, got responses={type(responses).__name__} and "
                f"pad_output={self.pad_output}"
            )
        encoded = self._encode(values, responses, batched)
        # The window holds every response plus the position before it, whose logits predict
        # the response's first token; its own first position is never a response token.
        keep = max(len(e.ids) - e.prompt_length for e in encoded) + 1 if response_only else 0
        rows = [e.ids for e in encoded]
        log_probs = self.sampler.sequence_log_probs(rows, keep)
        width = log_probs.shape[1]
        if self.pad_output:
            cpu = torch.device("cpu")
            ids, attention = (t.numpy() for t in left_pad(rows, self.pad_token_id, cpu))
            assistant = None
            if any(e.assistant_mask is not None for e in encoded):
                assistant = np.zeros_like(attention)
                for row, enc in enumerate(encoded):
                    if enc.assistant_mask is not None:
                        assistant[row, width - len(enc.ids) :] = enc.assistant_mask
            return LogProbOutput(ids, LogProbs(full=log_probs), Masks(attention, assistant))
        outputs = []
        for row, enc in enumerate(encoded):
            n, ids = enc.prompt_length, enc.ids
            if response_only:
                split = LogProbs(response=log_probs[row, width - (len(ids) - n) :])
            else:
                full = log_probs[row, width - len(ids) :]
                split = LogProbs(*((None, None) if n is None else (full[:n], full[n:])), full)
            tokens = Tokens(*((None, None) if n is None else (ids[:n], ids[n:])), ids)
            masks = Masks(np.ones(len(ids), dtype=bool), enc.assistant_mask)
            outputs.append(LogProbOutput(ids, split, masks, tokens))
        return outputs if batched else outputs[0]

    def get_new_version(self, **changes: object) -> TransformersPolicy:
        """A policy with some constructor arguments changed, sharing this one's model object
        and starting at its ``version``. ``generate=False`` drops ``num_samples`` and turns
        ``return_log_probs`` on unless given; ``generate_kwargs`` are kept for switching back.
        """
        current = {name: getattr(self, name) for name in _ARGUMENTS}
        current["generate_kwargs"] = self._given_kwargs
        unknown = sorted(set(changes) - set(current))
        if unknown:
            raise TypeError(
                f"get_new_version got unknown arguments {unknown}; valid: {sorted(current)}"
            )
        if changes.get("generate") is False:
            changes.setdefault("num_samples", None)
            changes.setdefault("return_log_probs", True)
        policy = type(self)(**(current | changes))
        policy.version = self.version
        return policy

    def get_dist(
        self,
        obs: Mapping[str, Any],
        responses: ScoredResponse | Sequence[ScoredResponse] | None = None,
        *,
        mask: str | np.ndarray | torch.Tensor | Sequence[np.ndarray] = "assistant",
    ) -> tuple[MaskedCategorical, torch.Tensor]:
        """``(dist, input_ids)``: a ``MaskedCategorical`` over the left-padded ``(B, T)`` tokens
        of the scored conversations (``B`` is 1 for one observation), from one forward pass
        with autograd, for a loss. ``mask`` selects the positions:

        - ``"prompt"`` / ``"sft"``: the response tokens (everything after the prompt);
        - ``"assistant"`` / ``"rlhf"``: every assistant token, all turns (``all_assistant_mask``);
        - ``"attention"`` / ``"generic"``: every real token;
        - custom: a bool ``(B, T)`` array in the padded layout, or one 1-D bool array per
          conversation (its unpadded length).

        The first token of each sequence has no prefix, so it is never selected.
        """
        if self.generate:
            raise RuntimeError(
                "get_dist scores given conversations and needs a log-prob policy: use "
                "policy.get_new_version(generate=False).get_dist(...)"
            )
        values, batched = split_observation(obs, self.input_mode)
        encoded = self._encode(values, responses, batched)
        ids, attention = left_pad([e.ids for e in encoded], self.pad_token_id, self.device)
        selected = dist_mask(mask, encoded, attention) & has_prefix(attention)
        check_length(self.model, ids.shape[1])
        with self.sampler.precision():
            logits = forward_logits(self.model, ids, attention)
        # Line the logits up with the tokens they predict; position 0 predicts nothing.
        aligned = F.pad(logits[:, :-1], (0, 0, 1, 0))
        return MaskedCategorical(aligned, selected), ids

    # -- the shared forward pass -------------------------------------------------------------

    def _encode(
        self,
        values: list[History | str | np.ndarray],
        responses: ScoredResponse | Sequence[ScoredResponse] | None,
        batched: bool,
    ) -> list[Encoded]:
        responses = split_responses(responses, len(values), batched)
        return [self._encoder.scored(v, r) for v, r in zip(values, responses, strict=True)]
