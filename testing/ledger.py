"""The ledger of groups published vs trained, one definition for the fault-injection suite
(``tests/faults/pipeline.py``) and the soak (``bench/soak.py``).

It reads what an operator can see: the ``trajectories`` stream with the trainer's consumer group and the dead
letters, and the latest checkpoint's ``state.json`` (its ``recent_groups``: every group trained, and
``covered``: entries it holds but may not have acknowledged yet). ``problems``/``exact_problems`` return what is
wrong as lines (empty: sound); the suite asserts on them, the soak reports them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from shared.protocol import TrajectoryGroup
from shared.stream import decode

STREAM, GROUP, DEAD = "trajectories", "trainer", "trajectories:dead"


@dataclass
class Ledger:
    """The stream as the trainer's consumer group sees it, and the checkpoint's ledger (read after it)."""

    groups: dict[str, str]  # entry id → group id, every entry in the stream
    delivered: set[str]  # entry ids served to the consumer group
    pending: set[str]  # served, not acknowledged
    dead: dict[str, str]  # dead-lettered entry id → reason
    trained: list[str]  # the checkpoint's recent_groups: every group trained (whole: see ``window``)
    covered: set[str]  # entry ids the checkpoint contains but may not have acknowledged yet
    # The stream read again after the checkpoint (a running trainer may have served, trained and checkpointed
    # more groups between the two reads): what the checkpoint can have trained. None: the same as above.
    served_after: set[str] | None = None  # group ids served (not dead-lettered) at the second read
    groups_trained: int | None = None  # the checkpoint's count; more than len(trained): it names only the last

    def acked(self) -> set[str]:
        return self.delivered - self.pending - set(self.dead)

    def served(self) -> set[str]:
        """Group ids the stream had served (and not dead-lettered) by the time the checkpoint was read."""
        if self.served_after is not None:
            return self.served_after
        return {self.groups[i] for i in self.delivered - set(self.dead)}

    @property
    def whole(self) -> bool:
        """The checkpoint names every group trained (not only the last of them)."""
        return self.groups_trained is None or len(self.trained) == self.groups_trained


def entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_view(client: redis.Redis) -> tuple[dict[str, str], set[str], set[str], dict[str, str]]:
    """(entry id → group id, entries served, entries pending, dead-lettered entry → reason), read now."""
    groups = {_text(i): decode(TrajectoryGroup, f).group_id for i, f in client.xrange(STREAM)}
    info = next(g for g in client.xinfo_groups(STREAM) if _text(g["name"]) == GROUP)
    last = entry_key(_text(info["last-delivered-id"]))
    delivered = {i for i in groups if entry_key(i) <= last}
    rows = client.xpending_range(STREAM, GROUP, min="-", max="+", count=1_000_000)
    pending = {_text(r["message_id"]) for r in rows}
    dead = {_text(f[b"source_id"]): _text(f[b"reason"]) for _, f in client.xrange(DEAD)}
    return groups, delivered, pending, dead


def checkpoint_state(root: Path) -> dict:
    """The latest checkpoint's ``state.json`` under ``root`` (retried: the latest may be pruned meanwhile)."""
    from services.trainer import checkpoint

    for _ in range(50):
        try:
            return json.loads((checkpoint.latest(root) / "state.json").read_text())
        except (FileNotFoundError, TypeError):
            time.sleep(0.1)
    raise AssertionError(f"no readable checkpoint under {root}")


def read_ledger(client_for, checkpoints: Path) -> Ledger:
    """The stream, then the checkpoint, then the stream again (``client_for()``: a Redis client, closed after
    each read). The trainer keeps serving, training and checkpointing meanwhile: the checkpoint can only be ahead
    of the first read (every group acknowledged then is in it) and behind the second (every group it trained
    was served by then)."""
    client = client_for()
    before = stream_view(client)
    client.close()
    state = checkpoint_state(checkpoints)
    client = client_for()
    after = stream_view(client)
    client.close()
    groups, delivered, pending, dead = before
    served_after = {after[0][i] for i in after[1] - set(after[3])}
    return Ledger(
        groups,
        delivered,
        pending,
        dead,
        state["recent_groups"],
        set(state["covered"]),
        served_after,
        state["groups_trained"],
    )


def problems(led: Ledger) -> list[str]:
    """What holds at any moment: no group trained twice, none trained that the stream does not hold (lost),
    every acknowledged group trained, no dead-lettered group trained. Where the checkpoint names only its last
    groups (``not led.whole``), an acknowledged group older than its window is not called lost."""
    out = []
    trained = set(led.trained)
    if twice := sorted(g for g in trained if led.trained.count(g) > 1):
        out.append(f"groups trained twice: {twice}")
    if unknown := sorted(trained - led.served()):
        out.append(f"trained groups that the stream no longer holds or never served: {unknown}")
    acked = sorted(led.acked(), key=entry_key)
    if not led.whole:  # only the acknowledged entries the window can name
        acked = acked[len(acked) - len(led.trained) :] if len(led.trained) < len(acked) else acked
    if untrained := sorted(led.groups[i] for i in acked if led.groups[i] not in trained):
        out.append(f"groups acknowledged but never trained (lost): {untrained}")
    if dead_trained := sorted({led.groups[i] for i in led.dead if i in led.groups} & trained):
        out.append(f"dead-lettered groups trained: {dead_trained}")
    return out


def exact_problems(led: Ledger) -> list[str]:
    """After the trainer stopped: every served group is trained exactly once (acknowledged, or covered by the
    checkpoint and acknowledged by the next start) or pending untrained (the next start trains it)."""
    out = problems(led)
    trained = set(led.trained)
    entries = sorted(led.delivered - set(led.dead), key=entry_key)
    if not led.whole:
        entries = entries[-len(led.trained) :] if led.trained else []
    for entry in entries:
        group = led.groups[entry]
        if entry in led.pending and entry not in led.covered:
            if group in trained:
                out.append(f"{group} is trained and pending: the next start trains it again")
        elif group not in trained:
            out.append(f"{group} ({entry}) was served and acknowledged but never trained")
    return out
