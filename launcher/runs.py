"""``make train``'s run folders: which one a command starts in, and whether it is finished.

Each run folder holds ``run.json`` (its recipe, when it started, when it finished). Running the same recipe
again continues its newest unfinished run, as a training tool's resume does: everything prepared is reused,
Redis reopens its append-only file, the trainer loads its latest checkpoint (step, version and the groups it
covered), so nothing is trained twice. ``--new`` starts over; ``--resume RUN`` picks a folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

RUN_FILE = "run.json"


@dataclass(frozen=True)
class RunChoice:
    folder: Path
    resumed: bool
    why: str  # said at the terminal: which run, and why that one


def _read(folder: Path) -> dict:
    try:
        return json.loads((folder / RUN_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def unfinished(root: Path, recipe: str) -> list[Path]:
    """Run folders of ``recipe`` (its resolved path) under ``root`` that never finished, newest first."""
    runs = [p for p in root.glob(f"*/{RUN_FILE}") if p.parent.is_dir()]
    mine = [p.parent for p in runs if (doc := _read(p.parent)).get("recipe") == recipe and not doc.get("finished")]
    return sorted(mine, key=lambda p: p.name, reverse=True)


def choose(root: Path, recipe: str, *, resume: str | None = None, new: bool = False) -> RunChoice:
    """``new``: a fresh folder. ``resume``: that folder (``"latest"``: the newest unfinished run of
    ``recipe``). Neither: the newest unfinished run of ``recipe`` if there is one, else a fresh folder."""
    recipe = str(Path(recipe).resolve())
    if new:
        return RunChoice(_create(root, recipe), False, "new run (--new)")
    if resume and resume != "latest":
        folder = Path(resume)
        if not folder.is_dir():
            raise FileNotFoundError(f"--resume {resume}: no such run folder")
        return RunChoice(folder, True, f"resuming {folder} (--resume)")
    found = unfinished(root, recipe)
    if found:
        return RunChoice(found[0], True, f"resuming the unfinished run {found[0]} of this recipe (--new starts over)")
    if resume:
        raise FileNotFoundError(f"--resume: no unfinished run of {recipe} under {root}")
    return RunChoice(_create(root, recipe), False, "new run (no unfinished run of this recipe)")


def _create(root: Path, recipe: str) -> Path:
    folder = root / time.strftime("%Y%m%d-%H%M%S")
    while folder.exists():  # two runs started within one second
        time.sleep(0.2)
        folder = root / time.strftime("%Y%m%d-%H%M%S")
    folder.mkdir(parents=True)
    (folder / RUN_FILE).write_text(json.dumps({"recipe": recipe, "started": time.time(), "finished": None}))
    return folder


def mark_finished(folder: Path) -> None:
    doc = _read(folder)
    doc["finished"] = time.time()
    (folder / RUN_FILE).write_text(json.dumps(doc))


def start_from_checkpoint(source: Path, checkpoints: Path) -> int:
    """Copy the newest checkpoint under ``source`` into ``checkpoints`` (a new run's checkpoint folder) as that
    run's start: model, optimizer, scheduler and step kept; the source's RNG state (the new run seeds its own)
    and queue position (stream ids and groups of the source's own Redis) dropped. Returns its step."""
    import shutil

    from services.trainer import checkpoint

    start = checkpoint.latest(source)
    if start is None:
        raise FileNotFoundError(f"no checkpoint under {source}")
    copy = checkpoints / start.name
    shutil.copytree(start, copy)
    for rng in copy.glob("rng-*.pt"):
        rng.unlink()
    state = json.loads((copy / "state.json").read_text())
    state["covered"] = []
    for key, empty in (("trained_groups", []), ("recent_groups", []), ("groups_trained", 0)):
        if key in state:
            state[key] = empty
    (copy / "state.json").write_text(json.dumps(state))
    return state["step"]
