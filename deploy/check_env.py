"""``make up``'s first step: stop with a message, before compose starts, when ``.env``'s model needs a Hugging Face
token that is missing.

    python3 deploy/check_env.py [.env]     # exit 1 and say what to set

A model of a gated family (its licence must be accepted on the Hub first: Gemma, Llama, Mistral) cannot be
downloaded without ``HF_TOKEN``; without this check compose would start and the policy server fail in its log.
Standard library only: it runs before the virtualenv exists.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

GATED = ("google/gemma", "meta-llama/", "mistralai/")  # families whose weights need an accepted licence
DEFAULT_MODEL = "google/gemma-2-2b"  # docker-compose.yml's default POLICY_MODEL


def read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.strip().startswith("#"):
            out[key.strip()] = value.split(" #")[0].strip().strip("\"'")
    return out


def problem(env: dict[str, str]) -> str | None:
    model = env.get("POLICY_MODEL") or DEFAULT_MODEL
    token = env.get("HF_TOKEN") or os.environ.get("HF_TOKEN", "")
    if model.lower().startswith(GATED) and not token:
        return (
            f"POLICY_MODEL={model} is gated on the Hugging Face Hub and HF_TOKEN is empty: accept its licence on "
            "the Hub, set HF_TOKEN=<your token> in .env (or pick an open model: POLICY_MODEL and the recipe's "
            "[trainer] model), then run make up again."
        )
    return None


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else ".env")
    message = problem(read_env(path)) if path.is_file() else None
    if message:
        print(f">> {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
