"""The KV cache's dtype (``kv_dtype``): what the forward makes under bf16 autocast, and that storing KV in bf16
there changes nothing while fp32 stays exact."""

from __future__ import annotations

import pytest
import torch

from services.inference.kv import KVBatch
from services.inference.model import ModelRunner
from services.inference.prefix import PrefixCache


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pathlib import Path

    from services.inference.factory import build_tiny_model, read_texts

    corpora = [Path("data/hotpotqa/corpus.jsonl"), Path("/work/shared/data/hotpotqa-sample/corpus.jsonl")]
    corpus = next((p for p in corpora if p.is_file()), None)
    if corpus is None:
        pytest.skip("no bundled corpus to train the tokenizer on")
    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_model(root, read_texts([corpus], limit=600), size="tiny", seed=0, vocab_size=1024, max_len=512)


def greedy(runner: ModelRunner, prompt: list[int], steps: int = 8):
    """Greedy tokens decoded on a KVBatch, then the logits of a prefill that reuses the cached prefix."""
    cache = PrefixCache(max_bytes=10**8)
    logits, layers = runner.prefill(prompt, None)
    kv = KVBatch(runner.num_layers)
    kv.add_rows(layers)
    out, token = [], int(logits.argmax())
    for _ in range(steps):
        out.append(token)
        token = int(runner.decode(kv, [token], [None]).argmax())
    cache.put(
        None,
        prompt + out[:-1],
        [(k[:, :, : kv.length], v[:, :, : kv.length]) for k, v in zip(kv.keys, kv.values, strict=False)],
    )
    hit = cache.get(None, prompt + out)
    (batched, _), _ = runner.prefill_batch([(prompt + out, None, hit), (prompt[:9], None, None)])
    return out, (kv.keys[0].dtype, kv.values[0].dtype), batched, cache.nbytes


def test_autocast_today_makes_fp32_keys_and_bf16_values(tiny):
    runner = ModelRunner(tiny, precision="bf16", kv_dtype="fp32")
    runner.kv_dtype = None  # no cast: what the forward itself leaves in the cache
    _, layers = runner.prefill(list(range(10, 30)), None)
    assert (layers[0][0].dtype, layers[0][1].dtype) == (torch.float32, torch.bfloat16)


def test_fp32_is_unchanged_and_bf16_kv_works(tiny):
    prompt = list(range(10, 60))
    fp32 = greedy(ModelRunner(tiny, precision="fp32"), prompt)
    assert fp32[1] == (torch.float32, torch.float32)
    # bf16 KV with fp32 compute: rounded K/V, cast back for the attention; output close, half the bytes
    half = greedy(ModelRunner(tiny, precision="fp32", kv_dtype="bf16"), prompt)
    assert half[1] == (torch.bfloat16, torch.bfloat16) and half[3] * 2 == fp32[3]
    assert (half[2] - fp32[2]).abs().max() < 0.05
    # under bf16 autocast the attention computes in bf16 anyway: bf16 KV (auto) gives exactly fp32 KV's logits
    auto = greedy(ModelRunner(tiny, precision="bf16"), prompt)
    wide = greedy(ModelRunner(tiny, precision="bf16", kv_dtype="fp32"), prompt)
    assert auto[1] == (torch.bfloat16, torch.bfloat16) and wide[1] == (torch.float32, torch.float32)
    assert auto[0] == wide[0] and torch.equal(auto[2], wide[2]) and auto[3] * 2 == wide[3]


def test_bf16_linears_under_autocast_compute_the_same_bits(tiny):
    """Under autocast the decoder's linears are stored in bf16 (no per-forward cast); the logits are those of
    fp32 weights cast by autocast, bit for bit, and a tied output head stays fp32."""
    stored = ModelRunner(tiny, precision="bf16")
    cast = ModelRunner(tiny, precision="bf16")
    for module in cast.base.modules():  # what the server held before: fp32 weights autocast casts each forward
        if isinstance(module, torch.nn.Linear):
            module.weight.data = module.weight.data.float()
    linears = [m for m in stored.base.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert stored.base.get_input_embeddings().weight.dtype == torch.float32
    prompt = list(range(10, 60))
    assert greedy(stored, prompt)[0] == greedy(cast, prompt)[0]
    a, b = stored.prefill(prompt, None)[0], cast.prefill(prompt, None)[0]
    assert torch.equal(a, b)


def test_tied_head_copy_follows_the_weight(tiny):
    """The tied output head's bf16 copy is made again when the weight changes in place (a weight reload)."""
    runner = ModelRunner(tiny, precision="bf16")
    assert runner.tied
    prompt = list(range(10, 40))
    before = runner.prefill(prompt, None)[0]
    with torch.no_grad():
        runner.base.get_input_embeddings().weight.mul_(1.5)  # what a reload's copy_ does: same tensor, new version
    after = runner.prefill(prompt, None)[0]
    fresh = ModelRunner(tiny, precision="bf16")
    with torch.no_grad():
        fresh.base.get_input_embeddings().weight.mul_(1.5)
    assert not torch.equal(before, after)
    assert torch.equal(after, fresh.prefill(prompt, None)[0])
