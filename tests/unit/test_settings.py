"""Settings precedence (defaults < TOML < env < CLI), forbidden extras, and the generated CLI."""

from __future__ import annotations

import argparse
from typing import ClassVar

import pytest
from pydantic import Field, ValidationError

from shared.settings import ServiceSettings, read_recipe, service_config


class DemoSettings(ServiceSettings):
    model_config = service_config("CODA_DEMO_")
    toml_section: ClassVar[str] = "demo"

    port: int = Field(8000, description="HTTP port")
    name: str = Field("base", description="a name")
    weights: dict[str, float] = Field(default_factory=dict, description="reward weights")
    topk: int | None = Field(None, description="optional")


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[demo]\nport = 9000\nname = "toml"\n[other]\nx = 1\n')
    return path


def test_defaults(monkeypatch):
    monkeypatch.delenv("CODA_RECIPE", raising=False)
    s = DemoSettings.load()
    assert (s.port, s.name, s.topk) == (8000, "base", None)


def test_precedence(recipe, monkeypatch):
    assert DemoSettings.load(recipe).port == 9000  # TOML over default
    monkeypatch.setenv("CODA_DEMO_PORT", "9100")
    assert DemoSettings.load(recipe).port == 9100  # env over TOML
    assert DemoSettings.load(recipe, port=9200).port == 9200  # CLI over env
    assert DemoSettings.load(recipe).name == "toml"


def test_recipe_from_env(recipe, monkeypatch):
    monkeypatch.setenv("CODA_RECIPE", str(recipe))
    assert DemoSettings.load().port == 9000


def test_unknown_keys_are_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[demo]\nprot = 1\n")
    with pytest.raises(ValidationError, match="prot"):
        DemoSettings.load(bad)


def test_missing_and_broken_recipe(tmp_path):
    with pytest.raises(FileNotFoundError, match="recipe file not found"):
        read_recipe(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[demo\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        read_recipe(broken)


def test_cli_flags(recipe, monkeypatch):
    monkeypatch.delenv("CODA_DEMO_PORT", raising=False)
    parser = argparse.ArgumentParser()
    DemoSettings.add_arguments(parser)
    assert "HTTP port" in parser.format_help()
    args = parser.parse_args(["--recipe", str(recipe), "--name", "cli", "--weights", '{"f1": 0.5}'])
    s = DemoSettings.from_args(args)
    assert (s.port, s.name, s.weights) == (9000, "cli", {"f1": 0.5})
    with pytest.raises(ValueError, match="expected JSON"):
        DemoSettings.from_args(parser.parse_args(["--weights", "{oops"]))
