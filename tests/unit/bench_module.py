"""A script of bench/ imported by its file path, for the unit tests of its pure parts (bench/ is no package)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


@contextlib.contextmanager
def bench_module(name: str, *, bench_on_path: bool = False) -> Iterator[ModuleType]:
    """``bench/<name>.py`` as module ``name`` while the context lasts (registered in ``sys.modules``:
    dataclasses look their module up while a class is built); ``bench_on_path`` for a script that imports its
    sibling modules."""
    if bench_on_path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        if bench_on_path:
            sys.path.remove(str(BENCH))
