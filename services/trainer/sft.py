"""The SFT demonstrations RED co-trains on: a JSONL of token ids with a loss mask, read in a seeded shuffled
order, a question's demonstrations together, planner and executor demonstrations balanced in every batch.

One line per demonstration: ``{"id": ..., "role": ..., "token_ids": [...], "loss_mask": [...], "queries":
[...], ...}``; ``loss_mask`` is 1 only on tokens the policy should imitate (its own think/search/answer
text), 0 on the prompt and on retrieved documents (``make_sft`` builds the file).

Why not the file's order: make-sft writes questions in dataset order (the easy one-search questions and the
two-hop ones in runs), and a CoDA question gives 2–4 executor demonstrations for its one planner demonstration,
so a short warm start read in file order sees few planner demonstrations and fewer still that split a question
into sub-questions. So the rows are grouped by question id and the groups shuffled by ``random.Random`` seeded
from the trainer's ``seed`` (a fresh permutation each epoch); with planner rows in the file, each batch draws
``planner_share`` of its rows from the planner rows' own shuffled stream and the rest from the others', so the
planner stream (fewer rows) cycles faster: its demonstrations repeat rather than thin out.

The cursor is the number of demonstrations taken so far: the order is a pure function of (seed, cursor), so
the cursor (an int, part of the checkpoint) is all a resumed run needs to continue with the next one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from services.trainer.packing import TrainSeq
from shared.log import get_logger

log = get_logger(__name__)

# How many split planner demonstrations (a question delegated as two or more sub-questions) a warm start should
# show at least; the start-up log says how many steps that takes, to size ``[stack] warm_start_steps`` by.
SPLIT_DEMOS_WANTED = 40


@dataclass(frozen=True)
class Demo:
    """One demonstration line: its tokens and loss mask, its question id and role, and whether it is a planner
    demonstration that delegates more than one sub-question (a *split* one)."""

    ids: list[int]
    mask: list[int]
    qid: object  # the question's id (None: the row is a group of its own)
    role: str  # "policy" (flat agent), "executor" or "planner" (CoDA)
    split: bool


class _Stream:
    """Row indices grouped by question, the groups shuffled afresh each epoch by a seeded RNG; item ``j`` is a
    pure function of ``j`` (epoch ``j // len``), so any position can be read without reading those before."""

    def __init__(self, groups: list[list[int]], seed: str) -> None:
        self.groups, self.seed = groups, seed
        self.size = sum(len(g) for g in groups)
        self._epoch, self._order = -1, []  # the last epoch's order: reads move forward, one epoch at a time

    def __getitem__(self, j: int) -> int:
        epoch, pos = divmod(j, self.size)
        if epoch != self._epoch:
            groups = list(self.groups)
            # A string seed: random.Random hashes it (sha512), stable across processes, unlike hash() of a tuple.
            random.Random(f"{self.seed}/{epoch}").shuffle(groups)
            self._epoch, self._order = epoch, [i for g in groups for i in g]
        return self._order[pos]


def _groups(rows: list[Demo], keep: list[int]) -> list[list[int]]:
    """The indices ``keep`` grouped by question id, in the order of each id's first row (no id: a group each)."""
    by_id: dict[object, list[int]] = {}
    groups: list[list[int]] = []
    for i in keep:
        qid = rows[i].qid
        if qid is None:
            groups.append([i])
        elif qid in by_id:
            by_id[qid].append(i)
        else:
            by_id[qid] = [i]
            groups.append(by_id[qid])
    return groups


class SftData:
    """The demonstrations of one JSONL file and their order: position ``k`` (the cursor) shows ``index(k)``."""

    def __init__(self, path: str | Path, seed: int = 0, planner_share: float = 0.5) -> None:
        """``seed`` fixes the order (the trainer's ``seed``); ``planner_share``: the fraction of each batch drawn
        from the planner demonstrations when the file has any (0: no balance, one shuffled stream of all rows)."""
        if not 0 <= planner_share <= 1:
            raise ValueError(f"planner_share must be in [0, 1], got {planner_share}")
        self.rows: list[Demo] = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, mask = row["token_ids"], row["loss_mask"]
            if len(ids) != len(mask):
                raise ValueError(f"{path}:{n}: {len(mask)} mask entries for {len(ids)} tokens")
            if any(mask):
                role = row.get("role") or "policy"
                split = role == "planner" and len(row.get("queries") or []) >= 2
                # A repeated demonstration (``copy`` 1, 2, ...: make-sft up-weights a row by writing it again) is a
                # group of its own, so its copies land in different batches, not side by side.
                qid = (row.get("id"), row["copy"]) if row.get("copy") else row.get("id")
                self.rows.append(Demo(ids, mask, qid, role, split))
        if not self.rows:
            raise ValueError(f"{path}: no demonstration with a trained token")
        planners = [i for i, r in enumerate(self.rows) if r.role == "planner"]
        others = [i for i, r in enumerate(self.rows) if r.role != "planner"]
        # An exact fraction: which positions are planner slots must not depend on float rounding.
        self.share = Fraction(planner_share).limit_denominator(100)
        self.balanced = bool(planners and others and self.share)
        if self.balanced:
            self.planners = _Stream(_groups(self.rows, planners), f"{seed}/planner")
            self.others = _Stream(_groups(self.rows, others), f"{seed}/other")
        else:
            self.everything = _Stream(_groups(self.rows, list(range(len(self.rows)))), f"{seed}/all")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def has_planners(self) -> bool:
        return any(r.role == "planner" for r in self.rows)

    def index(self, k: int) -> int:
        """The row shown at position ``k`` of the order. Balanced, position ``k`` is a planner slot when
        ``floor((k+1)·share) > floor(k·share)``: the planner slots spread evenly, so any ``n`` consecutive
        positions hold ``n·share`` of them, rounded down or up (exactly 2 of 4 at share 1/2)."""
        if not self.balanced:
            return self.everything[k]
        num, den = self.share.numerator, self.share.denominator
        before = k * num // den  # planner slots before position k
        if (k + 1) * num // den > before:
            return self.planners[before]
        return self.others[k - before]

    def indices(self, cursor: int, n: int) -> list[int]:
        """The rows of positions ``cursor`` .. ``cursor + n - 1``."""
        return [self.index(k) for k in range(cursor, cursor + n)]

    def take(self, cursor: int, n: int) -> tuple[list[TrainSeq], int]:
        """The ``n`` demonstrations from position ``cursor`` on, and the next cursor (``cursor + n``)."""
        seqs = [
            TrainSeq(tokens=list(self.rows[r].ids), mask=list(self.rows[r].mask), index=i)
            for i, r in enumerate(self.indices(cursor, n))
        ]
        return seqs, cursor + n

    def _splits(self) -> Iterator[int]:
        """The positions (from cursor 0) that show a split planner demonstration, in order; none when the file
        has none."""
        if not any(r.split for r in self.rows):
            return
        k = 0
        while True:
            if self.rows[self.index(k)].split:
                yield k
            k += 1

    def split_planner_rows_seen(self, steps: int, batch: int) -> int:
        """How many split planner demonstrations the first ``steps`` batches of ``batch`` (from cursor 0, as a
        fresh warm start reads them) show, a demonstration shown twice counted twice."""
        return sum(self.rows[r].split for r in self.indices(0, steps * batch))

    def steps_to_see_split(self, k: int, batch: int) -> int | None:
        """The fewest steps of ``batch`` from cursor 0 whose batches show ``k`` split planner demonstrations,
        repeats counted (as in ``split_planner_rows_seen``); None when the file has no split planner row."""
        if k <= 0:
            return 0
        for seen, pos in enumerate(self._splits(), 1):
            if seen == k:
                return pos // batch + 1
        return None

    def log_coverage(self, batch: int, steps: int | None = None) -> None:
        """Log at start-up how many steps of ``batch`` show ``SPLIT_DEMOS_WANTED`` split planner demonstrations
        (None: the file has none) and, given ``steps`` (an SFT-only warm start's ``max_steps``), how many those
        steps show: the warm start's length is chosen by that. Silent for a file without planner rows."""
        if not self.has_planners:
            return
        fields = {
            "demonstrations": len(self.rows),
            "planner": sum(r.role == "planner" for r in self.rows),
            "split_planner": sum(r.split for r in self.rows),
            "batch": batch,
            f"steps_to_see_{SPLIT_DEMOS_WANTED}_split": self.steps_to_see_split(SPLIT_DEMOS_WANTED, batch),
        }
        if steps:
            fields |= {"steps": steps, "split_planner_seen": self.split_planner_rows_seen(steps, batch)}
        log.info("SFT demonstrations: split planner demonstrations shown (repeats counted)", extra=fields)
