"""Numbers the pages quote from results files, checked by ``testing.docs_check`` (``check_snippets``; its
``--write`` rewrites them from the files).
"""

from __future__ import annotations

import re
from pathlib import Path

from testing.docs_pages import (
    HEADING,
    REPO,
    Problem,
)

# <!-- from: bench/results/x.md: TEMPLATE -->RENDERED<!-- end -->: TEMPLATE's {fields} are read from the results
# file, and RENDERED must be TEMPLATE filled in. A field is
#   {ROW @ COLUMN}        the cell of a markdown table of that file: the first table with a header cell COLUMN
#                         and a row whose first cells are ROW (cells separated by " ; ": `full RED ; 2`);
#   {ROW @ COLUMN @ num}  the same cell's first number ("32.6 (32.0–33.1)" → "32.6");
#   {SECTION # ROW @ COLUMN [@ num]}  the same, in the tables under the first heading that starts with SECTION
#                         (up to the next heading of its level or above): a file with one table per dataset;
#   {re:REGEX}            the first group of REGEX's first match in the file.
# No "|" anywhere in a snippet: a table cell of the page would end there (write "\x7c" in a REGEX).
# `python -m testing.docs_check --write` rewrites every RENDERED from its file; the check fails otherwise.
SNIPPET = re.compile(r"<!-- from: (?P<src>[^\s:]+): (?P<template>.*?) -->(?P<rendered>.*?)<!-- end -->", re.S)
FIELD = re.compile(r"\{(?P<body>re:.+?|[^{}@]+@[^{}]+)\}")
NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")


def markdown_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every table of a markdown text as (header cells, rows of cells)."""
    tables, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and line.startswith("|") and re.match(r"^\|(\s*:?-+:?\s*\|)+\s*$", lines[i + 1]):
            if i > 0 and lines[i - 1].startswith("|"):
                continue
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            tables.append((_cells(line), rows))
    return tables


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def field_value(source: str, body: str) -> str:
    """One ``{field}`` of a snippet read from the results file's text; ValueError when it is not there."""
    if body.startswith("re:"):
        match = re.search(body[3:], source)
        if not match:
            raise ValueError(f"no match for {body[3:]!r}")
        return match.group(1)
    row, column, *how = [part.strip() for part in body.split("@")]
    section, _, row = row.rpartition(" # ")
    keys = [k.strip() for k in row.split(";")]
    for header, rows in markdown_tables(section_text(source, section.strip()) if section else source):
        if column not in header:
            continue
        for cells in rows:
            if cells[: len(keys)] == keys:
                value = cells[header.index(column)]
                if how == ["num"]:
                    number = NUMBER.search(value)
                    if not number:
                        raise ValueError(f"no number in {value!r}")
                    value = number.group(0)
                return value
    raise ValueError(f"no table with a column {column!r} and a row {row!r}")


def section_text(source: str, section: str) -> str:
    """The lines under the first heading that starts with ``section``, up to the next heading of its level or
    above; ValueError when there is no such heading."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        match = HEADING.match(line)
        if match and match.group(2).startswith(section):
            level, end = len(match.group(1)), len(lines)
            for j in range(i + 1, len(lines)):
                after = HEADING.match(lines[j])
                if after and len(after.group(1)) <= level:
                    end = j
                    break
            return "\n".join(lines[i + 1 : end])
    raise ValueError(f"no heading that starts with {section!r}")


def render_snippet(source: str, template: str) -> str:
    return FIELD.sub(lambda m: field_value(source, m.group("body")), template)


def check_snippets(path: Path, root: Path = REPO, write: bool = False) -> list[Problem]:
    """Every ``<!-- from: … -->`` snippet of ``path`` says what its results file says now (``write``: make it)."""
    text = path.read_text()
    problems: list[Problem] = []

    def fix(match: re.Match) -> str:
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
        source = root / match.group("src")
        if not source.is_file():
            problems.append(Problem(where, f"quotes {match.group('src')}: no such file"))
            return match.group(0)
        try:
            want = render_snippet(source.read_text(), match.group("template"))
        except ValueError as error:
            problems.append(Problem(where, f"quotes {match.group('src')}: {error}"))
            return match.group(0)
        if want != match.group("rendered"):
            if not write:
                problems.append(
                    Problem(
                        where,
                        f"says {match.group('rendered')!r} where {match.group('src')} says {want!r} "
                        "(python -m testing.docs_check --write)",
                    )
                )
            return match.group(0)[: match.start("rendered") - match.start()] + want + "<!-- end -->"
        return match.group(0)

    new = SNIPPET.sub(fix, text)
    if write and new != text:
        path.write_text(new)
    return problems
