"""Training that overlaps sampling: ``AsyncBatches`` samples iteration k+1's episodes (through
``AsyncEpisodes``) while iteration k updates, never more than ``max_staleness`` updates behind.

Batch j may start sampling once the updates of iterations ``< j - max_staleness`` are
published to the sampler, so every turn of batch j was sampled by a policy at most
``max_staleness`` updates older than the one batch j trains (0: no overlap, the synchronous
order). The loss then weighs each token by the log-prob of the version that sampled it (its
segment's ``log_probs``), as PipelineRL's and TRL's off-policy corrections do.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from llm_gym.checks import check_int
from llm_gym.episodes import AsyncEpisodes, Episode

__all__ = ["AsyncBatches", "staleness"]


def staleness(episodes: Sequence[Episode], iteration: int, update_epochs: int) -> int:
    """How many updates (iterations) the oldest turn of ``episodes`` lags behind the policy
    that trains on them at ``iteration`` (versions count optimizer steps, ``update_epochs``
    an iteration)."""
    versions = [v for episode in episodes for v in episode.versions]
    if None in versions or not versions:
        raise ValueError("every assistant turn of an asynchronous batch must carry its version")
    return iteration - min(versions) // update_epochs


class AsyncBatches:
    """The batches of ``batch_size`` episodes (ordered by stream position, so a GRPO group's
    episodes are consecutive) from ``first`` on, sampled ahead in a thread that starts with
    the first batch asked for; an ``EpisodeSource`` (``episodes``: the next batch).

    Args:
        driver: the ``AsyncEpisodes`` that plays them (its stream at batch ``first``).
        batch_size: episodes per iteration (whole groups).
        max_staleness: updates a batch may be sampled ahead of the one that trains on it.
        first: the first iteration (a resumed run's).
        timeout: seconds ``next`` waits for a batch before a one-line ``TimeoutError``.
        update_epochs: optimizer steps an iteration (what ``staleness`` counts by).

    Attributes (of the last batch): ``seconds`` its sampling took, ``lag`` its staleness and
    ``snapshot`` the driver's curriculum and KL coefficient as it left them.
    """

    def __init__(
        self,
        driver: AsyncEpisodes,
        batch_size: int,
        max_staleness: int,
        first: int = 0,
        timeout: float = 3600.0,
        update_epochs: int = 1,
    ) -> None:
        self.driver, self.batch_size = driver, check_int("batch_size", batch_size, 1)
        self.max_staleness = check_int("max_staleness", max_staleness, 0)
        self.update_epochs = check_int("update_epochs", update_epochs, 1)
        self.released, self.timeout = first, timeout  # updates that reached the sampler so far
        self.iteration = first  # the batch episodes() gives next
        self.seconds, self.lag = 0.0, 0
        self.snapshot: dict[str, Any] = driver.snapshot()
        self._ready: queue.Queue = queue.Queue()
        self._turn = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(
            target=self._produce, args=(first,), name="llm_gym-batches", daemon=True
        )

    def _may_sample(self, iteration: int) -> bool:
        return self._stopped or iteration - self.released <= self.max_staleness

    def _produce(self, iteration: int) -> None:
        try:
            while True:
                with self._turn:  # sampling batch j waits for update j - K - 1
                    self._turn.wait_for(functools.partial(self._may_sample, iteration))
                    if self._stopped:
                        return
                start = time.perf_counter()
                episodes = self.driver.episodes(self.batch_size)  # in stream order
                seconds = time.perf_counter() - start
                self._ready.put((iteration, episodes, seconds, self.driver.snapshot()))
                iteration += 1
        except BaseException as error:  # handed to the trainer's thread
            self._ready.put((None, error, 0.0, None))

    def next(self, iteration: int) -> tuple[list[Episode], float]:
        """Batch ``iteration``'s episodes and the seconds its sampling took (``snapshot``: the
        driver's curriculum and KL coefficient as the batch left them); raises what the
        sampling thread raised."""
        if self._thread.ident is None:  # the first batch asked for: sampling starts
            self._thread.start()
        try:
            got, episodes, seconds, snapshot = self._ready.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(
                f"no batch of episodes within {self.timeout:g} s (the sampling thread is stuck)"
            ) from None
        if got is None:
            raise episodes
        assert got == iteration, f"batch {got} came for iteration {iteration}"
        self.snapshot = snapshot  # the shared curriculum and KL coefficient after this batch
        return episodes, seconds

    def episodes(self, count: int) -> list[Episode]:
        """The next batch (``count`` must be ``batch_size``), at most ``max_staleness``
        updates stale (else a ``RuntimeError``)."""
        if count != self.batch_size:
            raise ValueError(f"count must be the batch size {self.batch_size}, got {count}")
        episodes, self.seconds = self.next(self.iteration)
        self.lag = staleness(episodes, self.iteration, self.update_epochs)
        if self.lag > self.max_staleness:
            raise RuntimeError(f"iteration {self.iteration}'s batch is {self.lag} updates stale")
        self.iteration += 1
        return episodes

    def report(self) -> dict[str, Any]:
        """What the last batch left, for its metrics row: the shared curriculum's ``level``
        and KL coefficient (``kl_coef``; None without them) and its ``staleness``."""
        return {**self.snapshot, "staleness": self.lag}

    def state_dict(self) -> dict[str, Any]:
        """The shared curriculum and KL coefficient as the last trained batch left them, not
        as the batches sampled ahead since have moved them."""
        return dict(self.snapshot)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The driver's curriculum and KL coefficient put back (its stream is at ``first``)."""
        self.driver.restore(state)

    def release(self, iteration: int) -> None:
        """Iteration ``iteration``'s update reached the sampler: later batches may start."""
        with self._turn:
            self.released = iteration + 1
            self._turn.notify_all()

    def close(self) -> None:
        """Let the sampling thread end after its current batch (``driver.close`` stops it at
        once)."""
        with self._turn:
            self._stopped = True
            self._turn.notify_all()
