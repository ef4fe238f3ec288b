"""``python -m services.rollout {serve,eval,sync-weights}`` — the rollout service's command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.rollout.config import RolloutSettings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.rollout",
        description="Rollout service: agent episodes → scored trajectory groups on Redis.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the producer with its status API (/health, /metrics, /status)")
    RolloutSettings.add_arguments(serve)
    ev = sub.add_parser(
        "eval",
        help="greedy episodes on a split; EM/F1 per data source as a table and JSON",
        description="Example: python -m services.rollout eval --recipe configs/coda.toml --split eval "
        "(or --recipe coda: configs/coda.toml when present, else the coda agent "
        "with defaults)",
    )
    RolloutSettings.add_arguments(ev)
    sync = sub.add_parser(
        "sync-weights",
        help="only the weight sync: follow the weights stream and load every announced version into every "
        "policy server (for a trainer that trains on no episodes: [trainer] sft_only)",
    )
    RolloutSettings.add_arguments(sync)
    return p


def resolve_recipe(args: argparse.Namespace) -> argparse.Namespace:
    """``--recipe coda`` is friendly shorthand: ``configs/coda.toml`` when it exists, else ``--agent coda``."""
    from agents import AGENTS

    name = getattr(args, "recipe", None)
    if name in AGENTS and not Path(name).is_file():
        config = Path("configs") / f"{name}.toml"
        args.recipe = str(config) if config.is_file() else None
        if args.setting__agent is None:
            args.setting__agent = name
    return args


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from shared.log import configure_logging

    configure_logging()
    settings = RolloutSettings.from_args(resolve_recipe(args))
    if args.command == "eval":
        from services.rollout.eval import format_table, run_eval

        path, result = run_eval(settings)
        # The table is the command's output (stdout), not a log line.
        print(format_table(result))
        print(f"\n{len(result['rows'])} prompts, {result['failed']} failed, {result['seconds']} s → {path}")
        return
    if args.command == "sync-weights":
        import asyncio

        from services.rollout.weight_sync import run_alone

        asyncio.run(run_alone(settings))
        return
    import uvicorn

    from services.rollout.app import build_app

    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
