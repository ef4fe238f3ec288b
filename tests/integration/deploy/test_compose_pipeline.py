"""Compose runs what ``make train`` runs (the preparation, the demonstrations, the evals) from one description,
with CPU torch in the CPU profile's images, in a form both Docker Compose and podman-compose accept."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from launcher.config import StackSettings
from launcher.prepare import COMPOSE_ROOT, Layout, sft_path
from tests.integration.deploy.project import (
    ROOT,
    compose,
    dockerfile_instructions,
    env_example,
    raw_compose,
    service_environment,
    subcommands,
    walk_strings,
)

CPU_TORCH = "https://download.pytorch.org/whl/cpu"
TINY = str(ROOT / "configs" / "tiny-cpu.toml")
TRAINERS = ("trainer", "trainer-cpu")

# The variables compose cannot do without, nothing else: every other one at its default.
REQUIRED_ONLY = {"REDIS_PASSWORD": "x", "GRAFANA_PASSWORD": "x", "CODA_CONTROL_TOKEN": "x"}


def _active(profiles: set[str]) -> dict:
    return {
        name: s for name, s in compose()["services"].items() if not s.get("profiles") or set(s["profiles"]) & profiles
    }


def _dockerfile_arg(path: Path, name: str) -> str | None:
    for ins, args in dockerfile_instructions(path):
        if ins == "ARG" and args.split("=", 1)[0] == name:
            return args.split("=", 1)[1] if "=" in args else ""
    return None


def test_a_prepare_job_runs_the_make_train_preparation_before_anything_reads_it():
    services = compose()["services"]
    prepare = services["prepare"]
    assert prepare["restart"] == "no" and "profiles" not in prepare, "prepare is a one-shot of every profile"
    assert prepare["build"]["dockerfile"] == "Dockerfile.stack"
    entry = next(a for i, a in dockerfile_instructions(ROOT / "Dockerfile.stack") if i == "ENTRYPOINT")
    assert entry == '["python", "-m", "launcher"]'
    assert prepare["command"][0] == "prepare" and "prepare" in subcommands("stack")
    for reader in (*TRAINERS, "retriever", "policy-cpu"):
        assert services[reader]["depends_on"].get("prepare") == {"condition": "service_completed_successfully"}, (
            f"{reader} must wait for prepare to finish"
        )
    # One description: no compose shell line builds a model, an index or demonstrations by itself.
    for name, service in services.items():
        text = " ".join(walk_strings(service.get("command", [])))
        assert not re.search(r"make-tiny|make-sft|services\.retriever build", text), (
            f"{name} repeats a preparation step of launcher/prepare.py"
        )
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prepare["volumes"]}
    for reader in ("trainer-cpu", "retriever", "policy-cpu"):
        for mount in services[reader]["volumes"]:
            source, target = mount.split(":")[:2]
            if target in ("/app/runs", "/app/runs/models", "/app/runs/index"):
                assert mounts.get(target) == source, f"prepare does not write {target} where {reader} reads it"


def test_both_trainers_read_the_demonstrations_prepare_writes():
    """The SFT data path comes from the function make train uses (the recipes learn through RED/SFT on them):
    the gpu trainer reads them as the cpu one does, from the `runs` volume prepare writes them to."""
    settings = StackSettings.load(TINY)
    layout = Layout.for_recipe(TINY, settings)
    expected = sft_path(COMPOSE_ROOT, settings)
    assert expected is not None and layout.sft == expected
    prepare_runs = next(
        m.split(":")[0] for m in compose()["services"]["prepare"]["volumes"] if m.endswith(":/app/runs")
    )
    for trainer in TRAINERS:
        service = compose()["services"][trainer]
        assert service_environment(service)["CODA_TRAINER_SFT_DATA"] == f"/app/{expected.as_posix()}", trainer
        assert f"{prepare_runs}:/app/runs" in service["volumes"], trainer
    # The model prepare builds is the one every cpu-profile service reads.
    assert layout.tiny and str(layout.model) == "runs/models/tiny"


def test_gpu_recipes_get_no_tiny_model_but_the_demonstrations():
    """A hub model is not built, but make-sft needs only its tokenizer: the gpu trainer gets demonstrations."""
    for recipe in ("coda", "red-coda", "search-r1"):
        path = str(ROOT / "configs" / f"{recipe}.toml")
        settings = StackSettings.load(path)
        layout = Layout.for_recipe(path, settings)
        assert not layout.tiny and layout.sft == sft_path(COMPOSE_ROOT, settings) is not None, recipe


@pytest.mark.parametrize("env_name", ["example", "defaults"])
def test_cpu_profile_images_install_the_cpu_torch(env_name):
    env = env_example() if env_name == "example" else REQUIRED_ONLY
    checked = 0
    for name, service in compose(env)["services"].items():
        if not service.get("build") or (service.get("profiles") and "cpu" not in service["profiles"]):
            continue
        path = ROOT / service["build"]["dockerfile"]
        index = (service["build"].get("args") or {}).get("TORCH_INDEX_URL", _dockerfile_arg(path, "TORCH_INDEX_URL"))
        assert index == CPU_TORCH, f"{name} (cpu profile) would install torch from {index!r}, not the CPU index"
        checked += 1
    assert checked >= 6


def test_port_mappings_are_ones_podman_accepts():
    """podman refuses a host port range mapped onto a container port (range) of a different length."""
    for env in (env_example(), REQUIRED_ONLY):
        for name, service in compose(env)["services"].items():
            for entry in service.get("ports", []):
                host, container = str(entry).split(":")[-2:]
                width = [
                    1 if "-" not in p else int(p.split("-")[1]) - int(p.split("-")[0]) + 1 for p in (host, container)
                ]
                assert width[0] == width[1], f"{name}: {entry} maps {width[0]} host ports onto {width[1]}"


def test_no_dependency_is_optional_or_on_another_profile():
    """podman-compose ≤ 1.6 raises KeyError on `required: false` dependencies outside the active profiles."""
    for name, service in raw_compose()["services"].items():
        for target, spec in service.get("depends_on", {}).items():
            assert "required" not in spec, f"{name} → {target}: `required` crashes podman-compose ≤ 1.6"
    for profiles in ({"cpu"}, {"gpu"}, {"gpu", "searcher-llm"}):
        active = _active(profiles)
        for name, service in active.items():
            for target in service.get("depends_on", {}):
                assert target in active, f"under {sorted(profiles)}, {name} depends on {target}, which is off"


def test_the_trainers_are_not_restarted_after_they_finish():
    """A trainer exits 0 at max_steps; `unless-stopped` would start it again and again."""
    for name in TRAINERS:
        assert compose()["services"][name]["restart"] == "on-failure", name


def test_compose_smoke_is_a_make_target_a_valid_script_and_runs_in_ci():
    script = ROOT / "deploy" / "compose-smoke.sh"
    assert script.is_file() and script.stat().st_mode & 0o111, "deploy/compose-smoke.sh must be executable"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^compose-smoke:.*\n\t.*deploy/compose-smoke\.sh", makefile, flags=re.M)
    assert re.search(r"^compose-eval:", makefile, flags=re.M)
    host = ROOT / "deploy" / "podman-host.sh"
    assert host.is_file() and host.stat().st_mode & 0o111, "deploy/podman-host.sh must be executable"
    assert subprocess.run(["bash", "-n", str(host)], capture_output=True).returncode == 0
    assert re.search(r"^ci-compose:.*\n\t.*deploy/podman-host\.sh", makefile, flags=re.M)
    assert "deploy/compose-smoke.sh" in host.read_text()
    # CI runs the smoke in containers after the test suite (issue 28: images and compose cannot break unseen).
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci.index("make ci-compose") > ci.index("make test")


class _RecordingSupervisor:
    """Stands in for the supervisor: records what would start, and lets every job succeed."""

    def __init__(self, evals: Path) -> None:
        self.started: list[str] = []
        self.services: list = []
        self.evals = evals

    def start(self, service, *, wait: bool = True):
        self.started.append(service.name)
        self.services.append(service)
        return service

    def wait_healthy(self, service) -> None:
        assert service in self.services

    def wait_for(self, service, **_):
        if service.name.startswith("eval-"):
            out = self.evals / service.name.removeprefix("eval-")
            out.mkdir(parents=True, exist_ok=True)
            (out / "eval.json").write_text('{"by_source": {"ALL": {"n": 3, "f1": 0.5}}, "failed": 0}')
        return 0

    def stop(self, service) -> None:
        self.services.remove(service)


def _compose_layout(root: Path) -> Layout:
    settings = StackSettings.load(TINY)
    return Layout(
        model=root / "models/tiny",
        index=root / "index/lookup",
        corpus=settings.corpus,
        index_args=(),
        sft=sft_path(root, settings),
        evals=root / "eval",
    )


def test_prepare_runs_the_make_train_steps_in_order_then_nothing_on_a_restart(tmp_path):
    from launcher.train import LocalStack

    layout = _compose_layout(tmp_path / "runs")
    stack = LocalStack(TINY, StackSettings.load(TINY, run_root=str(tmp_path / "prepare")), layout=layout)
    sup = _RecordingSupervisor(layout.evals)
    sft, before = stack.prepare_all(sup, serving=False)
    assert sup.started == ["make-tiny", "index", "retriever", "inference", "make-sft", "eval-step0"]
    assert sft == layout.sft and before.n == 3
    # A restart: everything is in the volumes, nothing starts, the step-0 eval is read back.
    layout.model.mkdir(parents=True)
    (layout.model / "config.json").write_text("{}")
    layout.index.mkdir(parents=True)
    (layout.index / "manifest.json").write_text("{}")
    layout.sft.write_text('{"token_ids": [1], "loss_mask": [1]}\n')
    again = _RecordingSupervisor(layout.evals)
    sft, before = LocalStack(
        TINY, StackSettings.load(TINY, run_root=str(tmp_path / "prepare")), layout=layout
    ).prepare_all(again, serving=False)
    assert again.started == [] and before.n == 3 and sft == layout.sft


def test_make_train_keeps_redis_and_the_servers_up_for_training(tmp_path):
    from launcher.train import LocalStack

    stack = LocalStack(TINY, StackSettings.load(TINY, run_root=str(tmp_path)))
    sup = _RecordingSupervisor(stack.layout.evals)
    stack.prepare_all(sup)
    assert sup.started == ["make-tiny", "index", "redis", "retriever", "inference", "make-sft", "eval-step0"]
    assert [s.name for s in sup.services] == ["redis", "retriever", "inference"]
    assert stack.layout.sft == sft_path(stack.run, stack.settings)
