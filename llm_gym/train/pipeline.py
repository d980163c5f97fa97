"""Training that overlaps sampling: ``AsyncBatches`` samples iteration k+1's episodes (through
``AsyncEpisodes``) while iteration k updates, never more than ``max_staleness`` updates behind.

Batch j may start sampling once the updates of iterations ``< j - max_staleness`` are
published to the sampler, so every turn of batch j was sampled by a policy at most
``max_staleness`` updates older than the one batch j trains (0: no overlap, the synchronous
order). The loss then weighs each token by the log-prob of the version that sampled it (the
record's ``sampled_log_probs``), as PipelineRL's and TRL's off-policy corrections do.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from typing import Any

from llm_gym.checks import check_int
from llm_gym.episodes import AsyncEpisodes

__all__ = ["AsyncBatches", "staleness"]


def staleness(records: list[dict[str, Any]], iteration: int, update_epochs: int) -> int:
    """How many updates (iterations) the oldest turn of ``records`` lags behind the policy
    that trains on them at ``iteration`` (versions count optimizer steps, ``update_epochs``
    an iteration)."""
    versions = [v for record in records for v in record["versions"]]
    if None in versions or not versions:
        raise ValueError("every assistant turn of an asynchronous batch must carry its version")
    return iteration - min(versions) // update_epochs


class AsyncBatches:
    """The batches of ``batch_size`` episodes (ordered by stream position, so a GRPO group's
    records are consecutive) from ``first`` on, sampled ahead in a thread.

    Args:
        driver: the ``AsyncEpisodes`` that plays them (its stream at batch ``first``).
        batch_size: episodes per iteration (whole groups).
        max_staleness: updates a batch may be sampled ahead of the one that trains on it.
        first: the first iteration (a resumed run's).
        timeout: seconds ``next`` waits for a batch before a one-line ``TimeoutError``.
    """

    def __init__(
        self,
        driver: AsyncEpisodes,
        batch_size: int,
        max_staleness: int,
        first: int = 0,
        timeout: float = 3600.0,
    ) -> None:
        self.driver, self.batch_size = driver, check_int("batch_size", batch_size, 1)
        self.max_staleness = check_int("max_staleness", max_staleness, 0)
        self.published, self.timeout = first, timeout  # updates published so far
        self._ready: queue.Queue = queue.Queue()
        self._turn = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._produce, args=(first,), name="llm_gym-batches", daemon=True
        )
        self._thread.start()

    def _may_sample(self, iteration: int) -> bool:
        return self._stopped or iteration - self.published <= self.max_staleness

    def _produce(self, iteration: int) -> None:
        try:
            while True:
                with self._turn:  # sampling batch j waits for update j - K - 1
                    self._turn.wait_for(functools.partial(self._may_sample, iteration))
                    if self._stopped:
                        return
                start = time.perf_counter()
                records = list(self.driver.episodes(self.batch_size))
                records.sort(key=lambda record: record["sample_index"])
                seconds = time.perf_counter() - start
                self._ready.put((iteration, records, seconds, self.driver.snapshot()))
                iteration += 1
        except BaseException as error:  # handed to the trainer's thread
            self._ready.put((None, error, 0.0, None))

    def next(self, iteration: int) -> tuple[list[dict[str, Any]], float]:
        """Batch ``iteration``'s records and the seconds its sampling took (``snapshot``: the
        driver's curriculum and KL coefficient as the batch left them); raises what the
        sampling thread raised."""
        try:
            got, records, seconds, snapshot = self._ready.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(
                f"no batch of episodes within {self.timeout:g} s (the sampling thread is stuck)"
            ) from None
        if got is None:
            raise records
        assert got == iteration, f"batch {got} came for iteration {iteration}"
        self.snapshot = snapshot  # the shared curriculum and KL coefficient after this batch
        return records, seconds

    def publish(self, iteration: int) -> None:
        """Iteration ``iteration``'s update reached the sampler: later batches may start."""
        with self._turn:
            self.published = iteration + 1
            self._turn.notify_all()

    def close(self) -> None:
        """Let the sampling thread end after its current batch (``driver.close`` stops it at
        once)."""
        with self._turn:
            self._stopped = True
            self._turn.notify_all()
