"""``python -m launcher.alerts``: regenerate deploy/prometheus/alerts.yml and docs/alerts.md from the rules
(``--recipe``/``--out``: a rules file with a recipe's ``[alerts]`` thresholds instead). The rules' promtool tests,
deploy/prometheus/alerts.test.yml, are test fixtures: ``python -m testing.alert_cases`` rewrites them."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.alerts.render import docs_markdown, rules_yaml
from launcher.alerts.settings import AlertSettings

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "deploy/prometheus/alerts.yml"
DOCS_FILE = ROOT / "docs/alerts.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.alerts", description=__doc__)
    parser.add_argument("--recipe", help="read thresholds from this recipe's [alerts] table")
    parser.add_argument("--out", type=Path, help="write the Prometheus rules here (with --recipe)")
    args = parser.parse_args(argv)
    if args.recipe or args.out:
        out = args.out or Path("alerts.yml")
        out.write_text(rules_yaml(AlertSettings.load(args.recipe)))
        print(f"wrote {out}")
        return 0
    # The committed files hold the defaults, whatever the environment says.
    defaults = AlertSettings.model_construct()
    RULES_FILE.write_text(rules_yaml(defaults))
    DOCS_FILE.write_text(docs_markdown(defaults))
    print(f"wrote {RULES_FILE} and {DOCS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
