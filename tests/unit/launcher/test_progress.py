"""make train's terminal: pace and ETA by hand-computed numbers, the live line redrawn in place on a terminal
and plain lines elsewhere, and the run folder a command continues."""

from __future__ import annotations

import io
import json
import logging

import pytest

from launcher import runs
from launcher.progress import CLEAR, Display, Pace, duration, pace_text


def test_pace_counts_only_the_steps_this_process_saw():
    pace = Pace(max_steps=100)
    assert pace.update(40, now=1000.0) == (None, None)  # a resumed run: steps 1–40 ran at another time
    assert pace.update(40, now=1005.0) == (None, None)
    rate, left = pace.update(50, now=1020.0)  # 10 steps in 20 s
    assert rate == pytest.approx(0.5) and left == pytest.approx(100.0)  # 50 steps left at 0.5/s
    assert Pace(max_steps=0).update(3, 0.0) == (None, None)
    assert Pace(0, first=(1, 0.0)).update(3, 4.0) == (0.5, None)  # no max_steps: no ETA


def test_durations_and_pace_text():
    assert [duration(s) for s in (4, 185, 7620)] == ["4s", "3m05s", "2h07m"]
    assert pace_text(None, None) == "measuring pace"
    assert pace_text(0.5, 100.0) == "0.50 steps/s  ETA 1m40s"
    assert pace_text(0.02, None) == "50 s/step"


def test_a_terminal_gets_one_live_line_and_lines_above_it():
    out = io.StringIO()
    shown = Display("make train", out, live=True)
    shown.status("training: step 1/10")
    shown.status("training: step 2/10")
    shown.say("a service died")
    shown.keep()
    shown.say("done")
    text = out.getvalue()
    # Each update erases the line it replaces; a said line goes above the live line, which is redrawn.
    assert text.count(CLEAR) == 3 and text.count("\n") == 3
    assert text.index("step 2/10") < text.index("a service died") < text.rindex("step 2/10") < text.index("done")


def test_elsewhere_plain_lines_at_most_every_plain_every_s():
    out = io.StringIO()
    shown = Display("make train", out, live=False)
    for step in range(5):
        shown.status(f"training: step {step}", plain_every_s=3600)
    logging.getLogger("test.progress").addHandler(shown)
    logging.getLogger("test.progress").warning("rollout exited")
    lines = out.getvalue().splitlines()
    assert CLEAR not in out.getvalue() and len(lines) == 2
    assert lines[0].endswith("training: step 0") and lines[1].endswith("warning: rollout exited")


def test_a_closed_terminal_does_not_stop_the_shutdown():
    out = io.StringIO()
    out.close()
    Display("make train", out, live=True).say("stopping")  # no exception


def test_the_same_recipe_continues_its_newest_unfinished_run(tmp_path):
    recipe, other = tmp_path / "a.toml", tmp_path / "b.toml"
    recipe.write_text(""), other.write_text("")
    first = runs.choose(tmp_path / "runs", str(recipe))
    assert not first.resumed and "new run" in first.why
    again = runs.choose(tmp_path / "runs", str(recipe))
    assert again.resumed and again.folder == first.folder
    assert not runs.choose(tmp_path / "runs", str(other)).resumed  # another recipe's run is not continued
    runs.mark_finished(first.folder)
    assert json.loads((first.folder / runs.RUN_FILE).read_text())["finished"]
    fresh = runs.choose(tmp_path / "runs", str(recipe))
    assert not fresh.resumed and fresh.folder != first.folder
    assert runs.choose(tmp_path / "runs", str(recipe), new=True).folder not in (first.folder, fresh.folder)
    assert runs.choose(tmp_path / "runs", str(recipe), resume=str(first.folder)).folder == first.folder
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        runs.choose(tmp_path / "runs", str(recipe), resume=str(tmp_path / "nope"))
