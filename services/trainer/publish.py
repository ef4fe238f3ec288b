"""Weight publishing: write the policy's weights atomically and announce them; nothing else.

LoRA: the adapter is saved to ``<weights_dir>/policy-v{N}`` and served as ``<served>-<run>-v{N}``
(``shared.protocol.adapter_name``); full: the model is written as safetensors to ``<weights_dir>/v{N}``. Then
``policy:version`` is set to N and a ``WeightUpdate`` (where the folder is, under which model name it is to be
served) goes on the ``weights`` stream, together with the admission mark (``shared.stream``) that lets the
rollout start the next groups, in one transaction.

The run id is kept in Redis beside the version counter (``<version key>:run``): the first publish of a run
creates it, a restarted trainer reads it back (its versions keep their names), and a wiped Redis (a new run,
whose counter starts again) gets a new one, so its ``v3`` is a name no server holds for older weights.

Weights flow one way (docs/architecture.md, "The pipeline"): the trainer never loads them into a server. The rollout's fleet watch
reads the announcement and loads the folder into every policy server (``services.rollout.loader``), this
trainer's own included, and again into one that restarted; it also unloads adapters that fell out of its
keep window. The trainer deletes the folders that fell out of ``keep`` (the fleet keeps fewer loaded).

N is reserved in Redis (``<version key>:reserved``) before it is announced: a restarted trainer never gives
a number it may have announced (a transaction whose reply was lost, a crash right after it) to other weights.

Every folder is written under a ``.tmp`` name and renamed when complete, so a reader (or a crash) never
sees a half-written version. Under ZeRO-3 the parameters are gathered collectively; only rank 0 writes.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import torch

from shared.contract import DEFAULT_CONTRACT
from shared.log import get_logger
from shared.protocol import WeightUpdate, adapter_name, new_run_id
from shared.stream import AdmissionMarks, encode

log = get_logger(__name__)

_VERSIONED = re.compile(r"^(?:policy-)?v(\d+)$")


def folder_name(version: int, kind: str) -> str:
    """The folder version ``version`` is written to under ``weights_dir``."""
    return f"policy-v{version}" if kind == "lora" else f"v{version}"


def _full_state_dict(engine) -> dict[str, torch.Tensor] | None:
    """The full model state dict on rank 0 (None elsewhere); gathers ZeRO-3 shards collectively."""
    if engine.zero_optimization_stage() == 3:
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.lm.state_dict() if torch.distributed.get_rank() == 0 else None


def write_weights(engine, root: Path, version: int, kind: str) -> Path | None:
    """Write version ``version`` under ``root`` (collective); returns the folder on rank 0, else None."""
    lm = engine.module.lm
    state = None if kind == "lora" else _full_state_dict(engine)
    if torch.distributed.get_rank() != 0:
        return None
    name = folder_name(version, kind)
    final, tmp = root / name, root / f"{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if kind == "lora":
        lm.save_pretrained(tmp, safe_serialization=True)
    else:
        # The module is the transformers model (prefix-free keys); its config travels along for vLLM loaders.
        state = {k.removeprefix("lm."): v for k, v in state.items()}
        lm.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


class Publisher:
    """Writes versions and announces them in Redis; rank 0 only (ranks > 0 just join the gather)."""

    def __init__(
        self,
        engine,
        weights_dir: str,
        kind: str,
        redis,
        weights_stream: str,
        version_key: str,
        keep: int,
        served_model_name: str = DEFAULT_CONTRACT.served_model_name,
        admission_key: str = DEFAULT_CONTRACT.admission_key,
    ) -> None:
        self.engine = engine
        self.root = Path(weights_dir)
        self.kind = kind
        self.redis = redis
        self.version_key = version_key
        self.reserved_key = f"{version_key}:reserved"
        self.run_key = f"{version_key}:run"
        self._run_id: str | None = None
        self.marks = AdmissionMarks(redis, admission_key) if redis is not None else None
        self.keep = keep
        self.served_model_name = served_model_name
        self.weights_stream = weights_stream

    def live_version(self) -> int | None:
        """The version Redis says is live (None when never published)."""
        if self.redis is None:
            return None
        raw = self.redis.get(self.version_key)
        return None if raw is None else int(raw)

    def highest_version(self) -> int | None:
        """The highest version ever given to weights: announced, or reserved for a write that was cut short."""
        if self.redis is None:
            return None
        seen = [int(raw) for raw in self.redis.mget(self.version_key, self.reserved_key) if raw is not None]
        return max(seen, default=None)

    @property
    def run_id(self) -> str:
        """This run's id (module docstring): Redis's, else a new one written there (one per Publisher without
        Redis)."""
        if self._run_id is None:
            fresh = new_run_id()
            if self.redis is not None:
                self.redis.set(self.run_key, fresh, nx=True)
                raw = self.redis.get(self.run_key)
                fresh = raw.decode() if isinstance(raw, bytes) else (raw or fresh)
            self._run_id = fresh
            log.info("run id", extra={"run_id": self._run_id})
        return self._run_id

    def model_name(self, version: int) -> str:
        """The name version ``version`` is served under: its adapter's (LoRA) or the served model's (full)."""
        if self.kind == "lora":
            return adapter_name(self.served_model_name, self.run_id, version)
        return self.served_model_name

    def mark(self, version: int, consumed: int) -> None:
        """Tell the rollout how many groups the trainer has taken (a step that published nothing)."""
        if self.marks is not None:
            self.marks.write(version, consumed)

    def publish(
        self, version: int, step: int, announce: bool = True, consumed: int | None = None
    ) -> WeightUpdate | None:
        """Write and (``announce``) announce ``version``; returns the event on rank 0, else None.

        ``announce=False`` writes again weights Redis already announces under ``version`` (a restart from the
        checkpoint they came from): no version bump, no new event; the fleet watch loads the folder into a
        server that lost it. ``consumed`` (groups taken so far) goes out with the version as the rollout's
        admission mark.
        """
        start = time.perf_counter()
        path = write_weights(self.engine, self.root, version, self.kind)
        if path is None:
            return None
        if self.redis is not None:
            self._reserve(version)
        seconds = time.perf_counter() - start
        event = WeightUpdate(
            version=version,
            kind=self.kind,
            model_name=self.model_name(version),
            path=str(path.resolve()),
            step=step,
            created_at=time.time(),
            publish_seconds=seconds,
        )
        if self.redis is not None and announce:
            # One transaction: a crash can never leave the version key and the event stream disagreeing.
            pipe = self.redis.pipeline(transaction=True)
            pipe.set(self.version_key, version)
            pipe.set(self.run_key, self.run_id)  # again after a wipe while this trainer ran: the names stay its
            pipe.xadd(self.weights_stream, encode(event), maxlen=10_000, approximate=True)
            if consumed is not None:
                self.marks.write(version, consumed, pipe=pipe)
            pipe.execute()
        elif consumed is not None:
            self.mark(version, consumed)
        self._prune(version)
        log.info("weights published", extra={"version": version, "kind": self.kind, "seconds": round(seconds, 3)})
        return event

    def _reserve(self, version: int) -> None:
        """Record ``version`` as taken before it is announced (the reservation only ever grows)."""
        current = self.redis.get(self.reserved_key)
        if current is None or int(current) < version:
            self.redis.set(self.reserved_key, version)

    def _prune(self, version: int) -> None:
        """Delete the folders of versions that fell out of the keep window (the fleet watch unloads adapters)."""
        for folder in self.root.iterdir() if self.root.is_dir() else []:
            m = _VERSIONED.match(folder.name)
            if m and int(m.group(1)) <= version - self.keep:
                shutil.rmtree(folder, ignore_errors=True)
