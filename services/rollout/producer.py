"""The producer loop: admit → take a prompt → run ``n`` episodes concurrently → score → publish one group.

A group is published only when all its ``n`` episodes finished (GRPO needs the whole group). When any
episode fails after the clients' bounded retries, the group is recorded as failed with its cause, its
admission slot is freed and its prompt goes back to the queue. If the cause is a dependency outage (LLM,
retriever, searcher or Redis down, timing out or answering 502/503/504/429) the prompt is not to blame: it is not
counted, and admission pauses until the dependency answers again (``services.rollout.admission``). Otherwise
the failure counts against the prompt, which is dropped, with an error log, after ``max_prompt_failures``
failures without a success in between. The loop itself never stops on an episode error.

With a fleet of policy servers (``services.rollout.fleet``) each episode runs on one server, and one
whose server fails mid-episode starts over on another before its group counts as failed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from dataclasses import dataclass

import redis

from agents.core.episode import AgentContext, Episode
from agents.datasets import PromptRecord
from agents.question_kinds import question_kind
from services.rollout.admission import Admission, DependencyGate, http_answers, outage_dependency
from services.rollout.config import RolloutSettings
from services.rollout.embedding import Embedder
from services.rollout.fleet import FleetRunner
from services.rollout.metrics import RolloutMetrics
from services.rollout.scoring import Scorer, build_group
from shared.log import get_logger
from shared.protocol import TrajectoryGroup
from shared.protocol.trajectory import has_signal
from shared.retry import Failure, classify
from shared.stream import StreamQueue, group_staleness

log = get_logger(__name__)


def group_has_signal(group: TrajectoryGroup) -> bool:
    """Whether the trainer would learn from ``group``. The rollout does not know the trainer's ``role_baseline``
    (inherit / per_role / pooled), so it asks whether ANY of them gives some sample a nonzero advantage
    (``has_signal`` with no mode): the conservative choice, which never drops a group the trainer would learn
    from under the mode it runs (a per-role trainer learns from a group whose planners tie but whose executors
    do not; a pooled one from planners all 1 and executors all 0). It drops exactly the groups whose rewards
    are all equal, which no mode learns from."""
    return has_signal([s.reward for s in group.samples], [s.role for s in group.samples])


class PromptQueue:
    """Prompts in a seeded shuffled order, epoch after epoch; failed prompts are re-queued first.

    ``choice_weight`` < 1 keeps each epoch every open question but each choice question (``agents.question_kinds``)
    only with that probability, drawn by a generator of its own (seeded from ``seed``: runs reproduce, and the
    shuffle's draws are those of ``choice_weight`` = 1, whose order is the same as without it)."""

    def __init__(
        self, records: list[PromptRecord], *, seed: int = 0, epochs: int | None = None, choice_weight: float = 1.0
    ) -> None:
        if not records:
            raise ValueError("the dataset has no prompts")
        if not 0 <= choice_weight <= 1:
            raise ValueError(f"choice_weight must be within [0, 1], not {choice_weight}")
        self.records, self.rng, self.epochs = list(records), random.Random(seed), epochs
        self.choice_weight, self.choice_rng = choice_weight, random.Random(f"choice_weight:{seed}")
        self.choices = {r.prompt_id for r in self.records if question_kind(r.question, r.golden_answers) == "choice"}
        if choice_weight == 0 and all(r.prompt_id in self.choices for r in self.records):
            raise ValueError(
                f"choice_weight=0 leaves no prompts: all {len(self.records)} are choice questions "
                "(yes/no, or the answer named in the question; agents.question_kinds)"
            )
        self.epoch = 0
        self.pending: deque[PromptRecord] = deque()
        self.retry: deque[PromptRecord] = deque()
        self.attempts: Counter[str] = Counter()

    def _order(self) -> list[PromptRecord]:
        """One epoch's prompts: all of them shuffled, then the choice questions thinned to ``choice_weight``."""
        order = list(self.records)
        self.rng.shuffle(order)
        if self.choice_weight < 1:
            order = [
                r for r in order if r.prompt_id not in self.choices or self.choice_rng.random() < self.choice_weight
            ]
        return order

    def next(self) -> PromptRecord | None:
        if self.retry:
            return self.retry.popleft()
        while not self.pending:  # an epoch of choice questions only may keep none of them: draw the next
            if self.epochs is not None and self.epoch >= self.epochs:
                return None
            self.pending.extend(self._order())
            self.epoch += 1
        return self.pending.popleft()

    def requeue(self, record: PromptRecord, max_failures: int) -> bool:
        """Put a prompt back that failed by its own fault; False (dropped) once it failed ``max_failures``
        times in a row."""
        self.attempts[record.prompt_id] += 1
        if self.attempts[record.prompt_id] >= max_failures:
            return False
        self.retry.append(record)
        return True

    def put_back(self, record: PromptRecord) -> None:
        """Put a prompt back uncounted: its group failed because a dependency was down."""
        self.retry.append(record)

    def succeeded(self, record: PromptRecord) -> None:
        """A published group: earlier failures no longer count towards dropping the prompt."""
        self.attempts.pop(record.prompt_id, None)

    def __len__(self) -> int:
        return len(self.pending) + len(self.retry)


@dataclass
class Stats:
    published: int = 0
    failed: int = 0
    dropped: int = 0
    episodes: int = 0
    no_signal: int = 0  # scored groups not published under drop_flat_groups: all their rewards were equal


class Producer:
    def __init__(
        self,
        settings: RolloutSettings,
        ctx: AgentContext,
        *,
        publisher: StreamQueue,
        client: redis.Redis,
        admission: Admission,
        metrics: RolloutMetrics,
        prompts: PromptQueue,
        embed: Embedder,
        fleet: FleetRunner | None = None,
    ) -> None:
        self.s, self.ctx, self.publisher, self.r = settings, ctx, publisher, client
        self.fleet = fleet  # None: every episode on ``ctx`` as built (one server, no leases)
        self.admission, self.metrics, self.prompts, self.embed = admission, metrics, prompts, embed
        # The agent, its reward and its metric, resolved once here rather than looked up for every episode.
        self.agent, self.scorer = settings.agent_spec, Scorer.of(settings, embed)
        self.stats = Stats()
        self.failures: Counter[str] = Counter()  # by ``Failure.label``, the metric's ``cause``
        self.blamed: Counter[str] = Counter()  # those of them counted against their prompt (not outages)
        self.services = {
            "inference": settings.inference_url,
            "retriever": settings.retriever_url,
            "searcher": settings.searcher_url,
        }
        self.gate = DependencyGate(self._answers, metrics)
        self._tasks: set[asyncio.Task] = set()

    @property
    def version(self) -> int:
        return self.ctx.policy.state.version

    async def run(self, max_groups: int | None = None) -> Stats:
        """Produce until the prompts run out (finite epochs), ``max_groups`` were started, or cancelled."""
        started = 0
        try:
            while max_groups is None or started < max_groups:
                await self.gate.wait()  # a dependency is down: probe it instead of failing prompts on it
                try:
                    wait = await self.admission.acquire()
                except redis.RedisError as exc:  # the shared admission gate lives in Redis
                    self.gate.down("redis", classify(exc).label, time.perf_counter())
                    continue
                if self.gate.waiting_for is not None:  # it went down while we waited for the slot
                    await self.admission.release(published=False)
                    continue
                self.metrics.admission_wait.observe(wait)
                record = self.prompts.next()
                if record is None:
                    await self.admission.release(published=False)
                    break
                started += 1
                task = asyncio.create_task(self._group(record, self.version, wait))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                self.metrics.running.set(self.admission.running)
                self.metrics.queued.set(len(self.prompts))
            await asyncio.gather(*list(self._tasks))
        finally:
            for task in list(self._tasks):
                task.cancel()
        return self.stats

    async def _episode(self, record: PromptRecord) -> tuple[Episode, float]:
        start = time.perf_counter()
        if self.fleet is not None:
            episode = await self.fleet.run(record)
        else:
            episode = await self.agent.run(self.ctx, record)
        return episode, time.perf_counter() - start

    def _classify(self, exc: BaseException) -> Failure:
        return self.fleet.classify(exc) if self.fleet is not None else classify(exc, self.services)

    async def _answers(self, dependency: str) -> bool:
        """The gate's probe: does ``dependency`` answer again?"""
        if dependency == "redis":
            try:
                return bool(await asyncio.to_thread(self.r.ping))
            except redis.RedisError:
                return False
        if dependency == "inference" and self.fleet is not None and self.fleet.answers is not None:
            return await self.fleet.answers()
        return await http_answers(self.services[dependency])

    async def _group(self, record: PromptRecord, version: int, wait_s: float) -> None:
        start = time.perf_counter()
        published = False
        try:
            results = await asyncio.gather(
                *(self._episode(record) for _ in range(self.s.n_samples)), return_exceptions=True
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                # One outage error means the group met the outage; blame that, not the prompt.
                outages = [e for e in errors if outage_dependency(self._classify(e))]
                self._failed(record, (outages or errors)[0], start)
                return
            try:
                group = self._score(
                    record,
                    [r for r in results if not isinstance(r, BaseException)],
                    version,
                    {"admission_wait_s": wait_s, "group_s": time.perf_counter() - start},
                )
                if self.s.drop_flat_groups and not group_has_signal(group):
                    self._no_signal(record, group)
                    return  # not published: the slot is freed below and the loop admits a new prompt at once
                await asyncio.to_thread(self._publish, group)
            except Exception as exc:  # a reward bug or Redis down: count it, keep the prompt, keep running
                self._failed(record, exc, start)
                return
            published = True
            self.prompts.succeeded(record)
            self.gate.ok()
        finally:
            await self.admission.release(published)
            self.metrics.running.set(self.admission.running)

    def _score(
        self, record: PromptRecord, results: list[tuple[Episode, float]], version: int, timing: dict[str, float]
    ) -> TrajectoryGroup:
        episodes = [e for e, _ in results]
        rewards = self.scorer.combine([self.scorer.score(record, e) for e in episodes])
        timing["episode_s_mean"] = sum(s for _, s in results) / len(results)
        timing["episode_s_max"] = max(s for _, s in results)
        for (episode, seconds), reward in zip(results, rewards, strict=True):
            self.metrics.episodes.labels(self.s.agent).inc()
            self.metrics.episode_seconds.observe(seconds)
            self.metrics.turns.observe(episode.num_turns)
            self.metrics.reward.observe(reward.reward)
        for name in rewards[0].components:
            self.metrics.component.labels(name).set(sum(r.components.get(name, 0.0) for r in rewards) / len(rewards))
        self.stats.episodes += len(episodes)
        return build_group(self.scorer, record, episodes, rewards, version=version, timing=timing)

    def _publish(self, group: TrajectoryGroup) -> None:
        self.publisher.publish(group)
        self.r.incr(self.s.published_key)
        self.stats.published += 1
        self.metrics.groups.labels("published").inc()
        trained = sum(s.num_trained_tokens for s in group.samples)
        self.metrics.tokens.labels("trained").inc(trained)
        self.metrics.tokens.labels("context").inc(sum(len(s.token_ids) for s in group.samples) - trained)
        self.metrics.staleness.observe(group_staleness(group, self.version))
        self.metrics.version.labels("rollout").set(self.version)

    def _no_signal(self, record: PromptRecord, group: TrajectoryGroup) -> None:
        """Dynamic sampling: a group the trainer learns nothing from is dropped. The prompt did nothing wrong
        (its episodes ran): it is neither re-queued nor blamed, and comes again in its next epoch."""
        self.prompts.succeeded(record)
        self.gate.ok()
        self.stats.no_signal += 1
        self.metrics.groups.labels("no_signal").inc()
        log.debug(
            "group without learning signal not published",
            extra={"prompt_id": record.prompt_id, "reward": group.samples[0].reward if group.samples else None},
        )

    def _failed(self, record: PromptRecord, exc: BaseException, started: float) -> None:
        failure = self._classify(exc)  # typed; its label is the metric's cause
        cause = failure.label
        self.failures[cause] += 1
        self.stats.failed += 1
        self.metrics.failures.labels(cause).inc()
        self.metrics.groups.labels("failed").inc()
        dependency = outage_dependency(failure)
        if dependency is not None:  # not the prompt's fault: back in the queue uncounted, admission paused
            self.prompts.put_back(record)
            self.gate.down(dependency, cause, started)
            log.debug(
                "group failed in an outage; prompt re-queued", extra={"prompt_id": record.prompt_id, "cause": cause}
            )
            return
        self.blamed[cause] += 1
        if self.prompts.requeue(record, self.s.max_prompt_failures):
            log.warning(
                "group failed; prompt re-queued",
                extra={"prompt_id": record.prompt_id, "cause": cause, "error": repr(exc)[:300]},
            )
        else:
            self.stats.dropped += 1
            self.metrics.groups.labels("dropped").inc()
            log.error("prompt dropped after repeated failures", extra={"prompt_id": record.prompt_id, "cause": cause})

    def status(self) -> dict:
        a = self.admission
        return {
            "recipe": self.s.agent,
            "version": self.version,
            "model": self.ctx.policy.state.model_name,
            "admission": {
                "capacity": a.capacity,
                "running": a.running,
                "accepted": a.accepted,
                "max_staleness": a.max_staleness,
                "groups_per_step": a.groups_per_step,
            },
            "published": self.stats.published,
            "failed": self.stats.failed,
            "dropped": self.stats.dropped,
            "no_signal": self.stats.no_signal,  # not published (drop_flat_groups): all rewards equal
            "episodes": self.stats.episodes,
            "failures_by_cause": dict(self.failures),
            "blamed_failures_by_cause": dict(self.blamed),  # counted against their prompts: not outages
            "queued_prompts": len(self.prompts),
            "epoch": self.prompts.epoch,
            **self.gate.status(),
            **({"fleet": self.fleet.fleet.status()} if self.fleet is not None else {}),
        }
