"""``RayEnvWorkers``: ``AsyncRollouts``' env workers as Ray actors, one per group of sub-envs,
placed on the cluster's nodes by Ray's scheduler. Nothing here schedules or talks to a node
itself: a call is an actor method, its result a ``concurrent.futures.Future``."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import gymnasium as gym

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as error:  # ray is an optional dependency (the "ray" extra)
    raise ImportError(
        "AsyncRollouts(ray_address=...) needs Ray: pip install 'llm-gym[ray]' (or pip install ray)"
    ) from error

from llm_gym.drivers.workers import EnvWorker, forwarded_env_vars

__all__ = ["PLACEMENTS", "RayEnvWorkers", "connect"]

PLACEMENTS = ("spread", "pack")  # Ray's SPREAD (a node each, as far as it goes) or DEFAULT
_RemoteEnvWorker = ray.remote(EnvWorker)


def connect(address: str, timeout: float = 10.0) -> bool:
    """Join Ray at ``address`` unless it runs in this process already (``"local"``: the cluster
    ``ray start`` runs on this machine, else a new one here); whether this call started it.
    A ``host:port`` that does not answer within ``timeout`` seconds is a one-line
    ``ConnectionError`` (Ray itself would retry for minutes)."""
    if ray.is_initialized():
        return False
    if address not in ("local", "auto"):
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
        except (OSError, ValueError) as error:
            raise ConnectionError(
                f"cannot reach the Ray cluster at --ray {address} (expected 'auto', "
                f"'host:port' or 'ray://host:port' of a running cluster): {error}"
            ) from None
    ray.init(address=None if address == "local" else address, log_to_driver=False)
    return True


class RayEnvWorkers:
    """One Ray actor per group of slots, each an ``EnvWorker`` that steps its slots from
    threads (``max_concurrency``: one slow tool holds up no other slot of its worker).

    Args:
        env_fn: the sub-envs' constructor, pickled to the actors.
        groups: the slots of each worker.
        address: ``ray.init``'s address when Ray is not running yet (``"auto"``: the cluster
            ``ray start`` runs here; ``"local"``: a new one on this machine; ``"ray://..."``).
        placement: ``"spread"`` (one worker per node while nodes last), ``"pack"``, or one Ray
            node id per worker.
        options: more ``ray.remote`` options for every actor (``num_cpus`` defaults to 0.5:
            a worker's envs mostly wait for the sampler and their tools).
        startup_timeout: seconds to wait for the workers to start (Ray waits for free
            resources) before a one-line ``RuntimeError``.
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        groups: Sequence[Sequence[int]],
        *,
        address: str,
        placement: str | Sequence[str] = "spread",
        options: Mapping[str, Any] | None = None,
        startup_timeout: float = 300.0,
    ) -> None:
        if not isinstance(placement, str) and len(placement) != len(groups):
            raise ValueError(
                f"placement as node ids needs one per worker ({len(groups)}), got {len(placement)}"
            )
        if isinstance(placement, str) and placement not in PLACEMENTS:
            raise ValueError(
                f"placement must be 'spread', 'pack' or a list of Ray node ids, got {placement!r}"
            )
        self.started_ray = connect(address)
        self.env_fn, self.groups, self.placement = env_fn, [list(g) for g in groups], placement
        self.options = {"num_cpus": 0.5, **(options or {})}
        self.startup_timeout = startup_timeout
        env_vars = {**forwarded_env_vars(), **self.options.pop("env_vars", {})}
        self.options["runtime_env"] = {"env_vars": env_vars}
        self.actors: list[Any] = [None] * len(self.groups)
        self.restarts = 0
        try:
            for w in range(len(self.groups)):
                self._start(w)
            self.nodes = self._started([actor.node.remote() for actor in self.actors])
        except BaseException:
            self.close()
            raise

    def _start(self, w: int, anywhere: bool = False) -> None:
        placement = self.placement
        if placement == "spread":
            strategy: Any = "SPREAD"
        elif placement == "pack" or anywhere:  # a replacement goes wherever Ray finds room
            strategy = "DEFAULT"
        else:
            strategy = NodeAffinitySchedulingStrategy(placement[w], soft=False)
        self.actors[w] = _RemoteEnvWorker.options(
            max_concurrency=len(self.groups[w]), scheduling_strategy=strategy, **self.options
        ).remote(self.env_fn, self.groups[w])

    def call(self, w: int, method: str, *args: Any) -> Future:
        """Worker ``w``'s ``method(*args)``, as a future."""
        return getattr(self.actors[w], method).remote(*args).future()

    def lost(self, error: BaseException) -> bool:
        """Whether ``error`` says the worker died (its process or node), not that an env failed."""
        return isinstance(error, RayActorError)

    def replace(self, w: int) -> None:
        """Start a new worker ``w`` (any node with room) with fresh sub-envs, the dead one's
        killed for good."""
        ray.kill(self.actors[w], no_restart=True)
        self.restarts += 1
        self._start(w, anywhere=True)
        self.nodes[w] = self._started([self.actors[w].node.remote()])[0]

    def _started(self, refs: list[Any]) -> list[str]:
        try:
            return ray.get(refs, timeout=self.startup_timeout)
        except GetTimeoutError:
            free = ray.available_resources().get("CPU", 0)
            raise RuntimeError(
                f"the env workers did not start within {self.startup_timeout:g} s: Ray has "
                f"{free:g} CPUs free and each worker asks num_cpus={self.options['num_cpus']}"
            ) from None

    def close(self) -> None:
        """Kill every actor this started; shut Ray down if this started it."""
        for actor in self.actors:
            if actor is not None:
                ray.kill(actor, no_restart=True)
        self.actors = [None] * len(self.groups)
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
