"""RL-health alerts: the rules that say a run has stopped learning, defined once (``rules.RULES``).

The same rules are evaluated in two places: Prometheus (``deploy/prometheus/alerts.yml``, generated from them
by ``python -m launcher.alerts``) and ``make train`` itself (``monitor.Monitor``, over the trainer's step
records and the rollout's ``/metrics``). Thresholds come from the recipe's ``[alerts]`` table
(``settings.AlertSettings``).
"""
