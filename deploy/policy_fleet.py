"""A compose override with N vLLM policy servers, one GPU each, for the gpu profile.

vLLM has no heartbeat of its own to announce itself in Redis (``shared.server_registry``), so the rollout is
told the extra servers by name: ``[rollout] inference_urls`` through ``CODA_ROLLOUT_INFERENCE_URLS``. Server 1
is the compose file's ``policy``. The trainer writes and announces each new version; the rollout loads it into
every server, this one included (docs/scaling-out.md, "A fleet of policy servers"), with the control token that vLLM takes
as its API key.

Each extra server is a copy of ``policy`` (same image, model, flags, volumes) with its own GPU
(``POLICY_GPU_K``, default K-1), its own host port (``POLICY_HOST_PORT_K``, default 8010+K) and a fraction of
its GPU that it does not share with the trainer (``VLLM_FLEET_GPU_MEMORY``, default 0.85).

    python deploy/policy_fleet.py 4 > docker-compose.fleet.yml
    docker compose -f docker-compose.yml -f docker-compose.fleet.yml --profile gpu up -d
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
PORT = 8002  # vLLM's port inside every policy container (the compose file's)


def server_name(k: int) -> str:
    return "policy" if k == 1 else f"policy-{k}"


def fleet_override(n: int, compose: dict[str, Any]) -> dict[str, Any]:
    """The override document for ``n`` policy servers (``n`` ≥ 2), built from ``compose``'s ``policy``."""
    if n < 2:
        raise ValueError(f"a fleet needs at least 2 policy servers, got {n}")
    base = compose["services"]["policy"]
    services: dict[str, Any] = {}
    for k in range(2, n + 1):
        server = copy.deepcopy(base)
        server["command"] = [
            "--gpu-memory-utilization=${VLLM_FLEET_GPU_MEMORY:-0.85}"
            if str(arg).startswith("--gpu-memory-utilization=")
            else arg
            for arg in base["command"]
        ]
        server["ports"] = [f"${{BIND_ADDRESS:-127.0.0.1}}:${{POLICY_HOST_PORT_{k}:-{8010 + k}}}:{PORT}"]
        for device in server["deploy"]["resources"]["reservations"]["devices"]:
            device["device_ids"] = [f"${{POLICY_GPU_{k}:-{k - 1}}}"]
        services[server_name(k)] = server
    urls = [f"http://{server_name(k)}:{PORT}" for k in range(2, n + 1)]
    # Merged into the rollout's environment (compose merges mappings key by key).
    services["rollout"] = {"environment": {"CODA_ROLLOUT_INFERENCE_URLS": json.dumps(urls)}}
    return {"services": services}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("servers", type=int, help="policy servers in all, the compose file's `policy` included (>= 2)")
    parser.add_argument("--compose-file", type=Path, default=COMPOSE_FILE)
    args = parser.parse_args(argv)
    if args.servers < 2:
        parser.error(f"servers must be at least 2 (got {args.servers}): one is the compose file's `policy`")
    compose = yaml.safe_load(args.compose_file.read_text())
    header = f"# {args.servers} vLLM policy servers: written by deploy/policy_fleet.py {args.servers} (do not edit)\n"
    sys.stdout.write(header + yaml.safe_dump(fleet_override(args.servers, compose), sort_keys=False, width=120))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
