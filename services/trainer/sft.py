"""The SFT demonstrations RED co-trains on: a JSONL of token ids with a loss mask, read in a fixed cycle.

One line per demonstration: ``{"token_ids": [...], "loss_mask": [...], "source": ..., ...}``; ``loss_mask``
is 1 only on tokens the policy should imitate (its own think/search/answer text), 0 on the prompt and on
retrieved documents (``make_sft`` builds the file). The read position is part of the checkpoint, so a
resumed run continues with the next demonstration.
"""

from __future__ import annotations

import json
from pathlib import Path

from services.trainer.packing import TrainSeq


class SftData:
    def __init__(self, path: str | Path) -> None:
        self.rows: list[tuple[list[int], list[int]]] = []
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, mask = row["token_ids"], row["loss_mask"]
            if len(ids) != len(mask):
                raise ValueError(f"{path}:{n}: {len(mask)} mask entries for {len(ids)} tokens")
            if any(mask):
                self.rows.append((ids, mask))
        if not self.rows:
            raise ValueError(f"{path}: no demonstration with a trained token")

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, cursor: int, n: int) -> tuple[list[TrainSeq], int]:
        """``n`` demonstrations from ``cursor`` on (wrapping around) and the next cursor."""
        seqs = []
        for i in range(n):
            ids, mask = self.rows[(cursor + i) % len(self.rows)]
            seqs.append(TrainSeq(tokens=list(ids), mask=list(mask), index=i))
        return seqs, (cursor + n) % len(self.rows)
