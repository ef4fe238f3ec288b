"""Raw results with per-question rows, kept small in git: ``bench/results/<name>.json.xz`` (xz-compressed JSON,
about a fifteenth of the plain file); a plain ``<name>.json`` is still read where no ``.json.xz`` exists."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def path_of(name: str, results: Path = RESULTS) -> Path:
    """Where ``name``'s raw results are read from: the compressed file, else a plain one."""
    packed = results / f"{name}.json.xz"
    return packed if packed.is_file() or not (results / f"{name}.json").is_file() else results / f"{name}.json"


def read(name: str, results: Path = RESULTS) -> dict | None:
    """``name``'s raw results, or None when there are none."""
    path = path_of(name, results)
    if not path.is_file():
        return None
    text = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return json.loads(text)


def write(doc: dict, name: str, results: Path = RESULTS) -> Path:
    """Write ``name``'s raw results compressed (and drop a plain copy, which ``read`` would no longer see)."""
    results.mkdir(parents=True, exist_ok=True)
    packed = results / f"{name}.json.xz"
    packed.write_bytes(lzma.compress(json.dumps(doc, indent=0).encode(), preset=9 | lzma.PRESET_EXTREME))
    (results / f"{name}.json").unlink(missing_ok=True)
    return packed
