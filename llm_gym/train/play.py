"""What a run plays: its vector env (the task's, or one given), the KL penalty charged in it,
and the ``Feed`` of episodes each iteration trains on, which owns the state a checkpoint
keeps of them (the item stream, the curriculum, the KL coefficient)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from llm_gym.agents import AgentEpisodes, load_agent
from llm_gym.envs import DatasetChatVectorEnv
from llm_gym.episodes import EpisodeSource, VectorEpisodes, multi_turn
from llm_gym.episodes.tree import TreeEpisodes
from llm_gym.run.config import rubric_weights
from llm_gym.run.setup import (
    async_episodes,
    charge_kl,
    dtype_name,
    env_kwargs,
    reference_scorer,
    task_envs,
)
from llm_gym.train.config import GRPOConfig
from llm_gym.train.model import check_objects_run
from llm_gym.train.pipeline import AsyncBatches
from llm_gym.train.sharding import Processes, gather_objects
from llm_gym.wrappers import AdaptiveKLController

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from llm_gym.episodes import Episode
    from llm_gym.policies.base import Policy
    from llm_gym.rubrics import RunRubric
    from llm_gym.samplers import Sampler, Scorer
    from llm_gym.wrappers.controllers import KLController

__all__ = [
    "Feed", "FeedSetup", "LockStep", "agent_episodes", "build_feed", "check_episode_groups",
    "check_given_env", "check_vector_env", "kl_scorer", "run_envs",
]  # fmt: skip

# What an env object (not an id) cannot be asked for: each makes envs of its own from
# config.env (the asynchronous driver's, an agent's, Ray's workers, the held-out evaluation)
# or wraps the ones it makes (curriculum, rubric).
_ENV_OBJECT_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("eval_episodes", "--eval-episodes"),
)  # fmt: skip
# What a trainer's env must observe: the prompt's tokens, the history for the episode's
# record and which tokens the policy wrote.
_TRAINER_KEYS = ("tokens", "history", "policy_mask")
# What a checkpoint holds of the episodes: each field None where the run has no such part.
_EMPTY = {"kl_coef": None, "level": None, "drawn_level": None, "successes": None}


class Feed:
    """The episodes a run trains on (``episodes``, from any ``EpisodeSource``) with the parts
    whose state a checkpoint keeps: the item ``stream`` (the native vector env), the
    ``curriculum`` wrapper and the ``kl`` wrapper charging the penalty; ``pipeline``: the
    source when it samples ahead (``AsyncBatches``), whose own state overrides theirs.

    ``restart``: the player of a single-turn run (``VectorEpisodes``), which a resumed run
    puts back on the items it was at (``reset_seed``: the run's stream seed).

    ``refills``: DAPO's dynamic sampling, up to this many more batches a call whose groups of
    ``group_size`` replace the batch's groups whose rewards are all equal (``dropped``: how
    many the last call replaced, ``played``: how many episodes it played).

    ``sampled_tokens``: the tokens the last call sampled, whatever they went to (refills,
    branches past their parents' turns, VinePPO's continuations): the budget runs compare at."""

    def __init__(
        self,
        source: EpisodeSource,
        processes: Processes,
        *,
        stream: DatasetChatVectorEnv | None = None,
        curriculum: Any = None,
        kl: Any = None,
        pipeline: AsyncBatches | None = None,
        restart: VectorEpisodes | None = None,
        reset_seed: int | None = None,
        refills: int = 0,
        group_size: int = 1,
    ) -> None:
        self.source, self.processes = source, processes
        self.refills, self.group_size, self.dropped, self.played = refills, group_size, 0, 0
        self.stream, self.curriculum, self.kl, self.pipeline = stream, curriculum, kl, pipeline
        self.restart, self.reset_seed = restart, reset_seed
        self.seconds, self.sampled_tokens = 0.0, 0
        self.drawn_level = self.level  # the level the current items were drawn at

    @property
    def level(self) -> int | None:
        """The task's level now (None without levels)."""
        return None if self.stream is None else self.stream.level

    def episodes(self, count: int) -> list[Episode]:
        """``count`` episodes, the groups that teach nothing replaced from up to ``refills``
        more batches (too few found: some stay); ``seconds``: their sampling time (where the
        source tells it apart from its env steps and waits)."""
        self.sampled_tokens = 0
        groups = _groups(self._played(count), self.group_size)
        self.seconds, self.played = self._seconds, count
        kept = [g for g in groups if _varied(g)]
        flat = [g for g in groups if not _varied(g)]
        for _ in range(self.refills if len(kept) < len(groups) else 0):
            more = _groups(self._played(count), self.group_size)
            self.seconds, self.played = self.seconds + self._seconds, self.played + count
            kept += [g for g in more if _varied(g)]
            flat += [g for g in more if not _varied(g)]
            if len(kept) >= len(groups):
                break
        kept = kept[: len(groups)]
        fill = flat[: len(groups) - len(kept)]
        self.dropped = len(flat) - len(fill)
        return [e for group in kept + fill for e in group]

    def _played(self, count: int) -> list[Episode]:
        # One batch of the source; _seconds its sampling time.
        self.drawn_level = self.level  # the next items are drawn in this batch, at this level
        start = time.perf_counter()
        episodes = self.source.episodes(count)
        self._seconds = getattr(self.source, "seconds", time.perf_counter() - start)
        # A source that samples more than its episodes hold (a tree's values) says so.
        self.sampled_tokens += getattr(
            self.source, "sampled_tokens", sum(e.num_tokens for e in episodes)
        )
        return episodes

    def report(self) -> dict[str, Any]:
        """The batch's ``level`` and ``kl_coef`` for its metrics row, with ``staleness`` when
        sampled ahead, and with dynamic sampling the episodes it played
        (``sampled_episodes``) and the groups it left out (``dropped_groups``). It changes
        nothing: ``advance_kl`` moves an adaptive KL coefficient on after the batch."""
        if self.pipeline is not None:  # as the batch left the shared ones
            report = {**self.pipeline.report(), "sampled_tokens": self.sampled_tokens}
            return {**report, "level": self.level if report["level"] is None else report["level"]}
        report = {"level": self.level, "kl_coef": None, "sampled_tokens": self.sampled_tokens}
        if self.refills:
            report.update(sampled_episodes=self.played, dropped_groups=self.dropped)
        if self.kl is not None:
            report["kl_coef"] = float(self.kl.coef)
        return report

    def advance_kl(self) -> None:
        """After a batch is reported: an adaptive KL coefficient moves on by the KL its
        episodes were charged (a constant one stays; the asynchronous driver moves its own
        as episodes finish)."""
        if self.kl is not None:  # none under the asynchronous driver
            self.kl.update_kl_coef()

    def release(self, iteration: int) -> None:
        """Iteration ``iteration``'s update reached the sampler (batches sampled ahead may
        go on)."""
        if self.pipeline is not None:
            self.pipeline.release(iteration)

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs of the episodes: the stream's ``positions`` (the whole run's
        sub-envs', gathered from every process, which must all call it), the ``level`` and
        ``drawn_level``, the curriculum's ``successes``, the ``kl_coef``."""
        state = dict(_EMPTY, level=self.level, drawn_level=self.drawn_level)
        mine = [] if self.stream is None else self.stream.state_dict()["positions"]
        state["positions"] = gather_objects(mine)
        if self.curriculum is not None:
            state["successes"] = self.curriculum.state_dict()["successes"]
        if self.kl is not None:
            state["kl_coef"] = self.kl.kl_controller.state_dict()["coef"]
        if self.pipeline is not None:
            state.update(self.pipeline.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the parts back as ``state_dict`` gave them (on any number of processes)."""
        if self.kl is not None and state["kl_coef"] is not None:
            self.kl.kl_controller.load_state_dict({"coef": state["kl_coef"]})
        if self.stream is not None and state["level"] is not None:
            self.stream.set_level(state["level"])
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state)
        if self.pipeline is not None:
            self.pipeline.load_state_dict(state)
        if self.restart is not None:
            self._replay(state)

    def _replay(self, state: dict[str, Any]) -> None:
        # Each sub-env back on the item it was at, drawn at the level it was drawn at: the
        # stream's order from the seed, each position one back, the items drawn again.
        envs = self.restart.envs
        envs.reset(seed=self.reset_seed)
        if self.stream is None:
            raise ValueError(
                "the env's question stream cannot be resumed at its position (it needs the "
                "native vector env over a seeded source)"
            )
        if state["drawn_level"] is not None:
            self.stream.set_level(state["drawn_level"])
        positions = self.processes.own(state["positions"])
        if None in positions:
            raise ValueError(
                "the env's question stream cannot be resumed at its position (it needs the "
                "native vector env over a seeded source)"
            )
        self.stream.load_state_dict({"positions": [p - 1 for p in positions]})
        self.restart.obs, _ = envs.reset()
        if state["level"] is not None:
            self.stream.set_level(state["level"])
        self.drawn_level = state["drawn_level"]

    @property
    def restarts(self) -> int | None:
        """Env workers the asynchronous driver replaced (None without one)."""
        return None if self.pipeline is None else self.pipeline.driver.restarts

    def close(self) -> None:
        """Stop the source (its envs, threads, gateway) and the asynchronous driver."""
        self.source.close()
        if self.pipeline is not None:
            self.pipeline.driver.close()


class LockStep:
    """A run's processes as the ``Peers`` of each one's episodes (``llm_gym.episodes``):
    their counts gathered, and a turn this process has no prompt for sat out by ``policy``
    (its own ``sit_out`` or its sampler's: a sharded model's forwards paired with the
    others'). ``sharded``: whether the processes generate with one model sharded over them,
    so that a policy that cannot sit a turn out would hang the run (refused here); a served
    policy, which every process only calls, has nothing to do."""

    def __init__(self, policy: Policy, sharded: bool) -> None:
        sampler = getattr(policy, "sampler", None)
        self._sit_out = getattr(policy, "sit_out", None) or getattr(sampler, "sit_out", None)
        if sharded and self._sit_out is None:
            raise TypeError(
                f"{type(policy).__name__} cannot sit a turn out (no sit_out, nor a sampler "
                "with one), which processes that generate with one sharded model need when "
                "another's episodes go on"
            )

    def counts(self, count: int) -> list[int]:
        """Every process's ``count``, in process order."""
        return gather_objects([count])

    def sit_out(self) -> None:
        """This process's part of a generation it has no prompt for."""
        if self._sit_out is not None:
            self._sit_out()


class FeedSetup:
    """A run's ``envs`` (the task's vector env with its wrappers, or the one given), the
    ``feed`` of their episodes, and whether an episode may take several turns."""

    def __init__(self, envs: gym.vector.VectorEnv, feed: Feed, multi_turn: bool) -> None:
        self.envs, self.feed, self.multi_turn = envs, feed, multi_turn


def check_given_env(config: GRPOConfig, env: object, world: int) -> None:
    """What a library run's ``env`` object (None: not given; an env id is no object) allows
    with ``config`` across ``world`` processes: a vector env or a callable making one, in a
    new run of one process that makes no envs of its own from ``config.env``."""
    if env is None:
        return
    if not (callable(env) or isinstance(env, gym.vector.VectorEnv)):
        raise TypeError(
            f"env must be an env id, a gymnasium VectorEnv or a callable making one, got "
            f"{type(env).__name__}"
        )
    check_objects_run(config, world)
    given = [flag for name, flag in _ENV_OBJECT_CONFLICTS if getattr(config, name)]
    if set(rubric_weights(config.rubric)) - {"task"}:  # parts beyond the task's reward
        given.append("--rubric")
    if given:
        raise ValueError(
            f"env as an object does not go with {', '.join(given)}, which make envs "
            "of their own from config.env: pass the env id, or leave them off "
            "(eval_episodes=0; evaluate with trainer.evaluate() on an id's run)"
        )


def check_vector_env(
    config: GRPOConfig, envs: gym.vector.VectorEnv, world: int, multi_turn: bool
) -> None:
    """What the run's vector env must be: a sub-env per response observing the trainer's
    keys; a multi-turn one (``multi_turn``: whether its episodes may take more than one
    response) charges no KL penalty in its envs across processes."""
    size = config.groups * config.group_size // world
    if envs.num_envs != size:
        raise ValueError(
            f"env has {envs.num_envs} sub-envs; the run steps groups × group_size = "
            f"{config.groups} × {config.group_size} = {size}, a sub-env per response"
        )
    keys = getattr(envs.single_observation_space, "spaces", {})
    if not set(_TRAINER_KEYS) <= set(keys):
        raise ValueError(
            "env must observe 'tokens', 'history' and 'policy_mask' (input_mode='tokens', "
            "observation_keys=('tokens', 'history', 'policy_mask')), got the keys "
            f"{sorted(keys)}"
        )
    if multi_turn and config.dynamic_sampling:
        raise ValueError(
            f"{config.env} plays more than one turn an episode, whose iterations reseed "
            "their groups: dynamic_sampling (--dynamic-sampling) refills single-turn tasks"
        )
    if multi_turn and world > 1 and config.kl_coef > 0:
        raise ValueError(
            f"{config.env} plays more than one turn an episode (tools, a game, max_turns), "
            "whose KL penalty charged in the envs (--kl-coef > 0) a run across processes does "
            "not take yet: drop --kl-coef or run it in one process"
        )


def check_episode_groups(prompts: Sequence[object], group_size: int) -> None:
    """That each group of ``group_size`` consecutive episodes (given by their ``prompts``)
    played one item: GRPO compares a group's responses."""
    for start in range(0, len(prompts), group_size):
        played = {json.dumps(p, sort_keys=True, default=str)
                  for p in prompts[start : start + group_size]}  # fmt: skip
        if len(played) > 1:
            raise ValueError(
                f"env's sub-envs {start}..{start + group_size - 1} (one group) played "
                f"{len(played)} different prompts; a group must play one item: make the "
                f"vector env with repeats={group_size}, group_repeats=True"
            )


def build_feed(
    config: GRPOConfig,
    envs: gym.vector.VectorEnv,
    tokenizer: PreTrainedTokenizerBase,
    processes: Processes,
    sample: Policy,
    rubric: RunRubric,
    *,
    reference: Scorer | None = None,
    gen: Scorer | None = None,
    first: int = 0,
    sampler: Sampler | Policy | None = None,
    weights_dtype: torch.dtype | None = None,
) -> FeedSetup:
    """The ``Feed`` of the run's episodes from iteration ``first``, over ``envs``
    (``run_envs``'s): ``sample`` answers each batch of prompts; ``reference`` (with
    ``controller``) charges the KL penalty in the envs (``gen``: the scorer of the policy's
    side, None: the sampled log-probs), or in each sub-env of the asynchronous driver (with
    Ray, a copy in an actor, its weights in ``weights_dtype``); an agent's calls go to
    ``sampler``, which also sits out, across processes, the turns this process has no
    prompt for (``LockStep``; ``sample`` where it is None)."""
    turns = multi_turn(envs)
    check_vector_env(config, envs, processes.world, turns)
    base = envs.unwrapped
    stream = base if isinstance(base, DatasetChatVectorEnv) else None
    curriculum = envs if config.curriculum else None  # before KL wraps it
    parts: dict[str, Any] = {"stream": stream, "curriculum": curriculum}
    refill = {"refills": config.dynamic_sampling, "group_size": config.group_size}
    size, kl, controller = processes.num_envs, None, None
    if config.kl_coef > 0 and config.kl_target is not None:  # else a constant coefficient
        controller = AdaptiveKLController(config.kl_coef, config.kl_target, config.kl_horizon)
    if config.kl_coef > 0 and not config.asynchronous:
        envs = kl = charge_kl(
            envs, config, config.model, gen=gen, controller=controller, ref=reference
        )  # fmt: skip
    if config.agent is not None:  # an agent program plays batch k's items of (seed, k)
        source: EpisodeSource = agent_episodes(
            config, tokenizer, sampler, config.group_size, config.seed, first
        )
        return FeedSetup(envs, Feed(source, processes, **parts, **refill), turns)
    if config.asynchronous:  # the vector env above only tells what the task is
        driver = _driver(
            config, tokenizer, sample, rubric, reference, controller, curriculum, weights_dtype,
            processes.device,
        )  # fmt: skip
        driver.seek(first * size)  # batch j is stream positions [j B, (j + 1) B)
        batches = AsyncBatches(
            driver, size, config.max_staleness, first, update_epochs=config.update_epochs
        )
        return FeedSetup(envs, Feed(batches, processes, pipeline=batches, **parts), turns)
    config.check_turns(turns)
    # Across processes each plays its own groups, generating as often as the others: the
    # policy itself sits turns out (sample may wrap it).
    peers = None
    if processes.world > 1 and turns:
        sharded = config.backend == "transformers"  # else a server generates for all
        peers = LockStep(sampler if sampler is not None else sample, sharded)
    # The group's chains, then its branches and the values of their states.
    if config.branches or config.advantage == "vine":
        source = TreeEpisodes(
            envs, sample, group_size=config.group_size, branches=config.branches,
            vine_rollouts=config.vine_rollouts if config.advantage == "vine" else 0,
            gamma=config.gamma, seed=config.seed, reseed=config.seed + 1, first=first,
            shards=(processes.first_env, processes.num_envs * processes.world), peers=peers,
        )  # fmt: skip
        return FeedSetup(envs, Feed(source, processes, kl=kl, **parts), turns)
    if turns:  # tools, games: iteration k restarts each group from seed + 1 + k
        source = VectorEpisodes(envs, sample, reseed=config.seed + 1, first=first, peers=peers)
        return FeedSetup(envs, Feed(source, processes, kl=kl, **parts, **refill), turns)
    source = VectorEpisodes(envs, sample, seed=config.seed)
    feed = Feed(source, processes, kl=kl, restart=source, reset_seed=config.seed, **parts, **refill)
    return FeedSetup(envs, feed, turns)


def kl_scorer(config: GRPOConfig, scorer: Scorer, compute: torch.dtype) -> Scorer | None:
    """The scorer of the policy's side of the KL charged in the envs: None (the sampled
    log-probs) when sampling and scoring both run in float32; else the trained model's own
    forward, since below float32 generation's log-probs are mostly rounding noise against a
    forward's."""
    computed = dtype_name(compute)
    served = config.backend_args.get("dtype", computed)
    return None if computed == served == "float32" else scorer


def _groups(episodes: list[Episode], size: int) -> list[list[Episode]]:
    return [episodes[i : i + size] for i in range(0, len(episodes), size)]


def _varied(group: list[Episode]) -> bool:
    # Whether the group's rewards differ: GRPO's advantages are 0 for a group of equal ones.
    return len({e.reward for e in group}) > 1


def run_envs(
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    processes: Processes,
    rubric: RunRubric,
    given: gym.vector.VectorEnv | Callable[[], gym.vector.VectorEnv] | None = None,
) -> gym.vector.VectorEnv:
    """The run's vector env: a sub-env per response, each group's on one item, ``config``'s
    task (across processes this process's part of the whole run's sub-envs) or the env
    ``given`` (or made by it)."""
    if given is None:
        shards = None
        if processes.world > 1:
            if gym.spec(config.env).vector_entry_point is None:
                raise ValueError(
                    f"{config.env} has no native vector env, which a run across processes "
                    "splits between them: run it in one process"
                )
            shards = (processes.first_env, processes.num_envs * processes.world)
        return task_envs(
            config, tokenizer, processes.num_envs, repeats=config.group_size,
            group_repeats=True, shards=shards, **rubric.env_options(),
        )  # fmt: skip
    envs = given if isinstance(given, gym.vector.VectorEnv) else given()
    if not isinstance(envs, gym.vector.VectorEnv):
        raise TypeError(f"env() must make a gymnasium VectorEnv, got {type(envs).__name__}")
    return envs


def _driver(
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    sample: Policy,
    rubric: RunRubric,
    reference: Scorer | None,
    controller: KLController | None,
    curriculum: Any,
    weights_dtype: torch.dtype | None,
    device: torch.device,
) -> Any:
    # One curriculum and one KL coefficient for every sub-env, moved by episodes in the order
    # they finish. In this process one generate runs at a time: each waits for every env step
    # in flight, so that the batches (and the samples) do not depend on timing; the
    # curriculum and the KL coefficient move between batches, by stream order.
    ref = None
    if config.kl_coef > 0:  # each sub-env charges its own; the controller is shared
        ref = reference
        if config.ray_address is not None:  # one Ray actor the env workers share
            ref = reference_scorer(config, config.model, weights_dtype=weights_dtype, device=device)
    schedule = curriculum.schedule if curriculum is not None else None
    wait = math.inf if config.backend == "transformers" else 0.05
    return async_episodes(
        config, tokenizer, sample, config.groups * config.group_size,
        repeats=config.group_size, ref=ref, controller=controller, curriculum=schedule,
        batch_wait=wait, shared_updates="batch", **rubric.env_options(),
    )  # fmt: skip


def agent_episodes(
    config: GRPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    sampler: Sampler | Policy | None,
    group_size: int,
    seed: int,
    first: int = 0,
) -> AgentEpisodes:
    """``config.agent``'s runs over the task's items, its calls sampled by ``sampler``."""
    env = gym.make(config.env, **env_kwargs(config, tokenizer)).unwrapped
    return AgentEpisodes(
        load_agent(config.agent), env, sampler, tokenizer, group_size=group_size,
        num_agents=config.num_agents, timeout=config.agent_timeout, seed=seed, first=first,
    )  # fmt: skip
