"""docs/configuration.md is exactly what the settings classes generate (it cannot drift from the code)."""

from __future__ import annotations

from pathlib import Path

from launcher.reference import SETTINGS, render, settings_class

REPO = Path(__file__).resolve().parents[3]


def test_reference_is_up_to_date():
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc == render(), "regenerate: python -m launcher config-reference > docs/configuration.md"


def test_every_field_of_every_service_is_documented():
    doc = render()
    for _, module, name in SETTINGS:
        cls = settings_class(module, name)
        for key, field in cls.model_fields.items():
            nested = getattr(field.annotation, "model_fields", None)  # a nested table: its own keys are the rows
            for row in nested or [key]:
                assert f"| `{row}` |" in doc, (name, key, row)
            if nested:
                assert f"`[{cls.toml_section}.{key}]`" in doc, (name, key)
        assert f"`[{cls.toml_section}]`" in doc
