"""``SamplerPolicy``: any ``Sampler`` (a vLLM server, an OpenAI-compatible one) as a policy
over ChatEnv observations, returning the ``Response`` actions ``TransformersPolicy`` returns.

Observations become token ids as ``TransformersPolicy`` makes them (the tokens mode passes the
env's ids through untouched); the sampled ids come back as they are, with their log-probs and
the sampler's version, and the text is only decoded from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llm_gym.chat.containers import Response
from llm_gym.chat.templates import get_chat_template
from llm_gym.checks import check_choice
from llm_gym.policies.transformers import Encoder, check_tokenizer, split_observation
from llm_gym.samplers.base import Sampler, check_sampler
from llm_gym.spaces import INPUT_MODES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from llm_gym.samplers.transformers import SubEnvGenerators

__all__ = ["SamplerPolicy"]


class SamplerPolicy:
    """``policy(obs)``: a ``Response`` per observation (a list for a vector env's batch; a list
    of ``num_samples`` per observation when the sampler samples several).

    Args:
        sampler: anything with ``sample(prompts) -> list[Sample]`` (``llm_gym.samplers``).
        tokenizer: the model's tokenizer (renders history and text inputs, decodes the texts).
        input_mode: which observation key to read: ``"history"``, ``"text"`` or ``"tokens"``.
        chat_template_name / chat_template: the template for ``"history"`` inputs (as
            ``TransformersPolicy``'s).
    """

    generate = True  # a policy that samples; the KL wrappers' scorers have False

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: PreTrainedTokenizerBase,
        *,
        input_mode: str = "tokens",
        chat_template_name: str | None = None,
        chat_template: str | None = None,
    ) -> None:
        check_sampler(sampler)
        check_tokenizer(tokenizer)
        if chat_template_name is not None:
            get_chat_template(chat_template_name)  # validates the name
        self.sampler, self.tokenizer = sampler, tokenizer
        self.input_mode = check_choice("input_mode", input_mode, INPUT_MODES)
        template = {"chat_template_name": chat_template_name, "chat_template": chat_template}
        self._encoder = Encoder(tokenizer, len(tokenizer), template)
        # A trainer's generator per sub-env, which seeds each request (None: the sampler's own).
        self.sub_env_generators: SubEnvGenerators | None = None

    def __repr__(self) -> str:
        return f"SamplerPolicy({self.sampler!r}, input_mode={self.input_mode!r})"

    @property
    def version(self) -> int | None:
        """The sampler's policy version (what its next responses will carry)."""
        return getattr(self.sampler, "version", None)

    def __call__(
        self, obs: Mapping[str, Any], *, seeds: Sequence[int] | None = None
    ) -> Response | list[Response] | list[list[Response]]:
        """Response(s) to ``obs``, sampled in one call of the sampler (``seeds``: each
        sample's own, for a sampler that takes them: ``OpenAISampler``'s)."""
        values, batched = split_observation(obs, self.input_mode)
        prompts = self._encoder.prompts(values)
        if seeds is None and self.sub_env_generators is not None and "env_index" in obs:
            seeds = self.sub_env_generators.seeds(obs["env_index"])
        samples = (
            self.sampler.sample(prompts)
            if seeds is None
            else self.sampler.sample(prompts, seeds=seeds)
        )
        k = getattr(self.sampler, "num_samples", None)
        if len(samples) != len(values) * (k or 1):
            raise ValueError(
                f"the sampler returned {len(samples)} samples for {len(values)} prompts: "
                f"expected {k or 1} for each (its num_samples)"
            )
        rows = [s.tokens for s in samples]
        texts = self._encoder.codec.decode_many(rows, skip_special_tokens=False)
        results = [
            Response(text, s.tokens, s.log_probs, s.version)
            for text, s in zip(texts, samples, strict=True)
        ]
        if k is not None:
            results = [results[i * k : (i + 1) * k] for i in range(len(values))]
        return results if batched else results[0]

    def close(self) -> None:
        """Close the sampler (stops a server llm_gym started)."""
        close = getattr(self.sampler, "close", None)
        if close is not None:
            close()
