"""``AsyncEpisodes``: episodes of N sub-envs against one policy, every conversation kept busy.

A sub-env's turn goes to the policy as soon as that sub-env is ready, together with whatever
other turns are ready then; a sub-env steps as soon as its own response is back (its tool
calls in its own thread), and episodes come out in the order they finish. One slow tool holds
up its own conversation only, where the synchronous vector env waits for it every step.

The driver owns the item stream (the env's source, with its seed and ``repeats``) and hands
each free sub-env the next item: every epoch holds every item exactly ``repeats`` times
whatever the sub-env or the order, an episode's ``item_index`` is its position in the stream,
and with greedy sampling the same seed gives the same episodes in any finishing order.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import gymnasium as gym

from llm_gym.checks import check_choice, check_int, check_number
from llm_gym.episodes.episode import Episode
from llm_gym.episodes.records import EpisodeTrace
from llm_gym.episodes.workers import EnvWorker
from llm_gym.sources import Shard
from llm_gym.spaces import INPUT_MODES

__all__ = ["AsyncEpisodes"]


class DaemonThreads:
    """``ThreadPoolExecutor``'s ``submit`` and ``shutdown`` on daemon threads: a call that
    never returns (a tool asleep, a hung server) cannot keep the interpreter from exiting,
    where ThreadPoolExecutor joins its threads at exit even after ``shutdown(wait=False)``.
    Threads start as calls need them, up to ``max_workers``."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers, self.name = max_workers, name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # threads waiting for a call
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run ``fn(*args)`` on a thread; its future."""
        with self._lock:
            if self._shut:
                raise RuntimeError(f"{self.name}: cannot run a call after shutdown")
            future: Future = Future()
            self._calls.put((future, fn, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            _run_call(*call)
            del call  # no reference to a call's arguments kept while idle
            self._idle.release()

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        """No more calls; cancel those not started (``cancel_futures``), let the threads end
        after their current call, and with ``wait`` wait for them."""
        with self._lock:
            self._shut = True
        while cancel_futures:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        for _ in self._threads:
            self._calls.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _run_call(future: Future, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if future.set_running_or_notify_cancel():
        try:
            result = fn(*args)
        except BaseException as error:  # handed to whoever waits on the future
            future.set_exception(error)
        else:
            future.set_result(result)


class _ThreadWorkers:
    """The env workers in this process, their calls run on a thread per slot."""

    restarts = 0

    def __init__(self, env_fn: Callable[[], gym.Env], groups: Sequence[Sequence[int]]) -> None:
        self.workers = [EnvWorker(env_fn, group) for group in groups]
        self.nodes = ["local"] * len(groups)
        self.pool = DaemonThreads(sum(map(len, groups)), "llm_gym-env")

    def call(self, w: int, method: str, *args: Any) -> Future:
        return self.pool.submit(getattr(self.workers[w], method), *args)

    def lost(self, error: BaseException) -> bool:
        return False  # a thread does not die on its own: its error is the env's

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for worker in self.workers:
            worker.close()


class AsyncEpisodes:
    """Drive ``num_envs`` sub-envs made by ``env_fn`` with ``policy``, asynchronously.

    Args:
        env_fn: makes one sub-env: a ``DatasetChatEnv`` (e.g. ``functools.partial(gym.make,
            "LLMChat-GSM8K-v0", ...)``), wrapped as the user likes (reward and KL wrappers
            act per sub-env as they would on one env). Called once here for the stream.
        num_envs: how many conversations run at once.
        policy: ``policy(obs_batch) -> list[Response]`` reading its ``input_mode`` key
            (``TransformersPolicy``, ``SamplerPolicy``).
        seed: the stream's order (None: the env's own).
        input_mode: the observation key the policy reads (None: ``policy.input_mode``, else
            ``"history"``).
        sampler_calls: policy calls in flight at once (1: one batch of the ready turns at a
            time, right for a model in this process; a server batches concurrent requests
            itself, so give it ``num_envs``).
        batch_wait: seconds ready turns wait for env steps sent less than this long ago, so
            that the turns of steps without a slow tool share one batch (0: send at once;
            ``math.inf``: until no env step is in flight, so that the batches, and with them
            the samples do not depend on timing: a trainer's, to resume exactly).
        ray_address: None runs the sub-envs here, on threads; else env workers are Ray actors
            (``ray.init(address=...)`` unless Ray runs already: ``"auto"``, ``"local"``, a
            ``"ray://"`` address).
        workers: how many env workers (Ray actors) share the sub-envs.
        placement: ``"spread"``, ``"pack"`` or one Ray node id per worker.
        ray_options: more ``ray.remote`` options for the workers (``num_cpus``, ``resources``).
        timeout: seconds to wait for any answer before a one-line ``TimeoutError``.
        max_restarts: dead workers replaced before the run gives up.
        curriculum: a ``LevelSchedule`` (``llm_gym.wrappers``) every sub-env shares: each
            finished episode's success counts toward it in the order episodes finish, and
            the items drawn next are drawn at its level (each episode's ``level`` is the one
            its item was drawn at).
        kl_controller: the ``KLController`` the sub-envs' KL wrappers share (they must hold
            it: threads only, not Ray's actors); updated with each finished episode's KL
            reward (``-kl_coef · kl_sum``, the coefficient it was charged under) in the order
            episodes finish.
        shared_updates: when the curriculum and the KL controller count finished episodes:
            ``"episode"``, each as it finishes; ``"batch"``, all of one ``play`` call when
            it ends, in stream order: the level and coefficient then hold still within a
            batch, so a run is the same whatever the threads' timing (a trainer's, which
            resumes exactly).

    Attributes:
        restarts: workers replaced so far; ``nodes``: each worker's Ray node id.

    >>> import functools
    >>> from llm_gym.envs import DatasetChatEnv
    >>> rows = [{"query": q} for q in ("a?", "b?", "c?")]
    >>> env_fn = functools.partial(DatasetChatEnv, rows, shuffle=False)
    >>> rollouts = AsyncEpisodes(env_fn, 2, lambda obs: ["ok"] * len(obs["history"]))
    >>> [e.prompt[-1]["content"] for e in rollouts.episodes(3)]
    ['a?', 'b?', 'c?']
    >>> rollouts.close()
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        num_envs: int,
        policy: Callable[[Mapping[str, Any]], Sequence[Any]],
        *,
        seed: int | None = None,
        input_mode: str | None = None,
        sampler_calls: int = 1,
        batch_wait: float = 0.05,
        ray_address: str | None = None,
        workers: int = 1,
        placement: str | Sequence[str] = "spread",
        ray_options: Mapping[str, Any] | None = None,
        timeout: float = 600.0,
        max_restarts: int = 3,
        curriculum: Any = None,
        kl_controller: Any = None,
        shared_updates: str = "episode",
    ) -> None:
        if not callable(env_fn):
            raise TypeError(f"env_fn must make a sub-env, got {type(env_fn).__name__}")
        if not callable(policy):
            raise TypeError(f"policy must be callable on observations, got {type(policy)}")
        self.num_envs = check_int("num_envs", num_envs, 1)
        self.sampler_calls = check_int("sampler_calls", sampler_calls, 1)
        workers = check_int("workers", workers, 1)
        if workers > num_envs:
            raise ValueError(f"workers must be <= num_envs={num_envs}, got {workers}")
        if ray_address is None and workers != 1:
            raise ValueError(f"workers={workers} needs ray_address (workers are Ray actors)")
        self.timeout = check_number("timeout", timeout, 0, strict=True)
        self.batch_wait = batch_wait  # math.inf: until no env step is in flight
        if batch_wait != math.inf:
            check_number("batch_wait", batch_wait, 0)
        self.max_restarts = check_int("max_restarts", max_restarts, 0)
        template = env_fn()
        base = template.unwrapped
        if not hasattr(base, "source"):
            raise TypeError(
                f"env_fn must make a DatasetChatEnv, whose items the driver hands out; it "
                f"made {type(base).__name__}"
            )
        self.env_fn, self.policy = env_fn, policy
        self.input_mode = check_choice(
            "input_mode", input_mode or getattr(policy, "input_mode", None) or "history",
            INPUT_MODES,
        )  # fmt: skip
        self.repeats = base.repeats
        self.stream = base.source.for_shard(Shard(0, 1, base.repeats))
        template.close()
        if kl_controller is not None and ray_address is not None:
            raise ValueError(
                "kl_controller is shared by sub-envs in this process: Ray's env workers "
                "(ray_address) each hold their own; charge a constant coefficient there"
            )
        self.curriculum, self.kl_controller = curriculum, kl_controller
        self.shared_updates = check_choice("shared_updates", shared_updates, ("episode", "batch"))
        self._counted: list[Episode] = []  # "batch": this call's finished episodes
        if curriculum is not None:
            self.set_level(curriculum.level)
        self.reset(seed)
        # Slot s lives in worker s % workers: each worker holds every workers-th slot.
        self.groups = [list(range(w, num_envs, workers)) for w in range(workers)]
        self.worker_of = {s: w for w, group in enumerate(self.groups) for s in group}
        if ray_address is None:
            self.workers: Any = _ThreadWorkers(env_fn, self.groups)
        else:
            from llm_gym.episodes.ray import RayEnvWorkers

            self.workers = RayEnvWorkers(
                env_fn, self.groups, address=ray_address, placement=placement, options=ray_options
            )
        self.sampling = DaemonThreads(self.sampler_calls, "llm_gym-sample")
        self._abandoned = 0  # calls left running by a timeout (they may still touch sub-envs)

    @property
    def restarts(self) -> int:
        """How many env workers died and were replaced."""
        return self.workers.restarts

    @property
    def nodes(self) -> list[str]:
        """Each worker's Ray node id (``"local"`` without Ray)."""
        return list(self.workers.nodes)

    def reset(self, seed: int | None = None) -> None:
        """Start the stream again from the order ``seed`` defines (None: a fresh order)."""
        self.stream.reseed(seed)
        self.position, self.replay = 0, deque()
        self.drawn: dict[int, int | None] = {}  # stream position: the level it was drawn at

    def seek(self, position: int) -> None:
        """Serve the stream from ``position`` next (how a resumed run goes on)."""
        self.stream.seek(check_int("position", position, 0))
        self.position, self.replay, self.drawn = position, deque(), {}

    def set_level(self, level: int) -> None:
        """Draw the next items at ``level`` (a procedural task's difficulty)."""
        self.stream.set_level(level)

    def snapshot(self) -> dict[str, Any]:
        """What the shared curriculum and KL coefficient are now (what a checkpoint taken
        between two batches holds): ``level``, ``successes``, ``kl_coef``."""
        curriculum, controller = self.curriculum, self.kl_controller
        return {
            "level": None if curriculum is None else curriculum.level,
            "successes": None if curriculum is None else list(curriculum.successes),
            "kl_coef": None if controller is None else controller.state_dict()["coef"],
        }

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Put the curriculum and KL coefficient back as ``snapshot`` holds them."""
        if self.curriculum is not None and snapshot.get("level") is not None:
            self.curriculum.level = int(snapshot["level"])
            self.curriculum.successes = list(snapshot.get("successes") or [])
            self.set_level(self.curriculum.level)
        if self.kl_controller is not None and snapshot.get("kl_coef") is not None:
            self.kl_controller.load_state_dict({"coef": float(snapshot["kl_coef"])})

    def _finished(self, position: int, episode: Episode) -> Episode:
        # A finished episode: the level its item was drawn at, and its count toward the
        # shared curriculum and KL coefficient (now, or when the batch ends).
        level = self.drawn.pop(position, None)
        if level is not None:
            episode.level = level
        if self.shared_updates == "batch":
            self._counted.append(episode)
        else:
            self._count([episode])
        return episode

    def _count(self, episodes: Sequence[Episode]) -> None:
        if self.curriculum is not None:
            if self.curriculum.record(bool(e.info.get("success")) for e in episodes):
                self.set_level(self.curriculum.level)
        rewards = [
            -float(e.info["kl_coef"]) * float(e.kl_sum)
            for e in episodes
            if e.info.get("kl_coef") is not None and e.kl_sum is not None
        ]
        if self.kl_controller is not None and rewards:
            self.kl_controller.update(rewards)

    def episodes(self, count: int) -> list[Episode]:
        """``count`` more episodes of the stream, in stream order (``item_index``): those of
        ``play(count)``."""
        return sorted(self.play(count), key=lambda episode: episode.item_index)

    def play(self, count: int) -> Iterator[Episode]:
        """Run ``count`` more episodes of the stream; yield each as it finishes (the
        synchronous ``Episodes``' episode, with ``item_index`` and ``seed``). Items drawn but
        not finished when the caller stops early are played first next time."""
        check_int("count", count, 1)
        if self._abandoned:
            raise RuntimeError(
                f"an earlier episodes() call timed out with {self._abandoned} calls running, "
                "which may still step its sub-envs: close() this driver and make another"
            )
        run = _Run(self)
        self._counted = []
        try:
            yield from run.play(count)
            if self._counted:  # "batch": this call's episodes, in stream order
                self._count(sorted(self._counted, key=lambda e: e.item_index))
        except KeyboardInterrupt:  # Ctrl-C: leave at once (close() stops the workers)
            run.stop(wait_calls=False)
            raise
        except TimeoutError:  # nothing answered for `timeout`: no second wait for them
            self._abandoned = len(run.pending)
            run.stop(wait_calls=False)
            raise
        finally:
            run.stop(wait_calls=True)

    def close(self) -> None:
        """Stop every worker (Ray actors included) and thread this started."""
        self.sampling.shutdown(wait=False, cancel_futures=True)
        self.workers.close()

    def __enter__(self) -> AsyncEpisodes:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Run:
    """One ``episodes`` call: which item each slot plays, and the calls in flight."""

    def __init__(self, driver: AsyncEpisodes) -> None:
        self.driver = driver
        self.free = deque(range(driver.num_envs))
        self.ready: list[int] = []
        self.items: dict[int, tuple[int, Mapping[str, Any]]] = {}
        self.traces: dict[int, EpisodeTrace] = {}
        self.obs: dict[int, Any] = {}
        self.pending: dict[Future, tuple[str, Any, int, float]] = {}
        self.lives = {s: 0 for s in range(driver.num_envs)}  # a replaced slot's calls are stale
        self.sampling = 0

    def play(self, count: int) -> Iterator[Episode]:
        driver, finished, answered = self.driver, 0, time.monotonic()
        while finished < count:
            # Samples in flight and those waiting to be played again count toward `count`.
            in_hand = len(self.items) + len(driver.replay)
            held = self._dispatch(count - finished - in_hand)
            timeout = driver.timeout - (time.monotonic() - answered)
            if held is not None:  # ready turns wait a moment for the steps just sent
                timeout = min(timeout, held)
            done, _ = wait(self.pending, timeout=max(timeout, 0), return_when=FIRST_COMPLETED)
            if done:
                answered = time.monotonic()
            elif held is None or time.monotonic() - answered >= driver.timeout:
                raise TimeoutError(
                    f"no sub-env or policy call answered within timeout={driver.timeout:g} s "
                    f"({len(self.pending)} in flight)"
                )
            for future in done:
                for episode in self._collect(future):
                    finished += 1
                    yield episode

    def _dispatch(self, unstarted: int) -> float | None:
        # Start free slots, then send the ready turns to the policy; the seconds the ready
        # turns are held back for env calls younger than batch_wait (None: not held).
        driver = self.driver
        while self.free and (driver.replay or unstarted > 0):
            if driver.replay:
                position, item = driver.replay.popleft()
            else:
                position, item = driver.position, driver.stream.next_item()
                driver.drawn[position] = getattr(driver.stream, "level", None)
                driver.position += 1
                unstarted -= 1
            slot = self.free.popleft()
            self.items[slot] = (position, item)
            self._call("start", slot, item)
        young = [t for kind, _, _, t in self.pending.values() if kind != "sample"]
        wait_left = max(young) + driver.batch_wait - time.monotonic() if young else 0.0
        if self.ready and wait_left > 0 and self.sampling < driver.sampler_calls:
            return wait_left  # a tool-less step takes milliseconds: batch its turn too
        # By slot: a batch's rows, and so its samples, do not depend on which step came back
        # first (a row's numerics can depend on its place in the batch).
        self.ready.sort()
        while self.ready and self.sampling < driver.sampler_calls:
            calls = driver.sampler_calls - self.sampling
            # With room for several calls, split the ready turns among them.
            size = -(-len(self.ready) // calls) if calls > 1 else len(self.ready)
            batch, self.ready = self.ready[:size], self.ready[size:]
            obs = {driver.input_mode: tuple(self.obs[s][driver.input_mode] for s in batch)}
            future = driver.sampling.submit(driver.policy, obs)
            self.pending[future] = ("sample", [(s, self.lives[s]) for s in batch], -1, 0.0)
            self.sampling += 1
        return None

    def _call(self, method: str, slot: int, *args: Any) -> None:
        driver = self.driver
        future = driver.workers.call(driver.worker_of[slot], method, slot, *args)
        self.pending[future] = (method, (slot, *args), self.lives[slot], time.monotonic())

    def _collect(self, future: Future) -> list[Episode]:
        kind, what, life, _ = self.pending.pop(future)
        if kind == "sample":
            self.sampling -= 1
            responses = future.result()
            if len(responses) != len(what):
                raise ValueError(
                    f"the policy returned {len(responses)} responses for {len(what)} "
                    "observations: expected one each"
                )
            for (slot, slot_life), response in zip(what, responses, strict=True):
                if slot_life == self.lives[slot]:  # else its worker died meanwhile
                    self._call("step", slot, response)
            return []
        slot = what[0]
        if life != self.lives[slot]:
            return []  # a call to a worker that has since been replaced
        error = future.exception()
        if error is not None:
            return self._failed(slot, error)
        if kind == "start":
            obs, _ = future.result()
            self.obs[slot], self.traces[slot] = obs, EpisodeTrace(obs["history"])
            self.ready.append(slot)
            return []
        obs, reward, terminated, truncated, info = future.result()
        trace = self.traces[slot]
        trace.add(what[1], reward, info.get("kl"))
        if not (terminated or truncated):
            self.obs[slot] = obs
            self.ready.append(slot)
            return []
        position, _ = self.items.pop(slot)
        episode = trace.finish(slot, info, obs)
        del self.traces[slot], self.obs[slot]
        self.free.append(slot)
        # With item_index, the stream's seed names its item.
        episode.item_index, episode.seed = position, getattr(self.driver.stream, "seed", None)
        return [self.driver._finished(position, episode)]

    def _failed(self, slot: int, error: BaseException) -> list[Episode]:
        driver, w = self.driver, self.driver.worker_of[slot]
        position = self.items[slot][0]
        if not driver.workers.lost(error):  # the env itself failed: the run stops
            raise RuntimeError(
                f"sub-env {slot} failed on item {position} of the stream: "
                f"{type(error).__name__}: {error}"
            ) from error
        for s in driver.groups[w]:  # its calls in flight are stale from now on
            self.lives[s] += 1
            self.traces.pop(s, None), self.obs.pop(s, None)
        if driver.restarts >= driver.max_restarts:
            raise RuntimeError(
                f"env worker {w} died and max_restarts={driver.max_restarts} workers were "
                f"already replaced: {type(error).__name__}"
            ) from error
        # Its unfinished episodes start again from their items, on a new worker.
        lost = sorted(s for s in driver.groups[w] if s in self.items)
        driver.replay.extendleft(reversed([self.items.pop(s) for s in lost]))
        self.ready = [s for s in self.ready if driver.worker_of[s] != w]
        self.free.extend(lost)
        driver.workers.replace(w)
        return []

    def stop(self, wait_calls: bool) -> None:
        # Items drawn and not finished go back to the front of the stream, in order; the
        # calls in flight to live workers end before a sub-env starts again (bounded by the
        # timeout; a dead worker's may never answer).
        driver = self.driver
        unfinished = sorted(self.items.values(), key=lambda entry: entry[0])
        driver.replay.extendleft(reversed(unfinished))
        self.items.clear()
        live = [
            future
            for future, (kind, what, life, _) in self.pending.items()
            if kind == "sample" or life == self.lives[what[0]]
        ]
        if wait_calls and live:
            wait(live, timeout=driver.timeout)
        else:  # a future cancelled here never counts as done for wait(): no waiting after it
            for future in self.pending:
                future.cancel()
        self.pending.clear()
