"""Replies sampled in turns: ``Turns`` submits a gateway's requests to its
``BatchingSampler`` ``chunk_tokens`` at a time, so that a long reply delays a short one by
about one chunk, and drops a request as soon as its client hangs up (a call not begun is
taken out of its batch; nothing of it is recorded)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np

from llm_gym.chat.codec import TokenCodec
from llm_gym.samplers.base import Sample, SamplingSettings
from llm_gym.samplers.batching import Batched, BatchingSampler
from llm_gym.seeding import derive_seed

__all__ = ["Turns"]

_POLL = 0.25  # seconds between looks at whether a waiting request's client hung up


class Turns:
    """The chunked sampling of a gateway's requests.

    Args:
        batching: the sampler the chunks go through (requests in flight batched).
        codec: decodes replies to look for stop strings between chunks.
        chunk_tokens: tokens per chunk (None: a reply in one call).
        context_length: the model's positions (a chunk never asks past them; None: unknown).

    ``cancelled`` counts the requests dropped because their client hung up.
    """

    def __init__(
        self, batching: BatchingSampler, codec: TokenCodec, chunk_tokens: int | None,
        context_length: int | None,
    ) -> None:  # fmt: skip
        self.batching, self.codec = batching, codec
        self.chunk_tokens, self.context_length = chunk_tokens, context_length
        self.cancelled = 0

    async def sample(
        self, request: Any, prompt: np.ndarray, n: int, settings: SamplingSettings,
        budget: int | None, stops: list[str],
    ) -> tuple[list[Sample], float, float] | None:  # fmt: skip
        """The ``n`` samples of ``prompt`` (at most ``budget`` tokens each) and the seconds
        they queued and were sampled; None when the client hung up first. Sampled
        ``chunk_tokens`` at a time: each chunk is a call of its own, queued behind the calls
        waiting, its prompt the prompt and the tokens so far (as sampled, never re-tokenized),
        its seed (if any) derived from the request's and the chunk's number. Every chunk asks
        for ``chunk_tokens`` (the last one's tail past ``budget`` dropped), so that the
        chunks of requests at different points share a batch."""
        chunked = (
            self.chunk_tokens is not None and budget is not None and budget > self.chunk_tokens
            and self.batching.configurable and (self.batching.num_samples or 1) == 1
        )  # fmt: skip
        if not chunked:
            if budget is not None and self.batching.configurable:
                settings = replace(settings, max_new_tokens=budget)
            batched = await self._wait(request, self.batching.submit([prompt] * n, settings))
            return None if batched is None else (batched.samples, batched.queued, batched.seconds)
        tokens: list[list[np.ndarray]] = [[] for _ in range(n)]
        log_probs: list[list[np.ndarray] | None] = [[] for _ in range(n)]
        versions: list[list[int | None]] = [[] for _ in range(n)]
        finish, active, done, step = ["length"] * n, list(range(n)), 0, 0
        queued = seconds = 0.0
        while active:
            keep = min(self.chunk_tokens, budget - done)
            seed = settings.seed
            if seed is not None and step:  # the first chunk keeps the request's own seed
                seed = derive_seed(seed, step)
            size = self.chunk_tokens  # past the context only near its end: then what is left
            if self.context_length is not None:
                size = min(size, self.context_length - len(prompt) - done)
            chunk = replace(settings, max_new_tokens=size, seed=seed)
            prompts = [np.concatenate([prompt, *tokens[i]]) for i in active]
            batched = await self._wait(request, self.batching.submit(prompts, chunk))
            if batched is None:
                return None
            queued, seconds = queued + batched.queued, seconds + batched.seconds
            done, step, still = done + keep, step + 1, []
            for i, sample in zip(active, batched.samples, strict=True):
                tokens[i].append(np.asarray(sample.tokens[:keep], np.int64))
                versions[i].append(sample.version)
                if sample.log_probs is None:
                    log_probs[i] = None
                elif log_probs[i] is not None:
                    log_probs[i].append(sample.log_probs[:keep])
                if sample.finish_reason == "stop" and len(sample.tokens) <= keep:
                    finish[i] = "stop"
                elif done < budget and not self._says_stop(tokens[i], stops):
                    still.append(i)
            active = still
        samples = []
        for i in range(n):
            ids = np.concatenate(tokens[i]) if tokens[i] else np.zeros(0, np.int64)
            values = None if log_probs[i] is None else np.concatenate(log_probs[i])
            known = [v for v in versions[i] if v is not None]
            # The oldest policy that sampled any of its tokens (a weight update may come
            # between chunks).
            samples.append(Sample(ids, values, finish[i], min(known) if known else None))
        return samples, queued, seconds

    def _says_stop(self, tokens: list[np.ndarray], stops: list[str]) -> bool:
        if not stops:
            return False
        (text,) = self.codec.decode_many([np.concatenate(tokens)], skip_special_tokens=False)
        return any(stop in text for stop in stops)

    async def _wait(self, request: Any, future: Any) -> Batched | None:
        """What ``future`` gives, or None as soon as ``request``'s client hangs up (the call
        is cancelled if not begun: a batch leaves it out; a begun one is left to finish)."""
        waiting = asyncio.wrap_future(future)
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=_POLL)
            if done:
                return waiting.result()
            if await request.is_disconnected():
                future.cancel()
                waiting.add_done_callback(_retrieve)
                self.cancelled += 1
                return None


def _retrieve(future: asyncio.Future) -> None:
    """Take an abandoned call's outcome, so that its error is not logged as never retrieved."""
    if not future.cancelled():
        future.exception()
