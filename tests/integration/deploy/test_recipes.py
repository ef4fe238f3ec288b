"""Every shipped recipe (configs/*.toml) loads with every service's settings class, and the services of one
recipe agree with each other (batch shape, staleness, model names, which model is served where)."""

from __future__ import annotations

import os
import tomllib

import pytest

from agents import AGENTS as KNOWN_AGENTS
from tests.integration.deploy.project import ROOT, SERVICES, settings_class

RECIPES = sorted((ROOT / "configs").glob("*.toml"))
REQUIRED = {
    "tiny-cpu",
    "search-r1",
    "coda",
    "red-coda",
    "thinker-searcher",
    "recursive-reasoner",
    "tool-agent",
}
# The agent each named recipe runs: configs/<agent>.toml for every agent (tiny-cpu: whatever the embedded
# default chooses). Ablation arms are no recipes: bench/_ablation_arms.py overrides these (tests/unit/bench).
AGENTS = {name: name for name in KNOWN_AGENTS}


# Besides the services, the local stack (`make train`) reads its own [stack] table.
READERS = (*SERVICES, "stack")


def _table(path) -> dict:
    return tomllib.loads(path.read_text())


def _load_all(path, monkeypatch) -> dict[str, object]:
    for key in list(os.environ):
        if key.startswith("CODA_"):
            monkeypatch.delenv(key)
    return {s: settings_class(s).load(recipe=path) for s in READERS}


def test_every_recipe_of_the_issue_is_shipped():
    assert {p.stem for p in RECIPES} >= REQUIRED, f"missing: {sorted(REQUIRED - {p.stem for p in RECIPES})}"


@pytest.mark.parametrize("agent", sorted(KNOWN_AGENTS))
def test_every_agent_has_its_recipe_toml(agent, monkeypatch):
    """agents.AGENTS is what the e2e smoke trains: each agent through configs/<agent>.toml."""
    path = ROOT / "configs" / f"{agent}.toml"
    assert path.is_file(), f"agents.AGENTS has {agent!r} but configs/{agent}.toml is missing"
    assert _load_all(path, monkeypatch)["rollout"].agent == agent


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_with_every_service(path, monkeypatch):
    from launcher.alerts.settings import AlertSettings

    # [alerts]: the RL-health alerts' thresholds (docs/alerts.md), read by make train and the rules generator.
    sections = {settings_class(s).toml_section for s in READERS} | {"shared", AlertSettings.toml_section}
    unknown = set(_table(path)) - sections
    assert not unknown, f"{path.name}: tables no service reads: {sorted(unknown)}"
    assert set(_load_all(path, monkeypatch)) == set(READERS)
    AlertSettings.load(recipe=path)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_services_of_one_recipe_agree(path, monkeypatch):
    s = _load_all(path, monkeypatch)
    rollout, trainer, inference, searcher = (s[k] for k in ("rollout", "trainer", "inference", "searcher"))
    assert rollout.groups_per_step == trainer.groups_per_step, "rollout and trainer disagree on the step size"
    assert rollout.max_staleness == trainer.max_staleness, "rollout admits what the trainer would drop"
    assert trainer.temperature == rollout.temperature, "the trainer must score tokens at the sampling temperature"
    if path.stem in AGENTS:
        assert rollout.agent == AGENTS[path.stem]
    if path.stem == "red-coda":
        assert trainer.sft_data, "RED co-training needs demonstrations"
    assert rollout.served_model_name == (inference.served_model_name or inference.model)
    if trainer.finetune == "lora":
        assert trainer.lora.rank <= inference.max_lora_rank, "the server would refuse the adapter"
        # The rollout loads every version into every server: the adapters it keeps, and the one it loads.
        assert rollout.keep_adapters + 1 <= inference.max_loras, "more adapters kept than the server holds"
    if path.stem == "tiny-cpu":  # the one recipe whose CPU server serves the trained model itself
        assert trainer.model == inference.model == rollout.tokenizer
    if rollout.agent == "thinker-searcher":
        assert rollout.searcher_url.endswith(f":{searcher.port}")


def test_recipes_ask_the_compose_servers_for_models_they_serve(monkeypatch):
    """Under compose, vLLM serves "policy" (and "searcher" in profile searcher-llm): recipes must use those
    names, and LoRA recipes must fit vLLM's --max-lora-rank / --max-loras."""
    from tests.integration.deploy.project import compose

    services = compose()["services"]
    served = {}
    for name in ("policy", "searcher-llm"):
        flags = dict(a.removeprefix("--").split("=", 1) for a in services[name]["command"] if "=" in a)
        served[name] = flags
    for path in RECIPES:
        s = _load_all(path, monkeypatch)
        rollout, trainer = s["rollout"], s["trainer"]
        assert rollout.served_model_name == served["policy"]["served-model-name"], path.name
        assert trainer.served_model_name == served["policy"]["served-model-name"], path.name
        assert s["searcher"].served_model_name in (
            served["policy"]["served-model-name"],
            served["searcher-llm"]["served-model-name"],
        ), path.name
        max_model_len = int(served["policy"]["max-model-len"])
        assert rollout.max_context_tokens <= max_model_len, f"{path.name}: episodes longer than vLLM's context"
        # The CPU server reports logprobs the way compose's vLLM does.
        assert s["inference"].logprobs_mode == served["policy"]["logprobs-mode"], path.name
        if trainer.finetune == "lora":
            assert trainer.lora.rank <= int(served["policy"]["max-lora-rank"]), path.name
            assert rollout.keep_adapters + 1 <= int(served["policy"]["max-loras"]), path.name
            # Adapters rollouts may still sample from, plus the new one (deploy/vllm/README.md).
            assert rollout.max_staleness + 2 <= int(served["policy"]["max-loras"]), path.name
