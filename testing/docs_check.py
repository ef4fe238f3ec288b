"""The docs check that ``make lint`` runs: the README and ``docs/`` cannot rot silently.

    python -m testing.docs_check            # exit 1 and one line per problem

It checks, in ``README.md``, ``tests/README.md``, ``bench/README.md`` and ``docs/*.md``:
- every relative link resolves: the file (or folder) exists, and a ``#anchor`` names a heading of the target;
- the generated pages are what their generators print now (``docs/configuration.md``, ``docs/metrics.md``);
- every number quoted from a results file between ``<!-- from: bench/results/x.md: TEMPLATE -->`` and
  ``<!-- end -->`` is what that file says now (the syntax: ``check_snippets``; ``--write`` rewrites them);
- every example command parses: ``make <target>`` names a target of the Makefile, and every ``--flag`` of a
  ``python -m <module> [subcommand] …`` or ``python <script>.py …`` example appears in that command's
  ``--help`` (run once per command, so only argparse is exercised).

And in every tracked ``.py``, ``.toml``, ``.yml``, ``.sh``, ``Makefile``, ``Dockerfile*`` and ``.env.example``
(comments, docstrings and the strings ``--help`` prints): every pointer to a section of a page (``README
"Security"``, ``docs/x.md ("A heading")``, ``docs/x.md#anchor``, ``PAGE.md § 9``) names a file and a heading
that exist.

Examples are read from fenced code blocks and from inline code spans. A generated page's own examples are
checked like any other.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from testing.docs_pages import (
    INLINE,
    LINK,
    REPO,
    Problem,
    anchors,
    doc_files,
    slug,
    split_text,
    without_code_spans,
)
from testing.docs_snippets import check_snippets

# Generated pages: path → (module, function that renders it, the command that writes it).
GENERATED = {
    "docs/configuration.md": ("launcher.reference", "render", "python -m launcher config-reference"),
    "docs/metrics.md": ("tools.glossary", "render", "python -m tools.glossary"),
}
SHELL_END = re.compile(r"\s(?:\||&&|;|>|2>|<)\s|\s#")  # where one command of a line ends


def check_links(path: Path, root: Path = REPO) -> list[Problem]:
    """Every relative link of ``path`` resolves, anchors included."""
    text = path.read_text()
    problems = []
    for number, line in split_text(text)[0]:
        for target in LINK.findall(without_code_spans(line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            where = f"{path.relative_to(root)}:{number}"
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(Problem(where, f"link to {target}: no such file"))
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                problems.append(Problem(where, f"link to {target}: no heading #{anchor} in {dest.name}"))
    return problems


# ---------------------------------------------------------------- example commands
def example_commands(text: str) -> list[tuple[int, str]]:
    """Shell commands of the page: each line of a code block (continuations joined) and each inline code span
    that starts a ``make`` or ``python`` command, as (line number, command)."""
    prose, code = split_text(text)
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in code:
        if pending is not None:
            start, before = pending
            line, number = before + " " + line.strip(), start
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
            continue
        out.append((number, line.strip()))
    for number, line in prose:
        for _, span in INLINE.findall(line):
            out.append((number, span.strip()))
    return out


def _words(command: str) -> list[str]:
    command = SHELL_END.split(" " + command.strip())[0]
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: take the plain words
        words = command.split()
    return words[:1] + [w.strip("[]") for w in words[1:]]  # `[--faiss HNSW32]`: an optional flag


def make_invocation(command: str) -> tuple[str, list[str]] | None:
    """``make [VAR=x] target [VAR=x]…`` → (target, variables); None when the command is no make example."""
    words = _words(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # CODA_X=1 make train
        words = words[1:]
    if not words or words[0] != "make" or len(words) < 2:
        return None
    targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
    if not targets or not re.match(r"^[a-z][a-z0-9_-]*$", targets[0]):
        return None  # `make <target>`, prose
    return targets[0], [w.split("=", 1)[0] for w in words[1:] if "=" in w]


def python_invocation(command: str) -> tuple[list[str], list[str]] | None:
    """``[ENV=x] [.venv/bin/]python[3] -m module [sub] --flags`` (or ``torchrun … -m module``, or ``python
    script.py``) → (the command to ask for ``--help``, its flags); None otherwise."""
    words = _words(command)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words or not re.search(r"(^|/)(python3?(\.\d+)?|torchrun)$", words[0]):
        return None
    rest = words[1:]
    if "-m" in rest:
        i = rest.index("-m")
        if i + 1 >= len(rest):
            return None
        head, rest = ["-m", rest[i + 1]], rest[i + 2 :]
    elif words[0].endswith("torchrun"):
        return None
    elif rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        head, rest = [rest[0]], rest[1:]
    else:
        return None
    if not re.match(r"^[\w./-]+$", head[-1]):
        return None
    if rest and re.match(r"^[a-z][a-z0-9-]*$", rest[0]):  # a subcommand
        head.append(rest[0])
    flags = [w.split("=", 1)[0] for w in rest if re.match(r"^--[a-z][a-z0-9_-]*", w)]
    return head, flags


def makefile_targets(makefile: Path) -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9_-]*):(?!=)", makefile.read_text(), re.M))


def makefile_variables(makefile: Path) -> set[str]:
    """Variables the Makefile reads or sets (``$(VAR)``, ``VAR ?=``, ``VAR :=``)."""
    text = makefile.read_text()
    return set(re.findall(r"\$\(([A-Z_][A-Z0-9_]*)\)", text)) | set(
        re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:+]?=", text, re.M)
    )


def check_examples(
    path: Path,
    make: tuple[set[str], set[str]],
    help_of: Callable[[tuple[str, ...]], str | None],
    root: Path = REPO,
) -> list[Problem]:
    """Every make example names a target (``make``: the Makefile's targets and variables) and only variables
    the Makefile reads; every python example's flags appear in its ``--help``.
    ``help_of(head)``: the help text of ``python <head> --help``, None when that command does not exist."""
    problems = []
    for number, command in example_commands(path.read_text()):
        where = f"{path.relative_to(root)}:{number}"
        if (invocation := make_invocation(command)) is not None:
            target, variables = invocation
            if target not in make[0]:
                problems.append(Problem(where, f"`{command}`: the Makefile has no target {target!r}"))
            for name in variables:
                if name not in make[1]:
                    problems.append(Problem(where, f"`{command}`: the Makefile reads no variable {name}"))
            continue
        if (python := python_invocation(command)) is None:
            continue
        head, flags = python
        text = help_of(tuple(head))
        if text is None and len(head) > 1 and head[0] == "-m" and len(head) == 3:
            head = head[:2]  # the word after the module was an argument, not a subcommand
            text = help_of(tuple(head))
        if text is None:
            problems.append(Problem(where, f"`{command}`: `python {' '.join(head)} --help` fails"))
            continue
        for flag in flags:
            if flag != "--help" and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                problems.append(Problem(where, f"`{command}`: {' '.join(head)} accepts no {flag}"))
    return problems


class HelpCache:
    """``python <head> --help`` of each command once, run from the repository root."""

    def __init__(self, root: Path = REPO, python: str = sys.executable) -> None:
        self.root, self.python, self.done = root, python, {}

    def __call__(self, head: tuple[str, ...]) -> str | None:
        if head not in self.done:
            if head[0] != "-m" and not (self.root / head[0]).is_file():
                self.done[head] = None
            else:
                run = subprocess.run(
                    [self.python, *head, "--help"],
                    cwd=self.root,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    env=_env(self.root),
                )
                self.done[head] = run.stdout if run.returncode == 0 else None
        return self.done[head]


def _env(root: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "200"  # argparse wraps long flags otherwise
    return env


# ---------------------------------------------------------------- generated pages
def check_generated(root: Path = REPO, pages: Iterable[str] = GENERATED) -> list[Problem]:
    import importlib

    problems = []
    for rel in pages:
        module, function, command = GENERATED[rel]
        want = getattr(importlib.import_module(module), function)()
        path = root / rel
        if not path.is_file() or path.read_text() != want:
            problems.append(Problem(rel, f"not current: regenerate with `{command} > {rel}`"))
    return problems


# ---------------------------------------------------------------- pointers from the code to the docs
# Comments, docstrings and --help texts name a section of a page: README "Security", README, "Security",
# README § Security, docs/scaling-out.md ("A fleet of policy servers"), docs/x.md#anchor, docs/architecture.md §2.
POINTER_EXAMPLES = {"testing/docs_check.py", "tests/unit/testing/test_docs_check.py"}  # they show the forms
POINTER_FILES = ("*.py", "*.toml", "*.yml", "*.yaml", "*.sh", "Makefile", "Dockerfile*", ".env.example")
PAGE = r"(?P<page>README(?:\.md)?|[\w./-]+\.md)"
POINTER = re.compile(
    PAGE
    + r"(?:(?P<anchor>#[\w-]+)|(?:,? \(?|\()[\"“](?P<quoted>[^\"”]{1,120})[\"”]|,? ?§ ?(?P<section>[\w.]+(?: [\w-]+){0,5}))"
)


def pointer_files(root: Path = REPO) -> list[Path]:
    """The tracked files whose comments and strings may point into the docs."""
    run = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    names = run.stdout.split() if run.returncode == 0 else [str(p.relative_to(root)) for p in root.rglob("*")]
    out = []
    for name in names:
        path = root / name
        if name in POINTER_EXAMPLES:
            continue
        if path.is_file() and any(path.match(pattern) for pattern in POINTER_FILES):
            out.append(path)
    return out


def check_pointers(path: Path, root: Path = REPO) -> list[Problem]:
    """Every section a comment or string of ``path`` points to is a heading of that page."""
    text = path.read_text(errors="replace")
    problems = []
    for match in POINTER.finditer(text):
        page = match.group("page")
        page = "README.md" if page == "README" else page
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
        dest = next((p for p in (root / page, path.parent / page) if p.is_file()), None)
        if dest is None:
            problems.append(Problem(where, f"points to {match.group(0)!r}: no such file {page}"))
            continue
        headings = anchors(dest.read_text())
        if match.group("anchor"):
            wanted = match.group("anchor")[1:]
        else:  # a quoted or § section name; a line break inside it is a comment's continuation
            words = re.sub(r"\s*\n\s*(?:#|\*|//)?\s*", " ", match.group("quoted") or match.group("section")).split()
            # a quoted name is the heading or its start; after § the name's end is unknown: any leading words
            tries = [words] if match.group("quoted") else [words[:n] for n in range(len(words), 0, -1)]
            if not any(_names_heading(slug(" ".join(w)), headings) for w in tries):
                problems.append(Problem(where, f"points to {match.group(0)!r}: {page} has no such heading"))
            continue
        if wanted not in headings:
            problems.append(Problem(where, f"points to {match.group(0)!r}: {page} has no such heading"))
    return problems


def _names_heading(wanted: str, headings: set[str]) -> bool:
    return any(h == wanted or h.startswith(wanted + "-") for h in headings)


def run_checks(
    root: Path = REPO, help_of: Callable[[tuple[str, ...]], str | None] | None = None, write: bool = False
) -> list[Problem]:
    help_of = help_of or HelpCache(root)
    make = makefile_targets(root / "Makefile"), makefile_variables(root / "Makefile")
    problems = check_generated(root)
    for path in doc_files(root):
        problems += check_snippets(path, root, write=write)
        problems += check_links(path, root)
        problems += check_examples(path, make, help_of, root)
    for path in pointer_files(root):
        problems += check_pointers(path, root)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.docs_check", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--write", action="store_true", help="first rewrite every number quoted from a results file (<!-- from: -->)"
    )
    args = parser.parse_args(argv)
    problems = run_checks(write=args.write)
    for problem in problems:
        print(problem)
    print(f"docs check: {len(doc_files())} pages, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
