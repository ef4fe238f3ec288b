"""bm25s runs a JAX top-k at import when JAX is installed; on a GPU host that took 75% of the GPU's memory for
a retriever that never uses JAX (an H200: 107 GB). The sparse index imports it with JAX kept on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# A stand-in `jax` that records, at bm25s's import-time top-k, which platforms JAX was told to use.
FAKE_LAX = """
import os
from pathlib import Path

def top_k(scores, k):
    Path(os.environ["JAX_SEEN"]).write_text(os.environ.get("JAX_PLATFORMS", "<unset>"))
    return scores[:k], list(range(k))
"""


def _platforms_seen(tmp_path: Path, **env: str) -> str:
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text("from jax import lax\n")
    (fake / "jax" / "lax.py").write_text(FAKE_LAX)
    seen = tmp_path / "seen.txt"
    base = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    run_env = {**base, "PYTHONPATH": os.pathsep.join([str(fake), str(REPO)]), "JAX_SEEN": str(seen), **env}
    code = "from services.retriever.sparse import SparseIndex; SparseIndex.build(['a cat', 'a dog'])"
    subprocess.run([sys.executable, "-c", code], env=run_env, check=True, capture_output=True, timeout=120)
    return seen.read_text()


def test_bm25s_imports_jax_on_the_cpu(tmp_path):
    assert _platforms_seen(tmp_path) == "cpu"


def test_a_users_jax_platforms_wins(tmp_path):
    assert _platforms_seen(tmp_path, JAX_PLATFORMS="cuda") == "cuda"
