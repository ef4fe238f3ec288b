"""An fp32 ONNX Runtime copy of the query encoder, for the forward passes torch is slow at on CPU.

A sentence-transformers forward in eager torch pays a fixed cost per layer call; for one or two short queries
that cost is most of the pass. The same graph exported to ONNX and run by ONNX Runtime gives the same vectors
(cosine to torch's ≥ 0.99999, checked at load) in about half the time for one query on this project's CPUs
(bench/retriever.py: 8.3 vs 17.8 ms for one HotpotQA question, 160 vs 203 ms for 16).

The export (torch.export → ONNX, ~7 s) is cached by content: the model's weight files, the prefix-free
sample the graph was traced with, and the torch/onnx versions name the file, so a restart loads it in
milliseconds. A graph that does not reproduce torch's vectors is never used: the caller keeps torch.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from shared.log import get_logger

log = get_logger(__name__)

# Two rows of different lengths: a trace with one row, or rows without padding, lets the exporter fold the
# attention mask away (the graph then ignores padding and gives wrong vectors for every padded batch).
TRACE_SAMPLE = ["which magazine was started first", "who directed the 1994 biographical film about Ed Wood"]
MAX_COSINE_GAP = 1e-4  # 1 - cosine(onnx, torch) allowed on the check queries; measured ≤ 1e-7


def cache_key(model_dir: str) -> str:
    """A name for the exported graph: the model's files (names and bytes) and the exporter's versions."""
    import onnx
    import torch

    digest = hashlib.sha256(f"{torch.__version__}|{onnx.__version__}|{TRACE_SAMPLE}".encode())
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{model_dir} is not a local model folder")
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in {".json", ".safetensors", ".bin"}):
        digest.update(str(path.relative_to(root)).encode())
        with path.open("rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:20]


def default_cache_dir() -> Path:
    """Where exported graphs live: ``CODA_ONNX_CACHE``, else ``~/.cache/coda-stack/onnx``."""
    return Path(os.environ.get("CODA_ONNX_CACHE") or Path.home() / ".cache" / "coda-stack" / "onnx")


def _traceable(st_model, names: list[str]):
    """The module the exporter traces: the feature tensors in (in ``names`` order), the sentence embedding out."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.st = st_model

        def forward(self, *tensors):
            return self.st(dict(zip(names, tensors, strict=True)))["sentence_embedding"]

    return Pooled().eval()


def export(st_model, tokenize, path: Path) -> None:
    """Export ``st_model`` (fp32, CPU) to ``path`` with batch and sequence length free."""
    import torch

    features = tokenize(TRACE_SAMPLE)
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features]
    inputs = tuple(features[name] for name in names)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed: two servers starting at once never read half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        with torch.inference_mode(False), torch.no_grad():
            program = torch.onnx.export(
                _traceable(st_model, names),
                inputs,
                dynamo=True,
                input_names=names,
                output_names=["sentence_embedding"],
                dynamic_shapes=(tuple({0: batch, 1: seq} for _ in names),),  # one entry: forward's *tensors
                optimize=True,
                verbose=False,
            )
        program.save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def graph_path(model_dir: str, cache_dir: Path | None = None) -> Path:
    """Where the graph exported from ``model_dir`` is kept."""
    return (cache_dir or default_cache_dir()) / f"{Path(model_dir).name}-{cache_key(model_dir)}.onnx"


class OnnxEncoder:
    """``encoder(features)`` → float32 ``(n, dim)`` sentence embeddings (not yet normalised), thread-safe."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        # Never spin: ORT's default keeps its threads spinning ~40 ms after each run (measured), taking the core
        # from the next chunk's worker; spinning only within a run saved 0.1 of 4.3 ms for one question.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.names = [item.name for item in self.session.get_inputs()]
        self.path = path

    def __call__(self, features: dict) -> np.ndarray:
        feeds = {name: np.asarray(features[name], dtype=np.int64) for name in self.names}
        return self.session.run(None, feeds)[0]


def load_or_export(st_model, tokenize, model_dir: str, threads: int = 1, cache_dir: Path | None = None):
    """An ``OnnxEncoder`` for ``st_model`` (exporting it once per content), or None when that cannot be done
    here (no onnx/onnxruntime, an exporter error, a graph whose vectors differ from torch's)."""
    try:
        path = graph_path(model_dir, cache_dir)
        if not path.exists():
            log.info("exporting the query encoder to ONNX (once per model)", extra={"path": str(path)})
            export(st_model, tokenize, path)
        encoder = OnnxEncoder(path, threads)
    except Exception as exc:  # an optional speed-up: any failure leaves the torch encoder serving
        log.warning("ONNX query encoder unavailable; torch serves every pass", extra={"error": repr(exc)})
        return None
    gap = _cosine_gap(st_model, tokenize, encoder)
    if gap > MAX_COSINE_GAP:
        log.warning("ONNX query encoder disagrees with torch; not used", extra={"gap": gap, "path": str(path)})
        return None
    log.info("ONNX query encoder ready", extra={"path": str(path), "cosine_gap": gap})
    return encoder


def _cosine_gap(st_model, tokenize, encoder: OnnxEncoder) -> float:
    """Largest 1 - cosine between the two encoders over padded batches of several lengths."""
    import torch

    checks = [TRACE_SAMPLE[:1], TRACE_SAMPLE, [*TRACE_SAMPLE, "Ed Wood", "Scott Derrickson's nationality"]]
    worst = 0.0
    for texts in checks:
        features = tokenize(texts)
        with torch.inference_mode():
            ref = st_model(dict(features))["sentence_embedding"].float().numpy()
        got = encoder(features)
        cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
        worst = max(worst, float(1 - cos.min()))
    return worst
