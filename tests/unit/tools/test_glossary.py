"""docs/metrics.md is what the code's metric definitions generate, and every key the code writes has a meaning."""

from __future__ import annotations

from pathlib import Path

from tools.glossary import (
    COMPONENTS,
    LOG_KEYS,
    check,
    progress_keys,
    prometheus_families,
    render,
    reward_components,
    trainer_gauges,
)

REPO = Path(__file__).resolve().parents[3]


def test_glossary_is_up_to_date():
    doc = (REPO / "docs" / "metrics.md").read_text()
    assert doc == render(), "regenerate: python -m tools.glossary > docs/metrics.md"


def test_every_written_key_is_described():
    assert check() == []


def test_the_live_line_keys_come_from_the_report():
    keys = progress_keys()
    assert "reward_mean" in keys and "red/sft_loss_weight" in keys
    page = render()
    for key in keys:
        assert f"| `{key}` |" in page


def test_log_keys_hold_the_step_record_and_the_objective():
    keys = set(LOG_KEYS)  # the trainer's record, its parts expanded
    for key in ("step", "loss", "pg_loss", "clip_fraction", "red/sft_loss_weight", "red/h_rl", "queue_lag", "time"):
        assert key in keys
    assert "ratio" not in keys and "num_tokens" not in keys  # tensors of one micro-batch, never logged
    assert all(LOG_KEYS.values()), "a log key without a description"


def test_reward_components_include_the_answer_scores_and_computed_names():
    names = reward_components()
    assert {"em", "f1", "sub_em", "cover_em", "has_answer", "executor_score_mean"} <= names
    assert names <= set(COMPONENTS)


def test_every_trainer_gauge_shows_a_logged_key():
    gauges = trainer_gauges()
    assert gauges["coda_trainer_red_sft_loss_weight"] == "red/sft_loss_weight"
    assert set(gauges.values()) <= set(LOG_KEYS)
    names = {f.name for f in prometheus_families()}
    assert set(gauges) <= names
    assert {"coda_http_requests_total", "coda_rollout_episodes_total", "coda_policy_version"} <= names
