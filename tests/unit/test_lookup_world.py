"""The synthetic lookup world: deterministic, answerable only by retrieval, held-out pairs truly held out."""

from __future__ import annotations

import json
from pathlib import Path

from agents.lookup_world import make_world, write_world


def test_deterministic_for_a_seed():
    assert make_world(seed=3) == make_world(seed=3)
    assert make_world(seed=3) != make_world(seed=4)


def test_answers_live_only_in_the_gold_document():
    world = make_world(num_people=40)
    docs = {d["id"]: d["contents"] for d in world.corpus}
    for q in world.train + world.test:
        assert q.entity in q.question
        assert q.golden_answers[0] in docs[q.gold_doc_id]
        assert q.golden_answers[0].lower() not in q.question.lower()  # the question never gives it away


def test_held_out_pairs_never_in_training_but_people_are():
    world = make_world(num_people=60, test_fraction=0.2)
    train_pairs = {(q.entity, q.relation) for q in world.train}
    train_people = {q.entity for q in world.train}
    assert len(world.test) == 36  # 20% of 180 questions
    for q in world.test:
        assert (q.entity, q.relation) not in train_pairs
        assert q.entity in train_people


def test_written_files_match_the_bundled_world(tmp_path):
    """data/lookup is exactly what the generator writes with its defaults (so it can be regenerated)."""
    paths = write_world(make_world(), tmp_path)
    bundled = Path(__file__).resolve().parents[2] / "data" / "lookup"
    for name, path in paths.items():
        assert path.read_text() == (bundled / path.name).read_text(), name
    first = json.loads(paths["corpus"].read_text().splitlines()[0])
    assert first["id"] == "0" and first["contents"].startswith('"')
