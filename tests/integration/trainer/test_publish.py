"""Weight publishing for the real CPU inference server, full weights and LoRA: the trainer writes and announces,
the rollout's loader puts the announced folder on the server; then the server's logprobs for a probe prompt
equal the trainer's (1e-4), old folders are deleted, Redis announces. A server that restarts is brought back
to the live version by the rollout's fleet watch, never by the trainer."""

from __future__ import annotations

import contextlib
import random
import time

import pytest

from services.rollout.loader import load_into
from services.trainer.config import TrainerSettings
from services.trainer.engine import build_engine, init_distributed
from services.trainer.packing import TrainSeq
from services.trainer.publish import Publisher
from services.trainer.step import Objective, StepInput, train_step
from services.trainer.sync_check import max_abs_diff, server_sample, serves, wait_served
from shared.inference_sync import SyncInferenceClient
from shared.protocol import WeightUpdate
from shared.stream import decode
from tests.integration.trainer import harness as h
from tests.live_vllm import running_vllm

PROMPT = [11, 12, 13, 14, 15, 16]


def _step(eng, settings, rng, vocab):
    seqs = []
    for i in range(8):
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(8, 24))]
        n = len(tokens)
        seqs.append(
            TrainSeq(
                tokens,
                [0] * 4 + [1] * (n - 4),
                {"old_logp": [-8.0] * n, "adv": [rng.uniform(-1, 1)] * n, "staleness": [0.0] * n},
                i,
            )
        )
    train_step(eng, StepInput(seqs), Objective(settings), None, budget=128)


@pytest.mark.slow
@contextlib.contextmanager
def _our_server(model, tmp_path):
    server, url = h.start_server(model, tmp_path)
    try:
        yield url
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.parametrize("server_kind", ["ours", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_published_full_and_lora_weights_reach_the_server_exactly(tmp_path, redis_client, server_kind):
    """Our CPU server, and a live vLLM (CPU build) with our worker extension: the same publish and load code."""
    from services.inference.factory import build_tiny_model, read_texts

    model = build_tiny_model(tmp_path / "model", read_texts(["data/hotpotqa/corpus.jsonl"], limit=300))
    serving = _our_server(model, tmp_path) if server_kind == "ours" else running_vllm(model, tmp_path / "vllm.log")
    rng = random.Random(0)
    with serving as url, SyncInferenceClient(url) as llm:
        llm.wait_ready(120)
        # LoRA first: the full publishes replace the server's base weights the adapters sit on.
        for kind, start in (("lora", 0), ("full", 10)):
            settings = TrainerSettings(model=str(model), finetune=kind, lr=5e-2, lora={"rank": 8})
            eng = build_engine(settings, init_distributed())
            pub = Publisher(eng.engine, str(tmp_path / f"w-{kind}"), kind, redis_client, "weights", "policy:version", 2)
            previous: tuple[list[int], list[float]] | None = None
            for version in range(start, start + 3):
                if version > start:
                    _step(eng, settings, rng, eng.lm.config.vocab_size)
                event = pub.publish(version, step=version - start)
                assert not serves(llm, event)  # written and announced, not loaded: that is the rollout's job
                load_into(url, event.kind, event.model_name, event.path, event.version)
                assert serves(llm, event)
                tokens, theirs = server_sample(llm, event.model_name, PROMPT, 12)
                assert len(tokens) == 12
                assert max_abs_diff(eng, PROMPT, tokens, theirs) <= 1e-4, (kind, version)
                if previous is not None:  # the check can fail: the previous version's logprobs differ
                    assert max_abs_diff(eng, PROMPT, *previous) > 1e-3
                previous = (tokens, theirs)
                assert int(redis_client.get("policy:version")) == version
            if kind == "lora":
                assert not (tmp_path / "w-lora" / "policy-v0").exists()  # keep window of 2
                assert (tmp_path / "w-lora" / "policy-v1").exists()
    events = [decode(WeightUpdate, f) for _, f in redis_client.xrange("weights")]
    assert [e.version for e in events] == [0, 1, 2, 10, 11, 12]
    assert [e.kind for e in events] == ["lora"] * 3 + ["full"] * 3


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_fleet_watch_loads_the_live_weights_into_a_restarted_server(tmp_path, redis_server, redis_client, kind):
    """The trainer announces a version; the rollout's weight sync loads it into the server. The server restarts
    with its start-up weights (full) or without our adapters (LoRA); the sync notices within its probe period
    and loads the live version again, exactly, once."""
    from services.inference.factory import build_tiny_model, read_texts
    from shared.redis_server import free_port

    model = build_tiny_model(tmp_path / "model", read_texts(["data/hotpotqa/corpus.jsonl"], limit=300))
    port = free_port()
    server, url = h.start_server(model, tmp_path, port=port)
    sync = None
    try:
        with SyncInferenceClient(url) as llm:
            llm.wait_ready(120)
            settings = TrainerSettings(model=str(model), finetune=kind, lr=5e-2, lora={"rank": 8})
            eng = build_engine(settings, init_distributed())
            pub = Publisher(eng.engine, str(tmp_path / "w"), kind, redis_client, "weights", "policy:version", 2)
            _step(eng, settings, random.Random(0), eng.lm.config.vocab_size)
            event = pub.publish(3, step=1)
            sync = h.start_weight_sync(redis_server.url, url, tmp_path / "sync.log")
            assert wait_served(llm, event, 60), (tmp_path / "sync.log").read_text()[-2000:]
            tokens, theirs = server_sample(llm, event.model_name, PROMPT, 12)
            assert max_abs_diff(eng, PROMPT, tokens, theirs) <= 1e-4
            server.terminate()
            server.wait(30)
            server, _ = h.start_server(model, tmp_path, port=port)
            llm.wait_ready(120)
            assert wait_served(llm, event, 60), (tmp_path / "sync.log").read_text()[-2000:]
            if kind == "full":
                assert llm.served_version() == 3
            tokens, theirs = server_sample(llm, event.model_name, PROMPT, 12)
            assert max_abs_diff(eng, PROMPT, tokens, theirs) <= 1e-4
            time.sleep(1.0)  # several more probes: the weights are there now, nothing is loaded again
            loads = (tmp_path / "sync.log").read_text().count("policy server behind: loading the live weights")
            assert loads == 2, (tmp_path / "sync.log").read_text()[-2000:]  # the first load and the restart's
    finally:
        if sync is not None:
            sync.terminate()
            sync.wait(30)
        server.terminate()
        server.wait(30)
