"""The running batch: the sequences being decoded, their shared KV cache, and one prefill or decode step at a
time over all of them (``Engine`` feeds it from its thread).

Failures are isolated per request: when a batched prefill, decode or sampling step raises, it is redone one
prompt or row at a time and only the requests whose own work raised fail; the others go on as if nothing
happened (a seeded request's tokens too, unless the fault came after its noise was drawn). A step in which
every request failed counts towards ``consecutive_failures``, which ``Engine.check_health`` reports.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from services.inference.kv import KVBatch
from services.inference.model import ModelRunner
from services.inference.prefix import PrefixCache
from services.inference.sampling import LogprobsMode, sample
from services.inference.sequences import (
    GenerationRequest,
    Sequence,
    banned_ids,
    final_text,
    next_finish,
    resolve,
)
from services.inference.stops import Finish
from shared.log import get_logger

log = get_logger(__name__)


class EngineMetrics(Protocol):
    def on_step(self, rows: int, seconds: float, new_tokens: int) -> None: ...
    def on_request_done(self, prompt_tokens: int, completion_tokens: int) -> None: ...
    def on_prefix_hit(self, tokens: int) -> None: ...
    def on_prefill(self, tokens: int, seconds: float) -> None: ...


class RunningBatch:
    """Engine-thread state: ``running`` sequences (rows of ``kv``, in order) and their requests."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        logprobs_mode: LogprobsMode,
        seed: int,
        metrics: EngineMetrics | None,
        prefix_cache_tokens: int | None,
        max_prefill_batch: int,
        prefix_cache_bytes: int | None = None,
    ) -> None:
        self.runner, self.logprobs_mode, self.metrics = runner, logprobs_mode, metrics
        self.max_prefill_batch = max_prefill_batch
        self.prefix = PrefixCache(prefix_cache_tokens, prefix_cache_bytes)
        # What the engine did since start (``/status``, bench/generation_profile.py): forward passes, the tokens
        # they ran and the seconds they took; decode rows per step.
        self.counters = {
            "prefill_passes": 0,
            "prefill_prompts": 0,
            "prefill_tokens": 0,  # prompt tokens that went through the model (prefix-cache hits excluded)
            "prefill_cached_tokens": 0,  # prompt tokens whose KV came from the prefix cache
            "prefill_seconds": 0.0,
            "decode_steps": 0,
            "decode_tokens": 0,  # rows of all decode steps: one token each
            "decode_seconds": 0.0,
            "decode_rows_max": 0,
        }
        self.kv = KVBatch(runner.num_layers)
        self.running: list[Sequence] = []
        self.owners: dict[int, GenerationRequest] = {}  # id(sequence) -> its request
        self.generator = torch.Generator().manual_seed(seed)
        self.consecutive_failures = 0  # steps in a row in which every request failed; a success resets it
        self.last_error: BaseException | None = None

    def idle(self) -> bool:
        """No sequence is being decoded (engine thread: the moment a full reload may swap weights)."""
        return not self.running

    def adapter_idle(self, name: str) -> bool:
        return all(s.adapter != name for s in self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def _prefill(self, requests: list[GenerationRequest]) -> None:
        """Run each distinct (prompt, adapter) once, several per forward pass; its choices share the KV."""
        groups: dict[tuple, list[Sequence]] = {}
        for request in requests:
            for seq in request.sequences:
                self.owners[id(seq)] = request
                groups.setdefault((tuple(seq.prompt), seq.adapter), []).append(seq)
        keys = list(groups)
        for first in range(0, len(keys), self.max_prefill_batch):
            self._prefill_chunk(keys[first : first + self.max_prefill_batch], groups)
        self._reap()

    def _prefill_chunk(self, keys: list[tuple], groups: dict[tuple, list[Sequence]]) -> None:
        """One batched prefill; if it raises, each prompt alone, failing only the requests of one that raises."""
        keys = [key for key in keys if any(s.finish is None for s in groups[key])]  # skip failed requests
        items = [(list(prompt), adapter, self.prefix.get(adapter, list(prompt))) for prompt, adapter in keys]
        start = time.perf_counter()
        try:
            outputs = self.runner.prefill_batch(items) if items else []
        except Exception as exc:
            if len(keys) > 1:
                log.warning(
                    "batched prefill failed; prefilling its prompts one by one",
                    extra={"prompts": len(keys), "error": repr(exc)},
                )
                for key in keys:
                    self._prefill_chunk([key], groups)
            else:
                log.exception("prefill failed; failing its request(s)")
                for seq in groups[keys[0]]:
                    self._fail(seq, exc)
            return
        if items:
            seconds, cached = time.perf_counter() - start, sum(hit.length for _, _, hit in items if hit)
            new = sum(len(prompt) for prompt, _, _ in items) - cached
            c = self.counters
            c["prefill_passes"] += 1
            c["prefill_prompts"] += len(items)
            c["prefill_tokens"] += new
            c["prefill_cached_tokens"] += cached
            c["prefill_seconds"] += seconds
            if self.metrics:
                self.metrics.on_prefill(new, seconds)
        for (prompt, adapter, hit), (logits, layers), key in zip(items, outputs, keys, strict=True):
            self.prefix.put(adapter, prompt, layers)
            if hit and self.metrics:
                self.metrics.on_prefix_hit(hit.length)
            seqs = [s for s in groups[key] if s.finish is None]
            n = len(seqs)
            self.kv.add_rows([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in layers])
            self.running.extend(seqs)
            self._advance(seqs, logits.unsqueeze(0).expand(n, -1))

    def _step(self) -> None:
        self._abort_cancelled()
        if not self.running:
            return
        start = time.perf_counter()
        rows = list(self.running)
        try:
            logits = self.runner.decode(self.kv, [s.out_ids[-1] for s in rows], [s.adapter for s in rows])
        except Exception as exc:
            logits = self._decode_rows(rows, exc)
        live = [row for row, s in enumerate(rows) if s.finish is None]
        self._advance([rows[row] for row in live], logits[live] if len(live) < len(rows) else logits)
        seconds, c = time.perf_counter() - start, self.counters
        c["decode_steps"] += 1
        c["decode_tokens"] += len(rows)
        c["decode_seconds"] += seconds
        c["decode_rows_max"] = max(c["decode_rows_max"], len(rows))
        if self.metrics:
            self.metrics.on_step(len(rows), seconds, len(rows))
        if all(s.finish is not None and s.finish.reason == "abort" for s in rows):
            self.consecutive_failures += 1  # nobody got a token: a broken engine, not a bad request
        self._reap()

    def _decode_rows(self, rows: list[Sequence], error: Exception) -> torch.Tensor:
        """A failed batched decode step redone one row at a time (each writes its KV column in place); a row
        that fails alone fails its request. Returns logits for every row (zeros for the failed ones)."""
        if len(rows) == 1:
            log.error("decode failed; failing its request", exc_info=error)
            self._fail(rows[0], error)
            return torch.zeros(1, 1)
        log.warning(
            "batched decode failed; decoding its rows one by one", extra={"rows": len(rows), "error": repr(error)}
        )
        self.kv.ensure_capacity(self.kv.length + 1)  # before the views, so none of them reallocates
        outputs: list[torch.Tensor | None] = []
        for row, seq in enumerate(rows):
            outputs.append(None)
            if seq.finish is not None:  # a sibling's failure ended its request
                continue
            try:
                # merge=False: rows of different adapters one after another would merge and unmerge each time
                outputs[-1] = self.runner.decode(self.kv.row(row), [seq.out_ids[-1]], [seq.adapter], merge=False)[0]
            except Exception as exc:
                log.exception("decode failed; failing its request")
                self._fail(seq, exc)
        self.kv.length += 1
        template = next((o for o in outputs if o is not None), None)
        if template is None:
            return torch.zeros(len(rows), 1)
        return torch.stack([o if o is not None else torch.zeros_like(template) for o in outputs])

    def _advance(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token for each of ``seqs`` (rows of ``logits``) and decide which ones finished. A row
        whose sampling or stop check raises fails its own request; a failed batch is redone row by row."""
        if not seqs:
            return
        try:
            banned = [self._banned(s) for s in seqs]
            result = sample(
                logits,
                [s.params for s in seqs],
                [s.generator for s in seqs],
                banned,
                self.logprobs_mode,
                self.generator,
            )
        except Exception as exc:
            if len(seqs) == 1:
                log.exception("sampling failed; failing its request")
                self._fail(seqs[0], exc)
                return
            log.warning(
                "batched sampling failed; sampling its rows one by one", extra={"rows": len(seqs), "error": repr(exc)}
            )
            for row, seq in enumerate(seqs):
                if seq.finish is None:  # a sibling's failure may have ended it already
                    self._advance([seq], logits[row : row + 1])
            return
        for seq, token, logprob, top in zip(seqs, result.tokens, result.logprobs, result.top, strict=True):
            if seq.finish is not None:
                continue
            try:
                seq.out_ids.append(token)
                seq.out_logprobs.append(logprob)
                seq.out_top.append(top)
                seq.finish = next_finish(seq, token, self.runner)
            except Exception as exc:
                log.exception("stop check failed; failing its request")
                self._fail(seq, exc)

    def _fail(self, seq: Sequence, exc: Exception) -> None:
        """Fail ``seq``'s whole request (all its choices): its rows leave the batch at the next reap."""
        request = self.owners.get(id(seq))
        self.last_error = exc
        if request is None:
            return
        resolve(request.future, error=exc)
        running = {id(s) for s in self.running}
        for sibling in request.sequences:
            if sibling.finish is None:
                sibling.finish = Finish("abort")
            if id(sibling) not in running:
                self.owners.pop(id(sibling), None)

    def _banned(self, seq: Sequence) -> list[int]:
        return banned_ids(seq, self.runner.eos_ids)

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
            request = self.owners.pop(id(seq), None)
            if request is None or request.future.done():  # failed (or cancelled): nobody reads its text
                continue
            try:
                seq.text = final_text(seq, self.runner)
            except Exception as exc:
                log.exception("detokenising failed; failing its request")
                self._fail(seq, exc)
                continue
            if all(s.finish is not None for s in request.sequences):
                if self.metrics:
                    self.metrics.on_request_done(
                        sum(len(s.prompt) for s in request.sequences), sum(len(s.out_ids) for s in request.sequences)
                    )
                resolve(request.future, (request.sequences, request.version))
                self.consecutive_failures = 0

    def _remember(self, row: int, seq: Sequence) -> None:
        """Put a finished row's KV (prompt + generated ids but the last, which was never fed) in the cache."""
        pad, end = self.kv.pad[row], self.kv.length
        layers = [
            (k[row : row + 1, :, pad:end].clone(), v[row : row + 1, :, pad:end].clone())
            for k, v in zip(self.kv.keys, self.kv.values, strict=True)
        ]
        self.prefix.put(seq.adapter, seq.prompt + seq.out_ids[:-1], layers)

    def _fail_batch(self, exc: BaseException) -> list[GenerationRequest]:
        """Fail every running request and start from an empty batch (a fault no one request caused)."""
        requests = {id(r): r for r in self.owners.values()}
        for request in requests.values():
            resolve(request.future, error=exc)
        self.running, self.owners = [], {}
        self.kv = KVBatch(self.runner.num_layers)
        return list(requests.values())
