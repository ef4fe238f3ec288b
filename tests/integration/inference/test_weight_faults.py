"""Bad weights sent to a live server (full reload and LoRA): NaN/Inf values, truncated safetensors, broken
adapter configs. Each is a 400 that says what is wrong, and the server keeps serving exactly what it served
before (same tokens, same version, same adapters, /health ok)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from testing.local_inference import serve_in_thread
from tests.integration.inference.conftest import server_settings

PROMPT = [5, 17, 300, 42, 9, 77]


@pytest.fixture(scope="module")
def url(tiny_model, weights_root):
    settings = server_settings(tiny_model, weights_root)
    with serve_in_thread(settings) as url:
        yield url


def state(url: str, models: tuple[str, ...] = ("policy", "kept")) -> tuple:
    """What must not change: greedy tokens of the base and of a loaded adapter, the version, the model list."""
    with httpx.Client(base_url=url, timeout=60) as http:
        assert http.get("/health").status_code == 200
        outs = []
        for model in models:
            body = {
                "model": model,
                "prompt": PROMPT,
                "max_tokens": 8,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            data = http.post("/v1/completions", json=body).json()
            outs.append((data["choices"][0]["token_ids"], data["weight_version"]))
        return outs, sorted(card["id"] for card in http.get("/v1/models").json()["data"])


def test_a_first_adapter_that_fails_inside_peft_leaves_the_base_model(url, lora_adapter, weights_root):
    """Passes the checks, fails in peft after it wrapped the base model's layers (lora_B of the wrong width):
    the wrappers must come out again, or the base would run through half-loaded LoRA layers."""
    import torch
    from safetensors.torch import load_file, save_file

    before = state(url, ("policy",))
    target = weights_root / "adapters" / "bad-shape"
    shutil.copytree(lora_adapter[0], target, dirs_exist_ok=True)
    tensors = load_file(str(target / "adapter_model.safetensors"))
    name = next(n for n in sorted(tensors) if "lora_B" in n)
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
    save_file(tensors, str(target / "adapter_model.safetensors"))
    response = _load(url, target)
    assert response.status_code == 400 and "could not load LoRA adapter" in response.text, response.text
    assert state(url, ("policy",)) == before


@pytest.fixture(scope="module")
def kept_adapter(url, lora_adapter):
    """An adapter loaded before the faults: it must survive them."""
    response = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "kept", "lora_path": str(lora_adapter[0])})
    assert response.status_code == 200, response.text
    return lora_adapter[0]


def _poisoned_copy(source: Path, target: Path, file: str, value: float) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, dirs_exist_ok=True)
    tensors = load_file(str(source / file))
    name = sorted(tensors)[len(tensors) // 2]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(target / file))
    return target


def _truncated_copy(source: Path, target: Path, file: str) -> Path:
    shutil.copytree(source, target, dirs_exist_ok=True)
    data = (source / file).read_bytes()
    (target / file).write_bytes(data[: len(data) // 2])
    return target


def _reload(url: str, path: Path) -> httpx.Response:
    return httpx.post(
        f"{url}/collective_rpc", json={"method": "update_weights_from_path", "args": [str(path)]}, timeout=60
    )


def _load(url: str, path: Path, name: str = "bad", inplace: bool = False) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/load_lora_adapter",
        timeout=60,
        json={"lora_name": name, "lora_path": str(path), "load_inplace": inplace},
    )


@pytest.mark.parametrize(
    ("fault", "needle"),
    [
        ("nan", "non-finite"),
        ("inf", "non-finite"),
        ("-inf", "non-finite"),
        ("truncated", "could not read"),
        ("garbage", "could not read"),
    ],
)
def test_bad_full_reload_is_400_and_changes_nothing(url, kept_adapter, tiny_model, weights_root, fault, needle):
    before = state(url)
    target = weights_root / f"full-{fault}"
    if fault == "truncated":
        _truncated_copy(tiny_model, target, "model.safetensors")
    elif fault == "garbage":
        shutil.copytree(tiny_model, target, dirs_exist_ok=True)
        (target / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    else:
        _poisoned_copy(tiny_model, target, "model.safetensors", float(fault))
    response = _reload(url, target)
    assert response.status_code == 400 and needle in response.json()["error"]["message"], response.text
    assert state(url) == before


CONFIGS = {
    "not-json": "{'r': 4",
    "a-list": "[]",
    "null-rank": '{"peft_type": "LORA", "r": null, "target_modules": ["q_proj"]}',
    "text-alpha": '{"peft_type": "LORA", "r": 4, "lora_alpha": "x", "target_modules": ["q_proj"]}',
    "rank-mismatch": '{"peft_type": "LORA", "r": 2, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "o_proj"]}',
    "unknown-modules": '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["nope_proj"]}',
}


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("fault", ["nan", "inf", "truncated", *CONFIGS])
def test_bad_lora_adapter_is_400_and_changes_nothing(url, kept_adapter, weights_root, fault, inplace):
    before = state(url)
    target = weights_root / "adapters" / f"bad-{fault}"
    if fault in ("nan", "inf"):
        _poisoned_copy(kept_adapter, target, "adapter_model.safetensors", float(fault))
    elif fault == "truncated":
        _truncated_copy(kept_adapter, target, "adapter_model.safetensors")
    else:
        shutil.copytree(kept_adapter, target, dirs_exist_ok=True)
        (target / "adapter_config.json").write_text(CONFIGS[fault])
    response = _load(url, target, name="kept" if inplace else "bad", inplace=inplace)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"], response.text
    assert state(url) == before


def test_a_good_adapter_still_loads_after_the_faults(url, kept_adapter):
    assert _load(url, kept_adapter, name="again").status_code == 200
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "again"}).status_code == 200
