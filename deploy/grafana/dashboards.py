"""Writes the Grafana dashboards (deploy/grafana/dashboards/*.json) from the panel tables below.

    python -m deploy.grafana.dashboards          # regenerate after editing a table

The JSON files are committed (Grafana provisions them from disk); a test fails when they differ from what
this script writes, and another checks that every metric a panel queries is exported by some service
(``coda_*``) or is one of vLLM's own (``deploy/prometheus/vllm-metrics.txt``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from deploy.grafana.grafana_model import Dashboard, Panel
from deploy.grafana.panels_serving import INFERENCE, RETRIEVAL
from deploy.grafana.panels_training import PIPELINE, TRAINING

OUT = Path(__file__).resolve().parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}  # provisioning/datasources/prometheus.yml

DASHBOARDS = {"training": TRAINING, "pipeline": PIPELINE, "retrieval": RETRIEVAL, "inference": INFERENCE}


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
        for i, (expr, legend) in enumerate(panel.targets)
    ]
    out = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 4 if panel.kind == "stat" else 8, "w": panel.width, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
    }
    if panel.description:
        out["description"] = panel.description
    if panel.kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    else:
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
        }
    return out


def render(dashboard: Dashboard) -> dict:
    """The Grafana dashboard JSON (schema of Grafana 10/11) of one dashboard table."""
    panels, pid, y = [], 1, 0
    for row_title, row_panels in dashboard.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y, x, row_height = pid + 1, y + 1, 0, 0
        for panel in row_panels:
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            item = _panel_json(panel, pid, x, y)
            panels.append(item)
            pid, x, row_height = pid + 1, x + panel.width, max(row_height, item["gridPos"]["h"])
        y += row_height
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["coda-stack"],
        "timezone": "browser",
        "editable": False,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": []},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def dump(dashboard: Dashboard) -> str:
    return json.dumps(render(dashboard), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, dashboard in DASHBOARDS.items():
        (OUT / f"{name}.json").write_text(dump(dashboard))
        print(f"wrote {OUT / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
