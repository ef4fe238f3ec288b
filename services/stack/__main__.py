"""``python -m services.stack train``: run a recipe end to end with every service as a local process.

    python -m services.stack train --recipe configs/tiny-cpu.toml

This is what ``make train`` runs: no Docker, no GPU, a tiny model built on the spot, bundled data.
"""

from __future__ import annotations

import argparse
import sys
import time

from services.stack.config import StackSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.stack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="build, start, evaluate, train, evaluate again; print a summary")
    StackSettings.add_arguments(train)
    sub.add_parser("config-reference", help="print the configuration reference (markdown) of every service")
    plots = sub.add_parser("plots", help="redraw a run's PNG plots (reward components, losses) from its log")
    plots.add_argument("--run", default=None, help="run folder (default: the newest under runs/train)")
    args = parser.parse_args(argv)
    if args.command == "config-reference":
        from services.stack.reference import render

        print(render(), end="")
        return 0
    if args.command == "plots":
        return draw_plots(args.run)
    if not args.recipe:
        parser.error("--recipe is required (e.g. configs/tiny-cpu.toml)")

    from services.stack.supervisor import ServiceFailed
    from services.stack.train import LocalStack
    from shared.log import configure_logging

    configure_logging()
    stack = LocalStack(args.recipe, StackSettings.from_args(args), say=say)
    try:
        print(stack.run_all())
    except KeyboardInterrupt:
        say("interrupted: every service was stopped")
        return 130
    except (ServiceFailed, RuntimeError, FileNotFoundError) as exc:
        say(f"FAILED: {exc}")
        return 1
    return 0


def say(message: str) -> None:
    """A progress line of `make train` for the person at the terminal."""
    print(f"[make train {time.strftime('%H:%M:%S')}] {message}", flush=True)


def draw_plots(run: str | None) -> int:
    from pathlib import Path

    from services.trainer.observe import Observer

    runs = sorted(Path(StackSettings.load().run_root).glob("*/trainer/train.jsonl"))
    log_dir = Path(run) / "trainer" if run else (runs[-1].parent if runs else None)
    if log_dir is None or not (log_dir / "train.jsonl").is_file():
        print("no training log found: run `make train` first, or pass --run DIR", file=sys.stderr)
        return 1
    Observer(None, str(log_dir)).plot()
    for png in sorted(log_dir.glob("*.png")):
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
