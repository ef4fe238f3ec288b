"""Capture the vLLM response fixtures (``tests/fixtures/vllm/*.json``) from a live vLLM OpenAI server.

Run it on a GPU host against the server ``deploy/vllm/serve.sh`` starts (dev mode and runtime LoRA on):

    MODEL=Qwen/Qwen2.5-0.5B-Instruct deploy/vllm/serve.sh &
    python deploy/vllm/record_fixtures.py --url http://localhost:8002 \\
        --adapter /path/to/a/peft/lora --weights /path/to/full/safetensors/dir

It sends the requests the stack sends (each fixture's own ``request``; the prompt comes from the live model's
``/tokenize`` of a short chat, or ``--prompt-ids``) and writes what comes back into the fixture files, with
``source`` naming the server, its version and the date. A fixture exists to show one case (a stop-string stop
next to a length stop; an EOS stop next to a stop-token stop), so the stop string and stop token are chosen from
a first, unconstrained sample of the same seed, and other seeds are tried until the case shows. Whatever could
not be captured (a case that never showed, a route the server lacks, the legacy shape of vLLM <= 0.10) is
listed at the end and its old content is kept. Exit status: 0 when everything current was captured, 1 if not.

It runs against our CPU server too (``python -m services.inference serve``), which is how it is tested.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from shared.auth import bearer_headers
from shared.inference_client import error_message

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm"
ADAPTER_NAME = "policy-v3"


class Recorder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        # The stack's control token when one is set: a vLLM started with VLLM_API_KEY guards /v1 with it.
        self.http = httpx.Client(base_url=args.url.rstrip("/"), timeout=args.timeout, headers=bearer_headers())
        self.missing: list[str] = []
        self.written: list[str] = []
        version = self.http.get("/version")
        self.version = version.json().get("version", "?") if version.status_code == 200 else "unknown"
        self.source = (
            f"captured from a live server ({args.url}, /version: {self.version}) on "
            f"{time.strftime('%Y-%m-%d', time.gmtime())} by deploy/vllm/record_fixtures.py"
        )

    # ------------------------------------------------------------------ helpers
    def load(self, name: str) -> dict[str, Any]:
        return json.loads((self.args.out / name).read_text())

    def save(self, name: str, data: dict[str, Any]) -> None:
        data["source"] = self.source
        path = self.args.out / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(path)
        self.written.append(name)

    def base_model(self) -> tuple[str, int]:
        card = self.http.get("/v1/models").raise_for_status().json()["data"][0]
        return card["id"], int(card.get("max_model_len") or 2048)

    def prompt(self, model: str) -> list[int]:
        if self.args.prompt_ids:
            return [int(x) for x in self.args.prompt_ids.split(",")]
        r = self.http.post(
            "/tokenize",
            json={
                "model": model,
                "add_generation_prompt": True,
                "messages": [{"role": "user", "content": self.args.prompt_text}],
            },
        )
        if r.status_code != 200:
            raise SystemExit(f"/tokenize answered {r.status_code}; pass --prompt-ids instead")
        return r.json()["tokens"]

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"/v1/completions answered {r.status_code}: {r.text[:300]}")
        return r.json()

    # ------------------------------------------------------------------ completions
    def stop_and_length(self, model: str, prompt: list[int]) -> None:
        """Choice 0 stops on a stop string (kept in the text), choice 1 runs to max_tokens."""
        data = self.load("completion_stop_and_length.json")
        for seed in range(self.args.seeds):
            base = {**data["request"], "model": model, "prompt": prompt, "seed": seed, "stop": []}
            free = self.complete(base)["choices"]
            first, second = (c["text"] for c in sorted(free, key=lambda c: c["index"]))
            words = [w for w in first.split()[1:] if w.isalnum() and w not in second]
            if not words:
                continue
            request = {**base, "stop": [words[0]]}
            response = self.complete(request)
            a, b = sorted(response["choices"], key=lambda c: c["index"])
            if (a["finish_reason"], a["stop_reason"], b["finish_reason"]) == ("stop", words[0], "length"):
                self.save("completion_stop_and_length.json", {"request": request, "response": response})
                return
        self.missing.append("completion_stop_and_length.json: no seed gave a stop-string stop beside a length stop")

    def eos_and_stop_token(self, model: str, prompt: list[int]) -> None:
        """Choice 0 ends on EOS (stop_reason null), choice 1 on a ``stop_token_ids`` id (stop_reason = it)."""
        data = self.load("completion_eos_and_stop_token.json")
        for seed in range(self.args.seeds):
            base = {
                **data["request"],
                "model": model,
                "prompt": prompt,
                "seed": seed,
                "stop_token_ids": [],
                "max_tokens": self.args.eos_max_tokens,
            }
            free = sorted(self.complete(base)["choices"], key=lambda c: c["index"])
            a, b = free
            if not (a["finish_reason"] == "stop" and a["stop_reason"] is None and a.get("token_ids")):
                continue
            ids = [t for t in (b.get("token_ids") or [])[1:] if t not in a["token_ids"]]
            if not ids:
                continue
            request = {**base, "stop_token_ids": [ids[0]]}
            response = self.complete(request)
            x, y = sorted(response["choices"], key=lambda c: c["index"])
            if (x["finish_reason"], x["stop_reason"], y["finish_reason"], y["stop_reason"]) == (
                "stop",
                None,
                "stop",
                ids[0],
            ):
                self.save("completion_eos_and_stop_token.json", {"request": request, "response": response})
                return
        self.missing.append(
            "completion_eos_and_stop_token.json: no seed gave an EOS stop beside a stop-token stop "
            "(try --prompt-text with a question the model answers briefly)"
        )

    # ------------------------------------------------------------------ models, admin, errors
    def admin_models_errors(self, base: str, max_len: int, prompt: list[int]) -> None:
        admin, errors = self.load("admin.json"), self.load("errors.json")
        cases = {c["what"]: c for c in errors["cases"]}

        def case(what: str, r: httpx.Response) -> None:
            if r.status_code < 400:
                self.missing.append(f"errors.json '{what}': answered {r.status_code}, not an error")
                return
            try:
                body = r.json()
            except ValueError:
                body = {"text": r.text}
            cases[what] = {"what": what, "status": r.status_code, "body": body, "message": error_message(r)}

        case(
            "unknown model (current ErrorResponse shape)",
            self.http.post("/v1/completions", json={"model": "policy-v99", "prompt": prompt, "max_tokens": 4}),
        )
        # vLLM >= 0.2x caps max_tokens at the room the context leaves; only a prompt longer than the context fails.
        long_prompt = (prompt * (max_len // max(len(prompt), 1) + 2))[: max_len + 8]
        case(
            "prompt longer than the context",
            self.http.post("/v1/completions", json={"model": base, "prompt": long_prompt, "max_tokens": 4}),
        )
        case(
            "negative max_tokens",
            self.http.post("/v1/completions", json={"model": base, "prompt": prompt, "max_tokens": -1}),
        )
        case("unload of an unknown adapter", self.http.post("/v1/unload_lora_adapter", json={"lora_name": "policy-v1"}))
        case("dev route HTTPException (collective_rpc without method)", self.http.post("/collective_rpc", json={}))
        got_models = False
        if self.args.adapter:
            body = {"lora_name": ADAPTER_NAME, "lora_path": str(self.args.adapter)}
            r = self.http.post("/v1/load_lora_adapter", json=body)
            admin["load_lora_adapter"] = {"request": body, "status": r.status_code, "text": r.text}
            case("LoRA already loaded", self.http.post("/v1/load_lora_adapter", json=body))
            self.save("models.json", {"response": self.http.get("/v1/models").raise_for_status().json()})
            got_models = True
            self.stop_and_length(ADAPTER_NAME, prompt)  # the stack samples from the adapter by its name
            unload = {"lora_name": ADAPTER_NAME}
            r = self.http.post("/v1/unload_lora_adapter", json=unload)
            admin["unload_lora_adapter"] = {"request": unload, "status": r.status_code, "text": r.text}
        else:
            self.missing.append("models.json, admin.json LoRA routes, 'LoRA already loaded': pass --adapter")
            self.stop_and_length(base, prompt)
        for key, method, path in (
            ("pause", "post", "/pause?mode=wait"),
            ("is_paused", "get", "/is_paused"),
            ("resume", "post", "/resume"),
        ):
            r = self.http.request(method.upper(), path)
            if r.status_code == 200:
                entry = {"status": r.status_code, "response": r.json()}
                admin[key] = {"request_query": {"mode": "wait"}, **entry} if key == "pause" else entry
            else:
                self.missing.append(f"admin.json {key}: {path} answered {r.status_code} (VLLM_SERVER_DEV_MODE=1?)")
        if self.args.weights:
            body = {"method": "update_weights_from_path", "args": [str(self.args.weights)], "kwargs": {"version": "7"}}
            self.http.post("/pause", params={"mode": "wait"})
            r = self.http.post("/collective_rpc", json=body)
            self.http.post("/reset_prefix_cache")
            self.http.post("/resume")
            admin["collective_rpc"] = {"request": body, "status": r.status_code, "response": r.json()}
        else:
            self.missing.append("admin.json collective_rpc: pass --weights")
        self.save("admin.json", admin)
        errors["cases"] = list(cases.values())
        self.save("errors.json", errors)
        if not got_models:
            self.save("models.json", {"response": self.http.get("/v1/models").raise_for_status().json()})

    def run(self) -> int:
        base, max_len = self.base_model()
        prompt = self.prompt(base)
        self.admin_models_errors(base, max_len, prompt)
        self.eos_and_stop_token(base, prompt)
        print(f"server {self.args.url} (version {self.version}); wrote: {', '.join(sorted(set(self.written)))}")
        print("kept: completion_legacy_no_token_ids.json and the flat error shape (vLLM <= 0.10 only)")
        for line in self.missing:
            print(f"not captured: {line}")
        print(f"check: CODA_VLLM_FIXTURES={self.args.out} pytest tests/unit/inference/test_vllm_contract.py")
        return 0 if not self.missing else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    p.add_argument("--url", default="http://localhost:8002", help="the OpenAI server's base URL")
    p.add_argument("--out", type=Path, default=FIXTURES, help="fixture folder to update in place")
    p.add_argument("--adapter", help="a PEFT LoRA folder the server can read (loaded as policy-v3)")
    p.add_argument("--weights", help="a safetensors folder for update_weights_from_path (the same model's weights)")
    p.add_argument("--prompt-ids", help="comma-separated prompt token ids (default: /tokenize of --prompt-text)")
    p.add_argument("--prompt-text", default="Say hello in one word.", help="the user turn to tokenize")
    p.add_argument("--seeds", type=int, default=20, help="seeds to try per case")
    p.add_argument("--eos-max-tokens", type=int, default=64, help="token budget of the EOS case")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args = p.parse_args(argv)
    return Recorder(args).run()


if __name__ == "__main__":
    sys.exit(main())
