"""Print the pip requirements of one pyproject extra (plus the base dependencies), one per line.

The Dockerfiles install dependencies from this list *before* the code is copied, so a code change does not
invalidate the (large) dependency layer. Self-references such as ``coda-stack[a,b]`` are expanded.

    python deploy/docker/requirements.py trainer > /tmp/requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SELF_REF = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*\[([^\]]+)\]\s*$")


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """Base dependencies + every requirement of ``extras`` (self-references expanded), deduplicated."""
    project = pyproject["project"]
    name = project["name"].lower().replace("_", "-")
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise KeyError(f"pyproject.toml has no extra {extra!r} (known: {sorted(optional)})")
        seen.add(extra)
        for req in optional[extra]:
            match = SELF_REF.match(req)
            if match and match.group(1).lower().replace("_", "-") == name:
                pending.extend(e.strip() for e in match.group(2).split(","))
            else:
                out.append(req)
    return list(dict.fromkeys(out))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    pyproject = tomllib.loads(Path("pyproject.toml").read_text())
    print("\n".join(requirements(pyproject, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
