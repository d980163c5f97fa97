"""``OpenAISampler``: token-in/token-out sampling from an OpenAI-compatible HTTP server that
returns token ids (vLLM's ``serve``, or any server with vLLM's ``return_token_ids`` option).

The prompt sent is the env's token ids (``/v1/completions`` takes a list of ids as
``prompt``); the ids that come back are used as they are, never re-tokenized. Every prompt is
its own request, sent concurrently (the server batches them), so that each carries its own
seed: a GRPO group repeats one prompt, and one seed for all would sample one response k times.

A server that cannot return token ids is refused when the sampler is made, in one line:

>>> try:
...     OpenAISampler("http://127.0.0.1:9", timeout=1)  # nothing listens on port 9
... except SamplerError as error:
...     print(error)
could not reach the server at http://127.0.0.1:9 (Connection refused): is it running?
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from llm_gym.checks import check_int, check_number
from llm_gym.samplers.base import FINISH_REASONS, Sample, check_token_batch
from llm_gym.seeding import derive_seeds

__all__ = ["OpenAISampler", "SamplerError"]


class SamplerError(RuntimeError):
    """A sampler's server failed: unreachable, died, refused a request or answered garbage.
    The message is one line that says which and what to do."""


class OpenAISampler:
    """A ``Sampler`` over an OpenAI-compatible server's ``/v1/completions``.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:8000"`` (with or without ``/v1``).
        model: the served model's name; None: the server's only model (``/v1/models``).
        max_new_tokens: the token budget of each response (``max_tokens``).
        temperature: sampling temperature; 0 is greedy.
        top_p: nucleus sampling's mass (1.0: off).
        seed: makes sampling reproducible: request ``i`` of call ``c`` gets a seed drawn from
            ``(seed, c, i)``; None: the server's own randomness.
        num_samples: this many samples per prompt (consecutive in the output); None: one.
        return_log_probs: ask for the sampled tokens' log-probs (from the raw logits, as
            ``TransformersPolicy`` returns them; vLLM's default ``--logprobs-mode``).
        vocab_size: token ids must lie below it (checked on the way in and out); None: any.
        api_key: sent as a bearer token, for servers that want one.
        timeout: seconds any one request may take before it is an error (never a hang).
        max_concurrency: requests in flight at once.

    ``version`` counts weight updates (``update_weights``); every ``Sample`` carries it.
    ``with_settings(temperature=, top_p=, max_new_tokens=, seed=)`` gives a sampler of the
    same server with some settings changed, for one request.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        max_new_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        num_samples: int | None = None,
        return_log_probs: bool = True,
        vocab_size: int | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_concurrency: int = 64,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        self.temperature = check_number("temperature", temperature, 0)
        self.top_p = check_number("top_p", top_p, 0)
        self.seed = check_int("seed", seed, 0, optional=True)
        self.num_samples = check_int("num_samples", num_samples, 1, optional=True)
        self.vocab_size = check_int("vocab_size", vocab_size, 1, optional=True)
        self.timeout = check_number("timeout", timeout, 0)
        self.max_concurrency = check_int("max_concurrency", max_concurrency, 1)
        self.return_log_probs = bool(return_log_probs)
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.api_key, self.version, self._calls = api_key, 0, 0
        self.model = model if model is not None else self._only_model()
        self._check_token_ids()

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({self.base_url!r}, model={self.model!r}, version={self.version})"

    # -- the Sampler protocol ----------------------------------------------------------------

    def sample(
        self, prompts: Sequence[np.ndarray], *, seeds: Sequence[int] | None = None
    ) -> list[Sample]:
        """One ``Sample`` per prompt (``num_samples`` consecutive ones per prompt when set),
        the requests in flight together. ``seeds``: each request's own (one per sample; a
        trainer's per sub-env), else drawn from the sampler's ``seed``."""
        prompts = check_token_batch("prompts", prompts, self.vocab_size, min_length=1)
        k = self.num_samples or 1
        requests = [prompt for prompt in prompts for _ in range(k)]
        if seeds is not None:
            if len(seeds) != len(requests):
                raise ValueError(
                    f"seeds must give one seed per sample ({len(requests)}), got {len(seeds)}"
                )
            seeds = [check_int(f"seeds[{i}]", seed, 0) for i, seed in enumerate(seeds)]
        elif self.seed is not None:  # one seed per request, reproducible from (seed, call)
            seeds = derive_seeds(self.seed, self._calls, count=len(requests))
        else:
            seeds = [None] * len(requests)
        self._calls += 1
        if not requests:
            return []
        workers = min(self.max_concurrency, len(requests))
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(self._sample_one, requests, seeds))

    def with_settings(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        max_new_tokens: int | None = None,
        seed: int | None = None,
    ) -> OpenAISampler:
        """A sampler of the same server, starting at this one's ``version``, with the settings
        given changed (None: this one's); this sampler is left as it was. With ``seed`` its
        calls' seeds start again from ``(seed, 0)``: the same draws for the same seed."""
        configured = copy.copy(self)
        if temperature is not None:
            configured.temperature = check_number("temperature", temperature, 0)
        if top_p is not None:
            configured.top_p = check_number("top_p", top_p, 0)
        if max_new_tokens is not None:
            configured.max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
        if seed is not None:
            configured.seed, configured._calls = check_int("seed", seed, 0), 0
        return configured

    def update_weights(self, path: str, version: int | None = None) -> None:
        """Load new weights from ``path`` (a folder of safetensors the server can read) through
        vLLM's ``/collective_rpc`` ``reload_weights``, then drop the cached prefixes (they hold
        the old weights' keys and values); ``version`` becomes ``version`` (default: +1)."""
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        self._post("/collective_rpc", body, hint=(
            "loading weights needs a vLLM server started with VLLM_SERVER_DEV_MODE=1 that can "
            f"read {path}"
        ))  # fmt: skip
        self._post("/reset_prefix_cache", None)
        self.version = self.version + 1 if version is None else version

    def close(self) -> None:
        """Nothing to release: the server is the user's."""

    def __enter__(self) -> OpenAISampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------

    def _body(self, prompt: list[int], seed: int | None, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "return_token_ids": True,  # vLLM's: the sampled ids, not text to re-tokenize
            "skip_special_tokens": False,
        }
        if self.return_log_probs:
            body["logprobs"] = 0  # the sampled token's own log-prob
        if seed is not None:
            body["seed"] = seed
        return body

    def _sample_one(self, prompt: np.ndarray, seed: int | None) -> Sample:
        reply = self._post(
            "/v1/completions", self._body(prompt.tolist(), seed, self.max_new_tokens)
        )
        choice = self._choice(reply)
        tokens = self._token_ids(choice)
        log_probs = None
        if self.return_log_probs:
            values = (choice.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(values, list) or len(values) != len(tokens):
                got = "none" if values is None else f"{len(values)} for {len(tokens)} tokens"
                raise self._garbage(f"one log-prob per sampled token (logprobs), got {got}")
            log_probs = np.asarray(values, dtype=np.float32)
        finish = choice.get("finish_reason")
        if finish not in FINISH_REASONS:
            raise self._garbage(f"finish_reason in {FINISH_REASONS}, got {finish!r}")
        return Sample(tokens, log_probs, finish, self.version)

    def _choice(self, reply: Any) -> dict[str, Any]:
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise self._garbage(f"one completion in 'choices', got {str(reply)[:80]!r}")
        return choices[0]

    def _token_ids(self, choice: dict[str, Any]) -> np.ndarray:
        ids = choice.get("token_ids")
        if ids is None:
            raise SamplerError(
                f"the server at {self.base_url} returned no token ids: it needs vLLM's "
                "'return_token_ids' request option (vLLM >= 0.10.2), and llm_gym never "
                "re-tokenizes text"
            )
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise self._garbage(f"a list of int token ids, got {str(ids)[:80]!r}")
        array = np.asarray(ids, dtype=np.int64)
        if (
            self.vocab_size is not None
            and array.size
            and (array.min() < 0 or array.max() >= self.vocab_size)
        ):
            raise self._garbage(
                f"token ids in [0, {self.vocab_size}), got {array.min()}..{array.max()}"
            )
        return array

    def _check_token_ids(self) -> None:
        # One token from a one-token prompt: refuses at once a server without token ids.
        self._token_ids(self._choice(self._post("/v1/completions", self._body([0], None, 1))))

    def _only_model(self) -> str:
        reply = self._post("/v1/models", None, method="GET")
        names = [m.get("id") for m in reply.get("data", [])] if isinstance(reply, dict) else None
        if not names or len(names) != 1 or not isinstance(names[0], str):
            raise SamplerError(
                f"the server at {self.base_url} serves models {names}: pass model= (or "
                "--model-name) to say which one to sample from"
            )
        return names[0]

    def _post(
        self, path: str, body: dict[str, Any] | None, *, method: str = "POST", hint: str = ""
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.base_url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = " ".join(error.read().decode(errors="replace").split())[:300]
            raise SamplerError(
                f"the server at {self.base_url} refused {method} {path} with HTTP {error.code}: "
                f"{detail}" + (f" ({hint})" if hint else "")
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise self._unreachable(error) from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            raise self._garbage(f"JSON from {path}, got {text[:80]!r}") from None

    def _unreachable(self, error: Exception) -> SamplerError:
        reason = getattr(error, "reason", error)
        reason = getattr(reason, "strerror", None) or str(reason)
        return SamplerError(
            f"could not reach the server at {self.base_url} ({reason}): is it running?"
        )

    def _garbage(self, expected: str) -> SamplerError:
        return SamplerError(f"the server at {self.base_url} answered garbage: expected {expected}")
