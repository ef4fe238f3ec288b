"""The pages ``testing.docs_check`` and ``testing.reading_paths`` read: which files (``doc_files``), their prose
apart from their code (``split_text``), their headings and anchors, their links; and ``Problem``, what a check
reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@dataclass(frozen=True)
class Problem:
    where: str  # file:line
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def doc_files(root: Path = REPO) -> list[Path]:
    files = [
        root / "README.md",
        root / "tests" / "README.md",
        root / "bench" / "README.md",
        *sorted((root / "docs").glob("*.md")),
    ]
    return [f for f in files if f.is_file()]


# ---------------------------------------------------------------- markdown structure
def split_text(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code-block lines), each as (1-based line number, text)."""
    prose, code, fenced = [], [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        (code if fenced else prose).append((number, line))
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces → hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").lower().strip()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor (duplicates numbered as GitHub does: x, x-1, …) and explicit ``<a id>``."""
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    for _, line in split_text(text)[0]:
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def without_code_spans(line: str) -> str:
    return INLINE.sub("", line)
