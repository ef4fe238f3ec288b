"""Checkpoints that lose nothing: engine (model, optimizer, scheduler), RNG, trainer state; last K kept.

A checkpoint is written to ``step-NNNNNNNN.tmp/``, every file fsynced, then renamed to ``step-NNNNNNNN/``
(atomic on one filesystem) and the parent folder fsynced: a folder without ``.tmp`` is complete and durable.
A crash mid-write leaves a ``.tmp`` folder that is ignored and removed on the next save.

``TrainState.covered`` lists the stream entries whose effect the checkpoint contains but which may not have
been acknowledged yet (the ack follows the save); after a restart they are acknowledged without training.
That, not a list of every group ever trained, is what keeps training exactly-once: the state counts the
groups and names only the most recent ``RECENT_GROUPS`` of them, so a checkpoint stays the same size however
long the run.

Several ranks write one checkpoint together (each its optimizer shard and RNG state), so ``checkpoint_dir``
must be one folder all of them see (a shared filesystem across hosts; ``check_shared`` refuses to start
otherwise), and a ZeRO-partitioned checkpoint resumes with the world size that wrote it.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from services.trainer import faults
from shared.log import get_logger

log = get_logger(__name__)

DS_TAG = "engine"
_NAME = re.compile(r"^step-(\d{8})$")
# How many group ids a checkpoint names. A restart replays the consumer group's pending entries (at most
# checkpoint_every steps of groups) and then the backlog the rollout's admission let through (about
# max_staleness + 1 steps of groups): with the shipped recipes a few dozen groups, so the window holds every
# group a replay can bring back, and whole short runs (the crash and fault tests check their ledger in it).
# At ~40 bytes an id a state.json stays under ~200 kB however long the run.
RECENT_GROUPS = 4096


@dataclass
class TrainState:
    """Everything besides the engine that a resumed run needs to continue as if never stopped."""

    step: int = 0  # optimizer steps taken
    version: int = 0  # last policy version published (or to be published) from these weights
    tokens: int = 0  # trained tokens so far
    covered: list[str] = field(default_factory=list)  # stream ids trained since the previous checkpoint
    groups_trained: int = 0  # groups taken by training steps so far (those dropped as stale included)
    recent_groups: list[str] = field(default_factory=list)  # the last RECENT_GROUPS of them, in training order
    dropped_stale: int = 0  # samples dropped for staleness
    red: dict = field(default_factory=dict)  # RED state (entropy EMAs), as the RED module serialises it
    sft_cursor: int = 0  # demonstrations taken so far: the position in SftData's seeded order
    world: int | None = None  # ranks that wrote it (None: a checkpoint from before this was recorded)

    def record_groups(self, group_ids: list[str]) -> None:
        """Count the groups of one step and remember their ids, forgetting the oldest beyond the window."""
        self.groups_trained += len(group_ids)
        self.recent_groups = (self.recent_groups + list(group_ids))[-RECENT_GROUPS:]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainState:
        data = json.loads(text)
        if "trained_groups" in data:  # a checkpoint written before the window: it named every group trained
            every = data.pop("trained_groups")
            data.setdefault("groups_trained", len(every))
            data.setdefault("recent_groups", every[-RECENT_GROUPS:])
        return cls(**data)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def completed(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest(root: str | Path) -> Path | None:
    done = completed(root)
    return done[-1] if done else None


def save(engine, state: TrainState, root: str | Path, keep: int, rank: int, world: int) -> Path:
    """Write a checkpoint of ``engine`` and ``state`` (collective: every rank calls it). Returns its folder."""
    root = Path(root)
    final = root / f"step-{state.step:08d}"
    tmp = root / f"step-{state.step:08d}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier(world)
    lora = hasattr(engine.module.lm, "peft_config")
    engine.save_checkpoint(str(tmp), tag=DS_TAG, save_latest=False, exclude_frozen_parameters=lora)
    torch.save(rng_state(), tmp / f"rng-{rank}.pt")
    _barrier(world)
    if rank == 0:
        state.world = world
        (tmp / "state.json").write_text(state.to_json())
        _fsync_tree(tmp)
        if faults.ARMED:
            faults.point("mid_checkpoint")
        if final.exists():  # a step re-saved after resuming from an older checkpoint
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in completed(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob("step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        log.info("checkpoint saved", extra={"path": str(final), "step": state.step})
    _barrier(world)
    return final


def load(engine, path: Path, rank: int, world: int = 1) -> TrainState:
    """Restore ``engine`` (model, optimizer, scheduler) and this rank's RNG from ``path``; returns the state."""
    state = TrainState.from_json((path / "state.json").read_text())
    if state.world not in (None, world) and engine.zero_optimization_stage() > 0:
        raise ValueError(
            f"{path} was written by {state.world} ranks with ZeRO stage {engine.zero_optimization_stage()}, whose "
            f"optimizer state is partitioned by rank: resume it with {state.world} ranks, not {world}"
        )
    lora = hasattr(engine.module.lm, "peft_config")
    load_path, _ = engine.load_checkpoint(
        str(path), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=True, load_module_strict=not lora
    )
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {path}")
    rng = path / f"rng-{rank}.pt"
    if rng.is_file():
        set_rng_state(torch.load(rng, weights_only=False))
    log.info("resumed", extra={"path": str(path), "step": state.step, "version": state.version})
    return state


def check_shared(root: str | Path, ranks) -> None:
    """Refuse to start when some rank does not see the checkpoint folder rank 0 writes into (a host whose
    ``checkpoint_dir`` is a local folder): its shards would be lost and the next resume would diverge.
    ``ranks`` is the job's ``services.trainer.batches.Ranks``; collective."""
    if ranks.world == 1:
        return
    probe = Path(root) / f".ranks-{ranks.broadcast(uuid.uuid4().hex if ranks.rank == 0 else None)}"
    if ranks.rank == 0:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.touch()
    _barrier(ranks.world)
    missing = ranks.any(not probe.is_file())
    _barrier(ranks.world)
    if ranks.rank == 0:
        probe.unlink()
    if missing:
        raise RuntimeError(
            f"checkpoint_dir {root} is not one folder shared by every rank (some rank does not see what rank 0 "
            "writes there): put it on a filesystem every host mounts at the path given to it"
        )


def _barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()
