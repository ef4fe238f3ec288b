"""Continuous batching: one engine thread owns the model and runs one forward pass per decoding step for every
running sequence, admitting new requests between steps.

Weight changes (LoRA load/unload, full reload) are control operations run by the same thread between steps,
so a forward pass never sees weights change under it. A full reload also *drains*: admission stops, running
requests finish on the old weights, then the new weights go in and the version goes up. Every request is
admitted whole (all its choices at once), so each response comes from exactly one weight version, which it
reports.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from services.inference.kv import KVBatch
from services.inference.model import ModelRunner
from services.inference.prefix import PrefixCache
from services.inference.sampling import LogprobsMode, SamplingParams, sample
from services.inference.stops import Finish, check_text, check_token
from shared.log import get_logger

log = get_logger(__name__)


class AdapterNotLoaded(LookupError):
    """A request names an adapter that was unloaded while it waited."""


class EngineMetrics(Protocol):
    def on_step(self, rows: int, seconds: float, new_tokens: int) -> None: ...
    def on_request_done(self, prompt_tokens: int, completion_tokens: int) -> None: ...
    def on_prefix_hit(self, tokens: int) -> None: ...


@dataclass
class Sequence:
    """One choice being generated."""

    prompt: list[int]
    params: SamplingParams
    adapter: str | None
    generator: torch.Generator | None
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_top: list[dict[int, float] | None] = field(default_factory=list)
    checked_text_len: int = 0
    text: str = ""
    finish: Finish | None = None


@dataclass
class GenerationRequest:
    """All choices of one HTTP request; the future resolves to ``(sequences, weight_version)``."""

    sequences: list[Sequence]
    future: Future = field(default_factory=Future)
    version: int | None = None

    @property
    def adapters(self) -> set[str]:
        return {s.adapter for s in self.sequences if s.adapter}


@dataclass
class _Op:
    run: Callable[[], Any]
    ready: Callable[[], bool] | None  # run only once this holds (checked between steps); None = at once
    future: Future = field(default_factory=Future)


class Engine:
    def __init__(self, runner: ModelRunner, *, max_num_seqs: int = 128, logprobs_mode: LogprobsMode =
                 "raw_logprobs", seed: int = 0, metrics: EngineMetrics | None = None,
                 prefix_cache_tokens: int = 0, max_prefill_batch: int = 16) -> None:
        self.runner, self.max_num_seqs, self.logprobs_mode = runner, max_num_seqs, logprobs_mode
        self.max_prefill_batch = max_prefill_batch
        self.metrics = metrics
        self.prefix = PrefixCache(prefix_cache_tokens)  # engine thread only
        self.version = 0
        self.kv = KVBatch(runner.num_layers)
        self.running: list[Sequence] = []
        self.owners: dict[int, GenerationRequest] = {}  # id(sequence) -> its request
        self.waiting: deque[GenerationRequest] = deque()
        self.ops: deque[_Op] = deque()
        self.generator = torch.Generator().manual_seed(seed)
        self.paused = False  # vLLM's /pause?mode=wait: no admission until /resume
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="inference-engine", daemon=True)

    # -- public API (any thread) ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._thread.join(timeout=10)

    def submit(self, request: GenerationRequest) -> Future:
        with self._wake:
            self.waiting.append(request)
            self._wake.notify_all()
        return request.future

    def control(self, run: Callable[[], Any], ready: Callable[[], bool] | None = None) -> Future:
        """Run ``run()`` on the engine thread between steps, once ``ready()`` holds.

        While an op waits for ``ready`` no new request is admitted (running ones go on), so a drain finishes.
        """
        op = _Op(run, ready)
        with self._wake:
            self.ops.append(op)
            self._wake.notify_all()
        return op.future

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def idle(self) -> bool:
        """No sequence is being decoded (engine thread: the moment a full reload may swap weights)."""
        return not self.running

    def adapter_idle(self, name: str) -> bool:
        return all(s.adapter != name for s in self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- engine thread -------------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._wake:
                while not (self._stopped or self.running or self.ops or (self.waiting and not self.paused)):
                    self._wake.wait()
                if self._stopped:
                    break
            try:
                blocked = self._run_ops()
                if not blocked and not self.paused:
                    self._admit()
                if self.running:
                    self._step()
            except Exception as exc:  # a bug must fail the requests in flight, not hang them forever
                log.exception("engine step failed; failing running requests")
                self._fail_running(exc)
        self._fail_running(RuntimeError("inference engine stopped"))

    def _run_ops(self) -> bool:
        """Apply queued control ops in order; True while one waits for a drain (admission paused)."""
        while self.ops:
            op = self.ops[0]
            if op.ready is not None and not op.ready():
                return True
            self.ops.popleft()
            if not op.future.set_running_or_notify_cancel():
                continue  # the caller went away before it ran: nothing to do
            try:
                op.future.set_result(op.run())
            except Exception as exc:
                op.future.set_exception(exc)
        return False

    def _admit(self) -> None:
        """Admit whole waiting requests while seats are free, and prefill them together."""
        admitted: list[GenerationRequest] = []
        seats = self.max_num_seqs - len(self.running)
        while self.waiting:
            request = self.waiting[0]
            size = len(request.sequences)
            if (self.running or admitted) and size > seats:
                break
            self.waiting.popleft()
            missing = request.adapters - self.runner.adapters
            if request.future.cancelled():
                continue
            if missing:
                _resolve(request.future, error=AdapterNotLoaded(
                    f"The lora adapter '{sorted(missing)[0]}' cannot be found."))
                continue
            request.version = self.version
            admitted.append(request)
            seats -= size
        if not admitted:
            return
        try:
            self._prefill(admitted)
        except Exception as exc:
            running = {id(seq) for seq in self.running}
            for request in admitted:
                _resolve(request.future, error=exc)
                for seq in request.sequences:
                    if id(seq) not in running:
                        self.owners.pop(id(seq), None)

    def _prefill(self, requests: list[GenerationRequest]) -> None:
        """Run each distinct (prompt, adapter) once, several per forward pass; its choices share the KV."""
        groups: dict[tuple, list[Sequence]] = {}
        for request in requests:
            for seq in request.sequences:
                self.owners[id(seq)] = request
                groups.setdefault((tuple(seq.prompt), seq.adapter), []).append(seq)
        keys = list(groups)
        for first in range(0, len(keys), self.max_prefill_batch):
            chunk = keys[first:first + self.max_prefill_batch]
            items = [(list(prompt), adapter, self.prefix.get(adapter, list(prompt))) for prompt, adapter in chunk]
            for (prompt, adapter, hit), (logits, layers) in zip(items, self.runner.prefill_batch(items), strict=True):
                self.prefix.put(adapter, prompt, layers)
                if hit and self.metrics:
                    self.metrics.on_prefix_hit(hit.length)
                seqs = groups[(tuple(prompt), adapter)]
                n = len(seqs)
                self.kv.add_rows([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers])
                self.running.extend(seqs)
                self._advance(seqs, logits.unsqueeze(0).expand(n, -1))
        self._reap()

    def _step(self) -> None:
        self._abort_cancelled()
        if not self.running:
            return
        start = time.perf_counter()
        rows = list(self.running)
        logits = self.runner.decode(self.kv, [s.out_ids[-1] for s in rows], [s.adapter for s in rows])
        self._advance(rows, logits)
        if self.metrics:
            self.metrics.on_step(len(rows), time.perf_counter() - start, len(rows))
        self._reap()

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token for each of ``seqs`` (rows of ``logits``) and decide which ones finished."""
        banned = [self._banned(s) for s in seqs]
        result = sample(logits, [s.params for s in seqs], [s.generator for s in seqs], banned,
                        self.logprobs_mode, self.generator)
        for seq, token, logprob, top in zip(seqs, result.tokens, result.logprobs, result.top, strict=True):
            seq.out_ids.append(token)
            seq.out_logprobs.append(logprob)
            seq.out_top.append(top)
            seq.finish = self._finish(seq, token)

    def _banned(self, seq: Sequence) -> list[int]:
        if len(seq.out_ids) >= seq.params.min_tokens:
            return []
        eos = set() if seq.params.ignore_eos else set(self.runner.eos_ids)
        return sorted(eos | seq.params.stop_token_ids)

    def _finish(self, seq: Sequence, token: int) -> Finish | None:
        p, n = seq.params, len(seq.out_ids)
        finish = check_token(token, n, eos_ids=self.runner.eos_ids, stop_token_ids=p.stop_token_ids,
                             ignore_eos=p.ignore_eos, min_tokens=p.min_tokens)
        if finish is None and p.stop:
            text = self.runner.decode_text(seq.out_ids, p.skip_special_tokens)
            finish = check_text(text, seq.checked_text_len, p.stop, p.include_stop_str_in_output, n,
                                p.min_tokens)
            seq.checked_text_len = len(text)
        if finish is None and (n >= p.max_tokens or len(seq.prompt) + n >= self.runner.max_model_len):
            finish = Finish("length")
        return finish

    def _abort_cancelled(self) -> None:
        """Stop decoding for requests whose caller is gone (their futures were cancelled)."""
        for seq in self.running:
            if self.owners[id(seq)].future.cancelled():
                seq.finish = Finish("abort")
        self._reap()

    def _reap(self) -> None:
        """Remove finished rows from the batch and complete requests whose choices are all done."""
        keep = [i for i, s in enumerate(self.running) if s.finish is None]
        if len(keep) == len(self.running):
            return
        done = [s for s in self.running if s.finish is not None]
        if self.prefix.enabled:
            for row, seq in enumerate(self.running):
                if seq.finish is not None and seq.finish.reason != "abort":
                    self._remember(row, seq)
        self.kv.keep_rows(keep)
        self.running = [self.running[i] for i in keep]
        for seq in done:
            seq.text = self._final_text(seq)
            request = self.owners.pop(id(seq))
            if all(s.finish is not None for s in request.sequences) and not request.future.done():
                if self.metrics:
                    self.metrics.on_request_done(sum(len(s.prompt) for s in request.sequences),
                                                 sum(len(s.out_ids) for s in request.sequences))
                _resolve(request.future, (request.sequences, request.version))

    def _remember(self, row: int, seq: Sequence) -> None:
        """Put a finished row's KV (prompt + generated ids but the last, which was never fed) in the cache."""
        pad, end = self.kv.pad[row], self.kv.length
        layers = [(k[row:row + 1, :, pad:end].clone(), v[row:row + 1, :, pad:end].clone())
                  for k, v in zip(self.kv.keys, self.kv.values, strict=True)]
        self.prefix.put(seq.adapter, seq.prompt + seq.out_ids[:-1], layers)

    def _final_text(self, seq: Sequence) -> str:
        p, finish = seq.params, seq.finish
        ids = seq.out_ids
        if finish is not None and isinstance(finish.stop_reason, int) and not p.include_stop_str_in_output:
            ids = ids[:-1]  # a stop token id is reported in stop_reason, not in the text
        text = self.runner.decode_text(ids, p.skip_special_tokens)
        if finish is not None and finish.text_end is not None:
            text = text[:finish.text_end]
        return text

    def _fail_running(self, exc: Exception) -> None:
        requests = {id(r): r for r in self.owners.values()}
        requests.update({id(r): r for r in self.waiting})
        for request in requests.values():
            _resolve(request.future, error=exc)
        self.running, self.owners = [], {}
        self.waiting.clear()
        self.kv = KVBatch(self.runner.num_layers)


def _resolve(future: Future, result: Any = None, error: Exception | None = None) -> None:
    """Complete ``future`` unless its caller already cancelled it (a cancel can race with completion)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


def make_generators(seed: int | None, count: int) -> list[torch.Generator | None]:
    """Per-choice generators: choice ``i`` of a seeded request samples with ``seed + i`` (reproducible)."""
    if seed is None:
        return [None] * count
    return [torch.Generator().manual_seed((seed + i) % (2**63)) for i in range(count)]
