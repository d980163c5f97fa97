"""Ray, llm_gym's distributed engine: the episode drivers' env workers as actors
(``RayEnvWorkers``, one per group of sub-envs, placed on the cluster's nodes by Ray's
scheduler) and a reference scorer as an actor (``RayLogProbModel``, one model shared by many
envs through the actor's name). Nothing here schedules or talks to a node itself: a call is an
actor method, its result a ``concurrent.futures.Future`` or an array.

Start Ray first (``ray.init()``, or ``ray.init(address="auto")`` on a cluster)::

    import ray, llm_gym
    from llm_gym.episodes.ray import RayLogProbModel
    from llm_gym.lm import load_default_model

    ray.init()
    ref = RayLogProbModel(load_default_model, actor_name="ref")  # (model, tokenizer) factory
    same = RayLogProbModel(actor_name="ref")  # another env's client: the same actor
    env = llm_gym.wrappers.RetrieveKL(llm_gym.ChatEnv(query="Hi"), ref_model=same, coef=0.05)
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as error:  # ray is an optional dependency (the "ray" extra)
    raise ImportError(
        "llm_gym's Ray workers and scorer need Ray: pip install 'llm-gym[ray]' (or pip install ray)"
    ) from error

from llm_gym.checks import check_number, check_str
from llm_gym.episodes.workers import EnvWorker, forwarded_env_vars
from llm_gym.samplers import check_scorer

if TYPE_CHECKING:
    from llm_gym.samplers import LogProbOutput
    from llm_gym.samplers.base import ScoredResponse

__all__ = ["PLACEMENTS", "RayEnvWorkers", "RayLogProbModel", "connect"]

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

    def call(self, w: int, method: str, *args: object) -> Future:
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


_ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")


class _LogProbActor:
    """Runs in the Ray worker: builds the scoring policy once, then scores on request."""

    def __init__(self, factory: Callable[[], Any], policy_kwargs: dict[str, Any]) -> None:
        built = factory()
        if isinstance(built, tuple):
            if len(built) != 2:
                raise TypeError(
                    "ref_model_factory must return a log-prob policy or (model, tokenizer), got "
                    f"a tuple of {len(built)} items"
                )
            from llm_gym.policies import TransformersPolicy

            model, tokenizer = built
            built = TransformersPolicy(model, tokenizer, generate=False, **policy_kwargs)
        try:
            self.policy = check_scorer(built, "ref_model_factory's result")
        except ValueError as error:
            raise TypeError(
                f"{error} (ref_model_factory may also return (model, tokenizer))"
            ) from None

    def describe(self) -> tuple[str | None, bool, Any, str]:
        policy = self.policy
        attributes = ("input_mode", None), ("pad_output", False), ("tokenizer", None)
        return (*(getattr(policy, name, default) for name, default in attributes), repr(policy))

    def call(self, obs: Any, responses: Any, response_only: bool = False) -> Any:
        return self.policy(obs, responses, response_only=response_only)

    def score(self, prompts: Any, responses: Any) -> Any:
        return self.policy.score(prompts, responses)


_RemoteLogProbActor = ray.remote(_LogProbActor)


class RayLogProbModel:
    """A ``llm_gym.samplers.Scorer`` whose log-prob ``TransformersPolicy`` runs in a Ray actor,
    usable wherever a reference model is (one ``ray.get`` a call). The actor scores one
    request at a time; clients never hold the weights.

    Args:
        ref_model_factory: a picklable zero-argument callable (a module-level function, a
            ``functools.partial`` of one, a script's lambda) run once in the actor, returning
            a ``TransformersPolicy`` with ``generate=False`` or a ``(model, tokenizer)`` pair
            to wrap in one. None: reuse the running actor named ``actor_name``.
        num_cpus / num_gpus: the actor's Ray resources.
        actor_name: name the actor so other clients (other envs, processes) share it. With a
            factory, a running actor of that name is reused (the factory is then not run).
        namespace: the Ray namespace of the named actor (default: the job's).
        timeout: seconds to wait for each answer; a dead or stuck actor raises a
            ``RuntimeError`` instead of hanging.
        policy_kwargs: ``TransformersPolicy`` arguments when the factory returns
            ``(model, tokenizer)``, e.g. ``{"input_mode": "tokens"}``.

    Attributes:
        actor: the Ray actor handle (``ray.kill(model.actor)`` ends it).
        input_mode / pad_output / tokenizer: the actor's policy's, fetched once at start.
    """

    generate = False  # the scoring protocol: this model scores, it never generates

    def __init__(
        self,
        ref_model_factory: Callable[[], Any] | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        actor_name: str | None = None,
        namespace: str | None = None,
        timeout: float = 60.0,
        policy_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if ref_model_factory is not None and not callable(ref_model_factory):
            raise TypeError(
                "ref_model_factory must be a zero-argument callable returning a log-prob "
                f"policy, got {type(ref_model_factory).__name__}"
            )
        check_number("num_cpus", num_cpus, 0)
        check_number("num_gpus", num_gpus, 0)
        if check_str("actor_name", actor_name, optional=True) == "":
            raise ValueError("actor_name must be None or a non-empty str, got ''")
        timeout = check_number("timeout", timeout, 0, strict=True)
        if policy_kwargs is not None and not isinstance(policy_kwargs, Mapping):
            raise TypeError(f"policy_kwargs must be a dict, got {type(policy_kwargs).__name__}")
        if "generate" in (policy_kwargs or {}):
            raise ValueError("policy_kwargs may not set 'generate': the actor only scores")
        if ref_model_factory is None and actor_name is None:
            raise ValueError(
                "pass ref_model_factory (to start an actor) or actor_name (to use a running one)"
            )
        if not ray.is_initialized():
            raise RuntimeError(
                "Ray is not initialized: call ray.init() (or ray.init(address='auto') to join a "
                "cluster) before creating a RayLogProbModel"
            )
        self.actor_name, self.namespace, self.timeout = actor_name, namespace, float(timeout)
        if ref_model_factory is None:
            try:
                self.actor = ray.get_actor(actor_name, namespace=namespace)
            except ValueError as error:
                raise ValueError(
                    f"no running Ray actor named {actor_name!r} (namespace {namespace!r}); pass "
                    "ref_model_factory to start it"
                ) from error
        else:
            options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus}
            if actor_name is not None:
                options |= {"name": actor_name, "namespace": namespace, "get_if_exists": True}
            self.actor = _RemoteLogProbActor.options(**options).remote(
                ref_model_factory, dict(policy_kwargs or {})
            )
        self.started = ref_model_factory is not None
        # One round trip now: surfaces a failing factory here, not at the first env step.
        info = self._get(self.actor.describe.remote())
        self.input_mode, self.pad_output, self.tokenizer, self._policy_repr = info

    def __repr__(self) -> str:
        return f"RayLogProbModel({self._describe_actor()}, policy={self._policy_repr})"

    def __call__(
        self,
        obs: Mapping[str, Any],
        responses: ScoredResponse | Sequence[ScoredResponse] | None = None,
        *,
        response_only: bool = False,
    ) -> LogProbOutput | list[LogProbOutput]:
        """Score ``obs`` (+ ``responses``) in the actor: what the local policy would return, or
        raise (the same exception type)."""
        return self._get(self.actor.call.remote(obs, responses, response_only))

    def score(
        self, prompts: Sequence[np.ndarray], responses: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """The actor's policy's ``score``: ``float32`` log-probs of each response's tokens."""
        return self._get(self.actor.score.remote(prompts, responses))

    def close(self) -> None:
        """Kill the actor if this client started it (a named actor found running is left)."""
        if self.started:
            ray.kill(self.actor, no_restart=True)
            self.started = False

    def _describe_actor(self) -> str:
        if self.actor_name is None:
            return f"actor {self.actor._actor_id.hex()[:12]}"
        return f"actor {self.actor_name!r}"

    def _get(self, ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=self.timeout)
        except RayActorError as error:
            reason = _ANSI_COLOR.sub("", str(error))  # Ray colours the failing task's name
            raise RuntimeError(
                f"the Ray reference-model actor ({self._describe_actor()}) died: {reason}"
            ) from error
        except GetTimeoutError as error:
            raise RuntimeError(
                f"the Ray reference-model actor ({self._describe_actor()}) did not answer within "
                f"{self.timeout:g} s: it may be stuck, or waiting for free Ray resources "
                "(num_cpus/num_gpus)"
            ) from error
