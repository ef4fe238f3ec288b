"""Helpers for the trainer's integration tests: a tiny model folder, random groups, a trainer subprocess, the
real inference server and the rollout's weight sync beside it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from shared.protocol import Sample, TrajectoryGroup
from tests.precision import FP32_ENV

REPO = Path(__file__).resolve().parents[3]
VOCAB = 64


def save_tiny_model(path: Path) -> Path:
    from tests.unit.trainer.tiny import tiny_qwen2

    tiny_qwen2(vocab=VOCAB).save_pretrained(path)
    return path


def random_group(rng: random.Random, index: int, version: int = 0) -> TrajectoryGroup:
    samples = []
    for j in range(rng.randrange(2, 5)):
        prompt, gen = rng.randrange(2, 8), rng.randrange(2, 12)
        n = prompt + gen
        samples.append(
            Sample(
                sample_id=f"s{j}",
                token_ids=[rng.randrange(VOCAB) for _ in range(n)],
                prompt_len=prompt,
                loss_mask=[0] * prompt + [1] * gen,
                logprobs=[0.0] * prompt + [-4.0] * gen,
                versions=[-1] * prompt + [version] * gen,
                reward=rng.random(),
                reward_components={"f1": rng.random()},
            )
        )
    return TrajectoryGroup(
        group_id=f"g{index:04d}",
        prompt_id=f"p{index}",
        agent="test",
        policy_version=version,
        samples=samples,
        created_at=time.time(),
    )


def sft_file(path: Path, rng: random.Random, n: int = 6) -> Path:
    rows = []
    for _ in range(n):
        ids = [rng.randrange(VOCAB) for _ in range(rng.randrange(6, 14))]
        rows.append({"token_ids": ids, "loss_mask": [0] * 3 + [1] * (len(ids) - 3)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trainer_env(**faults: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODA_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **faults)
    env.update({name: os.environ.get(name, value) for name, value in FP32_ENV.items()})  # tests/precision.py
    return env


def trainer_args(tmp: Path, model: Path, url: str, *extra: str) -> list[str]:
    """The trainer's command line of these tests: ``model``, Redis at ``url``, checkpoints, weights and logs
    under ``tmp``, any free port, tiny micro-batches, short Redis reads, no staleness limit; then ``extra``."""
    return [
        "--model",
        str(model),
        "--redis-url",
        url,
        "--checkpoint-dir",
        str(tmp / "ckpt"),
        "--weights-dir",
        str(tmp / "w"),
        "--log-dir",
        str(tmp / "logs"),
        "--port",
        "0",
        "--micro-batch-tokens",
        "48",
        "--read-block-ms",
        "100",
        "--max-staleness",
        "1000",
        *extra,
    ]


def start_trainer(args: list[str], log: Path, **env: str) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "services.trainer", "train", *args],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=trainer_env(**env),
        )


def start_weight_sync(redis_url: str, inference_url: str, log: Path, *extra: str) -> subprocess.Popen:
    """The rollout's weight sync alone (``python -m services.rollout sync-weights``): it loads what the trainer
    announces into the server at ``inference_url``, as the rollout does in a full pipeline (the trainer loads
    nothing)."""
    args = ["--redis-url", redis_url, "--inference-url", inference_url, "--servers-key", "", "--fleet-probe-s", "0.2"]
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "services.rollout", "sync-weights", *args, *extra],
            cwd=REPO,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=trainer_env(),
        )


def checkpoint_state(root: Path) -> dict:
    from services.trainer import checkpoint

    return json.loads((checkpoint.latest(root) / "state.json").read_text())


def optimizer_steps(root: Path) -> tuple[int, int]:
    """(DeepSpeed global_steps, AdamW step count) stored in the latest checkpoint."""
    from services.trainer import checkpoint

    folder = checkpoint.latest(root) / checkpoint.DS_TAG
    states = torch.load(next(folder.glob("*model_states.pt")), weights_only=False)
    adam = states["optimizer"]["state"]
    return int(states["global_steps"]), int(next(iter(adam.values()))["step"])


def start_server(
    model: Path,
    weights_root: Path,
    extra: tuple[str, ...] = (),
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    prefix: tuple[str, ...] | list[str] = (),
    log_name: str = "server.log",
) -> tuple[subprocess.Popen, str]:
    """The real CPU inference server on ``host``:``port`` (default: a free port on 127.0.0.1), serving ``model``
    as ``policy``; ``prefix`` runs it through a wrapper (another host: ``ip netns exec NS``)."""
    from shared.redis_server import free_port

    port = port or free_port()
    # WARNING level: quieter test logs.
    env = {**trainer_env(), "CODA_LOG_LEVEL": "WARNING"}
    with open(weights_root / log_name, "ab") as fh:
        proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "services.inference",
                "serve",
                "--model",
                str(model),
                "--host",
                host,
                "--port",
                str(port),
                "--served-model-name",
                "policy",
                "--weights-root",
                str(weights_root),
                "--threads",
                "1",
                *extra,
            ],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    return proc, f"http://{host}:{port}"
