"""What the rules become outside Python: Prometheus's alerting rules file and the docs page, both generated.

    python -m launcher.alerts                 # rewrite deploy/prometheus/alerts.yml and docs/alerts.md
    python -m launcher.alerts --recipe R.toml --out my-alerts.yml   # rules with R's [alerts] thresholds

A test regenerates both and compares them with the committed files, so neither can drift from ``rules.RULES``.
"""

from __future__ import annotations

import yaml

from launcher.alerts.rules import RULES, Rule
from launcher.alerts.settings import AlertSettings

# A label on every alert of ours: Grafana's Alerts row selects them by it (ALERTS{kind="rl-health"}).
KIND = {"kind": "rl-health"}

RULES_HEADER = """\
# RL-health alerts for Prometheus. GENERATED from launcher/alerts/rules.py by
# `python -m launcher.alerts`; do not edit by hand (a test compares). docs/alerts.md says what each means
# and what to do. Tested with `promtool test rules deploy/prometheus/alerts.test.yml`.
"""


def prometheus_rules(settings: AlertSettings) -> dict:
    """The rules file as a document: one group, one alerting rule per ``Rule``."""
    return {
        "groups": [
            {
                "name": "coda-rl-health",
                "rules": [
                    {
                        "alert": rule.name,
                        "expr": rule.expr(settings),
                        "for": rule.hold(settings),
                        "labels": {"severity": rule.severity, **KIND},
                        "annotations": {"summary": rule.summary, "action": rule.action},
                    }
                    for rule in RULES
                ],
            }
        ]
    }


def rules_yaml(settings: AlertSettings) -> str:
    body = yaml.safe_dump(prometheus_rules(settings), sort_keys=False, width=100, allow_unicode=True)
    return RULES_HEADER + body


DOC_HEADER = """\
# RL-health alerts

<!-- GENERATED from launcher/alerts/rules.py by `python -m launcher.alerts`; do not edit. -->

The stack says when a run has stopped learning. Each rule below is defined once, in
`launcher/alerts/rules.py`, and evaluated in two places:

- **`make train`** evaluates them itself over the trainer's step records (`train.jsonl`) and the rollout's
  `/metrics`, every few seconds while training: an alert that starts firing prints a line above the live
  progress line (`alert <Name>: <the numbers> — <what to do>`), and the closing table lists every alert that
  fired, with the step it first fired at. `[alerts] enabled = false` turns this off.
- **Prometheus** (docker compose) loads `deploy/prometheus/alerts.yml`, generated from the same rules
  (`python -m launcher.alerts`; `--recipe R.toml --out FILE` writes one with a recipe's thresholds).
  Their states are the *Alerts* row of the Grafana *training* dashboard, and Prometheus's `/alerts` page.
  `deploy/prometheus/alerts.test.yml` holds recorded series that fire and do not fire each rule
  (test fixtures from `testing/alert_cases.py`, rewritten by `python -m testing.alert_cases`;
  `promtool test rules deploy/prometheus/alerts.test.yml`; `make test` runs it where promtool is installed).

Override any threshold in the recipe's `[alerts]` table (or `CODA_ALERTS_<KEY>` in the environment), e.g.

```toml
[alerts]
no_signal_steps = 50      # a hard task: allow 50 steps without a learning signal
entropy_floor = 0.05
```

`make train`'s windows count steps (`window_steps`), Prometheus's count time (`window_minutes`); peaks and
medians cover the whole run in `make train` and the last `lookback_hours` in Prometheus.
"""


def _threshold_rows(rule: Rule, settings: AlertSettings) -> list[str]:
    fields = AlertSettings.model_fields
    return [f"| `[alerts] {k}` | `{getattr(settings, k)!r}` | {fields[k].description} |" for k in rule.thresholds]


def docs_markdown(settings: AlertSettings) -> str:
    parts = [DOC_HEADER, "\n## Summary\n", "| alert | severity | fires when |", "|---|---|---|"]
    parts += [f"| [{r.name}](#{r.name.lower()}) | {r.severity} | {r.summary} |" for r in RULES]
    for rule in RULES:
        parts += [f"\n## {rule.name}\n", f"{rule.summary}\n", f"**What to do:** {rule.action}\n"]
        if rule.thresholds:
            parts += ["| recipe key | default | meaning |", "|---|---|---|", *_threshold_rows(rule, settings), ""]
        else:
            parts.append("No threshold: any occurrence fires.\n")
        hold = rule.hold(settings)
        parts.append(f"PromQL (for {hold}):\n\n```promql\n{rule.expr(settings)}\n```\n")
        if rule.prometheus_note:
            parts.append(f"In Prometheus: {rule.prometheus_note}.\n")
    common = ("enabled", "window_steps", "window_minutes", "lookback_hours")
    parts += ["\n## Settings every rule shares\n", "| recipe key | default | meaning |", "|---|---|---|"]
    parts += [
        f"| `[alerts] {k}` | `{getattr(settings, k)!r}` | {AlertSettings.model_fields[k].description} |" for k in common
    ]
    return "\n".join(parts).rstrip("\n") + "\n"
