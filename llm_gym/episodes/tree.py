"""Episodes that share states: branched groups (Tree-GRPO's expansion, Ji et al., 2025) and
VinePPO's Monte Carlo values (Kazemnejad et al., 2025), both played by forking the env where a
turn was made (``llm_gym.fork``) and letting the policy play on from there.

``TreeEpisodes`` is the ``EpisodeSource`` of a run with ``--branches K`` or ``--advantage
vine``: each call plays every sub-env's episode (the group's chains) keeping a fork of each
turn's state (``Snapshot``), then ``K`` branches a group, each forked at a turn boundary of one
of the group's chains and played to its end, then (vine) ``K`` continuations from each state a
trained turn was made in, whose mean return is that state's value. A branch's turns before the
one where it left its parent are its parent's (the same tokens, not sampled again, not trained
again); ``turn_nodes`` says which turns of a group are one and the same.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from llm_gym.envs.forking import fork, fork_sub_env
from llm_gym.episodes.episode import Episode, Segment
from llm_gym.episodes.records import EpisodeTrace
from llm_gym.episodes.vector import Episodes, Peers, play_episodes, still_playing
from llm_gym.policies.base import Policy
from llm_gym.seeding import derive_seed

__all__ = [
    "Snapshot",
    "TreeEpisodes",
    "branch_points",
    "discounted_returns",
    "play_forks",
    "turn_nodes",
]

_BRANCH_DRAWS = 0x7EE  # the key of the branch points' stream beside the run's seed


@dataclass
class Snapshot:
    """The state a turn was made in: ``env``, a fork of the env there (never stepped: each
    play from it forks it again), its observation ``obs`` and the episode's ``trace`` so far."""

    env: gym.Env
    obs: Mapping[str, Any]
    trace: EpisodeTrace


def turn_nodes(
    lengths: Sequence[int], branches: Sequence[Mapping[str, int] | None], first: int = 0
) -> list[list[int]]:
    """Which turns of a group are the same node of its tree: episode ``e``'s turn ``t`` gets
    an id, shared with its parent's turn ``t`` where ``e`` branched off (``branches[e]``:
    ``{"of": p, "turn": k}``, ``p - first`` the parent's place in the group, before ``e``:
    ``first`` is the group's first episode's index in its batch) after it (``t < k``).
    Two turns made in the same state are those whose previous turns share an id (or ``t = 0``).

    >>> turn_nodes([3, 3, 2], [None, {"of": 0, "turn": 1}, {"of": 1, "turn": 2}])
    [[0, 1, 2], [0, 4, 5], [0, 4]]
    """
    nodes: list[list[int]] = []
    for e, length in enumerate(lengths):
        branch = branches[e]
        own = [e * max(max(lengths, default=1), 1) + t for t in range(length)]
        if branch is not None:
            parent, turn = int(branch["of"]) - first, int(branch["turn"])
            if not 0 <= parent < e:
                raise ValueError(
                    f"episode {first + e} branches off {parent + first}, which is not before it "
                    "in its group"
                )
            own[:turn] = nodes[parent][:turn]
        nodes.append(own)
    return nodes


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Each turn's return from the ``rewards`` of an episode's turns:
    ``G_t = r_t + gamma * G_{t+1}``, the last turn's its reward.

    >>> [round(g, 4) for g in discounted_returns([0.0, 0.5, 1.0], 0.9)]
    [1.26, 1.4, 1.0]
    >>> discounted_returns([0.25, 0.5, 0.25])
    [1.0, 0.75, 0.25]
    """
    returns, later = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        later = returns[t] = float(rewards[t]) + gamma * later
    return returns


def branch_points(
    turns: Sequence[int], count: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """``count`` places to branch a group whose episodes made ``turns`` turns each: a random
    episode with a non-final turn, and the turn after a random non-final one of it (where the
    branch leaves it: ``1 .. turns - 1``); ``(e, 0)``, a fresh start, where no episode has two
    turns.

    >>> branch_points([1, 3, 1], 3, np.random.default_rng(0))
    [(1, 2), (1, 2), (1, 2)]
    """
    several = [e for e, n in enumerate(turns) if n > 1]
    points = []
    for _ in range(count):
        if not several:
            points.append((int(rng.integers(len(turns))), 0))
            continue
        e = several[int(rng.integers(len(several)))]
        points.append((e, 1 + int(rng.integers(turns[e] - 1))))
    return points


@torch.no_grad()
def play_forks(
    starts: Sequence[Snapshot],
    policy: Policy,
    streams: Sequence[int],
    env_indices: Sequence[int],
    keep: bool = False,
    peers: Peers | None = None,
) -> tuple[list[Episode], list[list[Snapshot]], float]:
    """Play an episode from each of ``starts`` to its end (each from a fresh fork of its
    snapshot), one batched generation a step; prompt ``i`` samples from sub-env stream
    ``streams[i]`` and its ``Episode`` says ``env_indices[i]``. The episodes, each one's
    snapshots from its start on (``keep``; else empty) and the seconds spent generating.
    ``peers``: the run's other processes, each playing its own starts, in lock step."""
    envs = [fork(start.env) for start in starts]
    traces = [start.trace.copy() for start in starts]
    obs = [start.obs for start in starts]
    kept: list[list[Snapshot]] = [[] for _ in starts]
    done: list[Episode | None] = [None] * len(starts)
    seconds = 0.0
    while still_playing(done.count(None), peers):
        active = [i for i, episode in enumerate(done) if episode is None]
        if not active:  # sat out: another process's episodes go on
            continue
        if keep:
            for i in active:
                kept[i].append(Snapshot(fork(envs[i]), obs[i], traces[i].copy()))
        began = time.perf_counter()
        batch = {"tokens": tuple(obs[i]["tokens"] for i in active),
                 "env_index": [streams[i] for i in active]}  # fmt: skip
        responses = policy(batch)
        seconds += time.perf_counter() - began
        for i, response in zip(active, responses, strict=True):
            obs[i], reward, terminated, truncated, info = envs[i].step(response)
            traces[i].add(response, reward, info.get("kl"))
            if terminated or truncated:
                done[i] = traces[i].finish(env_indices[i], info, obs[i])
    return list(done), kept, seconds  # type: ignore[arg-type]


class TreeEpisodes:
    """A vector env and its policy as an ``EpisodeSource`` whose groups share states: each
    ``episodes`` call plays one episode in every sub-env (the chains; multi-turn tasks, each
    call ``k`` reset with seed ``reseed + k``, as ``VectorEpisodes``), then ``branches`` more a
    group of ``group_size`` chains (``branch_points`` from the stream ``(seed, k, group)``),
    appended after the group's chains, each with ``branch = {"of": parent, "turn": t}`` (its
    parent's index in the run's list of the call); then with ``vine_rollouts`` each trained
    turn's state's value (``Episode.turn_values``). Sub-env ``i``'s chains sample from stream
    ``i``, the branches and continuations from streams past the run's sub-envs, so a call is a
    function of its ``k``, on one process or several.

    Across processes (``shards``: this one's first sub-env and the run's sub-envs, as the
    native vector env's; ``peers``: the others, when one sharded model samples for all),
    each plays its own groups, and the run's list of a call is every process's in order:
    the call of one process over all the groups.

    Attributes: ``seconds`` (the last call's generating), ``sampled_tokens`` (the tokens it
    sampled: chains, branches past their parents' turns, the values' continuations).
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: Policy,
        *,
        group_size: int,
        branches: int = 0,
        vine_rollouts: int = 0,
        gamma: float = 1.0,
        seed: int = 0,
        reseed: int = 0,
        first: int = 0,
        shards: tuple[int, int] | None = None,
        peers: Peers | None = None,
    ) -> None:
        if envs.num_envs % group_size:
            raise ValueError(
                f"the vector env's {envs.num_envs} sub-envs are not groups of {group_size}"
            )
        self.envs, self.policy, self.group_size = envs, policy, group_size
        self.branches, self.vine_rollouts, self.gamma = branches, vine_rollouts, gamma
        self.seed, self.reseed, self.calls = seed, reseed, first
        self.first_env, self.run_envs = shards or (0, envs.num_envs)
        self.peers = peers
        self.seconds, self.sampled_tokens = 0.0, 0

    def episodes(self, count: int) -> list[Episode]:
        """The chains of every sub-env (``count``: ``num_envs``), each group followed by its
        branches."""
        envs, n, size = self.envs, self.envs.num_envs, self.group_size
        if count != n:
            raise ValueError(
                f"count must be the vector env's num_envs={n} (an episode of every sub-env), "
                f"got {count}"
            )
        obs, _ = envs.reset(seed=self.reseed + self.calls)
        call, self.calls = self.calls, self.calls + 1
        chains, snapshots, self.seconds = _play_chains(envs, self.policy, obs, self.peers)
        # Each group's branches: where (from the group's own stream), then all of them
        # played in one batch.
        first_group = self.first_env // size
        starts, parents, where = [], [], []
        for g in range(0, n, size):
            seed = derive_seed(self.seed, call, _BRANCH_DRAWS, first_group + g // size)
            group = chains[g : g + size]
            turns = [len(c.responses) for c in group]
            for e, turn in branch_points(turns, self.branches, np.random.default_rng(seed)):
                starts.append(snapshots[g + e][turn])
                parents.append(g + e)
                where.append(turn)
        # Branch j of the run's samples from stream run_envs + j (this process's own streams
        # are counted from its first sub-env).
        past = self.run_envs + first_group * self.branches - self.first_env
        grown, grown_snapshots, seconds = play_forks(
            starts, self.policy, [past + j for j in range(len(starts))],
            [chains[p].env_index for p in parents], keep=self.vine_rollouts > 0, peers=self.peers,
        )  # fmt: skip
        self.seconds += seconds
        # The index of this process's first episode in the run's list of the call.
        offset = first_group * (size + self.branches)
        batch, batch_snapshots = [], []
        for g in range(0, n, size):
            first = len(batch)
            batch += chains[g : g + size]
            batch_snapshots += snapshots[g : g + size]
            for j in range(g // size * self.branches, (g // size + 1) * self.branches):
                branch = _from_turn(grown[j], where[j])
                branch.branch = {"of": offset + first + parents[j] - g, "turn": where[j]}
                batch.append(branch)
                # Its snapshots before its turn where[j] are its parent's.
                batch_snapshots.append(snapshots[parents[j]][: where[j]] + grown_snapshots[j])
        self.sampled_tokens = sum(e.num_tokens for e in batch)
        if self.vine_rollouts:
            branches = self.run_envs // size * self.branches
            self._values(batch, batch_snapshots, offset, self.run_envs + branches)
        return batch

    def _values(
        self, batch: list[Episode], snapshots: list[list[Snapshot]], offset: int, stream: int
    ) -> None:
        # VinePPO's value of each state a trained turn was made in (and the state after it):
        # the mean return of vine_rollouts continuations from it, all of the batch's played
        # together; the start's, the mean return of the group's other chains (fresh samples
        # of the same state); an end's, 0. The run's continuations sample from streams on from
        # stream, process by process (offset: this batch's first episode in the run's list).
        size, k = self.group_size + self.branches, self.vine_rollouts
        nodes: dict[int, list[list[int]]] = {}  # a group's first episode -> its turns' nodes
        wanted: dict[tuple[int, int], tuple[int, int]] = {}  # (group, node) -> (episode, turn)
        for g in range(0, len(batch), size):
            group = batch[g : g + size]
            nodes[g] = turn_nodes(
                [len(e.responses) for e in group], [e.branch for e in group], offset + g
            )
            for e, episode in enumerate(group):
                first = episode.branch["turn"] if episode.branch else 0
                for t in range(max(first, 1), len(episode.responses)):
                    wanted.setdefault((g, nodes[g][e][t - 1]), (g + e, t))
        order = sorted(wanted)
        starts = [snapshots[wanted[s][0]][wanted[s][1]] for s in order for _ in range(k)]
        counts = [len(starts)] if self.peers is None else self.peers.counts(len(starts))
        mine = stream + sum(counts[: self.first_env // self.envs.num_envs]) - self.first_env
        played, _, seconds = play_forks(
            starts, self.policy, range(mine, mine + len(starts)), [0] * len(starts),
            peers=self.peers,
        )  # fmt: skip
        self.seconds += seconds
        value = {}
        for j, state in enumerate(order):
            runs, t = played[j * k : (j + 1) * k], wanted[state][1]
            self.sampled_tokens += sum(sum(r.turn_tokens[t:]) for r in runs)  # not the prefix's
            value[state] = float(np.mean([discounted_returns(r.turn_rewards, self.gamma)[t]
                                          for r in runs]))  # fmt: skip
        for g in range(0, len(batch), size):
            group = batch[g : g + size]
            chains = [discounted_returns(e.turn_rewards or [e.reward], self.gamma)[0]
                      for e in group if e.branch is None]  # fmt: skip
            for e, episode in enumerate(group):
                others = list(chains)
                if episode.branch is None and len(chains) > 1:  # leave its own return out
                    others.remove(
                        discounted_returns(episode.turn_rewards or [episode.reward], self.gamma)[0]
                    )
                start = float(np.mean(others)) if others else 0.0
                later = [value.get((g, nodes[g][e][t - 1]), np.nan)
                         for t in range(1, len(episode.responses))]  # fmt: skip
                episode.turn_values = [start, *later]

    def close(self) -> None:
        """Close the vector env."""
        self.envs.close()


def _play_chains(
    envs: gym.vector.VectorEnv, policy: Policy, obs: dict[str, Any], peers: Peers | None
) -> tuple[list[Episode], list[list[Snapshot]], float]:
    # One episode in every sub-env (play_episodes), with a fork of each sub-env before each
    # of its turns.
    snapshots: list[list[Snapshot]] = [[] for _ in range(envs.num_envs)]

    def keep(running: Episodes, active: list[int]) -> None:
        for i in active:
            state = {key: running.obs[key][i] for key in running.obs}
            snapshots[i].append(Snapshot(fork_sub_env(envs, i), state, running.traces[i].copy()))

    records, seconds, _ = play_episodes(envs, policy, obs, before_turn=keep, peers=peers)
    return records, snapshots, seconds


def _from_turn(episode: Episode, turn: int) -> Episode:
    # A branch trains from the turn where it left its parent: the tokens before are the
    # parent's (its policy mask off there, its sampled log-probs and token counts from there).
    if not turn:
        return episode
    skip = sum(episode.turn_tokens[:turn])
    segments = []
    for segment in episode.segments:
        mask = segment.policy_mask.copy()
        mask[np.flatnonzero(mask)[:skip]] = False
        log_probs = None if segment.log_probs is None else segment.log_probs[skip:]
        segments.append(Segment(segment.ids, mask, log_probs))
    episode.segments = segments
    if episode.sampled_log_probs is not None:
        episode.sampled_log_probs = episode.sampled_log_probs[skip:]
    episode.num_tokens -= skip
    episode.turn_tokens = [0] * turn + list(episode.turn_tokens[turn:])
    return episode
