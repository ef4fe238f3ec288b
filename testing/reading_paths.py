"""How many words a newcomer reads, from the top of the README, to reach each goal.

    python -m testing.reading_paths            # one line per goal: its words and the sections read

A goal's path is the sections a reader reads in order: the README's top (title to the first ``##``), the
README sections that lead to the goal, then each linked doc section followed. Every step after the README's
top must be linked from a section read before it (a link to the page for the page's top, to the section's
anchor, or to its page when the section is the page's first), so a path that the docs stop leading along
fails instead of being counted.

A section runs from its heading to the next heading of its level or above (a page's top: to its first
heading below the title). Its words: the whitespace-separated tokens holding a letter or a digit, prose and
code blocks alike (a reader reads the commands), after dropping HTML comments (a quoted number's template),
link targets (``](url)``: the reader reads the link's text) and table rules. A step may be one sentence of a page
instead (the command a results page gives). A goal with alternatives (act on *an* alert, reproduce *a* row)
counts its longest alternative.

``tests/unit/testing/test_reading_paths.py`` holds every goal at ``LIMIT`` words or fewer.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from testing.docs_pages import FENCE, HEADING, LINK, REPO

LIMIT = 600
TOP = ""  # the section name of a page's top: from its title to its first heading below it


@dataclass(frozen=True)
class Step:
    page: str  # relative to the repository root
    section: str = TOP  # the heading's text, or TOP
    sentence: str = ""  # instead of a section: the one sentence of the page that holds these words


def _alerts(root: Path) -> list[Step]:
    """One alternative per alert: its section of docs/alerts.md (what it means, what to do)."""
    text = (root / "docs" / "alerts.md").read_text()
    names = [m.group(2) for m in map(HEADING.match, _prose(text)) if m and len(m.group(1)) == 2]
    return [Step("docs/alerts.md", n) for n in names if re.fullmatch(r"(?:[A-Z][a-z]+){2,}", n)]


def _qa_pages(root: Path) -> list[Step]:
    """One alternative per qa results page the README's results link: the sentence that gives its command."""
    linked = _links(root, Step("README.md"), section(root, Step("README.md", "Results")))
    pages = sorted(page for page, _ in linked if re.fullmatch(r"bench/results/qa[\w-]*\.md", page))
    return [Step(page, sentence="reproduce with") for page in pages]


README = Step("README.md")
# goal → alternatives, each a list of steps after the README's top
GOALS: dict[str, object] = {
    "run the default": [[Step("README.md", "The two commands")]],
    "read the live line": [[Step("README.md", "What `make train` does and prints")]],
    "plug in your own task": [[Step("README.md", "Your own task")]],
    "compose on GPUs": [[Step("README.md", "GPUs with docker compose")]],
    "scale out": [[Step("README.md", "GPUs with docker compose"), Step("docs/scaling-out.md")]],
    "act on an alert": lambda root: [[Step("README.md", "Alerts"), alert] for alert in _alerts(root)],
    "curl each service": [[Step("docs/services.md", "Every API with `curl`")]],
    "reproduce a benchmark row": lambda root: [[Step("README.md", "Results"), page] for page in _qa_pages(root)],
}


def _prose(text: str) -> list[str]:
    """The lines of ``text`` outside code blocks, code lines blanked (headings in code are no headings)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return out


def section(root: Path, step: Step) -> str:
    """The text of one section (or sentence); KeyError when the page has no such heading (or words)."""
    if step.sentence:
        text = (root / step.page).read_text()
        for sentence in re.split(r"(?<=\.)\s+|\n\s*\n", text):
            if step.sentence in sentence:
                return sentence
        raise KeyError(f"{step.page} has no sentence with {step.sentence!r}")
    lines = (root / step.page).read_text().splitlines()
    prose = _prose("\n".join(lines))
    headings = [(i, len(m.group(1)), m.group(2)) for i, m in enumerate(map(HEADING.match, prose)) if m]
    if step.section == TOP:
        start = headings[0][0] + 1 if headings and headings[0][1] == 1 else 0
        end = next((i for i, _, _ in headings if i >= start), len(lines))
        return "\n".join(lines[start:end])
    for n, (i, level, name) in enumerate(headings):
        if name == step.section:
            end = next((j for j, lv, _ in headings[n + 1 :] if lv <= level), len(lines))
            return "\n".join(lines[i:end])
    raise KeyError(f"{step.page} has no heading {step.section!r}")


def words(text: str) -> int:
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)\s]*\)", "] ", text)
    text = "\n".join(line for line in text.splitlines() if not re.fullmatch(r"\s*\|?(\s*:?-+:?\s*\|)+\s*", line))
    return sum(1 for token in text.split() if re.search(r"\w", token))


def _links(root: Path, step: Step, text: str) -> set[tuple[str, str]]:
    """(page, anchor) of every relative link in ``text`` (anchor '' for a page)."""
    out = set()
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (root / step.page).parent / file_part if file_part else root / step.page
        try:
            out.add((dest.resolve().relative_to(root.resolve()).as_posix(), anchor))
        except ValueError:
            continue
    return out


def _reached(step: Step, linked: set[tuple[str, str]]) -> bool:
    """A page's top by a link to the page; a section by a link to its anchor or to its page (the reader goes
    on by the page's headings)."""
    return any(page == step.page for page, _ in linked)


def alternatives(goal: str, root: Path = REPO) -> list[list[Step]]:
    spec = GOALS[goal]
    return spec(root) if callable(spec) else spec


def count(path: list[Step], root: Path = REPO) -> int:
    """The words of ``[README's top, *path]``; ValueError when a step is not linked from a step before it.
    A README section needs no link: the reader scrolls to it by its heading."""
    total, linked = 0, set()
    for step in [README, *path]:
        text = section(root, step)
        if step.page != "README.md" and not _reached(step, linked):
            where = step.section or step.sentence or "(top)"
            raise ValueError(f"{step.page} {where!r} is linked from no section read before it")
        linked |= _links(root, step, text)
        total += words(text)
    return total


def counts(root: Path = REPO) -> dict[str, tuple[int, list[Step]]]:
    """Each goal's words and the path they were counted on (its longest alternative)."""
    out = {}
    for goal in GOALS:
        best = max(((count(p, root), p) for p in alternatives(goal, root)), key=lambda x: x[0])
        out[goal] = best
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testing.reading_paths", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    over = 0
    for goal, (n, path) in counts().items():
        steps = " → ".join(
            f"{s.page}{' § ' + s.section if s.section else ''}{s.sentence and ' (the sentence with ' + repr(s.sentence) + ')'}"
            for s in [README, *path]
        )
        print(f"{n:5d}  {goal}: {steps}")
        over += n > LIMIT
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
