"""Eval's search metrics: does the first well-formed search name the entity / retrieve a gold document."""

from __future__ import annotations

from agents.core.episode import Episode, SearchTrace, TokenTrajectory
from agents.datasets import PromptRecord
from services.rollout.eval import summarise
from services.rollout.scoring import search_metrics

RECORD = PromptRecord(
    prompt_id="velkadar-city",
    question="Where does Velkadar live?",
    golden_answers=["Orvale"],
    metadata={"entity": "Velkadar", "gold_doc_id": "0"},
)


def episode(queries, retrieved):
    return Episode(main=TokenTrajectory([1, 2, 3], role="policy"), search=SearchTrace.of(queries, retrieved))


def test_first_search_names_the_entity_and_hits_the_gold_document():
    assert search_metrics(RECORD, episode(["Where does velkadar live?"], [["0", "7"]])) == {
        "search_entity": 1.0,
        "search_hit": 1.0,
    }


def test_only_the_first_search_counts():
    assert search_metrics(RECORD, episode(["Orvale", "Velkadar"], [["5"], ["0"]])) == {
        "search_entity": 0.0,
        "search_hit": 0.0,
    }


def test_no_search_or_failed_episode_scores_zero():
    assert search_metrics(RECORD, episode([], [])) == {"search_entity": 0.0, "search_hit": 0.0}
    assert search_metrics(RECORD, None) == {"search_entity": 0.0, "search_hit": 0.0}


def test_datasets_without_metadata_have_no_search_metrics():
    plain = PromptRecord(prompt_id="q", question="Who?", golden_answers=["x"])
    assert search_metrics(plain, episode(["who"], [["1"]])) == {}


def test_summary_averages_search_metrics():
    rows = [
        {
            "prompt_id": str(i),
            "data_source": "lookup",
            "error": None,
            "em": 0.0,
            "f1": 0.0,
            "search_entity": float(i % 2),
            "search_hit": 1.0,
        }
        for i in range(4)
    ]
    table = summarise(rows)
    assert table["metrics"] == ["em", "f1", "search_entity", "search_hit"]
    assert table["by_source"]["ALL"]["search_entity"] == 0.5
