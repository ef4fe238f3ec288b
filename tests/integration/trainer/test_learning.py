"""Learning sanity, end to end: rollouts from the real CPU inference server → Redis → trainer → weights back.

Reward = fraction of generated tokens equal to a target token (the most frequent token of the initial policy,
so its starting reward is near 0 but not exactly 0). A sign error, a mask shifted by one, a loss on the wrong
tokens or weights that never reach the server all keep the reward flat. The trainer writes and announces each
version; the rollout's weight sync (run alone beside it) loads it into the server. After every publish the
trainer checks that the server's logprobs equal its own for the same weights.
"""

from __future__ import annotations

import json
import random
import subprocess
import time

import pytest

from shared.inference_sync import SyncInferenceClient
from shared.protocol import Sample, TrajectoryGroup
from shared.stream import AdmissionMarks, StreamQueue
from tests.integration.trainer import harness as h

GROUPS, N, NEW_TOKENS = 4, 8, 16
TARGET_REWARD, BUDGET_S = 0.5, 60.0


def _prompts(rng: random.Random, vocab: int) -> list[list[int]]:
    return [[rng.randrange(10, vocab) for _ in range(6)] for _ in range(GROUPS)]


def _pick_target(llm: SyncInferenceClient, model_dir, prompts: list[list[int]], eos: int) -> tuple[int, float]:
    """The token with the highest mean probability over the initial policy's own continuations."""
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    total = None
    for p in prompts:
        for c in llm.complete("policy", p, max_tokens=NEW_TOKENS, n=N, seed=1, ignore_eos=True).choices:
            with torch.no_grad():
                logits = lm(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
            probs = torch.softmax(logits.float(), -1).sum(0)
            total = probs if total is None else total + probs
    total[eos] = 0.0
    target = int(total.argmax())
    return target, float(total[target] / total.sum())


def _group(llm: SyncInferenceClient, prompt: list[int], target: int, round_: int) -> TrajectoryGroup:
    out = llm.complete("policy", prompt, max_tokens=NEW_TOKENS, n=N, ignore_eos=True)
    samples = []
    for c in out.choices:
        gen = len(c.token_ids)
        reward = sum(t == target for t in c.token_ids) / max(gen, 1)
        samples.append(
            Sample(
                sample_id=f"s{c.index}",
                token_ids=prompt + c.token_ids,
                prompt_len=len(prompt),
                loss_mask=[0] * len(prompt) + [1] * gen,
                logprobs=[0.0] * len(prompt) + c.logprobs,
                versions=[-1] * len(prompt) + [out.weight_version] * gen,
                reward=reward,
                reward_components={"target_fraction": reward},
            )
        )
    return TrajectoryGroup(
        prompt_id=f"p{round_}",
        agent="learning-sanity",
        policy_version=out.weight_version,
        samples=samples,
        created_at=time.time(),
    )


def _wait_taken(redis_client, published: int, proc, timeout: float) -> None:
    """Until the trainer's admission mark says it has taken ``published`` groups: the step they made (if they
    taught anything: groups of equal rewards are skipped and make no step) is then on the server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mark = AdmissionMarks(redis_client).read()
        if mark is not None and mark.consumed >= published:
            return
        assert proc.poll() is None, "trainer exited"
        time.sleep(0.01)
    raise TimeoutError(f"the trainer did not take {published} groups")


def _wait_served(llm: SyncInferenceClient, redis_client, proc, timeout: float) -> None:
    """Until the server serves the version Redis announces (the weight sync loads it): the rollout samples
    only from a server at the live version."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (llm.served_version() or 0) >= int(redis_client.get("policy:version")):
            return
        assert proc.poll() is None, "trainer exited"
        time.sleep(0.01)
    raise TimeoutError("the server did not get the announced version")


def _wait_version(redis_client, above: int, proc, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        raw = redis_client.get("policy:version")
        if raw is not None and int(raw) > above:
            return int(raw)
        assert proc.poll() is None, "trainer exited"
        time.sleep(0.01)
    raise TimeoutError(f"policy version did not pass {above}")


@pytest.mark.slow
def test_reward_rises_end_to_end(tmp_path, redis_client, redis_server):
    from services.inference.factory import build_tiny_model, read_texts

    model = build_tiny_model(tmp_path / "model", read_texts(["data/hotpotqa/corpus.jsonl"], limit=300))
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    server, url = h.start_server(model, tmp_path)
    sync = h.start_weight_sync(redis_server.url, url, tmp_path / "sync.log")
    trainer = h.start_trainer(
        [
            "--model",
            str(model),
            "--redis-url",
            redis_server.url,
            "--inference-url",
            url,
            "--served-model",
            "policy",
            "--groups-per-step",
            str(GROUPS),
            "--lr",
            "1e-2",
            "--warmup-steps",
            "0",
            "--clip-high",
            "0.28",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--checkpoint-every",
            "10",
            "--weights-dir",
            str(tmp_path / "w"),
            "--log-dir",
            str(tmp_path / "logs"),
            "--port",
            "0",
            "--sync-check",
            "true",
            "--read-block-ms",
            "50",
            "--max-staleness",
            "0",
        ],
        tmp_path / "trainer.log",
    )
    try:
        with SyncInferenceClient(url) as llm:
            llm.wait_ready(120)
            _wait_version(redis_client, -1, trainer, 120)  # the trainer is up and published v0
            _wait_served(llm, redis_client, trainer, 60)
            prompts = _prompts(random.Random(0), json.loads((model / "config.json").read_text())["vocab_size"])
            target, expected = _pick_target(llm, model, prompts, eos)
            queue = StreamQueue(redis_client, "trajectories", TrajectoryGroup)
            history, start = [], time.monotonic()
            while time.monotonic() - start < BUDGET_S:
                groups = [_group(llm, p, target, len(history)) for p in prompts]
                history.append(sum(s.reward for g in groups for s in g.samples) / (GROUPS * N))
                if len(history) >= 2 and min(history[-2:]) >= TARGET_REWARD:
                    break
                for g in groups:  # as the rollout does: the group, then the published count
                    queue.publish(g)
                    redis_client.incr("rollout:published")
                _wait_taken(redis_client, GROUPS * len(history), trainer, 60)
                _wait_served(llm, redis_client, trainer, 60)
        elapsed = time.monotonic() - start
        log = (tmp_path / "trainer.log").read_text()[-3000:]
        print(f"target {target} (initial probability {expected:.4f}); reward per round {history}; {elapsed:.1f}s")
        assert history[0] < 0.15, history
        assert min(history[-2:]) >= TARGET_REWARD, (f"reward {history} after {elapsed:.0f}s", log)
        records = [json.loads(line) for line in (tmp_path / "logs" / "train.jsonl").read_text().splitlines()]
        diffs = [r["sync_max_abs_diff"] for r in records if "sync_max_abs_diff" in r]
        assert len(diffs) == len(records) and max(diffs) <= 1e-4, diffs
        assert all(abs(r["mismatch_kl_k3"]) < 1e-6 for r in records)  # on-policy: trainer == sampler logprobs
        trainer.terminate()  # SIGTERM: finish the step, checkpoint, ack, draw the plots, exit 0
        assert trainer.wait(60) == 0, log
        assert (tmp_path / "logs" / "rewards.png").is_file()
        consumer = StreamQueue(redis_client, "trajectories", TrajectoryGroup, group="trainer", consumer="probe")
        assert consumer.stats().pending == 0
    finally:
        for proc in (trainer, sync, server):
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
