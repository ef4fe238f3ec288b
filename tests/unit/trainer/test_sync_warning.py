"""The sync check's verdict: quiet within the tolerance, a message that says what to check beyond it."""

from __future__ import annotations

from services.trainer.sync_check import mismatch_warning


def test_within_tolerance_is_quiet():
    assert mismatch_warning(2.6e-6, 0.5, "policy") is None
    assert mismatch_warning(0.5, 0.5, "policy") is None


def test_a_server_on_other_weights_is_named():
    # 5.29 nats: what a vLLM still holding another run's weights gave against a LoRA trainer (recorded run).
    message = mismatch_warning(5.29, 0.5, "policy-v1")
    assert message is not None
    assert "'policy-v1'" in message and "5.29 nats" in message and "tolerance 0.5" in message
    assert "base model" in message
