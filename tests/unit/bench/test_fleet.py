"""bench/_fleet_report.py: the scaling and overhead arithmetic against numbers worked out by hand, the A B B A
order, and targets that the report can say are not met; and the fake server's latency knobs the benchmark
relies on (per-token latency, a cap on requests served at once, adapter loads and unloads)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from agents.prompts import CharTokenizer
from shared.inference_client import completion_body
from testing.fake_llm import FakeLLM, protocol_script


@pytest.fixture(scope="module")
def report():
    from bench import _fleet_report

    return _fleet_report


def test_scaling_is_judged_against_n_times_one_server(report):
    rows = report.with_scaling([{"servers": 1, "eps": 10.0}, {"servers": 4, "eps": 36.0}], capacity_per_server=12.5)
    one, four = rows
    assert one["linear"] == 10.0 and one["efficiency"] == 1.0 and one["of_ideal"] == pytest.approx(0.8)
    assert four["linear"] == 40.0 and four["efficiency"] == pytest.approx(0.9)  # 36 / (4 · 10)
    assert four["ideal"] == 50.0 and four["of_ideal"] == pytest.approx(0.72)


def test_scaling_needs_the_one_server_row(report):
    with pytest.raises(StopIteration):
        report.with_scaling([{"servers": 2, "eps": 10.0}], 1.0)


def test_repetitions_alternate_a_b_b_a(report):
    assert report.abba(1) == ["A", "B"]
    assert report.abba(4) == ["A", "B", "B", "A", "A", "B", "B", "A"]


def test_overhead_is_one_minus_the_ratio_of_the_means(report):
    runs = [
        {"variant": "fleet", "eps": 96.0},
        {"variant": "single", "eps": 100.0},
        {"variant": "single", "eps": 110.0},
        {"variant": "fleet", "eps": 99.0},
    ]
    out = report.overhead(runs)
    assert out["ratio"] == pytest.approx(97.5 / 105.0)
    assert out["overhead"] == pytest.approx(1 - 97.5 / 105.0)  # 7.1%: over the 5% target
    assert out["pairs"] == pytest.approx([0.96, 0.9])
    assert (out["pair_min"], out["pair_max"]) == pytest.approx((0.9, 0.96))
    assert out["met"] is False
    assert report.overhead([{"variant": "fleet", "eps": 97.0}, {"variant": "single", "eps": 100.0}])["met"] is True


def test_cpu_limit_is_the_rollout_core_or_the_host(report):
    assert report.cpu_limited({"rollout_cores": 0.9, "host_busy": 0.5})
    assert report.cpu_limited({"rollout_cores": 0.3, "host_busy": 0.95})
    assert not report.cpu_limited({"rollout_cores": 0.5, "host_busy": 0.6})


def test_the_report_says_not_met_below_ninety_percent(report):
    rows = report.with_scaling(
        [
            {"servers": n, "eps": eps, "episodes": 1, "latency_s": 1.0, "rollout_cores": 0.4, "server_cores": 0.1}
            | {"redis_cores": 0.0, "host_busy": 0.5, "failed": 0}
            for n, eps in ((1, 10.0), (16, 140.0))
        ],
        10.0,
    )
    cfg = {
        "slots": 4,
        "tokens": 32,
        "token_ms": 12.5,
        "service_s": 0.4,
        "capacity": 10.0,
        "in_flight": 128,
        "groups": 32,
        "n_samples": 4,
        "factor": 2.0,
        "max_n": 16,
        "window_s": 15.0,
        "warmup_s": 3.0,
    }
    text = "\n".join(report.scaling_section(rows, cfg))
    assert "**87.5%**" in text and "**not met** (87.5%)" in text and "No level was CPU-limited" in text


def test_spread_of_publish_times(report):
    assert report.spread([0.3, 0.1, 0.2]) == {"median": 0.2, "min": 0.1, "max": 0.3, "n": 3}


# ---------------------------------------------------------------- the fake server's knobs
async def _complete(client: httpx.AsyncClient, max_tokens: int) -> dict:
    body = completion_body("policy", CharTokenizer().encode("Question: who?\n"), max_tokens=max_tokens, stop=[])
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    return response.json()


async def test_fake_takes_its_time_per_token_and_serves_at_most_max_num_seqs():
    fake = FakeLLM(CharTokenizer(), protocol_script, token_delay_s=0.01, max_num_seqs=1, record=False)
    transport = httpx.ASGITransport(app=fake.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        start = time.perf_counter()
        out = await _complete(client, max_tokens=10)
        assert out["usage"]["completion_tokens"] == 10 and time.perf_counter() - start >= 0.1
        start = time.perf_counter()
        await asyncio.gather(_complete(client, 10), _complete(client, 10))  # one slot: one after the other
        assert time.perf_counter() - start >= 0.2


async def test_fake_loads_and_unloads_adapters_like_vllm():
    fake = FakeLLM(CharTokenizer(), protocol_script, load_delay_s=0.05)
    transport = httpx.ASGITransport(app=fake.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        start = time.perf_counter()
        load = await client.post("/v1/load_lora_adapter", json={"lora_name": "policy-v1", "lora_path": "/w/1"})
        assert load.status_code == 200 and time.perf_counter() - start >= 0.05
        assert fake.loras == {"policy-v1": "/w/1"}
        unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "policy-v1"})
        assert unload.status_code == 200 and unload.text == "Success: LoRA adapter 'policy-v1' removed successfully."
        assert fake.loras == {}
        again = await client.post("/v1/unload_lora_adapter", json={"lora_name": "policy-v1"})
        assert again.status_code == 404


def test_publish_report_explains_a_back_to_back_lag(report):
    cfg = {"load_ms": 100.0, "probe_s": 2.0, "gap_s": 11.0, "retry_s": 10.0, "fast_gap_s": 2.0}
    quick = report.spread([0.12])
    rows = [
        {"servers": 4, "fast": False, "event": quick, "total": quick, "loads": 3},
        {"servers": 4, "fast": True, "event": report.spread([9.5]), "total": report.spread([9.6]), "loads": 3},
    ]
    text = "\n".join(report.publish_section(rows, cfg))
    assert "| 4 (back-to-back) | 1 | 9500.0 |" in text and "SYNC_RETRY_S" in text
    assert "SYNC_RETRY_S" not in "\n".join(report.publish_section(rows[:1], cfg))


def test_overhead_report_flags_cpu_bound_runs_that_were_not(report):
    def run(variant, eps, cores):
        return {"variant": variant, "eps": eps, "cpu_ms_per_episode": 2.0, "rollout_cores": cores}

    def mode(cores):
        runs = [run("fleet", 99.0, cores), run("single", 100.0, cores)]
        return {"name": "cpu-bound", "describe": "", "runs": runs, "summary": report.overhead(runs)}

    starved = "\n".join(report.overhead_section([mode(0.4)]))
    assert "**1.0%** | **met** |" in starved and "not the fleet's CPU overhead" in starved
    assert "not the fleet's CPU overhead" not in "\n".join(report.overhead_section([mode(0.97)]))


def test_a_window_without_episodes_gives_no_ratio_rather_than_a_crash(report):
    out = report.overhead([{"variant": "fleet", "eps": 5.0}, {"variant": "single", "eps": 0.0}])
    assert out["ratio"] != out["ratio"] and out["met"] is False  # nan
