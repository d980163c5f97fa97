"""GRPO through llm_gym, in one file: what ``llm-gym train`` runs (docs/training.md tells
the iteration; one iteration serves tools, KL and curriculum alike)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from llm_gym.agents import AgentEpisodes, load_agent
from llm_gym.envs import single_env
from llm_gym.episodes import (
    EpisodeSource,
    VectorEpisodes,
    multi_turn,
    rubric_part_names,
    summarize,
)
from llm_gym.lm.loading import load_model
from llm_gym.lm.lora import AdapterDisabled, is_lora, load_lora, unwrapped, with_lora
from llm_gym.policies import SamplerPolicy, TransformersPolicy
from llm_gym.run.budget import check_run
from llm_gym.run.config import rubric_weights
from llm_gym.run.describe import describe_run
from llm_gym.run.files import LineFile, RunWriteError, told, write_text
from llm_gym.run.lock import FolderLock
from llm_gym.run.setup import (
    DTYPES,
    async_episodes,
    charge_kl,
    compute_dtype,
    dtype_name,
    env_kwargs,
    make_policy,
    reference_scorer,
    resolve_device,
    run_rubric,
    task_envs,
)
from llm_gym.samplers.transformers import stream_generators
from llm_gym.samplers.weights import export_model, write_weights
from llm_gym.train.checkpoints import (
    OPTIMIZER_FOLDER,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from llm_gym.train.config import GRPOConfig
from llm_gym.train.evaluation import evaluate_greedy
from llm_gym.train.loss import (
    group_advantages,
)
from llm_gym.train.pipeline import AsyncBatches
from llm_gym.train.run_folder import (
    METRICS_FILE,
    SERVED_FOLDER,
    SUMMARY_FILE,
    claim_out,
    clear_out,
    earlier_rows,
    write_summary,
)
from llm_gym.train.sharding import (
    barrier,
    broadcast_object,
    full_weights,
    gather_objects,
    join_processes,
    launched_processes,
    load_optimizer,
    process_rank,
    shard_model,
    world_size,
)
from llm_gym.train.update import PRECISION_WEIGHTS, GRPOUpdate, adamw, resolve_precision
from llm_gym.wrappers import AdaptiveKLController

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.policies.base import Policy

# What an env object (not an id) cannot be asked for: each makes envs of its own from
# config.env (the asynchronous driver's, an agent's, Ray's workers, the held-out evaluation)
# or wraps the ones it makes (curriculum, rubric).
_ENV_OBJECT_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("eval_episodes", "--eval-episodes"),
)  # fmt: skip
# What a run across processes does not do yet: each needs every process to step alike (an
# episode's turns, an agent's calls, an asynchronous batch) or to share one state (a
# curriculum's level, an adaptive KL coefficient).
_SHARDED_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("kl_target", "--kl-target"),
)  # fmt: skip

__all__ = ["GRPOTrainer"]


class GRPOTrainer:
    """A prepared run, as ``Rollout`` is one (every input error raised before generating);
    ``train()`` runs it. ``policy`` generates (``config.backend``), ``scorer`` (the model
    being trained) re-scores; ``version`` counts the optimizer's steps, and a vLLM sampler gets
    the new weights after each (``llm_gym.samplers.weights``).

    As a library, as TRL's: ``model`` (a transformers model, or a peft one whose adapters
    train) and its ``tokenizer`` train in place of the one ``config.model`` names, on their
    own device and dtype; ``env`` is an env id (played with ``config``'s env args), a
    Gymnasium vector env of ``groups × group_size`` sub-envs in tokens mode observing
    ``("tokens", "history", "policy_mask")``, whose groups of ``group_size`` consecutive
    sub-envs play one item (the native vector env's ``repeats=group_size,
    group_repeats=True``), or a callable making one.
    """

    def __init__(
        self,
        config: GRPOConfig,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        env: str | gym.vector.VectorEnv | Callable[[], gym.vector.VectorEnv] | None = None,
    ) -> None:
        if (model is None) != (tokenizer is None):
            given, missing = ("model", "tokenizer") if tokenizer is None else ("tokenizer", "model")
            raise ValueError(
                f"{given} was given without its {missing}: pass a model object and its "
                "tokenizer together, or neither (config.model names the model)"
            )
        if config.resume and (model is not None or env is not None):
            raise ValueError(
                "resume reloads a run from its folder by name; a model or env object cannot "
                "be resumed into yet: resume with GRPOTrainer(GRPOConfig.resumed(out))"
            )
        if isinstance(env, str):
            config, env = dataclasses.replace(config, env=env), None
        elif env is not None:
            given = [flag for name, flag in _ENV_OBJECT_CONFLICTS if getattr(config, name)]
            if set(rubric_weights(config.rubric)) - {"task"}:  # parts beyond the task's reward
                given.append("--rubric")
            if given:
                raise ValueError(
                    f"env as an object does not go with {', '.join(given)}, which make envs of "
                    "their own from config.env: pass the env id, or leave them off "
                    "(eval_episodes=0; evaluate with trainer.evaluate() on an id's run)"
                )
        self.config, self.given_model, self.given_env = config, (model, tokenizer), env
        self.out = Path(config.out)
        if launched_processes() > 1 or world_size() > 1:
            _check_sharded(config, model, env)
        # Under torchrun: one process of several, each on its own device (docs/many-gpus.md).
        device = model.device if model is not None else resolve_device(config.device)
        self.process_device, self.joined = join_processes(device)
        self.world, self.lead = world_size(), process_rank() == 0
        # This process's sub-envs: sub-envs first.. of the whole run's.
        self.num_envs = config.groups * config.group_size // self.world
        self.shards = (process_rank() * self.num_envs, self.num_envs * self.world)
        # Before the folder is looked at: one run at a time in it, until train() ends (the
        # first process holds the lock for all of them).
        self.lock = FolderLock(self.out) if self.lead else None
        try:
            self._prepare(config)
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        # The folder let go, and the process group left if this trainer joined it.
        if self.lock is not None:
            self.lock.release()
        if self.joined:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.joined = False

    def _prepare(self, config: GRPOConfig) -> None:
        given, tokenizer = self.given_model
        if given is not None:  # the model's own device and dtype
            parameter = next(given.parameters())
            self.device, self.dtype = parameter.device, parameter.dtype
            self.precision = resolve_precision(config.precision, self.device, self.dtype)
        else:  # the trained weights' dtype is the precision's
            self.device = self.process_device
            self.precision = resolve_precision(config.precision, self.device)
            self.dtype = PRECISION_WEIGHTS[self.precision]
        # What sampling, scoring and the reference compute in: --dtype, by autocast over
        # float32 weights (as the update does under bf16-mixed); weights below float32, theirs.
        self.compute_dtype = compute_dtype(config, self.device, self.dtype)
        if given is None:
            self._check_sizes(config)  # before anything is allocated
        checkpoint = claim_out(config)  # on --resume the newest one, checked whole
        barrier()  # every process has looked before the first clears the folder
        self.checkpoint = checkpoint
        state, tensors = load_checkpoint(checkpoint) if checkpoint else (None, None)
        torch.manual_seed(config.seed)
        if given is not None:
            self.model, self.tokenizer = given, tokenizer
            if config.lora_rank and is_lora(given):
                raise ValueError(
                    f"model is a peft model already, and lora_rank={config.lora_rank} would wrap "
                    "it again: leave lora_rank 0 (its adapters train)"
                )
            if config.lora_rank:  # adapters on the given model, which stays frozen
                self.model = with_lora(
                    given, config.lora_rank, alpha=config.lora_alpha,
                    dropout=config.lora_dropout, target_modules=config.lora_target_modules,
                )  # fmt: skip
        elif config.lora_rank:  # the base model, frozen, with adapters that train
            base, self.tokenizer = load_model(config.model, device=self.device, dtype=self.dtype)
            if checkpoint:
                self.model = load_lora(base, checkpoint, trainable=True)
            else:
                self.model = with_lora(
                    base, config.lora_rank, alpha=config.lora_alpha,
                    dropout=config.lora_dropout, target_modules=config.lora_target_modules,
                )  # fmt: skip
            # What the adapter checkpoints name as their base: --model, not its cache folder.
            self.model.peft_config["default"].base_model_name_or_path = config.model
        else:
            self.model, self.tokenizer = load_model(
                checkpoint or config.model, device=self.device, dtype=self.dtype
            )
        self.lora = is_lora(self.model)
        self.scorer = TransformersPolicy(  # the model being trained
            self.model, self.tokenizer, input_mode="tokens", generate=False,
            compute_dtype=self.compute_dtype,
        )  # fmt: skip
        self.pad_id = self.scorer.pad_token_id
        if config.gradient_checkpointing is not False:  # layers' inputs kept, rest recomputed
            model = unwrapped(self.model)
            enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5
            if enable is None:
                enable = model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        self.version = (int(state["iteration"]) * config.update_epochs) if state else 0
        self.sync_seconds = 0.0  # the last weight sync's
        served = None
        if config.backend == "vllm" and self.lead:  # the weights training starts from
            served = export_model(self.model, self.tokenizer, self.out / SERVED_FOLDER)
        sampling_model = self.model
        if config.asynchronous and config.backend == "transformers":
            sampling_model = copy.deepcopy(self.model)  # samples while this one trains
        self.policy = self._sampling_policy(sampling_model, config, served)
        if self.world > 1:  # each process holds a slice of every weight (FSDP2)
            shard_model(self.model, self.precision)
        self.sampling_lock = threading.Lock()  # no update lands in the middle of a batch
        # Each sub-env's own random stream in this iteration (see _sample).
        self.streams: dict[int, torch.Generator] = {}
        self._iteration = 0
        self.driver: Any = None  # --async: the AsyncEpisodes behind the source
        try:
            self._set_up(config, state, tensors)
        except BaseException:  # no server is left running after a setup error
            self.close()
            raise

    def _sampling_policy(self, model: Any, config: GRPOConfig, served: Path | None) -> Any:
        # Across processes, the first starts the vLLM server and the others sample from it.
        policy, server = None, None
        if config.backend != "vllm" or self.lead:
            policy = make_policy(
                model, self.tokenizer, config, served=served, compute_dtype=self.compute_dtype
            )
        if config.backend == "vllm" and self.world > 1:
            server = broadcast_object(policy.sampler.base_url if self.lead else None)
        return policy or make_policy(model, self.tokenizer, config, server=server)

    def _check_sizes(self, config: GRPOConfig) -> None:
        # A sub-env per response, each generating up to max_new_tokens a turn.
        # Across processes: each one's groups, and its slice of the trained weights.
        tokens, batch = config.max_response_tokens + 1, self.num_envs
        batches = [("--minibatch-size", min(config.minibatch_size, batch), tokens, True)]
        if config.backend == "transformers":  # else a server generates, in its own memory
            batches.append(("--groups × --group-size", batch, tokens, False))
        if config.eval_episodes:
            batches.append(("--eval-episodes", min(32, config.eval_episodes), tokens, False))
        copy = config.asynchronous and config.backend == "transformers"  # samples meanwhile
        copies = 1 + (config.kl_coef > 0 or config.kl_loss_coef > 0) + copy
        records = ("--eval-episodes", config.eval_episodes) if config.eval_episodes else None
        dtype = dtype_name(self.dtype)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        shards = (self.world, local)
        check_run(config, self.device, batches, records, copies, True, dtype, shards)

    def _set_up(self, config: GRPOConfig, state: Any, tensors: Any) -> None:
        self._publish(write=False)
        # The judges of --rubric, if any: their parts score each step's answers (a group
        # judge each group's), not the evaluation, which reads the task's success.
        self.rubric = run_rubric(config, self.tokenizer, config.group_size)
        self.envs = self._envs(config)
        self.part_names = rubric_part_names(self.envs)
        self.curriculum = self.envs if config.curriculum else None  # before KL wraps it
        self.multi_turn = multi_turn(self.envs)  # tools, games: iterations reseed themselves
        if self.multi_turn and self.world > 1:
            raise ValueError(
                f"{config.env} plays more than one turn an episode (tools, a game, max_turns), "
                "which a run across processes does not train yet: run it in one process"
            )
        self.kl_controller, kl_ref = None, None
        # The starting model, frozen, for the KL penalty and the KL term in the loss: with
        # LoRA the model itself, its adapter disabled (no copy); a given model's copy.
        self.reference: Any = None
        if config.kl_coef > 0 or config.kl_loss_coef > 0:
            if self.lora:
                self.reference = AdapterDisabled(self.scorer)
            elif self.given_model[0] is not None:
                frozen = copy.deepcopy(self.model).requires_grad_(False).eval()
                self.reference = TransformersPolicy(
                    frozen, self.tokenizer, input_mode="tokens", generate=False,
                    compute_dtype=self.compute_dtype,
                )  # fmt: skip
            else:  # in the trained weights' dtype: its log-probs start equal to the policy's
                local = dataclasses.replace(config, ray_address=None)
                self.reference = reference_scorer(local, config.model, weights=self.dtype)
        if config.kl_coef > 0:
            target = config.kl_target  # none: a constant coefficient
            if target is not None:
                self.kl_controller = AdaptiveKLController(config.kl_coef, target, config.kl_horizon)
            if config.asynchronous:  # each sub-env charges its own; the controller is shared
                kl_ref = self.reference
                if config.ray_address is not None:  # one Ray actor the env workers share
                    kl_ref = reference_scorer(config, config.model, weights=self.dtype)
            else:
                # Below float32, generation's log-probs are mostly rounding noise against a
                # forward's: re-score the responses in the same forward path as the reference.
                computed = dtype_name(self.compute_dtype)
                served_dtype = config.backend_args.get("dtype", computed)
                exact = computed == served_dtype == "float32"
                gen = None if exact else self.scorer
                self.envs = charge_kl(
                    self.envs, config, config.model, gen=gen, controller=self.kl_controller,
                    ref=self.reference,
                )  # fmt: skip
        if config.asynchronous:  # the vector env above only tells what the task is
            # One curriculum and one KL coefficient for every sub-env, moved by episodes in
            # the order they finish.
            # In this process one generate runs at a time: each waits for every env step in
            # flight, so that the batches (and the samples) do not depend on timing; the
            # curriculum and the KL coefficient move between batches, by stream order.
            schedule = self.curriculum.schedule if self.curriculum is not None else None
            wait = math.inf if config.backend == "transformers" else 0.05
            self.driver = async_episodes(
                config, self.tokenizer, self._sample, config.groups * config.group_size,
                repeats=config.group_size, ref=kl_ref, controller=self.kl_controller,
                curriculum=schedule, batch_wait=wait, shared_updates="batch",
                **self.rubric.env_options(),
            )  # fmt: skip
        trained = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: adapters
        self.optimizer = adamw(trained, config.learning_rate)
        self.updater = GRPOUpdate(
            self.model, self.optimizer, config, self.pad_id, reference=self.reference
        )
        self.start, self.before = 0, None
        self._drawn_level = getattr(self.envs.unwrapped, "level", None)
        # What the env plays, for the summary: its answer format and the tasks it names.
        self.answer_format = getattr(single_env(self.envs), "answer_format", None)
        self.task_names: set[str] = set()
        if state:
            self._restore(state, tensors)
        self.source: EpisodeSource = self._episode_source(state)
        # The held-out evaluation plays as the run does: the agent's runs, or the task's envs.
        self._held_out = self._greedy_evaluation if config.agent is None else self._agent_evaluation
        if not state and self.lead:  # set up without error: only now does an earlier run go
            clear_out(self.out)
            config.save()  # what --resume continues
        barrier()

    def _envs(self, config: GRPOConfig) -> gym.vector.VectorEnv:
        # A sub-env per response, each group's on one item: the task's, or the env given.
        # Across processes, each plays its part of the whole run's sub-envs.
        size = self.num_envs
        if self.given_env is None:
            shards = self.shards if self.world > 1 else None
            if shards is not None and gym.spec(config.env).vector_entry_point is None:
                raise ValueError(
                    f"{config.env} has no native vector env, which a run across processes "
                    "splits between them: run it in one process"
                )
            return task_envs(
                config, self.tokenizer, size, repeats=config.group_size, group_repeats=True,
                shards=shards, **self.rubric.env_options(),
            )  # fmt: skip
        envs = self.given_env if isinstance(self.given_env, gym.vector.VectorEnv) else None
        if envs is None:
            envs = self.given_env()
            if not isinstance(envs, gym.vector.VectorEnv):
                raise TypeError(f"env() must make a gymnasium VectorEnv, got {type(envs).__name__}")
        if envs.num_envs != size:
            raise ValueError(
                f"env has {envs.num_envs} sub-envs; the run steps groups × group_size = "
                f"{config.groups} × {config.group_size} = {size}, a sub-env per response"
            )
        keys = getattr(envs.single_observation_space, "spaces", {})
        if not {"tokens", "history", "policy_mask"} <= set(keys):
            raise ValueError(
                "env must observe 'tokens', 'history' and 'policy_mask' (input_mode='tokens', "
                "observation_keys=('tokens', 'history', 'policy_mask')), got the keys "
                f"{sorted(keys)}"
            )
        return envs

    def _episode_source(self, state: dict[str, Any] | None) -> EpisodeSource:
        # Where the episodes come from (the one choice; every iteration then asks alike), at
        # iteration `start`: a resumed run's source goes on where the run stopped.
        config, size = self.config, self.num_envs
        if config.agent is not None:  # an agent program plays batch k's items of (seed, k)
            return self._agent_episodes(self.policy, config.group_size, config.seed, self.start)
        if self.driver is not None:  # batch j is stream positions [j B, (j + 1) B)
            self.driver.seek(self.start * size)
            return AsyncBatches(
                self.driver, size, config.max_staleness, self.start,
                update_epochs=config.update_epochs,
            )  # fmt: skip
        if self.multi_turn:  # tools, games: iteration k restarts each group from seed + 1 + k
            return VectorEpisodes(self.envs, self._sample, reseed=config.seed + 1, first=self.start)
        obs = None if state is None else self._resumed_obs(state)
        return VectorEpisodes(self.envs, self._sample, seed=config.seed, obs=obs)

    def _agent_episodes(
        self, policy: Any, group_size: int, seed: int, first: int = 0
    ) -> AgentEpisodes:
        config = self.config
        env = gym.make(config.env, **env_kwargs(config, self.tokenizer)).unwrapped
        sampler = getattr(policy, "sampler", policy)  # a server's sampler, or the policy
        return AgentEpisodes(
            load_agent(config.agent), env, sampler, self.tokenizer, group_size=group_size,
            num_agents=config.num_agents, timeout=config.agent_timeout, seed=seed, first=first,
        )  # fmt: skip

    # -- the loop ---------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Run the iterations; write metrics, plot, checkpoints and ``summary.json``. Ctrl-C
        or a file the disk cannot take (``RunWriteError``, one line naming it) stops the run
        with its summary marked interrupted; the run folder is let go at the end."""
        try:
            return self._train()
        finally:
            self._leave()

    def _train(self) -> dict[str, Any]:
        config, started = self.config, time.perf_counter()
        rows = earlier_rows(self.out, self.start)
        bar = tqdm(
            total=config.iterations, initial=self.start, unit="it",
            disable=not (config.progress and self.lead), dynamic_ncols=True,
        )  # fmt: skip
        try:
            if self.before is None and config.eval_episodes:
                self.before = self.evaluate()
            metrics: Any = contextlib.nullcontext(_NOWHERE)  # the first process writes files
            if self.lead:  # the earlier rows are written aside first: a full disk cannot cost them
                lines = "".join(json.dumps(row) + "\n" for row in rows)
                write_text(self.out / METRICS_FILE, lines)
                metrics = LineFile(self.out / METRICS_FILE)
            with metrics as f:
                for iteration in range(self.start, config.iterations):
                    row = self.iteration(iteration)
                    rows.append(row)
                    f.write(json.dumps(row))  # a line per iteration, readable after Ctrl-C
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}")
                    done = iteration + 1
                    if done % config.save_every == 0 or done == config.iterations:
                        self.save(done)
                    publish = getattr(self.source, "publish", None)
                    if publish is not None:  # after the save: its RNG state is this one's
                        publish(iteration)
        except (KeyboardInterrupt, RunWriteError) as error:  # what finished is reported
            self._stopped(rows, started, error)
            raise
        finally:
            bar.close()
            self.close()
        after = self.evaluate() if config.eval_episodes else None
        try:
            return self.write(rows, after, time.perf_counter() - started)
        except RunWriteError as error:
            self._stopped(rows, started, error, after)
            raise

    def _stopped(
        self,
        rows: list[dict[str, Any]],
        started: float,
        error: BaseException,
        after: dict[str, float] | None = None,
    ) -> None:
        # The summary, marked interrupted, as far as the disk takes it; a RunWriteError then
        # says in its one line whether the summary was written.
        seconds = time.perf_counter() - started
        note = [f"Stopped: {error}"] if isinstance(error, RunWriteError) else []
        self.write(rows, after, seconds, interrupted=True, notes=note)
        if isinstance(error, RunWriteError):
            error.strerror = f"{error.strerror}; {told(self.out / SUMMARY_FILE, self.unwritten)}"

    def write(
        self,
        rows: list[dict[str, Any]],
        after: dict[str, float] | None,
        seconds: float,
        interrupted: bool = False,
        notes: list[str] = (),
    ) -> dict[str, Any]:
        """Write ``summary.json``, the plot and ``report.md`` (with ``notes``) of the metrics
        ``rows`` and the evaluation ``after`` (with ``before``); the summary. An
        ``interrupted`` run writes what the disk takes (``unwritten``: the others' errors)."""
        levels = {row["level"] for row in rows if row.get("level") is not None}
        config, names = self.config, self.task_names
        run = describe_run(config, self.answer_format, names, levels, config.backend)
        if self.given_model[0] is not None:  # the object's name, not config.model's
            name = getattr(unwrapped(self.model).config, "_name_or_path", "")
            run["model"] = name or type(unwrapped(self.model)).__name__
        summary = {"interrupted": interrupted, **run, "before": self.before, "after": after}
        summary.update(iterations=len(rows), minutes_this_run=seconds / 60)
        restarts = self.driver.restarts if self.driver and config.ray_address else None
        summary.update(device=str(self.device), worker_restarts=restarts)
        # What "auto" came to on this machine: the update's precision, the compute dtype.
        summary.update(precision=self.precision, dtype=dtype_name(self.compute_dtype))
        summary.update(packing=self.updater.packing, config=asdict(config))
        # How many processes ran it, and whether each held a slice of the model (FSDP2).
        summary.update(world_size=self.world, sharding="fsdp2" if self.world > 1 else None)
        if rows and rows[-1].get("parts"):  # a rubric's parts, as the last iteration paid them
            summary["parts"] = rows[-1]["parts"]
        rubric = getattr(self, "rubric", None)
        if rubric is not None and rubric.judges:  # what the judges cost this run
            summary["judges"] = rubric.stats()
        if self.lead:
            self.unwritten = write_summary(self.out, summary, rows, list(notes))
        return summary

    def iteration(self, iteration: int) -> dict[str, Any]:
        """Ask the source for an episode of every sub-env (``groups × group_size``), score
        them, update on each one's segments: the metrics row."""
        config, start = self.config, time.perf_counter()
        kl = config.kl_coef > 0
        # The next items are drawn in this iteration's step, at the level before it.
        self._drawn_level = getattr(self.envs.unwrapped, "level", None)
        self.streams, self._iteration = {}, iteration
        episodes = self.source.episodes(self.num_envs)
        # The sampling's seconds where the source tells them (not its env steps' or waits').
        seconds = getattr(self.source, "seconds", time.perf_counter() - start)
        if self.given_env is not None:
            _check_groups(episodes, config.group_size)
        # This process trains on its own groups' episodes; the row tells of every process's.
        everyone = gather_objects(episodes)
        self.task_names.update(
            str(e.info["task"]) for e in everyone if e.info.get("task") is not None
        )
        summary = summarize(everyone, seconds, self.part_names)
        rewards = torch.tensor([e.reward for e in episodes], device=self.device)
        advantages = group_advantages(rewards, config.group_size, config.scale_rewards)
        # Each segment trains with its episode's advantage (an env episode has one; an agent's
        # as many as its calls make); asynchronous batches by the log-probs they were sampled
        # with, and --tis-cap corrects toward them.
        rows = [(s, i) for i, e in enumerate(episodes) for s in e.segments]
        index = torch.tensor([i for _, i in rows], dtype=torch.long, device=self.device)
        behaviour = [s.log_probs for s, _ in rows] if config.asynchronous else None
        sampler = [s.log_probs for s, _ in rows] if config.tis_cap is not None else None
        update: dict[str, Any] = {"loss": 0.0}
        if rows:
            sequences, masks = [s.ids for s, _ in rows], [s.policy_mask for s, _ in rows]
            update = self._optimize(
                sequences, masks, advantages[index], behaviour, sampler_log_probs=sampler
            )
        snapshot = getattr(self.source, "snapshot", None)
        if snapshot is not None:  # the shared curriculum and KL as this batch left them
            level, kl_coef = snapshot["level"], snapshot["kl_coef"]
            kl_coef = config.kl_coef if kl_coef is None else kl_coef
        else:
            level = getattr(self.envs.unwrapped, "level", None)
            kl_coef = float(self.envs.coef) if kl else None
        row = {
            "iteration": iteration,
            "reward": summary.mean_reward,
            "task_reward": float(np.mean([e.reward_task or 0.0 for e in everyone])),
            "success": summary.accuracy,
            "kl": float(np.mean(np.concatenate([e.token_kl for e in everyone]))) if kl else None,
            "kl_coef": kl_coef if kl else None,
            **update,  # the loss and the update's diagnostics
            "response_tokens": float(np.mean([e.policy_tokens for e in everyone])),
            "level": level if level is not None else getattr(self.envs.unwrapped, "level", None),
            "tokens_per_second": summary.tokens_per_second,
            # the policy versions that sampled the episodes: the last update's, never older
            "versions": sorted({v for e in everyone for v in e.versions if v is not None}),
        }
        lag = getattr(self.source, "lag", None)
        if lag is not None:  # updates between the sampling policy and the trained one
            row["staleness"] = lag
        if config.backend != "transformers":  # writing and loading the new weights
            row["sync_seconds"] = self.sync_seconds
        if summary.parts:  # a rubric's parts, each one's mean over the iteration's episodes
            row["parts"] = summary.parts
        if config.agent is not None:  # what the agent did: calls, segments, failures
            row["calls_per_episode"] = float(np.mean([e.num_calls for e in episodes]))
            row["segments_per_episode"] = float(np.mean([e.num_segments for e in episodes]))
            row["agent_errors"] = sum(e.error is not None for e in episodes)
        if config.tools:
            row["tool_calls_per_episode"] = summary.tool_calls_per_episode
            row["failed_tool_share"] = summary.failed_tool_share
        if kl and snapshot is None:  # the asynchronous driver updates it per batch
            self.envs.update_kl_coef()
        row["seconds"] = time.perf_counter() - start
        return row

    def update(self, obs: dict[str, Any], responses: list[Any], advantages: torch.Tensor) -> float:
        """The iteration's update for single-turn ``responses`` to ``obs``'s prompts; the loss."""
        prompts = obs["tokens"]
        tokens = [np.concatenate([p, r.tokens]) for p, r in zip(prompts, responses, strict=True)]
        masks = [np.arange(len(t)) >= len(p) for t, p in zip(tokens, prompts, strict=True)]
        return self._optimize(tokens, masks, advantages)["loss"]

    def _optimize(
        self,
        tokens: list[Any],
        masks: list[Any],
        advantages: torch.Tensor,
        behaviour: Any = None,
        *,
        sampler_log_probs: Any = None,
    ) -> dict[str, Any]:
        # The update (llm_gym.train.update), then the sampler gets its weights: the loss and
        # the update's diagnostics.
        row = self.updater(
            tokens, masks, advantages, behaviour, sampler_log_probs=sampler_log_probs
        )
        self.version += self.config.update_epochs
        self._publish()
        return row

    def _sample(self, obs: dict[str, Any]) -> list[Any]:
        with self.sampling_lock:
            rows = obs.get("env_index")
            if rows is None or self.driver is not None:
                return self.policy(obs)
            # Each sub-env draws from its own stream, seeded by (seed, iteration, sub-env of the
            # whole run): a sample does not depend on which process drew it or beside which
            # others, so the run's samples do not depend on its world size. A server's request
            # gets its seed from that stream (a turn after another, the next one).
            first, seed = self.shards[0], self.config.seed
            generators = [
                self.streams.setdefault(i, stream_generators(seed, self._iteration, first + i))
                for i in rows
            ]  # fmt: skip
            if isinstance(self.policy, TransformersPolicy):
                return self.policy(obs, generators=generators)
            if isinstance(self.policy, SamplerPolicy):
                seeds = [int(torch.randint(2**31 - 1, (), generator=g)) for g in generators]
                return self.policy(obs, seeds=seeds)
            return self.policy(obs)

    def _publish(self, write: bool = True) -> None:
        with self.sampling_lock:
            self._publish_weights(write)

    def _publish_weights(self, write: bool) -> None:
        # The sampler samples with the weights of the last update from now on, and says so.
        if self.config.backend == "transformers":  # the model being trained, or its copy
            sampling = getattr(self.policy, "model", self.model)  # a test may swap in a function
            if sampling is not self.model:  # --async: the copy that samples
                sampling.load_state_dict(self.model.state_dict())
            if getattr(self.policy, "version", None) is not None:
                self.policy.version = self.version
            return
        folder, start, sampler = self.out / SERVED_FOLDER, time.perf_counter(), self.policy.sampler
        if write:  # across processes: gathered whole onto the first, which syncs the server
            weights = full_weights(self.model) if self.world > 1 else None
            if self.lead:
                path = write_weights(self.model, folder, weights).parent
                sampler.update_weights(path, version=self.version)
            barrier()  # no process samples before the server has the new weights
            self.sync_seconds = time.perf_counter() - start
        sampler.version = self.version

    def close(self) -> None:
        """Stop the envs, the asynchronous driver's workers and the sampler's server, if any
        (also done when ``train()`` ends)."""
        for part in (getattr(self, "source", None), getattr(self, "envs", None), self.driver):
            if part is not None:
                part.close()
        for part in (self.policy, getattr(self, "rubric", None)):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def evaluate(self, policy: Policy | None = None) -> dict[str, float]:
        """The greedy evaluation of the model on ``eval_episodes`` held-out items, played as
        the run plays its episodes (``evaluate_greedy``, or the agent's runs); ``policy``
        replaces the greedy policy of a task's envs."""
        return self._held_out(policy)

    def _greedy_evaluation(self, policy: Policy | None) -> dict[str, float]:
        config = self.config
        return evaluate_greedy(
            self.model, self.tokenizer, config, episodes=config.eval_episodes,
            seed=config.eval_seed, policy=policy, compute_dtype=self.compute_dtype,
        )  # fmt: skip

    def _agent_evaluation(self, policy: Policy | None) -> dict[str, float]:
        # The agent, its calls greedy unless it asks otherwise.
        config = self.config
        kwargs = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
        greedy = TransformersPolicy(
            self.model, self.tokenizer, input_mode="tokens", generate_kwargs=kwargs
        )
        with self._agent_episodes(greedy, 1, config.eval_seed) as agents:
            episodes = agents.episodes(config.eval_episodes, seed=config.eval_seed)
        return {
            "success": float(np.mean([e.success for e in episodes])),
            "reward": float(np.mean([e.reward for e in episodes])),
            "response_tokens": float(np.mean([e.num_tokens for e in episodes])),
            "agent_errors": sum(e.error is not None for e in episodes),
        }

    # -- checkpoints ------------------------------------------------------------------------

    def save(self, iteration: int) -> Path:
        """Checkpoint after ``iteration`` iterations (``llm_gym.train.checkpoints``): all that
        ``--resume`` needs to go on as if the run had not stopped."""
        base, schedule = self.envs.unwrapped, getattr(self.curriculum, "schedule", None)
        sources = getattr(base, "sources", ())
        state = {
            "iteration": iteration,
            "before": self.before,
            "kl_coef": None,  # below: the KL wrapper's, or the asynchronous driver's
            "level": getattr(base, "level", None),
            "drawn_level": self._drawn_level,  # the current questions' level
            "successes": None if schedule is None else schedule.successes,
            # every process's sub-envs': the whole run's, in order
            "positions": gather_objects([getattr(source, "position", None) for source in sources]),
        }
        snapshot = getattr(self.source, "snapshot", None)
        if snapshot is not None:  # as the last trained batch left them, not the next's
            state.update(level=snapshot["level"], successes=snapshot["successes"])
            state["kl_coef"] = snapshot["kl_coef"]
        elif self.config.kl_coef > 0:
            state["kl_coef"] = float(self.envs.coef)
        tensors = {
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        # The optimizer's state (twice the weights, in AdamW) where a run may resume exactly:
        # every checkpoint but the run's last by default. A checkpoint without it holds the
        # weights alone, in --save-dtype.
        keep_optimizer = self.config.save_optimizer
        if keep_optimizer is None:
            keep_optimizer = iteration < self.config.iterations
        dtype = None
        if not keep_optimizer and self.config.save_dtype is not None:
            dtype = DTYPES[self.config.save_dtype]  # storage, not compute: no speed to warn of
        return save_checkpoint(
            self.out, iteration, self.model, self.tokenizer, state, tensors,
            self.config.keep_checkpoints, dtype,
            optimizer=self.optimizer if keep_optimizer else None,
        )  # fmt: skip

    def _restore(self, state: dict[str, Any], tensors: dict[str, Any]) -> None:
        self.start, self.before = int(state["iteration"]), state["before"]
        if self.start >= self.config.iterations:
            raise ValueError(
                f"the run in {self.out} has done {self.start} iterations; pass --iterations "
                f"above {self.start} to train on"
            )
        if (self.checkpoint / OPTIMIZER_FOLDER).is_dir():  # resharded for this world size
            load_optimizer(self.model, self.optimizer, self.checkpoint / OPTIMIZER_FOLDER)
        elif "optimizer" in tensors:  # an llm_gym's before the optimizer went to DCP
            if self.world > 1:
                raise ValueError(
                    f"{self.checkpoint} holds its optimizer's state in the format of one "
                    "process (written by an earlier llm_gym): resume it in one process"
                )
            self.optimizer.load_state_dict(tensors["optimizer"])
        else:  # the run's last checkpoint, saved without it (--save-optimizer keeps it)
            print(
                f"llm-gym: note: {latest_checkpoint(self.out)} holds no optimizer state (a "
                "finished run's last checkpoint): AdamW starts afresh from its weights",
                file=sys.stderr,
            )
        if self.driver is not None:  # the shared curriculum and KL coefficient
            self.driver.restore(state)
        elif state["kl_coef"] is not None and self.config.kl_coef > 0:
            self.envs.kl_controller.coef = state["kl_coef"]
        if state["level"] is not None:
            self.envs.unwrapped.set_level(state["level"])
        if self.curriculum is not None:
            self.curriculum.schedule.level = state["level"]
            self.curriculum.schedule.successes = list(state["successes"] or [])
        torch.set_rng_state(tensors["torch_rng"])
        if tensors["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(tensors["cuda_rng"])

    def _resumed_obs(self, state: dict[str, Any]) -> dict[str, Any]:
        # A resumed run puts each sub-env back on the item it was at, drawn at the level it
        # was drawn at (the vector env's stream from the seed, then each source's position).
        config, base = self.config, self.envs.unwrapped
        self.envs.reset(seed=config.seed)
        sources = getattr(base, "sources", [])
        if not sources or None in state["positions"] or not hasattr(sources[0], "seek"):
            raise ValueError(
                f"{config.env}'s question stream cannot be resumed at its position (it needs "
                "the native vector env over a seeded source)"
            )
        if state["drawn_level"] is not None:
            base.set_level(state["drawn_level"])
        # The saved positions are the whole run's sub-envs': this process's part of them.
        first = self.shards[0] if self.world > 1 else 0
        positions = state["positions"][first : first + len(sources)]
        for source, position in zip(sources, positions, strict=True):
            source.seek(position - 1)  # the current question is drawn again
        obs, _ = self.envs.reset()
        if state["level"] is not None:
            base.set_level(state["level"])
        return obs


def _check_sharded(config: GRPOConfig, model: Any, env: Any) -> None:
    # What a run across processes needs, said before any process loads anything.
    world = max(launched_processes(), world_size())
    if config.groups % world:
        raise ValueError(
            f"--groups {config.groups} does not divide by the {world} processes of the run: "
            "each process samples whole groups (pass a multiple of the world size)"
        )
    given = [flag for name, flag in _SHARDED_CONFLICTS if getattr(config, name)]
    if config.backend != "transformers" and config.lora_rank:
        given.append(f"--lora-rank with --backend {config.backend}")
    if model is not None or env is not None:
        given.append("a model or env object")
    if given:
        raise ValueError(
            f"a run across {world} processes does not go with {', '.join(given)} yet: "
            "run it in one process"
        )


# Where the processes past the first write their files: nowhere (the first writes them).
_NOWHERE = type("_Nowhere", (), {"write": staticmethod(lambda line: None)})()


def _check_groups(episodes: list[Any], group_size: int) -> None:
    # A given env's groups must each play one item: GRPO compares a group's responses.
    for start in range(0, len(episodes), group_size):
        prompts = {json.dumps(e.prompt, sort_keys=True, default=str)
                   for e in episodes[start : start + group_size]}  # fmt: skip
        if len(prompts) > 1:
            raise ValueError(
                f"env's sub-envs {start}..{start + group_size - 1} (one group) played "
                f"{len(prompts)} different prompts; a group must play one item: make the "
                f"vector env with repeats={group_size}, group_repeats=True"
            )
