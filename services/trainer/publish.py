"""Weight publishing: write the policy's weights atomically, make the inference server load them, announce.

LoRA: the adapter is saved to ``<weights_dir>/policy-v{N}`` and loaded with ``POST /v1/load_lora_adapter``
under the name ``policy-v{N}``; adapters older than the keep window are unloaded and deleted.
Full: the model is written as safetensors to ``<weights_dir>/v{N}`` and the server reloads it through the
full-reload route (``POST /collective_rpc`` → ``update_weights_from_path``).
Then ``policy:version`` is set to N and a ``WeightUpdate`` goes on the ``weights`` stream, together with the
admission mark (how many groups the trainer has taken) that lets the rollout start the next ones.

N is reserved in Redis (``<version key>:reserved``) before the server sees the weights: a crash between the
load and the announcement must not let a restarted trainer give the same number to other weights.

A server that restarts comes back with its start-up weights. ``resend_if_lost`` (called by ``ServerWatch``
every few seconds) notices and loads the last published folder again, under the same version.

Every folder is written under a ``.tmp`` name and renamed when complete, so a reader (or a crash) never
sees a half-written version. Under ZeRO-3 the parameters are gathered collectively; only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from pathlib import Path

import torch

from shared.admission import AdmissionMarks
from shared.contract import DEFAULT_CONTRACT
from shared.inference_client import InferenceError, SyncInferenceClient
from shared.log import get_logger
from shared.protocol import WeightUpdate
from shared.stream import encode

log = get_logger(__name__)

_VERSIONED = re.compile(r"^(?:policy-)?v(\d+)$")


def model_name(version: int) -> str:
    return f"policy-v{version}"


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
    name = model_name(version) if kind == "lora" else f"v{version}"
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
    """Pushes versions to one inference server and to Redis; rank 0 only (ranks > 0 just join the gather)."""

    def __init__(
        self,
        engine,
        weights_dir: str,
        kind: str,
        client: SyncInferenceClient | None,
        redis,
        weights_stream: str,
        version_key: str,
        keep: int,
        served_model: str = DEFAULT_CONTRACT.served_model_name,
        admission_key: str = DEFAULT_CONTRACT.admission_key,
    ) -> None:
        self.engine = engine
        self.root = Path(weights_dir)
        self.kind = kind
        self.client = client
        self.redis = redis
        self.version_key = version_key
        self.reserved_key = f"{version_key}:reserved"
        self.marks = AdmissionMarks(redis, admission_key) if redis is not None else None
        self.keep = keep
        self.served_model = served_model
        self.weights_stream = weights_stream
        self.loaded: tuple[int, Path] | None = None  # the version (and its folder) last loaded into the server
        # Held from a load to its announcement: a re-send never lands between another version's load and its
        # announcement (it would put older weights back under the newer number).
        self._lock = threading.Lock()

    def live_version(self) -> int | None:
        """The version Redis says is live (None when never published)."""
        if self.redis is None:
            return None
        raw = self.redis.get(self.version_key)
        return None if raw is None else int(raw)

    def highest_version(self) -> int | None:
        """The highest version ever given to weights: announced, or reserved for a load that was cut short."""
        if self.redis is None:
            return None
        seen = [int(raw) for raw in self.redis.mget(self.version_key, self.reserved_key) if raw is not None]
        return max(seen, default=None)

    def mark(self, version: int, consumed: int) -> None:
        """Tell the rollout how many groups the trainer has taken (a step that published nothing)."""
        if self.marks is not None:
            self.marks.write(version, consumed)

    def publish(
        self, version: int, step: int, announce: bool = True, consumed: int | None = None
    ) -> WeightUpdate | None:
        """Write, load and (``announce``) announce ``version``; returns the event on rank 0, else None.

        ``announce=False`` re-sends weights the server may have lost (a restart) under a version Redis
        already holds: no version bump, no new event. ``consumed`` (groups taken so far) goes out with the
        version as the rollout's admission mark.
        """
        start = time.perf_counter()
        path = write_weights(self.engine, self.root, version, self.kind)
        if path is None:
            return None
        if self.redis is not None:
            self._reserve(version)
        name = model_name(version)
        with self._lock:
            if self.client is not None:
                # Replace whatever holds this name: our own load before a restart, or a run whose Redis state
                # was wiped while the server kept its adapters (a new name is a 404 no-op to unload).
                self._load(self.client, version, path, replace=True)
            seconds = time.perf_counter() - start
            event = WeightUpdate(
                version=version,
                kind=self.kind,
                model_name=name if self.kind == "lora" else self.served_model,
                path=str(path.resolve()),
                step=step,
                created_at=time.time(),
                publish_seconds=seconds,
            )
            if self.redis is not None and announce:
                # One transaction: a crash can never leave the version key and the event stream disagreeing.
                pipe = self.redis.pipeline(transaction=True)
                pipe.set(self.version_key, version)
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
        """Record ``version`` as taken before any server can serve it (the reservation only ever grows)."""
        current = self.redis.get(self.reserved_key)
        if current is None or int(current) < version:
            self.redis.set(self.reserved_key, version)

    def resend_if_lost(self, client: SyncInferenceClient) -> bool:
        """Load the last published version again if the server behind ``client`` no longer serves it (it
        restarted with its start-up weights); True when it did."""
        with self._lock:
            if self.loaded is None:
                return False
            version, path = self.loaded
            if self.kind == "lora":
                if model_name(version) in {card.id for card in client.models()}:
                    return False
            elif (served := client.served_version()) is not None and served >= version:
                return False
            log.warning(
                "the inference server lost the published weights (restarted?): loading them again",
                extra={"version": version, "kind": self.kind},
            )
            self._load(client, version, path, replace=False)
            return True

    def _load(self, client: SyncInferenceClient, version: int, path: Path, replace: bool) -> None:
        if self.kind == "lora":
            name = model_name(version)
            if replace:  # the server may still hold an adapter of this name from before our restart
                with contextlib.suppress(InferenceError):
                    client.unload_lora(name)
            client.load_lora(name, str(path.resolve()))
        else:
            client.reload_weights(str(path.resolve()), version)
        self.loaded = (version, path)

    def _prune(self, version: int) -> None:
        """Unload adapters and delete folders of versions that fell out of the keep window."""
        for folder in self.root.iterdir() if self.root.is_dir() else []:
            m = _VERSIONED.match(folder.name)
            if not m or int(m.group(1)) > version - self.keep:
                continue
            if self.kind == "lora" and self.client is not None:
                try:
                    self.client.unload_lora(model_name(int(m.group(1))))
                except InferenceError as exc:  # already unloaded (e.g. the server restarted): nothing to free
                    log.info("adapter not unloaded", extra={"adapter": folder.name, "reason": str(exc)[:200]})
            shutil.rmtree(folder, ignore_errors=True)
