"""The corpus of an index: canonical JSONL rows, read back by position through an mmap and an offsets table.

Building normalises every row once (``id`` as a string, ``contents`` present) and writes one compact JSON
object per line, so serving can splice a row's bytes straight into the response without parsing it: the
document goes out exactly as it is in the corpus, extra columns included, at no per-request cost.
"""

from __future__ import annotations

import json
import lzma
import mmap
from collections.abc import Iterator
from pathlib import Path

import numpy as np

CORPUS_FILE = "corpus.jsonl"
OFFSETS_FILE = "corpus_offsets.npy"


def normalize_row(row: dict, index: int) -> dict:
    """A corpus row in our canonical form; raises ValueError naming the row when it cannot be used.

    FlashRAG rows without ``contents`` but with ``title``/``text`` are accepted (contents is rebuilt as
    ``"\\"title\\"\\ntext"``); a missing ``id`` becomes the row index, which is what Search-R1 assumes.
    """
    if not isinstance(row, dict):
        raise ValueError(f"corpus row {index} is not a JSON object")
    row = dict(row)
    if "contents" not in row:
        if "text" not in row:
            raise ValueError(f"corpus row {index} has neither 'contents' nor 'text'")
        title = row.get("title")
        row["contents"] = f'"{title}"\n{row["text"]}' if title else str(row["text"])
    if not isinstance(row["contents"], str):
        raise ValueError(f"corpus row {index}: 'contents' must be a string")
    row["id"] = str(row.get("id", index))
    return {"id": row.pop("id"), "contents": row.pop("contents"), **row}


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """Rows of a JSONL file, or of an xz-compressed one (``.jsonl.xz``: the bundled real corpora ship so), blank
    lines skipped, with the line number in any parse error."""
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON: {exc}") from exc


def write_corpus(rows: Iterator[dict], out_dir: Path) -> Iterator[str]:
    """Write the canonical corpus and its offsets; yields each row's ``contents`` (what gets indexed)."""
    offsets = [0]
    with open(out_dir / CORPUS_FILE, "wb") as f:
        for i, row in enumerate(rows):
            row = normalize_row(row, i)
            line = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
            f.write(line)
            offsets.append(offsets[-1] + len(line))
            yield row["contents"]
    np.save(out_dir / OFFSETS_FILE, np.asarray(offsets, dtype=np.int64))


class CorpusStore:
    """Read-only access to the rows of an index directory, by position."""

    def __init__(self, index_dir: str | Path) -> None:
        index_dir = Path(index_dir)
        self.offsets = np.load(index_dir / OFFSETS_FILE, mmap_mode="r")
        self._file = open(index_dir / CORPUS_FILE, "rb")  # noqa: SIM115 (lives as long as the store)
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if len(self) else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def raw(self, i: int) -> bytes:
        """Row ``i`` as its JSON bytes (no trailing newline)."""
        return self._mm[int(self.offsets[i]) : int(self.offsets[i + 1]) - 1]

    def row(self, i: int) -> dict:
        return json.loads(self.raw(i))

    def contents(self, i: int) -> str:
        return self.row(i)["contents"]

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()
