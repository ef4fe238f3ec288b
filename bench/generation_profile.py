"""Where generation time goes on the inference server, under an agent-like multi-turn load.

    .venv/bin/python -m bench.generation_profile                      # SmolLM2-135M (runs/models/...) if present
    .venv/bin/python -m bench.generation_profile --quick              # tiny model, < 1 min: checks the script
    .venv/bin/python -m bench.generation_profile --server-arg=--kv-dtype=fp32   # one server setting changed
    .venv/bin/python -m bench.generation_profile --url http://127.0.0.1:8000 --model policy   # a running server
    .venv/bin/python -m bench.generation_profile --baseline d065602                 # against an older commit

The load: ``--sessions`` concurrent sessions × ``--turns`` turns, like a search agent: each turn's prompt is the
previous prompt + its completion + an observation of ``--observation`` token ids (the first prompt has
``--first`` ids), ``--max-tokens`` sampled tokens a turn (``ignore_eos``, so every turn decodes as many). Token
ids are random: what a step costs does not depend on which tokens. One warm-up session runs first.

It starts ``python -m services.inference serve`` (``--threads``, ``--server-arg`` passed on) and reads the
server's own counters (``GET /status``, differenced around the load): prefill passes / tokens / seconds,
decode steps / tokens / seconds, mean and max rows per decode step, prefix-cache hits and reused tokens, the
bytes it holds, and the server's peak RSS. Prefill GFLOP/s counts 2 FLOPs per non-embedding parameter per
prefilled token (attention scores and the LM head left out) and is set against a 2048² matmul in the server's
compute dtype (``bench._step_profile_2wiki.matmul_gflops``, measured with the server stopped).

``--url``: drive a server already running (ours, or vLLM: ``make vllm-cpu``, then serve it); then only what
the client sees (wall, tokens, tokens/s) plus ``/status`` when it has one, and vLLM's ``/metrics`` prefill/
prefix-cache counters when those exist. ``--baseline REV``: the same load also on the server of commit REV (a
git worktree), the two alternating over ``--reps`` rounds; the page adds both medians and their ratio. Writes
``<out>.md`` and ``<out>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = REPO / "runs" / "models" / "smollm2-135m-instruct"
OUT = REPO / "bench" / "results" / "generation_profile"

from shared.inference_client import InferenceClient  # noqa: E402
from shared.redis_server import free_port  # noqa: E402


def tiny_model(root: Path) -> Path:
    from services.inference.factory import build_tiny_model, read_texts

    corpora = [REPO / "data/hotpotqa/corpus.jsonl", Path("/work/shared/data/hotpotqa-sample/corpus.jsonl")]
    corpus = next(p for p in corpora if p.is_file())
    return build_tiny_model(root / "tiny", read_texts([corpus], limit=600), size="tiny", seed=0, vocab_size=1024)


def start_server(
    model: Path, root: Path, port: int, threads: int, extra: list[str], tree: Path = REPO
) -> subprocess.Popen:
    """The server of the source tree ``tree`` (this checkout, or a worktree of ``--baseline``)."""
    cmd = [sys.executable, "-m", "services.inference", "serve", "--model", str(model), "--port", str(port)]
    cmd += ["--served-model-name", "policy", "--weights-root", str(root), "--threads", str(threads), *extra]
    env = {**os.environ, "CODA_LOG_LEVEL": os.environ.get("CODA_LOG_LEVEL", "WARNING")}
    return subprocess.Popen(cmd, cwd=tree, env=env)


async def session(llm: InferenceClient, name: str, i: int, args, vocab: int) -> dict:
    rng = random.Random(1000 + i)
    ids = [rng.randrange(10, vocab) for _ in range(args.first)]
    sent = received = 0
    lengths = []
    for turn in range(args.turns):
        out = await llm.complete(
            name, ids, max_tokens=args.max_tokens, temperature=1.0, seed=100 * i + turn, ignore_eos=True
        )
        completion = out.choices[0].token_ids
        sent, received = sent + len(ids), received + len(completion)
        lengths.append(len(ids))
        ids = ids + completion + [rng.randrange(10, vocab) for _ in range(args.observation)]
    return {"prompt_tokens": sent, "completion_tokens": received, "prompt_lengths": lengths}


async def status(url: str) -> dict | None:
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{url}/status")
        return r.json() if r.status_code == 200 else None


async def prom(url: str) -> dict[str, float]:
    """Unlabelled-or-summed counters of a Prometheus /metrics page (vLLM's ``vllm:*`` or ours)."""
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.get(f"{url}/metrics")
    out: dict[str, float] = {}
    for line in r.text.splitlines() if r.status_code == 200 else []:
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def diff(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) if isinstance(v, int | float) else v for k, v in after.items()}


async def drive(url: str, name: str, args, vocab: int) -> dict:
    async with InferenceClient(url, timeout=3600) as llm:
        await llm.wait_ready(600)
        warm = argparse.Namespace(**{**vars(args), "turns": 2})
        await session(llm, name, 999, warm, vocab)  # warm-up: one-off costs, not counted
        before, prom_before = await status(url), await prom(url)
        start = time.perf_counter()
        results = await asyncio.gather(*[session(llm, name, i, args, vocab) for i in range(args.sessions)])
        wall = time.perf_counter() - start
        after, prom_after = await status(url), await prom(url)
    client = {
        "wall_s": wall,
        "requests": args.sessions * args.turns,
        "prompt_tokens": sum(r["prompt_tokens"] for r in results),
        "completion_tokens": sum(r["completion_tokens"] for r in results),
        "prompt_len_min": min(min(r["prompt_lengths"]) for r in results),
        "prompt_len_max": max(max(r["prompt_lengths"]) for r in results),
    }
    client["completion_tokens_per_s"] = client["completion_tokens"] / wall
    out = {"client": client, "prometheus": diff(prom_after, prom_before)}
    if before and after:
        engine = diff(after["engine"], before["engine"])
        engine["decode_rows_max"] = after["engine"]["decode_rows_max"]
        cache = diff(after["prefix_cache"], before["prefix_cache"])
        cache.update({k: after["prefix_cache"][k] for k in ("entries", "tokens", "bytes", "max_tokens", "max_bytes")})
        out["server"] = {**{k: v for k, v in after.items() if k not in ("engine", "prefix_cache")}}
        out["engine"], out["prefix_cache"] = engine, cache
    return out


def peak_rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def derive(res: dict, peak: dict[str, float]) -> dict:
    e = res.get("engine")
    if not e:
        return {}
    srv = res["server"]
    d = {
        "prefill_s": e["prefill_seconds"],
        "decode_s": e["decode_seconds"],
        "prefill_share": e["prefill_seconds"] / max(1e-9, e["prefill_seconds"] + e["decode_seconds"]),
        "prefill_tokens_per_s": e["prefill_tokens"] / max(1e-9, e["prefill_seconds"]),
        "decode_tokens_per_s": e["decode_tokens"] / max(1e-9, e["decode_seconds"]),
        "decode_rows_mean": e["decode_tokens"] / max(1, e["decode_steps"]),
        "decode_rows_max": e["decode_rows_max"],
        "prefill_prompts_per_pass": e["prefill_prompts"] / max(1, e["prefill_passes"]),
    }
    dense = srv.get("dense_params")
    if dense:
        d["prefill_gflops"] = 2 * dense * e["prefill_tokens"] / max(1e-9, e["prefill_seconds"]) / 1e9
        d["decode_gflops"] = 2 * dense * e["decode_tokens"] / max(1e-9, e["decode_seconds"]) / 1e9
        key = "bf16" if srv.get("autocast_bf16") else "fp32"
        if peak.get(key):
            d["matmul_peak_gflops"] = peak[key]
            d["prefill_of_peak"] = d["prefill_gflops"] / peak[key]
            d["decode_of_peak"] = d["decode_gflops"] / peak[key]
    return d


def dense_params(model: Path) -> int | None:
    """Parameters but the input embedding (tied or not, the prefill's LM head runs on one row a prompt)."""
    try:
        config = json.loads((model / "config.json").read_text())
        from services.inference.factory import count_parameters

        return count_parameters(model) - config["vocab_size"] * config["hidden_size"]
    except Exception:
        return None


def serve_and_drive(model: Path, root: Path, args, vocab: int, tree: Path = REPO) -> dict:
    port = free_port()
    proc = start_server(model, root, port, args.threads, args.server_arg, tree)
    try:
        res = asyncio.run(drive(f"http://127.0.0.1:{port}", "policy", args, vocab))
        res["server_peak_rss_mb"] = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return res


def compare(model: Path, root: Path, args, vocab: int, first: dict) -> dict:
    """``--baseline``: the same load on the server of another commit (a git worktree), alternating with this
    tree's over ``--reps`` rounds (the first round of this tree's is the run above), so drift hits both alike."""
    worktree = root / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.baseline], cwd=REPO, check=True)
    runs: dict[str, list[dict]] = {"baseline": [], "head": [first]}
    try:
        for rep in range(args.reps):
            runs["baseline"].append(serve_and_drive(model, root, args, vocab, worktree))
            if rep:
                runs["head"].append(serve_and_drive(model, root, args, vocab))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, check=False)
    return {"commit": args.baseline, "reps": args.reps, **{k: [summary(r) for r in v] for k, v in runs.items()}}


def summary(res: dict) -> dict:
    e = res.get("engine", {})
    return {
        "wall_s": res["client"]["wall_s"],
        "completion_tokens_per_s": res["client"]["completion_tokens_per_s"],
        "prefill_s": e.get("prefill_seconds"),
        "decode_s": e.get("decode_seconds"),
        "peak_rss_mb": res.get("server_peak_rss_mb"),
    }


def comparison_lines(base: dict) -> list[str]:
    """Medians of each side and this tree's ratio to the baseline (a measure the baseline's /status lacks: –)."""

    def med(side: str, key: str) -> float | None:
        values = [r[key] for r in base[side] if r.get(key) is not None]
        return statistics.median(values) if values else None

    rows = [("wall (s)", "wall_s"), ("completion tokens / s", "completion_tokens_per_s"), ("prefill s", "prefill_s")]
    rows += [("decode s", "decode_s"), ("server peak RSS (MB)", "peak_rss_mb")]
    lines = [
        "",
        f"## Against `{base['commit']}` (the same load, {base['reps']} alternating rounds, medians)",
        "",
        f"| measure | {base['commit']} | this tree | this tree / {base['commit']} |",
        "|---|---:|---:|---:|",
    ]
    lines.insert(
        -2,
        "Each round's wall seconds: "
        + "; ".join(f"{side} " + ", ".join(f"{r['wall_s']:.1f}" for r in base[side]) for side in ("baseline", "head"))
        + ".\n",
    )
    for label, key in rows:
        b, h = med("baseline", key), med("head", key)
        ratio = f"{h / b:.2f}" if b and h else "–"
        lines.append(
            f"| {label} | {'–' if b is None else f'{b:,.1f}'} | {'–' if h is None else f'{h:,.1f}'} | {ratio} |"
        )
    return lines


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a, c, e, p, d = (result.get(k, {}) for k in ("args", "client", "engine", "prefix_cache", "derived"))
    lines = [
        "# Generation profile",
        "",
        f"`python -m bench.generation_profile {' '.join(result['argv'])}` on {result['host']}, {result['date']}.",
        "",
        f"Load: {a['sessions']} sessions × {a['turns']} turns, first prompt {a['first']} ids, +{a['max_tokens']} "
        f"sampled + {a['observation']} observation ids a turn (prompts {c['prompt_len_min']}–{c['prompt_len_max']} "
        f"tokens). Server: {result.get('server', {})}.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| wall (s) | {c['wall_s']:.1f} |",
        f"| completion tokens / s (client) | {c['completion_tokens_per_s']:.1f} |",
        f"| prompt tokens sent / completion tokens | {c['prompt_tokens']:,} / {c['completion_tokens']:,} |",
    ]
    if e:
        lines += [
            f"| prefill: passes / prompts / tokens run / tokens from cache | {e['prefill_passes']} / "
            f"{e['prefill_prompts']} / {e['prefill_tokens']:,} / {e['prefill_cached_tokens']:,} |",
            f"| prefill s / decode s (prefill share) | {d['prefill_s']:.1f} / {d['decode_s']:.1f} "
            f"({d['prefill_share']:.0%}) |",
            f"| prefill tokens/s, GFLOP/s | {d['prefill_tokens_per_s']:.0f}, {d.get('prefill_gflops', 0):.1f} |",
            f"| decode steps / tokens, tokens/s, GFLOP/s | {e['decode_steps']} / {e['decode_tokens']:,}, "
            f"{d['decode_tokens_per_s']:.1f}, {d.get('decode_gflops', 0):.1f} |",
            f"| rows per decode step: mean / max | {d['decode_rows_mean']:.1f} / {d['decode_rows_max']} |",
            f"| prefix cache: hits / reused tokens | {p['hits']} / {p['reused_tokens']:,} |",
            f"| prefix cache at the end: entries / tokens / MB | {p['entries']} / {p['tokens']:,} / "
            f"{p['bytes'] / 2**20:.0f} |",
        ]
        if "matmul_peak_gflops" in d:
            lines.append(
                f"| 2048² matmul peak (GFLOP/s); prefill / decode of it | {d['matmul_peak_gflops']:.0f}; "
                f"{d['prefill_of_peak']:.0%} / {d['decode_of_peak']:.0%} |"
            )
    if result.get("server_peak_rss_mb"):
        lines.append(f"| server peak RSS (MB) | {result['server_peak_rss_mb']:,.0f} |")
    lines += ["", "GFLOP/s: 2 FLOPs per non-embedding parameter per token (attention scores, LM head left out)."]
    if result.get("baseline"):
        lines += comparison_lines(result["baseline"])
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory to serve (default: SmolLM2-135M if present, else tiny)")
    ap.add_argument("--url", help="drive this running server instead of starting one (--model: its served name)")
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 sessions × 2 turns: checks the script")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--first", type=int, default=300, help="ids in each session's first prompt")
    ap.add_argument("--observation", type=int, default=250, help="observation ids added after each turn")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2, help="server torch threads")
    ap.add_argument("--server-arg", action="append", default=[], help="extra serve flag (repeatable)")
    ap.add_argument("--no-peak", action="store_true", help="skip the matmul peak measure")
    ap.add_argument("--out", default=str(OUT), help="output path without suffix (.md and .json written)")
    ap.add_argument("--baseline", help="also serve the same load from this commit's tree (a git worktree), alternating")
    ap.add_argument("--reps", type=int, default=2, help="--baseline: rounds of each")
    args = ap.parse_args()
    if args.quick:
        args.sessions, args.turns, args.first, args.observation, args.max_tokens = 2, 2, 40, 20, 8
    result: dict = {
        "argv": sys.argv[1:],
        "args": vars(args),
        "host": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    with tempfile.TemporaryDirectory(prefix="generation-profile-") as tmp:
        if args.url:
            name, model = args.model or "policy", None
            vocab = 1000 if args.quick else 32000
            res = asyncio.run(drive(args.url.rstrip("/"), name, args, vocab))
        else:
            model = Path(args.model) if args.model else SMOLLM2 if SMOLLM2.is_dir() and not args.quick else None
            model = model or tiny_model(Path(tmp))
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
            res = serve_and_drive(model, Path(tmp), args, vocab)
            if args.baseline:
                result["baseline"] = compare(model, Path(tmp), args, vocab, res)
            result["server_peak_rss_mb"] = res.pop("server_peak_rss_mb")
            result["model"] = str(model)
            if "server" in res:
                res["server"]["dense_params"] = dense_params(model)
    result.update(res)
    peak: dict[str, float] = {}
    if not args.no_peak and "server" in result:
        import torch

        from bench._step_profile_2wiki import matmul_gflops

        torch.set_num_threads(result["server"].get("threads") or args.threads)
        peak = {dt: matmul_gflops(args.threads, dt) for dt in ("bf16", "fp32")}
    result["matmul_peak_gflops"] = peak
    result["derived"] = derive(result, peak)
    write(result, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
