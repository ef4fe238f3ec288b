"""``python -m services.trainer train``: run the trainer (SFT demonstrations come from ``python -m tools.make_sft``).

    python -m services.trainer train --recipe configs/tiny-cpu.toml --redis-url redis://127.0.0.1:6379/0
    torchrun --nproc_per_node 2 -m services.trainer train --zero-stage 2 ...    (multi-process)
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 1 --master_addr HOST0 --master_port 29500 \
        -m services.trainer train ...                                             (and --node_rank 1 on HOST1)

Settings: defaults < recipe ``[trainer]`` < ``CODA_TRAINER_*`` env < flags. torch, DeepSpeed and
transformers are imported only after the arguments are parsed, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from services.trainer.config import TrainerSettings

if TYPE_CHECKING:
    from shared.retry import Patience


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.trainer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser(
        "train",
        help="consume trajectory groups, train, checkpoint, publish weights",
        description="GRPO (+ RED SFT co-training) from the Redis stream. "
        "The deepspeed launcher's --local_rank is accepted and ignored.",
    )
    train.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    TrainerSettings.add_arguments(train)
    return parser


def train(args: argparse.Namespace) -> int:
    from shared.log import configure_logging, get_logger

    configure_logging()
    settings = TrainerSettings.from_args(args)
    from services.trainer.app import build_app, serve_in_thread
    from services.trainer.batches import lost_rank
    from services.trainer.loop import Trainer
    from shared.retry import DependencyDown

    log = get_logger(__name__)
    holder: dict = {}
    app, registry = build_app(lambda: holder.get("trainer"))
    stop = threading.Event()
    trainer = Trainer(settings, registry, stop)
    holder["trainer"] = trainer
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if settings.port and os.environ.get("RANK", "0") == "0":  # /health answers 503 until setup is done
        serve_in_thread(app, settings.host, settings.port)
    try:
        if os.environ.get("RANK", "0") == "0":
            announce_contract(settings, trainer.patience)
        trainer.setup()
        state = trainer.run(stop)
    except Exception as exc:
        if isinstance(exc, DependencyDown) and stop.is_set() and not trainer.ready.is_set():
            # Told to stop while waiting for Redis or the server at start-up: nothing was trained or lost.
            log.warning("stopped while waiting for a dependency at start-up")
            return 0
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            raise
        if lost_rank(exc):
            log.error(
                "another rank died, hangs or is unreachable (a collective failed or waited collective_timeout_s): "
                "the job stops; start the same command on every node to resume from the last checkpoint",
                extra={"rank": os.environ.get("RANK"), "error": f"{type(exc).__name__}: {exc}"[:400]},
            )
        else:
            log.exception("this rank failed: the job stops", extra={"rank": os.environ.get("RANK")})
        # Not the interpreter's teardown: it can wait forever on the process group's threads (work a gone peer
        # never matches), and torchrun only acts once this process has exited. Its exit ends the other ranks'
        # collectives at once; torchrun then stops this node's other ranks.
        logging.shutdown()
        os._exit(1)
    print(f"trained {state.step} steps, policy version {state.version}")
    return 0


def announce_contract(settings: TrainerSettings, patience: Patience) -> None:
    """Announce the pipeline contract in Redis, or refuse to start when the rollout's (or an earlier
    trainer's) differs (``shared.contract``). Before the model is built, so a refusal comes at once; waits
    for Redis like every start-up call (``patience``)."""
    import redis

    from shared.contract import announce

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10)  # a frozen Redis is waited out too
    try:
        patience.call("redis", announce, client, settings.contract(), "trainer")
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
