"""GRPO through llm_gym: what ``llm-gym train`` runs. ``GRPOTrainer`` builds a run's parts
(the processes, the model, the sampling policy and its weight sync, the ``Feed`` of episodes,
the update, the checkpoints) and its iteration reads top to bottom: episodes, advantages,
update, the weights published, the metrics row, the checkpoint (docs/training.md)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm.auto import tqdm

from llm_gym.envs import single_env
from llm_gym.episodes import EpisodeSource, iteration_metrics, rubric_part_names
from llm_gym.lm.lora import unwrapped
from llm_gym.policies import TransformersPolicy
from llm_gym.run.files import RunWriteError, told
from llm_gym.run.lock import FolderLock
from llm_gym.run.setup import compute_dtype, dtype_name, resolve_device, run_rubric
from llm_gym.run.signals import deferred, hold_signals, interruption
from llm_gym.run.trackers import Trackers
from llm_gym.train.advantages import overlong_tokens, segment_advantages
from llm_gym.train.checkpoints import Checkpointer, load_checkpoint
from llm_gym.train.config import GRPOConfig
from llm_gym.train.evaluation import evaluate_agent, evaluate_greedy
from llm_gym.train.generation import generation
from llm_gym.train.loss import trained_segments
from llm_gym.train.model import (
    CallersModel,
    check_given_model,
    frozen_reference,
    trained_model,
    training_precision,
)
from llm_gym.train.optim import adamw
from llm_gym.train.play import (
    Feed,
    build_feed,
    check_episode_groups,
    check_given_env,
    kl_scorer,
    run_envs,
)
from llm_gym.train.run_folder import (
    SUMMARY_FILE,
    TRAINING_PLOT_FILE,
    EpisodeLog,
    budget_spent,
    check_iterations_left,
    claim_out,
    earlier_rows,
    metrics_file,
    start_over,
    stop_notes,
    training_summary,
    write_summary,
)
from llm_gym.train.sharding import (
    Processes,
    barrier,
    gather_objects,
    peer_lost,
    run_world,
    shard_model,
)
from llm_gym.train.update import GRPOUpdate

if TYPE_CHECKING:
    from collections.abc import Callable

    import gymnasium as gym
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.policies.base import Policy

__all__ = ["GRPOTrainer"]


class GRPOTrainer:
    """A prepared run, as ``Rollout`` is one (every input error raised before generating);
    ``train()`` runs it, once. ``policy`` generates (``config.backend``), ``scorer`` (the
    model being trained) re-scores; ``version`` counts the optimizer's steps, and ``weights``
    moves each update's weights to the sampler (``llm_gym.samplers.weights``).

    As a library, as TRL's: ``model`` (a transformers model, or a peft one whose adapters
    train) and its ``tokenizer`` train in place of ``config.model``, on their own device and
    dtype; ``env`` is an env id (played with ``config``'s env args), a Gymnasium vector env of
    ``groups × group_size`` sub-envs in tokens mode observing ``("tokens", "history",
    "policy_mask")`` whose groups of ``group_size`` consecutive sub-envs play one item (the
    native vector env's ``repeats=group_size, group_repeats=True``), or a callable making one.
    """

    def __init__(
        self,
        config: GRPOConfig,
        model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        env: str | gym.vector.VectorEnv | Callable[[], gym.vector.VectorEnv] | None = None,
    ) -> None:
        if isinstance(env, str):
            config, env = dataclasses.replace(config, env=env), None
        world = run_world()
        check_given_model(config, model, tokenizer, world)
        check_given_env(config, env, world)
        config.check_world(world)
        self.config, self.given_model, self.given_env = config, (model, tokenizer), env
        # A caller's model gets back what the run switches on it when the run ends.
        self.callers = CallersModel.of(model) if model is not None else None
        self.out = Path(config.out)
        # Under torchrun: one process of several, each on its own device (docs/many-gpus.md).
        device = model.device if model is not None else resolve_device(config.device)
        self.processes = Processes.join(device, config.groups * config.group_size)
        self.lead = self.processes.lead
        # Before the folder is looked at: one run at a time in it, until train() ends (the
        # first process holds the lock for all of them).
        self.lock = FolderLock(self.out) if self.lead else None
        self.finished = False  # train() has run: its folder and processes are let go
        try:
            self._prepare(config, model, tokenizer)
        except BaseException:
            self._leave()
            raise

    def _leave(self) -> None:
        # The folder let go, the process group left if this trainer joined it, the caller's
        # model switched back.
        if self.lock is not None:
            self.lock.release()
        self.processes.leave()
        if self.callers is not None:
            self.callers.restore()

    def _prepare(self, config: GRPOConfig, given: PreTrainedModel | None, tokenizer: Any) -> None:
        # Where and in what the model trains, resolved once: every part gets these.
        self.device, self.precision, self.dtype = training_precision(config, given, self.processes)
        # What sampling, scoring and the reference compute in: --dtype, by autocast over
        # float32 weights (as the update does under bf16-mixed); weights below float32, theirs.
        self.compute_dtype = compute_dtype(config, self.device, self.dtype)
        checkpoint = claim_out(config)  # on --resume the newest one, checked whole
        barrier()  # every process has looked before the first clears the folder
        state, tensors = load_checkpoint(checkpoint) if checkpoint else (None, None)
        self.first_iteration = int(state["iteration"]) if state else 0
        self.before = state["before"] if state else None
        check_iterations_left(config, self.first_iteration)
        torch.manual_seed(config.seed)
        self.model, self.tokenizer = trained_model(
            config, given, tokenizer, checkpoint, self.device, self.dtype
        )
        self.scorer = TransformersPolicy(  # the model being trained
            self.model, self.tokenizer, input_mode="tokens", generate=False,
            compute_dtype=self.compute_dtype,
        )  # fmt: skip
        self.version = self.first_iteration * config.update_epochs
        self.feed = self.envs = self.rubric = None  # what close() stops, once made
        run = generation(config, self.model, self.tokenizer, self.processes, self.out,
                       self.compute_dtype)  # fmt: skip
        self.policy, self.weight_sync, self.server = run.policy, run.weight_sync, run.server
        self.generators = run.generators
        if self.processes.world > 1:  # each process holds a slice of every weight (FSDP2)
            shard_model(self.model)
        self.sampling_lock = threading.Lock()  # no update lands in the middle of a batch
        try:
            self._set_up(config, state, tensors, checkpoint)
        except BaseException:  # no server is left running after a setup error
            self.close()
            raise

    def _set_up(
        self, config: GRPOConfig, state: Any, tensors: Any, checkpoint: Path | None
    ) -> None:
        self._publish(write=False)
        # The judges of --rubric, if any: their parts score each step's answers (a group
        # judge each group's), not the evaluation, which reads the task's success.
        self.rubric = run_rubric(config, self.tokenizer, config.group_size, device=self.device,
                                 dtype=self.compute_dtype)  # fmt: skip
        envs = self.envs = run_envs(config, self.tokenizer, self.processes, self.rubric,
                                    self.given_env)  # fmt: skip
        self.part_names = rubric_part_names(envs)
        # What the env plays, for the summary: its answer format and the tasks it names.
        self.answer_format = getattr(single_env(envs), "answer_format", None)
        self.task_names: set[str] = set()
        self.reference = frozen_reference(
            config, self.model, self.scorer, given=self.given_model[0] is not None,
            weights_dtype=self.dtype, device=self.device,
        )  # fmt: skip
        played = build_feed(
            config, envs, self.tokenizer, self.processes, self._sample, self.rubric,
            reference=self.reference,
            gen=kl_scorer(config, self.scorer, self.compute_dtype), first=self.first_iteration,
            sampler=self.policy if self.server is None else self.server.sampler,
            weights_dtype=self.dtype,
        )  # fmt: skip
        self.envs, self.feed, self.multi_turn = played.envs, played.feed, played.multi_turn
        single_turn = not self.multi_turn and config.agent is None
        self.overlong = overlong_tokens(
            config.overlong_cache, config.max_response_tokens, single_turn
        )
        trained = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: adapters
        self.optimizer = adamw(trained, config.learning_rate)
        self.updater = GRPOUpdate(
            self.model, self.optimizer, config, self.scorer.pad_token_id,
            reference=self.reference, done=self.version,
        )  # fmt: skip
        self.checkpoints = Checkpointer(config, self.model, self.tokenizer, self.optimizer)
        if state:
            self.checkpoints.restore(checkpoint, tensors)
            self.feed.load_state_dict(state)
            self.updater.load_state_dict(state)
        if not state and self.lead:  # set up without error: only now does an earlier run go
            start_over(config)
        on = config.log_episodes and self.lead
        self.episode_log = EpisodeLog(self.out, self.first_iteration, on)
        barrier()

    @property
    def source(self) -> EpisodeSource:
        """Where the episodes come from; any ``EpisodeSource`` may be set in its place."""
        return self.feed.source

    @source.setter
    def source(self, source: EpisodeSource) -> None:
        self.feed = Feed(source, self.processes, stream=self.feed.stream)

    # -- the loop ---------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Run the iterations; write metrics, plot, checkpoints and ``summary.json``. Ctrl-C
        or a file the disk cannot take (``RunWriteError``, one line naming it) stops the run
        with its summary marked interrupted; the run folder is let go at the end."""
        if self.finished:
            raise RuntimeError(
                "train() has run: a further run goes on from its folder, "
                f"GRPOTrainer(resumed_config({str(self.out)!r}, iterations=N)).train()"
            )
        try:
            return self._train()
        finally:
            self.finished = True
            self._leave()

    def _train(self) -> dict[str, Any]:
        config, started = self.config, time.perf_counter()
        rows = earlier_rows(self.out, self.first_iteration)
        bar = tqdm(
            total=config.iterations, initial=self.first_iteration, unit="it",
            disable=not (config.progress and self.lead), dynamic_ncols=True,
        )  # fmt: skip
        # The first process reports to the trackers, as it writes the files.
        trackers = Trackers.none()
        try:
            if self.before is None and config.eval_episodes:
                self.before = self.evaluate()
            if self.lead:
                trackers = Trackers(config.report_to, self.out, asdict(config),
                                    self.first_iteration, hold=True)  # fmt: skip
            with metrics_file(self.out, rows, self.lead) as f:
                for iteration in range(self.first_iteration, config.iterations):
                    row = self.iteration(iteration)
                    rows.append(row)
                    f.write(json.dumps(row))  # a line per iteration, readable after Ctrl-C
                    trackers.log(row, iteration)
                    bar.update(1)
                    bar.set_postfix(reward=f"{row['reward']:.3f}", success=f"{row['success']:.2f}")
                    done, spent = iteration + 1, budget_spent(rows, config.max_sampled_tokens)
                    if done % config.save_every == 0 or done == config.iterations or spent:
                        self.save(done)
                        trackers.commit(done)  # the rows it holds, once each, whatever follows
                    self.feed.release(iteration)  # after the save: its RNG state is this one's
                    if spent:
                        break
        except BaseException as error:
            stop = self._stop(error, trackers, rows, started)
            if stop is None or stop is error:
                raise
            raise stop from error
        finally:
            bar.close()
            self.close()
        after = None
        try:
            after = self.evaluate() if config.eval_episodes else None
            summary = self.write(rows, after, time.perf_counter() - started)
        except BaseException as error:
            stop = self._stop(error, trackers, rows, started, after)
            if stop is None or stop is error:
                raise
            raise stop from error
        with deferred():  # the summary says finished: a signal waits for the trackers to say so
            trackers.finish(summary, len(rows), self.out / TRAINING_PLOT_FILE)
        return summary

    def _stop(
        self,
        error: BaseException,
        trackers: Trackers,
        rows: list[dict[str, Any]],
        started: float,
        after: dict[str, float] | None = None,
    ) -> BaseException | None:
        # What stops a run with its summary marked interrupted, and what it raises then (None:
        # a bug, whose traceback stays as it is): Ctrl-C or a signal (however a library passed
        # it on), a file the disk cannot take, across processes another process's death.
        stop = interruption(error)
        lost = self.processes.world > 1 and peer_lost(error)
        if stop is None and (isinstance(error, RunWriteError) or lost):
            stop = error
        if stop is not None:  # the summary, marked interrupted, as far as the disk takes it
            hold_signals()  # a second Ctrl-C, or the launcher's SIGTERM, waits for the summary
            seconds = time.perf_counter() - started
            summary = self.write(rows, after, seconds, interrupted=True, notes=stop_notes(stop))
            if isinstance(stop, RunWriteError):  # its one line says if the summary was written
                stop.strerror = f"{stop.strerror}; {told(self.out / SUMMARY_FILE, self.unwritten)}"
            trackers.finish(summary, len(rows))
        return stop

    def iteration(self, iteration: int) -> dict[str, Any]:
        """Ask the feed for an episode of every sub-env (``groups × group_size``), score
        them, update on each one's segments: the metrics row."""
        config, began = self.config, time.perf_counter()
        if self.generators is not None:
            self.generators.seek(iteration)
        episodes = self.feed.episodes(self.processes.num_envs)
        if self.given_env is not None:
            check_episode_groups([e.prompt for e in episodes], config.group_episodes)
        # This process trains on its own groups' episodes; the row tells of every process's.
        everyone = gather_objects(episodes)
        self.episode_log.write(iteration, everyone)  # --log-episodes
        self.task_names.update(
            str(e.info["task"]) for e in everyone if e.info.get("task") is not None
        )
        # Each segment (an agent's episode has several) trains with its episode's advantage,
        # or each turn's tokens with their turn's; asynchronous batches by their sampled
        # log-probs, which --tis-cap corrects toward.
        cut_at = config.max_new_tokens if config.mask_truncated else None
        segments, masks, index = trained_segments(episodes, cut_at, self.tokenizer.eos_token_id)
        update: dict[str, Any] = {"loss": 0.0}
        if segments:
            update = self.update(
                [s.ids for s in segments], masks, segment_advantages(
                    everyone, segments, index, estimator=config.advantage,
                    group_size=config.group_episodes, gamma=config.gamma,
                    scale=config.scale_rewards, max_length=config.max_response_tokens,
                    overlong=self.overlong, mine=self.processes.part(len(episodes)),
                ),
                [s.log_probs for s in segments],
            )  # fmt: skip
        row = self._row(iteration, everyone, update, began)
        self.feed.advance_kl()  # the next batch's coefficient, once this one's is reported
        return row

    def update(
        self,
        sequences: list[np.ndarray],
        masks: list[np.ndarray],
        advantages: list[np.ndarray],
        sampled_log_probs: list[np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """One update (``llm_gym.train.update``) on token ``sequences`` whose ``masks`` mark
        the policy's tokens, each token weighed by its advantage (``per_token_advantages``
        spreads one a sequence); ``sampled_log_probs``: the log-probs its policy tokens were
        sampled with (an asynchronous ratio's, ``tis_cap``'s). Then the sampler gets the new
        weights. The loss and the update's diagnostics."""
        row = self.updater(sequences, masks, advantages, sampled_log_probs)
        self.version += self.config.update_epochs
        self._publish()
        return row

    def _row(
        self, iteration: int, everyone: list[Any], update: dict[str, Any], began: float
    ) -> dict[str, Any]:
        # The iteration's metrics row (reading the feed's state, changing none).
        config, report = self.config, self.feed.report()
        # Every process's, so that a budget stops them all at one iteration.
        report["sampled_tokens"] = sum(gather_objects([report["sampled_tokens"]]))
        level, kl_coef = report.pop("level"), report.pop("kl_coef")  # the rest: as they are
        kl_coef = config.kl_coef if kl_coef is None else kl_coef
        row = iteration_metrics(
            everyone, self.feed.seconds, self.part_names, iteration=iteration, update=update,
            level=level, kl_coef=kl_coef if config.kl_coef > 0 else None,
            tools=bool(config.tools), agent=config.agent is not None,
            group_size=config.group_episodes, max_new_tokens=config.max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id, sync_seconds=self.weight_sync.seconds,
            **report,
        )  # fmt: skip
        return {**row, "seconds": time.perf_counter() - began}

    def _sample(self, obs: dict[str, Any]) -> list[Any]:
        with self.sampling_lock:
            return self.policy(obs)

    def _publish(self, write: bool = True) -> None:
        # The sampler samples with the weights of the last update from now on, and says so.
        with self.sampling_lock:
            self.weight_sync.publish(self.version, write=write)

    def close(self) -> None:
        """Stop the envs, the asynchronous driver's workers and the sampler's server, if any
        (also done when ``train()`` ends)."""
        for part in (self.feed, self.envs, self.server, self.rubric):
            if part is not None:
                part.close()

    def evaluate(self, policy: Policy | None = None) -> dict[str, float]:
        """The greedy evaluation of the model on ``eval_episodes`` held-out items, played as
        the run plays its episodes (``evaluate_greedy``, or the agent's runs); ``policy``
        replaces the greedy policy of a task's envs."""
        config = self.config
        if config.agent is not None:
            return evaluate_agent(self.model, self.tokenizer, config)
        return evaluate_greedy(
            self.model, self.tokenizer, config, episodes=config.eval_episodes,
            seed=config.eval_seed, policy=policy, compute_dtype=self.compute_dtype,
        )  # fmt: skip

    def save(self, iteration: int) -> Path:
        """Checkpoint after ``iteration`` iterations (``llm_gym.train.checkpoints``): the
        model, the optimizer, the RNG, the feed's and the update's state, all that ``--resume``
        needs to go on as if the run had not stopped."""
        state = {"iteration": iteration, "before": self.before, **self.feed.state_dict()}
        return self.checkpoints.save(iteration, {**state, **self.updater.state_dict()})

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
        ``interrupted`` run writes what the disk takes (``unwritten``: the others' errors,
        on every process; only the first writes)."""
        config, model = self.config, unwrapped(self.model)
        summary = training_summary(
            config, rows, before=self.before, after=after, seconds=seconds,
            interrupted=interrupted, answer_format=self.answer_format, tasks=self.task_names,
            # A model object's own name, not config.model's.
            model=getattr(model.config, "_name_or_path", "") or type(model).__name__
            if self.given_model[0] is not None else None,
            device=self.device, precision=self.precision, dtype=dtype_name(self.compute_dtype),
            packing=self.updater.packing, world=self.processes.world,
            restarts=self.feed.restarts if config.ray_address else None,
            judges=self.rubric.stats() if self.rubric.judges else None,
        )  # fmt: skip
        self.unwritten = write_summary(self.out, summary, rows, list(notes)) if self.lead else []
        return summary
