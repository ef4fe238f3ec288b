"""bench/_qa_curve.py: the adapters an arm keeps while it trains (when, which version, under what name), and the
raw numbers and plot a curve writes."""

from __future__ import annotations

import json
from pathlib import Path

from bench._qa_curve import Snapshots, curve_points, newest_adapter, write_curves


def publish(weights: Path, version: int, complete: bool = True) -> None:
    folder = weights / f"policy-v{version}"
    folder.mkdir(parents=True)
    if complete:  # a folder still being written has no config yet
        (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(bytes([version]))


def test_newest_adapter_skips_incomplete_folders(tmp_path):
    assert newest_adapter(tmp_path / "none") is None
    publish(tmp_path, 2)
    publish(tmp_path, 10)
    publish(tmp_path, 11, complete=False)
    (tmp_path / "policy-v99.tmp").mkdir()
    assert newest_adapter(tmp_path) == (10, tmp_path / "policy-v10")


def test_snapshots_are_kept_on_the_interval_and_at_the_phase_ends(tmp_path):
    weights, into = tmp_path / "weights", tmp_path / "curve"
    snaps = Snapshots(weights, into, every_s=300)
    snaps.poll(100, "sft")  # not due
    snaps.poll(310, "sft")  # due, but nothing published yet: tried again at the next poll
    assert snaps.points == []
    publish(weights, 3)
    snaps.poll(311, "sft")
    snaps.poll(400, "sft")  # the next one is due at 600
    publish(weights, 5)
    snaps.take(420, "warm")  # the end of the warm start, off the interval
    snaps.poll(599, "rl")
    snaps.poll(650, "rl")  # v5 again: RL has published nothing yet; the warm start's point stays as it is
    assert snaps.points == [
        {"train_s": 311, "version": 3, "phase": "sft", "path": "t00311-v3"},
        {"train_s": 420, "version": 5, "phase": "warm", "path": "t00420-v5"},
    ]
    assert (into / "t00311-v3" / "adapter_model.safetensors").read_bytes() == bytes([3])
    publish(weights, 8)
    snaps.poll(1290, "rl")  # late polls do not bunch up: the next is due at 1500, not 900
    snaps.poll(1400, "rl")
    assert [p["version"] for p in snaps.points] == [3, 5, 8]
    assert snaps.next_s == 1500


def test_curve_points_and_files(tmp_path):
    doc = {
        "runs": {
            "2wiki/coda/0": {
                "snapshots": [
                    {
                        "train_s": 300,
                        "version": 25,
                        "phase": "warm",
                        "path": "a",
                        "f1": 0.2,
                        "em": 0.1,
                        "n": 30,
                        "eval_s": 60,
                        "rows": [],
                    },
                    {"train_s": 600, "version": 27, "phase": "rl", "path": "b"},  # not evaluated yet
                ]
            },
            "2wiki/flat/0": {"rows": []},  # no snapshots (recorded before curves)
        }
    }
    curves = curve_points(doc)
    assert curves == {
        "2wiki/coda/0": [{"train_s": 300, "version": 25, "phase": "warm", "f1": 0.2, "em": 0.1, "n": 30, "eval_s": 60}]
    }
    write_curves(curves, tmp_path / "c.png", tmp_path / "c.json", "30 questions")
    assert json.loads((tmp_path / "c.json").read_text()) == {"questions": "30 questions", "runs": curves}
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
