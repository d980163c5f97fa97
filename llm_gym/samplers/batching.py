"""``BatchingSampler``: many callers, one sample call. Any ``Sampler`` behind one sampling
thread: calls that arrive together (from threads, or from event loops through ``asample``)
are sampled in one call of the wrapped sampler; calls with different ``SamplingSettings``
never share one (each group is sampled by ``sampler.with_settings(...)``)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from llm_gym.checks import check_int, check_number
from llm_gym.samplers.base import (
    ConfigurableSampler,
    Sample,
    Sampler,
    SamplingSettings,
    check_sampler,
)

__all__ = ["Batched", "BatchingSampler"]

_NO_SETTINGS = SamplingSettings()


@dataclass(frozen=True)
class Batched:
    """What one call got: its ``samples`` (``k`` consecutive per prompt for a sampler with
    ``num_samples=k``), the seconds it ``queued`` for the sampler (a batch before it, the
    wait for company) and the ``seconds`` its batch's sample call took."""

    samples: list[Sample]
    queued: float
    seconds: float


@dataclass
class _Job:
    prompts: list[np.ndarray]
    settings: SamplingSettings
    future: Future[Batched]
    queued: float  # perf_counter when it was queued


class BatchingSampler:
    """A ``Sampler`` over ``sampler`` whose calls, from any number of threads, share sample
    calls: one thread samples, and the calls waiting when it is free go in one batch.

    Args:
        sampler: any ``Sampler``; per-call settings need a ``ConfigurableSampler``
            (``with_settings``: ``TransformersSampler``, ``TransformersPolicy``, the
            OpenAI-compatible and vLLM samplers).
        max_batch: prompts in one sample call at most.
        batch_wait: seconds the sampling thread waits for one more call while fewer calls
            than its last batch had are in: callers that move together (a GRPO group, a
            batch of episodes) call again at about the same time and stay in one batch,
            while a lone caller never waits. 0: a batch is whatever calls are in when the
            sampler is free.

    ``sample(prompts, settings=None)`` blocks; ``asample`` awaits in an event loop without
    holding a thread; ``submit`` returns a ``Future`` of ``Batched`` (samples and timings);
    ``with_settings(**overrides)`` is a sampler whose calls carry those settings. ``close()``
    stops the thread (the wrapped sampler is the caller's). Sample order, and so a seeded
    sampler's draws, depend on which calls shared a batch.
    """

    def __init__(self, sampler: Sampler, *, max_batch: int = 64, batch_wait: float = 0.02):
        self.sampler = check_sampler(sampler)
        self.max_batch = check_int("max_batch", max_batch, 1)
        self.batch_wait = check_number("batch_wait", batch_wait, 0)
        self.batches = 0  # sample calls made, for the curious (and the tests)
        self.largest_batch = 0  # the most calls one sample call served
        self._last_batch = 1
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"BatchingSampler({self.sampler!r}, max_batch={self.max_batch})"

    @property
    def version(self) -> int | None:
        """The wrapped sampler's version (what its next samples carry)."""
        return getattr(self.sampler, "version", None)

    @property
    def num_samples(self) -> int | None:
        """The wrapped sampler's samples per prompt (None: one)."""
        return getattr(self.sampler, "num_samples", None)

    @property
    def configurable(self) -> bool:
        """Whether calls may carry their own settings (the wrapped sampler has
        ``with_settings``)."""
        return isinstance(self.sampler, ConfigurableSampler)

    # -- calls -------------------------------------------------------------------------------

    def submit(
        self, prompts: Sequence[np.ndarray], settings: SamplingSettings | None = None
    ) -> Future[Batched]:
        """Queue ``prompts`` for the next batch; the ``Future`` of what they got (a cancelled
        one is left out of its batch)."""
        settings = _NO_SETTINGS if settings is None else settings
        if not isinstance(settings, SamplingSettings):
            raise TypeError(
                f"settings must be a SamplingSettings or None, got {type(settings).__name__}"
            )
        if settings.given() and not self.configurable:
            raise ValueError(
                f"settings {settings.overrides()} need a sampler with with_settings(...), got "
                f"{type(self.sampler).__name__}, which samples with its own settings"
            )
        future: Future[Batched] = Future()
        self._start()
        self._jobs.put(_Job(list(prompts), settings, future, time.perf_counter()))
        return future

    def sample(
        self, prompts: Sequence[np.ndarray], settings: SamplingSettings | None = None
    ) -> list[Sample]:
        """The samples of ``prompts`` (as the wrapped sampler's ``sample``), sampled together
        with the calls that arrive with them."""
        return self.submit(prompts, settings).result().samples

    async def asample(
        self, prompts: Sequence[np.ndarray], settings: SamplingSettings | None = None
    ) -> list[Sample]:
        """``sample`` awaited in an event loop (no thread held while it waits)."""
        return (await asyncio.wrap_future(self.submit(prompts, settings))).samples

    def with_settings(self, **overrides: float | int | None) -> Sampler:
        """A ``Sampler`` whose calls go through this one with ``SamplingSettings(**overrides)``
        (batched only with calls of equal settings)."""
        return _Configured(self, SamplingSettings(**overrides))

    def close(self) -> None:
        """Stop the sampling thread once the calls queued are sampled."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is not None:
            self._jobs.put(None)
            worker.join(timeout=60)

    def __enter__(self) -> BatchingSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the sampling thread -----------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name="llm_gym-batching", daemon=True
                )
                self._worker.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs, prompts = [job], len(job.prompts)
            expected = min(self._last_batch, self.max_batch)
            stop = False
            while prompts < self.max_batch:
                try:
                    if len(jobs) < expected:
                        more = self._jobs.get(timeout=self.batch_wait)
                    else:
                        more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                jobs.append(more)
                prompts += len(more.prompts)
            self._last_batch = len(jobs)
            groups: dict[SamplingSettings, list[_Job]] = {}
            for job in jobs:
                if job.future.set_running_or_notify_cancel():  # else its caller went away
                    groups.setdefault(job.settings, []).append(job)
            for settings, group in groups.items():
                self._sample_group(settings, group)
            if stop:
                return

    def _sample_group(self, settings: SamplingSettings, group: list[_Job]) -> None:
        start = time.perf_counter()
        try:
            sampler = self.sampler
            if settings.given():
                sampler = self.sampler.with_settings(**settings.overrides())
            prompts = [p for job in group for p in job.prompts]
            samples = sampler.sample(prompts) if prompts else []
            per_prompt = len(samples) // len(prompts) if prompts else 1
            if len(samples) != per_prompt * len(prompts) or (prompts and not per_prompt):
                raise RuntimeError(
                    f"the sampler returned {len(samples)} samples for {len(prompts)} prompts: "
                    "expected the same number for each"
                )
        except Exception as error:  # each call of the batch gets it
            for job in group:
                job.future.set_exception(error)
            return
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(group))
        seconds, at = time.perf_counter() - start, 0
        for job in group:
            n = len(job.prompts) * per_prompt
            job.future.set_result(Batched(samples[at : at + n], start - job.queued, seconds))
            at += n


class _Configured:
    """A ``BatchingSampler``'s calls with fixed settings (what ``with_settings`` returns)."""

    def __init__(self, batching: BatchingSampler, settings: SamplingSettings) -> None:
        self.batching, self.settings = batching, settings

    @property
    def version(self) -> int | None:
        return self.batching.version

    def sample(self, prompts: Sequence[np.ndarray]) -> list[Sample]:
        return self.batching.sample(prompts, self.settings)

    async def asample(self, prompts: Sequence[np.ndarray]) -> list[Sample]:
        return await self.batching.asample(prompts, self.settings)
