"""The output head's forward + backward, old vs new: writes ``bench/results/head_grad.md``.

Issue 26: ``PolicyLogprobs`` turned hidden states into target logprobs and entropies one chunk at a time under
activation checkpointing (``old``: backward re-ran the head matmul, the log-softmax and the entropy through
autograd); it now uses ``logprobs.HeadLogprobs`` (``new``: backward recomputes the logits once and applies the
analytic gradients). This times one chunk's forward + backward of each on SmolLM2-135M shapes (hidden 576,
vocabulary 49152, 1024 tokens = the default ``logprob_chunk``, fp32) for four cases: the head frozen (LoRA; a
tied embedding) or trained, the entropy in the loss (``entropy_coef != 0``) or only logged. Methods alternate
within each round (their order flips every round) so the machine's drift hits both alike; the first round is a
warm-up and is dropped. It also reports the largest gradient difference between the two, as a check.

    .venv/bin/python -m bench.head_grad                  # 5 timed rounds
    .venv/bin/python -m bench.head_grad --device cuda    # also the peak CUDA memory of each
    .venv/bin/python -m bench.head_grad --tiny           # a tiny shape, printed only: does it run
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "head_grad.md"
CASES = {  # name: (head trained, entropy in the loss)
    "LoRA (head frozen), entropy logged": (False, False),
    "LoRA (head frozen), entropy in loss": (False, True),
    "full (head trained), entropy logged": (True, False),
    "full (head trained), entropy in loss": (True, True),
}


def make_inputs(args: argparse.Namespace, device):
    import torch

    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(args.vocab, args.hidden, generator=gen) * args.hidden**-0.5)
    hidden = torch.randn(args.tokens, args.hidden, generator=gen)
    targets = torch.randint(args.vocab, (args.tokens,), generator=gen)
    g = torch.randn(2, args.tokens, generator=gen)
    return head.to(device), hidden.to(device), targets.to(device), g.to(device)


def step(method: str, case: tuple[bool, bool], inputs, args: argparse.Namespace):
    """One forward + backward over all chunks; returns the gradients (hidden, and the weight if trained)."""
    from torch.utils.checkpoint import checkpoint

    from services.trainer.logprobs import HeadLogprobs, _head_chunk

    train_head, entropy_loss = case
    head, hidden, targets, g = inputs
    head.weight.requires_grad_(train_head)
    head.weight.grad = None
    h = hidden.detach().requires_grad_(True)
    loss = 0.0
    for i in range(0, args.tokens, args.chunk):
        hc, tc = h[i : i + args.chunk], targets[i : i + args.chunk]
        if method == "old":
            logp, ent = checkpoint(_head_chunk, head, hc, tc, args.temperature, use_reentrant=False)
        else:
            logp, ent = HeadLogprobs.apply(hc, head.weight, tc, args.temperature)
        loss = loss + (g[0, i : i + args.chunk] * logp).sum()
        if entropy_loss:
            loss = loss + (g[1, i : i + args.chunk] * ent).sum()
    loss.backward()
    return h.grad, head.weight.grad


def timed(method: str, case: tuple[bool, bool], inputs, args: argparse.Namespace) -> tuple[float, float | None]:
    import torch

    cuda = inputs[1].is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step(method, case, inputs, args)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return seconds, torch.cuda.max_memory_allocated() / 2**20 if cuda else None


def max_grad_diff(case: tuple[bool, bool], inputs, args: argparse.Namespace) -> float:
    old = [t.clone() for t in step("old", case, inputs, args) if t is not None]
    new = [t for t in step("new", case, inputs, args) if t is not None]
    return max(float((a - b).abs().max()) for a, b in zip(old, new, strict=True))


def run(args: argparse.Namespace) -> dict[str, dict]:
    import torch

    device = torch.device(args.device)
    inputs = make_inputs(args, device)
    results = {name: {"old": [], "new": [], "old_mb": [], "new_mb": []} for name in CASES}
    for name, case in CASES.items():
        results[name]["diff"] = max_grad_diff(case, inputs, args)
    for rnd in range(args.reps + 1):  # round 0: warm-up, dropped
        for name, case in CASES.items():
            for method in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
                seconds, mb = timed(method, case, inputs, args)
                if rnd > 0:
                    results[name][method].append(seconds)
                    if mb is not None:
                        results[name][f"{method}_mb"].append(mb)
        print(f"round {rnd}/{args.reps} done", file=sys.stderr)
    return results


def report(results: dict[str, dict], args: argparse.Namespace, wall: float) -> str:
    import torch

    lines = [
        "# Output head forward + backward: checkpointed chunk (old) vs HeadLogprobs (new)",
        "",
        f"Written by `python -m bench.head_grad` on {dt.date.today().isoformat()}: {platform.machine()}, "
        f"{platform.processor() or 'cpu'}, torch {torch.__version__}, device `{args.device}`, "
        f"{torch.get_num_threads()} threads, {wall:.0f} s in all.",
        f"Shapes: {args.tokens} tokens × hidden {args.hidden} → vocabulary {args.vocab}, chunks of {args.chunk}, "
        f"fp32, temperature {args.temperature}; {args.reps} timed rounds after a warm-up round, methods "
        "alternating. Seconds per forward + backward (median, then every round).",
        "",
        "| case | old s | new s | old / new | max abs grad diff | old rounds | new rounds |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, r in results.items():
        old, new = statistics.median(r["old"]), statistics.median(r["new"])
        rounds = [", ".join(f"{s:.3f}" for s in r[m]) for m in ("old", "new")]
        lines.append(
            f"| {name} | {old:.3f} | {new:.3f} | {old / new:.2f}× | {r['diff']:.1e} | {rounds[0]} | {rounds[1]} |"
        )
    if any(r["old_mb"] for r in results.values()):
        lines += ["", "Peak CUDA memory during one forward + backward (MiB, max over rounds):", ""]
        lines += ["| case | old | new |", "|---|---:|---:|"]
        lines += [f"| {n} | {max(r['old_mb']):.0f} | {max(r['new_mb']):.0f} |" for n, r in results.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="timed rounds (after one warm-up round)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--chunk", type=int, default=1024, help="logprob_chunk")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny shape, 2 rounds; prints, writes nothing")
    args = ap.parse_args()
    if args.tiny:
        args.tokens, args.hidden, args.vocab, args.chunk, args.reps = 70, 16, 300, 32, 2
    start = time.perf_counter()
    text = report(run(args), args, time.perf_counter() - start)
    print(text)
    if not args.tiny:
        OUT.write_text(text)


if __name__ == "__main__":
    main()
