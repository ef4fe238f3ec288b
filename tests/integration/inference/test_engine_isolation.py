"""The engine without HTTP, with faults injected below the route's validation: an exception while admitting or
stepping one request fails that request only, the running set and KV batch stay consistent, and the other
requests' tokens are exactly those of a fault-free run. Also the KV-cache growth under inference mode that
used to crash the next admission of a longer prompt, and a stopped engine failing requests instead of
hanging them."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from services.inference.engine import Engine, GenerationRequest, Sequence, make_generators
from services.inference.model import ModelRunner
from services.inference.sampling import SamplingParams


@pytest.fixture(scope="module")
def runner(tiny_model):
    return ModelRunner(tiny_model)


@pytest.fixture
def engine(runner):
    engine = Engine(runner, max_num_seqs=64, prefix_cache_tokens=0)
    engine.start()
    yield engine
    engine.stop()


def request(prompt: list[int], seed: int, **params) -> GenerationRequest:
    params = SamplingParams(**{"max_tokens": 8, "ignore_eos": True, **params})
    return GenerationRequest(
        [Sequence(prompt=prompt, params=params, adapter=None, generator=g) for g in make_generators(seed, 1)]
    )


def goods(count: int = 16) -> list[GenerationRequest]:
    return [request([5 + i, 17, 300, 42][: 2 + i % 3], seed=i) for i in range(count)]


def tokens(future: Future) -> list[int]:
    sequences, _ = future.result(timeout=60)
    return sequences[0].out_ids


def submit_together(engine: Engine, requests: list[GenerationRequest]) -> list[Future]:
    """Queue every request while admission is held, so they are admitted (and prefilled) in one batch."""
    held = engine.control(lambda: None, ready=lambda: False)  # an op that never gets ready blocks admission
    futures = [engine.submit(r) for r in requests]
    engine.ops.remove(next(op for op in engine.ops if op.future is held))
    with engine._wake:
        engine._wake.notify_all()
    return futures


def wait_idle(engine: Engine) -> None:
    """Until the step that completed the last future has also finished its bookkeeping (it resolves first)."""
    deadline = time.monotonic() + 10
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.01)


def assert_clean(engine: Engine) -> None:
    wait_idle(engine)
    assert engine.running == [] and engine.owners == {} and engine.kv.rows == 0


def test_out_of_vocabulary_stop_id_fails_only_its_request(engine, runner):
    """The fault behind the 16 × 500: the masked id is out of range at prefill and at every step."""
    expected = [tokens(f) for f in submit_together(engine, goods())]
    bad = request([1, 2, 3], seed=99, min_tokens=5, stop_token_ids=frozenset({1_000_000}))
    futures = submit_together(engine, [*goods()[:8], bad, *goods()[8:]])
    with pytest.raises(IndexError):
        futures[8].result(timeout=60)
    assert [tokens(f) for f in futures[:8] + futures[9:]] == expected
    assert_clean(engine)
    assert engine.consecutive_failures == 0


def test_a_fault_in_one_row_of_a_decode_step_fails_only_that_request(engine, monkeypatch):
    expected = [tokens(f) for f in submit_together(engine, goods())]
    bad = request([1, 2, 3], seed=99, max_tokens=20)
    banned = engine._banned

    def faulty(seq: Sequence) -> list[int]:
        if seq is bad.sequences[0] and len(seq.out_ids) == 3:
            raise RuntimeError("injected row fault")
        return banned(seq)

    monkeypatch.setattr(engine, "_banned", faulty)
    futures = submit_together(engine, [bad, *goods()])
    with pytest.raises(RuntimeError, match="injected row fault"):
        futures[0].result(timeout=60)
    assert [tokens(f) for f in futures[1:]] == expected
    assert_clean(engine)


def test_a_failing_batched_forward_falls_back_to_rows_with_identical_tokens(engine, runner, monkeypatch):
    expected = [tokens(f) for f in submit_together(engine, goods(6))]
    decode = runner.decode

    def batch_fault(kv, ids, adapters, **kwargs):
        if kv.rows > 1:
            raise RuntimeError("injected batch fault")
        return decode(kv, ids, adapters, **kwargs)

    monkeypatch.setattr(runner, "decode", batch_fault)
    assert [tokens(f) for f in submit_together(engine, goods(6))] == expected
    assert_clean(engine)


def test_every_step_failing_poisons_the_engine_until_one_succeeds(engine, runner, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected decode fault")

    monkeypatch.setattr(runner, "decode", broken)
    for i in range(3):
        with pytest.raises(RuntimeError, match="injected decode fault"):
            tokens(engine.submit(request([7, 8], seed=i)))
    wait_idle(engine)
    with pytest.raises(RuntimeError, match="failed"):
        engine.check_health()
    monkeypatch.undo()
    assert len(tokens(engine.submit(request([7, 8], seed=0)))) == 8
    assert "running" in engine.check_health()
    assert_clean(engine)


def test_a_longer_prompt_joins_after_the_cache_grew_during_decoding(engine, runner, monkeypatch):
    """Decode grows the KV buffers inside torch.inference_mode (4 → 64 columns at the second step); a prompt
    longer than the running rows but within that capacity is then joined by shifting the buffers in place on
    the engine thread, outside inference mode: that raised 'Inplace update to inference tensor outside
    InferenceMode' and failed every running request (sporadic in production: it needs this arrival order)."""
    decode, steps, joined = runner.decode, [], []

    def decode_then_submit(kv, ids, adapters, **kwargs):
        logits = decode(kv, ids, adapters, **kwargs)
        steps.append(kv.length)
        if len(steps) == 5:  # queued during this step, admitted right after it
            joined.append(engine.submit(request(list(range(10, 50)), seed=2, max_tokens=4)))
        return logits

    monkeypatch.setattr(runner, "decode", decode_then_submit)
    long = engine.submit(request([3, 4, 5], seed=1, max_tokens=40))
    assert len(tokens(long)) == 40 and len(tokens(joined[0])) == 4
    assert steps[4] < 40 <= 64  # the join needed a shift within the grown buffers, no reallocation
    assert_clean(engine)


def test_a_stopped_engine_fails_requests_instead_of_hanging(runner):
    engine = Engine(runner)
    engine.start()
    engine.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        engine.submit(request([1, 2], seed=0)).result(timeout=5)
    with pytest.raises(RuntimeError, match="not running"):
        engine.check_health()


def test_a_dead_engine_thread_fails_waiting_and_new_requests_and_says_why(runner, monkeypatch):
    engine = Engine(runner)
    engine.control(lambda: None, ready=lambda: False)  # holds admission: the request below stays waiting
    waiting = engine.submit(request([1, 2], seed=0))

    class Fatal(BaseException):  # not an Exception: nothing in the loop catches it
        pass

    def crash() -> bool:
        raise Fatal("injected loop fault")

    monkeypatch.setattr(engine, "_run_ops", crash)
    engine.start()
    with pytest.raises(RuntimeError, match=r"stopped.*injected loop fault"):
        waiting.result(timeout=10)
    with pytest.raises(RuntimeError, match=r"stopped.*injected loop fault"):
        engine.submit(request([1, 2], seed=0)).result(timeout=5)
    with pytest.raises(RuntimeError, match=r"not running.*Fatal"):
        engine.check_health()
    engine.stop()
