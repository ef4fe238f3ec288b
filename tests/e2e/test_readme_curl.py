"""The curl examples of docs/services.md ("Every API with curl"), run as written against the local stack (ports
mapped to the stack's). They were the README's until the README became a front door."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "services.md"
DEFAULT_PORTS = {8000: "retriever", 8001: "searcher", 8002: "inference", 8003: "trainer", 8004: "rollout"}


def readme_curl_commands() -> list[str]:
    text = DOC.read_text()
    block = re.search(r"<!-- curl-examples -->\s*```bash\n(.*?)```\s*<!-- /curl-examples -->", text, re.S)
    assert block, f"{DOC.name} has no curl-examples block"
    joined = block.group(1).replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("curl ")]


def test_readme_has_an_example_per_service():
    commands = readme_curl_commands()
    ports = {int(p) for c in commands for p in re.findall(r"localhost:(\d+)", c)}
    assert ports == set(DEFAULT_PORTS)


@pytest.mark.slow
def test_readme_curl_examples_run(local_stack):
    stack, sup, sft = local_stack
    actual = {name: getattr(stack.ports, name) for name in DEFAULT_PORTS.values()}
    trainer, rollout = stack.start_training(sup, sft, tag="curl", CODA_TRAINER_MAX_STEPS="1000")
    try:
        for command in readme_curl_commands():
            for default, name in DEFAULT_PORTS.items():
                command = command.replace(f"localhost:{default}", f"127.0.0.1:{actual[name]}")
            command = command.replace("curl -s", "curl -sS --fail-with-body --max-time 120", 1)
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            out = done.stdout.strip()
            assert out, command
            if "| grep" not in command and "/metrics" not in command:
                json.loads(out)  # every API answers JSON
    finally:
        stack.processes.stop(sup, trainer, rollout)
