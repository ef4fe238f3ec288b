"""Merging the one adapter every row names (services.inference.model): the logits equal those of peft's
per-row path (merging off) for all-adapter, mixed and switching batches; unmerging gives back the base weights
bit for bit; adapter and full-weight changes while merged end where they end unmerged; greedy completions over
HTTP are the same with merging on and off."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.inference.kv import KVBatch
from services.inference.model import ModelRunner
from services.inference.weights import apply_checkpoint, check_checkpoint, load_adapter, read_checkpoint, unload_adapter
from shared.inference_client import InferenceClient
from shared.inference_sync import SyncInferenceClient
from tests.integration.inference.conftest import server_settings

PROMPTS = [[5, 17, 300, 42, 9, 77], [11, 22, 33], [400, 401, 402, 403, 404, 405, 406, 407], [8, 9]]
STEPS = 4


def _adapter(tiny_model, path, seed: int, targets: list[str], rank: int):
    """A LoRA adapter with random A and B, B scaled so that B·A is ~1% of the weights (~2% of the elements need restoring) (a trained adapter's
    size; peft's random init makes it as large as the weights)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
    model = get_peft_model(base, config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.003)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapters(tiny_model, weights_root):
    """Paths of two adapters on different projections (pa: q, v, o; pb: k, gate, up, down): a merged pa must not
    let pb's LoRA into its rows, nor a merged pb pa's."""
    root = weights_root / "adapters"
    a = _adapter(tiny_model, root / "merge-a", 1, ["q_proj", "v_proj", "o_proj"], 4)
    b = _adapter(tiny_model, root / "merge-b", 2, ["k_proj", "gate_proj", "up_proj", "down_proj"], 8)
    return a, b


@pytest.fixture
def runners(tiny_model, adapters):
    """(merging on, merging off), each with adapters ``pa`` and ``pb`` loaded."""
    pair = []
    for merge in (True, False):
        runner = ModelRunner(tiny_model, merge_adapter=merge)
        load_adapter(runner, "pa", adapters[0])
        load_adapter(runner, "pb", adapters[1])
        pair.append(runner)
    return pair


def generate(runner: ModelRunner, adapters: list[str | None], steps: int = STEPS) -> torch.Tensor:
    """Logits ``[steps + 1, rows, vocab]``: prefill each prompt (row i: PROMPTS[i % 4] on adapters[i]), then
    ``steps`` batched decode steps feeding a fixed token sequence (the same for both runners)."""
    kv, logits = KVBatch(runner.num_layers), []
    first = []
    for row, adapter in enumerate(adapters):
        out, layers = runner.prefill(PROMPTS[row % len(PROMPTS)], adapter)
        kv.add_rows(layers)
        first.append(out)
    logits.append(torch.stack(first))
    for step in range(steps):
        tokens = [(7 * step + 13 * row) % 500 + 3 for row in range(len(adapters))]
        logits.append(runner.decode(kv, tokens, adapters))
    return torch.stack(logits)


def pristine(runner: ModelRunner) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in runner.params.items()}


def assert_params_equal(runner: ModelRunner, expected: dict[str, torch.Tensor]) -> None:
    changed = [name for name, param in runner.params.items() if not torch.equal(param, expected[name])]
    assert not changed, f"{len(changed)} parameters differ from the base, e.g. {changed[:3]}"


def test_a_batch_all_on_one_adapter_runs_merged_with_the_per_row_logits(runners):
    merged, per_row = runners
    ops: list[str] = []
    merged.on_merge = ops.append
    got, want = generate(merged, ["pa"] * 4), generate(per_row, ["pa"] * 4)
    assert merged.merged == "pa" and per_row.merged is None and ops == ["merge"]
    assert (got - want).abs().max() < 1e-4
    assert (want - generate(per_row, [None] * 4)).abs().max() > 1e-2  # the adapter changes the logits


def test_a_batch_all_on_one_adapter_unmerged_computes_what_the_per_row_path_does(runners):
    """Merging off: rows that all name one adapter run it as peft's active adapter (no per-row names); a base
    row beside them sends the batch down the per-row path. The adapter rows' logits agree, for either adapter
    (pa and pb target different projections: the inactive one must add nothing)."""
    _, unmerged = runners
    for name in ("pa", "pb", "pa"):
        plain = generate(unmerged, [name] * 4)
        assert list(unmerged.model.active_adapters) == [name]
        per_row = generate(unmerged, [name] * 4 + [None])
        assert (plain - per_row[:, :4]).abs().max() < 1e-5, name
        assert (per_row[:, 4] - generate(unmerged, [None] * 5)[:, 4]).abs().max() < 1e-5  # the base row: base
    assert (generate(unmerged, ["pa"] * 4) - generate(unmerged, ["pb"] * 4)).abs().max() > 1e-2


def test_prefill_uses_a_merge_but_does_not_start_one(runners):
    merged, _ = runners
    merged.prefill(PROMPTS[0], "pa")
    assert merged.merged is None  # prefill of a's prompt: the per-row path, nothing merged
    generate(merged, ["pa"] * 2, steps=1)
    assert merged.merged == "pa"
    merged.prefill(PROMPTS[1], "pa")
    assert merged.merged == "pa"
    merged.prefill(PROMPTS[1], None)
    assert merged.merged is None  # a base prompt needs the base weights


def test_mixed_batches_and_switching_adapters_match_the_per_row_path(runners):
    merged, per_row = runners
    base = pristine(merged)
    ops: list[str] = []
    merged.on_merge = ops.append
    for adapters, expect_merged in [
        (["pa"] * 3, "pa"),
        ([None, "pa", "pa", None], None),  # base rows unmerge a
        (["pb"] * 4, "pb"),  # a switch
        (["pa", "pb", "pa"], None),
        (["pa"] * 2, "pa"),
        (["pb"] * 2, "pb"),
    ]:
        got, want = generate(merged, adapters), generate(per_row, adapters)
        assert merged.merged == expect_merged, adapters
        assert (got - want).abs().max() < 1e-4, adapters
    assert ops == ["merge", "unmerge", "merge", "unmerge", "merge", "unmerge", "merge"]
    merged.unmerge()
    assert_params_equal(merged, base)  # every unmerge gave the base back exactly (the restored roundings)


def test_unloading_the_merged_adapter_serves_exactly_the_base_again(runners, tiny_model):
    merged, _ = runners
    fresh = ModelRunner(tiny_model)
    base = pristine(fresh)
    generate(merged, ["pb"] * 4)
    assert merged.merged == "pb"
    unload_adapter(merged, "pb")
    assert merged.merged is None and merged.adapters == {"pa"}
    assert_params_equal(merged, base)
    assert (generate(merged, [None] * 4) - generate(fresh, [None] * 4)).abs().max() < 1e-5
    generate(merged, ["pa"] * 2)
    unload_adapter(merged, "pa")  # the last one: peft's wrappers go, the plain base model is served
    assert merged.merged is None and not merged.has_adapters
    assert_params_equal(merged, base)
    assert torch.equal(generate(merged, [None] * 4), generate(fresh, [None] * 4))


def test_replacing_the_merged_adapter_in_place_serves_the_new_weights(runners, adapters):
    merged, per_row = runners
    generate(merged, ["pa"] * 2)
    for runner in runners:
        load_adapter(runner, "pa", adapters[1], replace=True)  # "pa" now holds pb's weights
    assert merged.merged is None
    assert (generate(merged, ["pa"] * 4) - generate(per_row, ["pa"] * 4)).abs().max() < 1e-4
    assert merged.merged == "pa"


def test_a_full_reload_while_merged_equals_the_reload_unmerged(runners, perturbed, tiny_model):
    merged, per_row = runners
    path, _ = perturbed
    generate(merged, ["pa"] * 4)
    assert merged.merged == "pa"
    for runner in runners:
        apply_checkpoint(runner, check_checkpoint(runner, read_checkpoint(path)))
    assert merged.merged is None
    assert_params_equal(merged, pristine(per_row))  # the new weights exactly, no delta baked in
    for adapters in (["pa"] * 4, [None, "pa", "pb", None], [None] * 2):
        assert (generate(merged, adapters) - generate(per_row, adapters)).abs().max() < 1e-4


def test_a_delta_as_large_as_the_weights_merges_and_unmerges_within_ulps(tiny_model, lora_adapter):
    """peft's random init (conftest's adapter): a quarter of the elements would need restoring, more than is
    kept, so those weights come back within ulps, not exactly; the logits still match the per-row path."""
    runner, per_row = ModelRunner(tiny_model, merge_adapter=True), ModelRunner(tiny_model, merge_adapter=False)
    base = pristine(runner)
    for r in (runner, per_row):
        load_adapter(r, "pa", lora_adapter[0])
    assert (generate(runner, ["pa"] * 4) - generate(per_row, ["pa"] * 4)).abs().max() < 1e-4
    assert runner.merged == "pa"
    runner.unmerge()
    for name, param in runner.params.items():
        torch.testing.assert_close(param, base[name], rtol=1e-6, atol=1e-7)
    assert (generate(runner, [None] * 4) - generate(per_row, [None] * 4)).abs().max() < 1e-5


def test_merging_off_or_in_bf16_never_merges(runners, tiny_model, adapters):
    _, per_row = runners
    generate(per_row, ["pa"] * 2, steps=1)
    assert per_row.merged is None
    bf16 = ModelRunner(
        tiny_model, precision="bf16", merge_adapter=True
    )  # bf16 autocast on the CPU: a merge would round the delta
    load_adapter(bf16, "pa", adapters[0])
    assert not bf16.merge_enabled
    generate(bf16, ["pa"] * 2, steps=1)
    assert bf16.merged is None


async def _greedy_batch(url: str, prompts: list[list[int]], models: list[str]) -> list[list[int]]:
    async with InferenceClient(url) as llm:
        outs = await asyncio.gather(
            *[
                llm.complete(model, prompt, max_tokens=12, temperature=0, ignore_eos=True)
                for prompt, model in zip(prompts, models, strict=True)
            ]
        )
    return [out.choices[0].token_ids for out in outs]


def test_greedy_completions_over_http_are_the_same_with_merging_on_and_off(tiny_model, weights_root, adapters):
    from testing.local_inference import serve_in_thread

    results, metrics = [], []
    for merge in (True, False):
        settings = server_settings(tiny_model, weights_root, merge_adapter=merge)
        with serve_in_thread(settings) as url, SyncInferenceClient(url) as client:
            client.load_lora("policy-v1", str(adapters[0]))
            all_adapter = asyncio.run(_greedy_batch(url, PROMPTS, ["policy-v1"] * 4))
            mixed = asyncio.run(_greedy_batch(url, PROMPTS, ["policy-v1", "policy", "policy-v1", "policy"]))
            client.unload_lora("policy-v1")
            base = asyncio.run(_greedy_batch(url, PROMPTS, ["policy"] * 4))
            metrics.append(_metrics(url))
        results.append((all_adapter, mixed, base))
    assert results[0] == results[1]
    assert 'coda_inference_adapter_merges_total{op="merge"}' in metrics[0]
    assert not any(
        line.startswith("coda_inference_adapter_merges_total{") and not line.endswith(" 0.0")
        for line in metrics[1].splitlines()
    )


def _metrics(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=10).text
