"""A real tiny model (built once per session) served by the real server on 127.0.0.1, plus the plain
transformers model the server's numbers are checked against."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.inference.config import InferenceSettings
from services.inference.factory import build_tiny_model, read_texts
from shared.inference_sync import SyncInferenceClient
from shared.redis_server import free_port

REPO = Path(__file__).resolve().parents[3]
CORPUS_CANDIDATES = [REPO / "data/hotpotqa/corpus.jsonl", Path("/work/shared/data/hotpotqa-sample/corpus.jsonl")]


def corpus() -> Path:
    for path in CORPUS_CANDIDATES:
        if path.is_file():
            return path
    pytest.skip("no bundled corpus to train the tokenizer on")


@pytest.fixture(scope="session")
def weights_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="session")
def tiny_model(weights_root) -> Path:
    """~0.3M-parameter Qwen2 with a 1024-token BPE vocabulary and a 512-token context."""
    return build_tiny_model(
        weights_root / "base", read_texts([corpus()], limit=600), size="tiny", seed=0, vocab_size=1024, max_len=512
    )


@pytest.fixture(scope="session")
def reference(tiny_model):
    """The same checkpoint loaded by plain transformers (what the trainer computes logprobs with)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def server_settings(tiny_model: Path, weights_root: Path, **overrides) -> InferenceSettings:
    """A server of the tiny model named ``policy`` on a free port, room for two rank-16 adapters."""
    base = dict(
        model=str(tiny_model),
        served_model_name="policy",
        port=free_port(),
        weights_root=str(weights_root),
        max_loras=2,
        max_lora_rank=16,
    )
    return InferenceSettings(**{**base, **overrides})


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="session")
def server_url(tiny_model, weights_root):
    from testing.local_inference import serve_in_thread

    with serve_in_thread(server_settings(tiny_model, weights_root, max_num_seqs=64)) as url:
        yield url


@pytest.fixture
def client(server_url):
    with SyncInferenceClient(server_url) as c:
        yield c


def reference_logprobs(model, prompt: list[int], generated: list[int]) -> list[float]:
    """log p(generated[i] | prompt + generated[:i]) from one plain forward pass."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([prompt + generated])).logits[0].float()
    lp = logits.log_softmax(-1)[len(prompt) - 1 : len(prompt) - 1 + len(generated)]
    return lp.gather(1, torch.tensor(generated).unsqueeze(1)).squeeze(1).tolist()


@pytest.fixture(scope="session")
def lora_dir_for_contract(tiny_model, weights_root) -> Path:
    """A freshly initialised (zero-B) LoRA adapter: loading it must not change outputs."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    path = weights_root / "adapters" / "contract"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def lora_adapter(tiny_model, weights_root):
    """A rank-4 adapter with random (non-zero) B matrices: a known perturbation of q/v/o projections."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    path = weights_root / "adapters" / "lora-a"
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="session")
def perturbed(tiny_model, weights_root):
    """Base weights + 0.05·N(0,1) (seed 3), written atomically (temp dir renamed), and that model."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    tensors = load_file(str(tiny_model / "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    new = {k: (v + 0.05 * torch.randn(v.shape, generator=gen)).contiguous() for k, v in tensors.items()}
    tmp = weights_root / "full" / ".v1.tmp"
    tmp.mkdir(parents=True)
    save_file(new, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    final = weights_root / "full" / "v1"
    os.rename(tmp, final)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    model.load_state_dict(new, strict=False)
    model.tie_weights()
    return final, model
