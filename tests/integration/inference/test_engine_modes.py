"""The engine without HTTP: processed-logprobs mode (what the recipes use with vLLM's
``--logprobs-mode processed_logprobs``) equals transformers' log-softmax of temperature-scaled logits, and the
EOS path keeps the id with a null stop_reason."""

from __future__ import annotations

import pytest
import torch

from services.inference.engine import Engine, GenerationRequest, Sequence, make_generators
from services.inference.model import ModelRunner
from services.inference.sampling import SamplingParams

PROMPT = [11, 22, 33, 44, 55]


@pytest.fixture(scope="module")
def runner(tiny_model):
    return ModelRunner(tiny_model)


def run(engine: Engine, params: SamplingParams, n: int = 2, seed: int = 0) -> list[Sequence]:
    request = GenerationRequest(
        [Sequence(prompt=PROMPT, params=params, adapter=None, generator=g) for g in make_generators(seed, n)]
    )
    engine.submit(request)
    sequences, _ = request.future.result(timeout=60)
    return sequences


def test_processed_logprobs_are_of_the_tempered_distribution(runner, reference):
    engine = Engine(runner, logprobs_mode="processed_logprobs")
    engine.start()
    try:
        for seq in run(engine, SamplingParams(max_tokens=12, temperature=0.7, ignore_eos=True)):
            with torch.inference_mode():
                logits = reference(torch.tensor([PROMPT + seq.out_ids])).logits[0].float()
            lp = (logits / 0.7).log_softmax(-1)[len(PROMPT) - 1 : -1]
            ref = lp.gather(1, torch.tensor(seq.out_ids).unsqueeze(1)).squeeze(1)
            assert (ref - torch.tensor(seq.out_logprobs)).abs().max() < 1e-4
    finally:
        engine.stop()


def test_eos_ends_with_the_id_kept_and_no_stop_reason(runner):
    engine = Engine(runner)
    engine.start()
    try:
        greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        first = run(engine, greedy, n=1)[0].out_ids[2]
        original = runner.eos_ids
        runner.eos_ids = frozenset({first})  # make the greedy path's third token the EOS
        try:
            seq = run(engine, SamplingParams(max_tokens=6, temperature=0.0), n=1)[0]
        finally:
            runner.eos_ids = original
    finally:
        engine.stop()
    assert seq.out_ids[-1] == first and len(seq.out_ids) <= 3
    assert seq.finish.reason == "stop" and seq.finish.stop_reason is None


def test_cancelled_request_stops_decoding(runner):
    import time

    engine = Engine(runner)
    engine.start()
    try:
        params = SamplingParams(max_tokens=400, ignore_eos=True)
        request = GenerationRequest([Sequence(prompt=PROMPT, params=params, adapter=None, generator=None)])
        engine.submit(request)
        deadline = time.monotonic() + 30
        while not engine.num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert request.future.cancel()
        while engine.num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.num_running == 0 and engine.alive
        assert len(run(engine, SamplingParams(max_tokens=3, ignore_eos=True), n=1)[0].out_ids) == 3
    finally:
        engine.stop()


def test_batched_prefill_equals_one_prompt_at_a_time(runner):
    from services.inference.prefix import Hit

    long_prompt = list(range(30, 70))
    _, cached = runner.prefill(long_prompt[:25], None)
    hit = Hit(25, cached)
    items = [(PROMPT, None, None), (long_prompt, None, hit), ([7, 8], None, None), (long_prompt, None, None)]
    batched = runner.prefill_batch(items)
    for item, (logits, layers) in zip(items, batched, strict=True):
        alone_logits, alone_layers = runner.prefill(item[0], None)
        assert (logits - alone_logits).abs().max() < 1e-4
        for (k, v), (k1, v1) in zip(layers, alone_layers, strict=True):
            assert k.shape == k1.shape and (k - k1).abs().max() < 1e-4 and (v - v1).abs().max() < 1e-4
