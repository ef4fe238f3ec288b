"""Recorded series for ``promtool test rules``: for every rule, input series on which it fires and series of a
healthy run on which it does not (one sample a minute). ``promtool_tests`` turns them into
``deploy/prometheus/alerts.test.yml``, with the expected alerts' annotations taken from the launcher's rules
(``launcher.alerts.rules.RULES``, which ``python -m launcher.alerts`` renders into ``alerts.yml``).

    python -m testing.alert_cases     # rewrite deploy/prometheus/alerts.test.yml
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.alerts.render import KIND
from launcher.alerts.rules import RULES
from launcher.alerts.settings import AlertSettings

TESTS_FILE = Path(__file__).resolve().parents[1] / "deploy/prometheus/alerts.test.yml"

T = '{job="trainer"}'
R = '{job="rollout"}'
P1 = 'server="http://policy-1:8002"'
PUBLISHED = 'coda_rollout_groups_total{job="rollout",outcome="published"}'


@dataclass(frozen=True)
class Case:
    rule: str
    fires: bool
    what: str  # the story the series tell
    series: dict[str, str]  # series → promtool values notation
    at: str  # eval_time
    labels: list[dict[str, str]] = field(default_factory=lambda: [{"job": "trainer"}])  # of each expected alert


CASES: tuple[Case, ...] = (
    Case(
        "TrainerNotStepping",
        True,
        "a step a minute for 30 minutes, then none for 50",
        {f"coda_trainer_step{T}": "1+1x30 31x60", f"coda_trainer_step_seconds{T}": "60x90"},
        "80m",
    ),
    Case(
        "TrainerNotStepping",
        False,
        "a step a minute all along",
        {f"coda_trainer_step{T}": "1+1x90", f"coda_trainer_step_seconds{T}": "60x90"},
        "80m",
    ),
    Case(
        "RolloutNotProducing",
        True,
        "groups for 20 minutes, then none, the trainer's queue empty",
        {
            PUBLISHED: "0+1x20 20x30",
            f"coda_trainer_queue_lag{T}": "0x50",
        },
        "45m",
        [{}],
    ),
    Case(
        "RolloutNotProducing",
        False,
        "a group a minute",
        {
            PUBLISHED: "0+1x50",
            f"coda_trainer_queue_lag{T}": "0x50",
        },
        "45m",
        [],
    ),
    Case(
        "PolicyServerDown",
        True,
        "one of two servers down from minute 6",
        {
            f'coda_rollout_server_up{{job="rollout",{P1}}}': "1x5 0x10",
            'coda_rollout_server_up{job="rollout",server="http://policy-2:8002"}': "1x15",
        },
        "12m",
        [{"job": "rollout", "server": "http://policy-1:8002"}],
    ),
    Case("PolicyServerDown", False, "the server up", {f'coda_rollout_server_up{{job="rollout",{P1}}}': "1x15"}, "12m"),
    Case(
        "PolicyServerBehind",
        True,
        "a server stuck at version 5 while the trainer publishes a version a minute",
        {f"coda_policy_version{T}": "0+1x20", f'coda_rollout_server_version{{job="rollout",{P1}}}': "0+1x5 5x15"},
        "15m",
        [{"job": "rollout", "server": "http://policy-1:8002"}],
    ),
    Case(
        "PolicyServerBehind",
        False,
        "a server that keeps up, and one not probed yet (-1)",
        {
            f"coda_policy_version{T}": "0+1x20",
            f'coda_rollout_server_version{{job="rollout",{P1}}}': "0+1x20",
            'coda_rollout_server_version{job="rollout",server="http://policy-2:8002"}': "-1x20",
        },
        "15m",
    ),
    Case(
        "StaleRollouts",
        True,
        "half the episodes dropped as stale",
        {f"coda_trainer_dropped_stale{T}": "0+2x30", f"coda_rollout_episodes_total{R}": "0+4x30"},
        "25m",
        [{}],
    ),
    Case(
        "StaleRollouts",
        False,
        "no episode dropped",
        {f"coda_trainer_dropped_stale{T}": "0x30", f"coda_rollout_episodes_total{R}": "0+4x30"},
        "25m",
    ),
    Case(
        "SamplerMismatch",
        True,
        "mismatch KL jumps from 0.001 to 0.5 and stays there",
        {f"coda_trainer_mismatch_kl_k3{T}": "0.001x9 0.5x10", f"coda_trainer_is_weight_mean{T}": "1x19"},
        "18m",
    ),
    Case(
        "SamplerMismatch",
        False,
        "small mismatch with one step at 0.96 (a healthy tiny-cpu run), weights near 1",
        {f"coda_trainer_mismatch_kl_k3{T}": "0.01x9 0.96 0.01x9", f"coda_trainer_is_weight_mean{T}": "1.02x19"},
        "18m",
    ),
    Case(
        "EntropyCollapse",
        True,
        "entropy from 2 nats to 0.05, the reward stuck at 0.3",
        {f"coda_trainer_rl_entropy{T}": "2-0.1x19 0.05x10", f"coda_trainer_reward_mean{T}": "0.3x30"},
        "25m",
    ),
    Case(
        "EntropyCollapse",
        False,
        "entropy from 2 nats to 0.05 as the reward reaches 0.95: a solved task",
        {f"coda_trainer_rl_entropy{T}": "2-0.1x19 0.05x10", f"coda_trainer_reward_mean{T}": "0+0.1x9 0.95x20"},
        "25m",
    ),
    Case(
        "EntropyCollapse",
        False,
        "entropy from 2 nats to 0.05 as the reward climbs from 0.1 to 0.6: it learned (smol-cpu's make train)",
        {f"coda_trainer_rl_entropy{T}": "2-0.1x19 0.05x10", f"coda_trainer_reward_mean{T}": "0.1+0.02x25 0.6x4"},
        "25m",
    ),
    Case(
        "EntropyCollapse",
        False,
        "a model trained from scratch: 7 nats down to 0.5 (below a tenth, not below the floor)",
        {f"coda_trainer_rl_entropy{T}": "7-0.3x21 0.5x10"},
        "28m",
    ),
    Case(
        "RewardDrop",
        True,
        "reward up from 0 to 0.8 in 40 minutes, then down to 0.1",
        {f"coda_trainer_reward_mean{T}": "0+0.02x40 0.8-0.05x14 0.1x30"},
        "80m",
    ),
    Case("RewardDrop", False, "reward rising", {f"coda_trainer_reward_mean{T}": "0+0.01x80"}, "80m"),
    Case(
        "NoLearningSignal",
        True,
        "two steps a minute, no group with a learning signal, reward 0 (the learning rate 100x)",
        {
            f"coda_trainer_signal_share{T}": "0x30",
            f"coda_trainer_reward_mean{T}": "0x30",
            f"coda_trainer_step{T}": "10+2x30",
        },
        "10m",
    ),
    Case(
        "NoLearningSignal",
        False,
        "two steps a minute, half the groups with a signal",
        {
            f"coda_trainer_signal_share{T}": "0.5x30",
            f"coda_trainer_reward_mean{T}": "0.3x30",
            f"coda_trainer_step{T}": "10+2x30",
        },
        "10m",
    ),
    Case(
        "NoLearningSignal",
        False,
        "no group with a signal on a solved task (every reward 1)",
        {
            f"coda_trainer_signal_share{T}": "0x30",
            f"coda_trainer_reward_mean{T}": "0.95x30",
            f"coda_trainer_step{T}": "10+2x30",
        },
        "10m",
    ),
    Case(
        "NoLearningSignal",
        False,
        "no group with a signal, but a step a minute: fewer than no_signal_steps in the window",
        {
            f"coda_trainer_signal_share{T}": "0x30",
            f"coda_trainer_reward_mean{T}": "0x30",
            f"coda_trainer_step{T}": "10+1x30",
        },
        "10m",
    ),
    Case(
        "DemonstrationLossRising",
        True,
        "a warm start whose demonstration loss rises from 12.9 by 2.3 a minute (the learning rate 100x)",
        {f"coda_trainer_sft_loss{T}": "12.9+2.3x20"},
        "6m",
    ),
    Case(
        "DemonstrationLossRising",
        False,
        "a warm start whose demonstration loss falls from 3",
        {f"coda_trainer_sft_loss{T}": "3-0.1x20"},
        "15m",
    ),
    Case(
        "DemonstrationLossRising",
        False,
        "the co-trained demonstrations' loss near 0 creeping up (many times its low, by 0.2 nats)",
        {f"coda_trainer_sft_loss{T}": "3-0.5x5 0.03+0.01x20"},
        "20m",
    ),
    Case("ClipFractionHigh", True, "40% of tokens clipped", {f"coda_trainer_clip_fraction{T}": "0.4x30"}, "20m"),
    Case("ClipFractionHigh", False, "5% clipped", {f"coda_trainer_clip_fraction{T}": "0.05x30"}, "20m"),
    Case(
        "NonFiniteLoss",
        True,
        "the loss becomes infinite",
        {f"coda_trainer_loss{T}": "0.5x5 Inf Inf", f"coda_trainer_grad_norm{T}": "1x7"},
        "6m",
    ),
    Case(
        "NonFiniteLoss",
        True,
        "the gradient norm becomes NaN",
        {f"coda_trainer_loss{T}": "0.5x7", f"coda_trainer_grad_norm{T}": "1x5 NaN NaN"},
        "6m",
    ),
    Case(
        "NonFiniteLoss",
        False,
        "finite loss and gradient norm",
        {f"coda_trainer_loss{T}": "0.5x7", f"coda_trainer_grad_norm{T}": "1x7"},
        "6m",
    ),
)


TESTS_HEADER = """\
# promtool unit tests of alerts.yml: for every rule, series on which it fires and series on which it does not.
# GENERATED from testing/alert_cases.py by `python -m testing.alert_cases`; do not edit by hand.
# Run: promtool test rules deploy/prometheus/alerts.test.yml
"""


def promtool_tests(settings: AlertSettings) -> str:
    """``alerts.test.yml``: one promtool test per recorded case (``CASES``)."""
    by_name = {rule.name: rule for rule in RULES}
    tests = []
    for case in CASES:
        rule = by_name[case.rule]
        annotations = {"summary": rule.summary, "action": rule.action}
        expected = [
            {"exp_labels": {"severity": rule.severity, **KIND, **labels}, "exp_annotations": annotations}
            for labels in (case.labels if case.fires else [])
        ]
        tests.append(
            {
                "name": f"{case.rule} {'fires' if case.fires else 'stays quiet'}: {case.what}",
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in case.series.items()],
                "alert_rule_test": [{"eval_time": case.at, "alertname": case.rule, "exp_alerts": expected}],
            }
        )
    doc = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}
    return TESTS_HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def main() -> int:
    # The committed file holds the defaults, whatever the environment says.
    TESTS_FILE.write_text(promtool_tests(AlertSettings.model_construct()))
    print(f"wrote {TESTS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
