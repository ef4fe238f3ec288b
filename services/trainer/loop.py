"""The training loop: groups from the stream → one optimizer step → checkpoint → ack → publish weights.

Order of effects per step (what makes a crash lose nothing and count nothing twice):
  1. train on the step's groups (in memory only);
  2. every ``checkpoint_every`` steps: write a durable checkpoint whose ``covered`` lists the stream entries
     trained since the last one, THEN acknowledge those entries;
  3. every ``publish_every`` steps: publish the weights as the next version (the version number is fixed in
     the checkpoint before it is written, so a resumed run knows which version its weights are).
A step whose groups leave nothing to train (every sample stale or untrained, no demonstrations) is not a
step: no optimizer step, no new version. Its groups still count as taken: they are acked with the next
checkpoint, and the admission mark tells the rollout to start new ones, so a stale backlog drains.
A crash before 2 loses the step's effect and its groups are still pending: they are trained again. A crash
between the save and the ack leaves pending entries the checkpoint covers: they are acked, not retrained.

Rank 0 talks to Redis (and, for the optional sync check, to the inference server) and broadcasts each
step's groups to the other ranks; the ranks agree on when to stop, and a lost rank ends the job within
``collective_timeout_s`` (``services.trainer.batches``). The trainer never loads weights into a server: it
writes and announces them (``services.trainer.publish``), the rollout loads them.
Their outages are waited out (``shared.retry``: retries with backoff, logged); only one that outlasts
``dependency_timeout_s`` ends the run. Stopping needs neither: the checkpoint is written first, the ack is
tried briefly and otherwise left to the next start (the checkpoint's ``covered`` list), and a publish that
cannot finish is redone by the next start's ``_resume_version``.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import torch

from services.trainer import checkpoint, faults
from services.trainer.batches import GroupReader, Ranks, group_check, set_collective_timeout, teaching, to_sequences
from services.trainer.config import TrainerSettings
from services.trainer.engine import build_engine, init_distributed, load_reference, param_dtype
from services.trainer.observe import Observer
from services.trainer.publish import Publisher
from services.trainer.rl.advantages import trajectory_advantages
from services.trainer.rl.red import REDState, REDWeights, planner_accuracy, red_weights
from services.trainer.sft import SftData
from services.trainer.step import Objective, StepInput, StepResult, train_step
from services.trainer.step_record import Rollouts, step_record
from services.trainer.sync_check import max_abs_diff, mismatch_warning, probe_prompt, server_sample, wait_served
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.retry import DependencyDown, Patience, Patient
from shared.stream import Entry, StreamQueue, taken

log = get_logger(__name__)


class Trainer:
    """Owns the engine, the stream consumer, the publisher and the observer of one training run."""

    def __init__(self, settings: TrainerSettings, registry=None, stop: threading.Event | None = None) -> None:
        """``stop`` (set on SIGTERM) also cuts short any wait for a dependency, start-up included."""
        self.s = settings
        self.registry = registry
        self.stop = stop or threading.Event()
        self.patience = Patience(settings.dependency_timeout_s, self.stop)
        self.unacked: list[str] = []
        self.last_publish = None
        self.sync_diff: float | None = None
        self.sync_probe: list[int] | None = None  # the sync check's prompt, made at its first use
        self.steps_without_rl = 0  # consecutive steps (or skipped steps) in which no RL sample was trained
        self.ready = threading.Event()

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        s = self.s
        # Start-up may wait for Redis or the server on rank 0 (dependency_timeout_s): the others wait as long.
        startup_s = max(s.collective_timeout_s, s.dependency_timeout_s)
        self.device = init_distributed(startup_s)
        random.seed(s.seed)
        np.random.seed(s.seed)
        torch.manual_seed(s.seed)
        self.eng = build_engine(s, self.device)
        self.rank0 = self.eng.rank == 0
        self.ranks = Ranks(self.eng.rank, self.eng.world)
        if self.eng.world > 1:
            set_collective_timeout(startup_s)  # DeepSpeed's own groups too (they got the backend's default)
        self.ref = load_reference(s, self.device, param_dtype(s, self.device))
        self.objective = Objective(s)
        self.sft = SftData(s.sft_data, seed=s.seed) if s.sft_data and s.red.mode != "grpo_only" else None
        if s.sft_only and self.sft is None:
            raise ValueError("sft_only needs demonstrations: set sft_data")
        if self.sft is not None and self.rank0:
            # An SFT-only run is the stack's warm start (max_steps = warm_start_steps): say what it shows.
            self.sft.log_coverage(s.sft_batch, s.max_steps if s.sft_only else None)
        self.redis = self.queue = self.reader = None
        client = None
        if self.rank0:
            import redis

            from shared.inference_sync import SyncInferenceClient
            from shared.retry import RetryPolicy

            # redis-py's 5 s socket timeout, on top of a blocking read's own wait (else every long read times out).
            raw = redis.Redis.from_url(s.redis_url, socket_timeout=s.read_block_ms / 1000 + 5)
            self.patience.call("redis", raw.ping)  # start-up waits for Redis (still starting, a DNS hiccup)
            # Idempotent calls wait out outages in the client; the stream read needs more (see GroupReader).
            self.redis = Patient(raw, self.patience, "redis")
            self.queue = StreamQueue(raw, s.stream, TrajectoryGroup, group=s.consumer_group, consumer=s.consumer)
            # The sync check's only: the trainer loads no weights (the rollout does). One try per call: Patience
            # retries outages (one warning each); the client's own retries would only add a warning per try.
            client = (
                Patient(
                    SyncInferenceClient(s.inference_url, retry=RetryPolicy(attempts=1)),
                    self.patience,
                    "inference server",
                )
                if s.inference_url and s.sync.check
                else None
            )
            self.observer = Observer(
                self.registry, s.log_dir, s.plot_every, s.wandb.project, s.wandb.mode, config=s.model_dump(mode="json")
            )
        self.client = client
        self.publisher = Publisher(
            self.eng.engine,
            s.weights_dir,
            s.finetune,
            self.redis,
            s.weights_stream,
            s.version_key,
            s.keep_weights,
            s.served_model_name,
            admission_key=s.admission_key,
        )
        self.state, self.red = checkpoint.TrainState(), REDState()
        checkpoint.check_shared(s.checkpoint_dir, self.ranks)
        # Rank 0 picks the checkpoint: every rank must resume from the same one.
        path = self.ranks.broadcast(checkpoint.latest(s.checkpoint_dir) if s.resume == "auto" else None)
        if path is not None:
            self.state = checkpoint.load(self.eng.engine, path, self.eng.rank, self.eng.world)
            self.red = REDState.from_dict(self.state.red) if self.state.red else REDState()
        if self.rank0:
            vocab = self.eng.lm.get_input_embeddings().num_embeddings
            self.reader = GroupReader(
                self.queue, self.state.covered, s.read_block_ms, check=group_check(vocab), patience=self.patience
            )
        self.saved_step = self.state.step
        self._resume_version()
        if self.eng.world > 1:
            # Start-up waited longer (see engine.init_distributed); from here on a silent rank is a lost one.
            set_collective_timeout(s.collective_timeout_s)
        self.ready.set()

    def _resume_version(self) -> None:
        """Make Redis announce exactly the weights we hold, under a version that only grows."""
        live, highest = self.ranks.broadcast(
            (self.publisher.live_version(), self.publisher.highest_version()) if self.rank0 else None
        )
        if highest is not None and highest > self.state.version:
            # Versions were published (or reserved for a publish cut short) from steps whose checkpoint was
            # lost: ours are older, so they get a new number rather than one the rollouts or the servers saw
            # with other weights.
            self.state.version = highest + 1
        # Equal versions: the folder is written again (it may have been cut short), not re-announced; the
        # rollout's fleet watch loads it into a server that lost it. Either way the admission mark is renewed:
        # it counts the groups taken, which a restart does not change.
        self._publish(announce=live != self.state.version)

    # ---------------------------------------------------------------- loop
    def run(self, stop: threading.Event | None = None) -> checkpoint.TrainState:
        if stop is not None:
            self.stop = self.patience.stop = stop
        stop, s = self.stop, self.s
        while s.max_steps == 0 or self.state.step < s.max_steps:
            if self.ranks.any(stop.is_set()):
                break
            if s.sft_only:
                self._train_sft_only()
                continue
            read = (lambda: self.reader.collect(s.groups_per_step, stop)) if self.rank0 else None
            entries = self.ranks.gather_work(read, stop)
            if len(entries) < s.groups_per_step:
                break  # stopping
            try:
                self._train_on(entries)
            except DependencyDown:
                if not stop.is_set():
                    raise
                # Only after the step's state is complete does a step talk to Redis or the server (mark,
                # publish, stats): the checkpoint below keeps the step, the next start publishes it.
                log.warning(
                    "stopping while a dependency is down: the step's publishing is left to the next start",
                    extra={"step": self.state.step, "version": self.state.version},
                )
                continue  # every rank leaves the loop at its next check, which sees rank 0's stop
        if self.unacked or (s.sft_only and self.state.step != self.saved_step):
            self._checkpoint()  # stopping between checkpoints: make the trained steps durable (then ack them)
        if self.rank0:
            self.observer.close()
        return self.state

    def _train_on(self, entries: list[Entry[TrajectoryGroup]]) -> None:
        s, st = self.s, self.state
        start = time.perf_counter()
        groups = [e.message for e in entries]
        adv, adv_result = trajectory_advantages(
            groups, mode=s.role_baseline, estimator=s.advantage, threshold=s.rft_threshold
        )
        seqs, dropped = to_sequences(groups, adv, st.version, s.max_staleness, s.stale_policy)
        skipped, norm = 0, None
        if s.zero_advantage != "train" and s.kl_coef == 0 and s.entropy_coef == 0:
            everything = seqs
            seqs, skipped = teaching(seqs, keep_one=s.zero_advantage == "skip")
            if s.zero_advantage == "skip":
                norm = everything  # normalised as if all were trained: the gradient is the whole batch's
        rows = [smp for g in groups for smp in g.samples]
        red = None
        if self.sft:  # RED weighs the demonstrations by the planner's accuracy: without them, nothing to weigh
            accuracy = planner_accuracy(
                [smp.reward_components.get(s.red.accuracy_key, smp.reward) for smp in rows],
                [smp.role for smp in rows],
                s.red.accuracy_threshold,
            )
            red = red_weights(self.red, s.red, accuracy, s.sft_coef)
        sft_weight = red.sft_loss_weight if red is not None else 0.0
        sft_seqs, cursor = [], st.sft_cursor
        if sft_weight > 0:
            sft_seqs, cursor = self.sft.take(st.sft_cursor, s.sft_batch)
        result = train_step(
            self.eng,
            StepInput(seqs, sft_seqs, sft_weight, rl_norm=norm),
            self.objective,
            self.ref,
            s.micro_batch_tokens,
            s.packing,
            s.share_prompts,
        )
        st.dropped_stale += dropped
        st.record_groups([g.group_id for g in groups])
        self.unacked += [e.id for e in entries]
        self._watch_rl(result, dropped, sum(1 for smp in rows if smp.num_trained_tokens), skipped)
        if not result.trained:
            # Nothing trained: the weights are unchanged, so neither the step count nor the version moves.
            # The groups are taken all the same (acked with the next checkpoint); the mark lets new ones start.
            if self.rank0:
                self.publisher.mark(st.version, self._consumed())
            return
        self.red.observe(result.rl_entropy(), result.sft_entropy(), s.red.ema_decay)
        if not self._finish_step(result, cursor) and self.rank0:
            self.publisher.mark(st.version, self._consumed())
        if self.rank0:
            seconds = time.perf_counter() - start
            queue = self.patience.call("redis", self.queue.stats)
            rollouts = Rollouts(groups, adv_result.num_zero_variance, dropped, skipped, queue)
            self._record(result, seconds, red=red, rollouts=rollouts)

    def _finish_step(self, result: StepResult, cursor: int) -> bool:
        """Count a trained step, then checkpoint and publish on their schedules; returns whether it published."""
        s, st = self.s, self.state
        st.step += 1
        st.tokens += int(result.metrics.tokens)
        st.sft_cursor = cursor
        st.red = self.red.to_dict()
        publish = st.step % s.publish_every == 0
        if publish:
            st.version += 1
        if st.step % s.checkpoint_every == 0:
            self._checkpoint()
        if publish:
            self._publish(announce=True)
        return publish

    def _train_sft_only(self) -> None:
        """One step on the next ``sft_batch`` demonstrations alone (``sft_only``): no groups are read."""
        s, st = self.s, self.state
        start = time.perf_counter()
        sft_seqs, cursor = self.sft.take(st.sft_cursor, s.sft_batch)
        result = train_step(
            self.eng, StepInput([], sft_seqs, s.sft_coef), self.objective, self.ref, s.micro_batch_tokens, s.packing
        )
        self.red.observe(None, result.sft_entropy(), s.red.ema_decay)
        self._finish_step(result, cursor)
        if self.rank0:
            self._record(result, time.perf_counter() - start)

    def _watch_rl(self, result: StepResult, dropped: int, trainable: int, skipped: int = 0) -> None:
        """Make training on nothing loud: a warning per step without RL tokens, counters for the dashboard.
        A step whose RL samples all had advantage 0 is not that: they were fresh, they just taught nothing."""
        if not result.rl_tokens and skipped and not dropped:
            log.info(
                "no RL sample had an advantage in this step: every group's rewards were equal",
                extra={"version": self.state.version, "skipped_zero_advantage": skipped},
            )
            return
        if result.rl_tokens:
            if self.steps_without_rl:
                log.info("RL samples trained again", extra={"after_steps": self.steps_without_rl})
            self.steps_without_rl = 0
            return
        self.steps_without_rl += 1
        if self.rank0:
            self.observer.without_rl(trained=result.trained)
            log.warning(
                "no RL sample trained in this step" + (": all were stale" if dropped else ""),
                extra={
                    "version": self.state.version,
                    "trainable_samples": trainable,
                    "dropped_stale": dropped,
                    "skipped_zero_advantage": skipped,
                    "sft_tokens": int(result.sft_trained_tokens),
                    "steps_in_a_row": self.steps_without_rl,
                },
            )

    def _consumed(self) -> int:
        """Groups the rollout published that this trainer has taken (rank 0): the admission mark's count
        (``shared.stream.taken``), the backlog a restart retrains not included."""
        s = self.s
        return taken(self.redis, s.stream, s.consumer_group, s.published_key, len(self.reader.backlog))

    def _checkpoint(self) -> None:
        self.state.covered = list(self.unacked)
        self.saved_step = self.state.step
        checkpoint.save(
            self.eng.engine, self.state, self.s.checkpoint_dir, self.s.keep_checkpoints, self.eng.rank, self.eng.world
        )
        if faults.ARMED:
            faults.point("before_ack")
        if self.rank0 and self.unacked:
            try:
                self.patience.call("redis", self.queue.ack, *self.unacked)
            except DependencyDown:
                if not self.stop.is_set():
                    raise
                # Safe to skip: the checkpoint just written lists them as covered, and the next start acks them.
                log.warning(
                    "stopping with Redis down: groups not acknowledged, the next start acknowledges them",
                    extra={"count": len(self.unacked)},
                )
        self.unacked = []
        if faults.ARMED:
            faults.point("before_publish")

    def _publish(self, announce: bool) -> None:
        consumed = self._consumed() if self.rank0 else None
        self.last_publish = self.publisher.publish(
            self.state.version, self.state.step, announce=announce, consumed=consumed
        )
        if self.rank0 and self.last_publish is not None:
            self.observer.published(self.state.version, self.last_publish.publish_seconds)
        if self.s.sync.check and self.s.inference_url:
            self.sync_diff = self._sync_check()

    def _sync_check(self) -> float | None:
        """The sync check of the version just published, once the rollout has loaded it into the server;
        None (skipped, with a warning) when it did not within ``[trainer.sync] wait_s``."""
        sync = self.s.sync
        if self.sync_probe is None:
            self.sync_probe = probe_prompt(self.s.model, sync.prompt)
        prompt = self.sync_probe
        sample = None
        if self.rank0 and wait_served(self.client, self.last_publish, sync.wait_s):
            sample = server_sample(self.client, self.last_publish.model_name, prompt, sync.tokens)
        elif self.rank0:
            log.warning(
                "sync check skipped: the inference server did not serve the published version in time "
                "(the rollout loads it; is one running?)",
                extra={"version": self.state.version, "waited_s": sync.wait_s},
            )
        sample = self.ranks.broadcast(sample)
        if sample is None:
            return None
        tokens, server_logprobs = sample
        diff = max_abs_diff(self.eng, prompt, tokens, server_logprobs)
        log.info("sync check", extra={"version": self.state.version, "max_abs_diff": diff})
        if self.rank0 and (warning := mismatch_warning(diff, sync.tolerance, self.last_publish.model_name)):
            log.warning(warning, extra={"version": self.state.version})
        return diff

    def _record(
        self, result: StepResult, seconds: float, red: REDWeights | None = None, rollouts: Rollouts | None = None
    ) -> None:
        """Log the step ``self.state`` has just counted (rank 0), with its publish if it published one."""
        published = self.last_publish is not None and self.last_publish.step == self.state.step
        publish = self.last_publish if published else None
        rec = step_record(
            result, self.state, seconds, red=red, rollouts=rollouts, publish=publish, sync_diff=self.sync_diff
        )
        self.observer.record(rec)
