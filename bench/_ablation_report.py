"""The ablation bench's report: ``bench/results/ablation.md`` (tables and the outcome) and ``ablation.png``
(held-out F1 against training wall time), written from ``ablation.json`` by ``python -m bench.ablation``."""

from __future__ import annotations

from pathlib import Path

from bench._ablation_arms import SMOL

ARMS = {name: arm.label for name, arm in SMOL.items()}


def _fmt(x, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _relations(by_relation: dict | None) -> str:
    return " · ".join(f"{rel} {_fmt(f1)}" for rel, f1 in (by_relation or {}).items()) or "–"


def _demonstrations(cfg: dict) -> str:
    """Which demonstrations the arms had: a budget (and the relations it asks for) or one per question."""
    n = cfg.get("sft_limit")
    if not n:
        return "one for every training question"
    said = f"a budget of {n} (the first {n} training questions'), cycled by every step that uses them"
    if cfg.get("demonstrated"):
        said += (
            f"; they ask for {', '.join(cfg['demonstrated'])} only (the training and held-out questions also ask "
            "for the other relations)"
        )
    return said


def _hotpot(cfg: dict) -> str:
    if not cfg["hotpot"]:
        return ""
    seeds = f" of the seed {', '.join(map(str, cfg['hotpot_seeds']))} runs" if cfg.get("hotpot_seeds") else ""
    return f", and on the first {cfg['hotpot']} bundled HotpotQA questions (their own BM25 index) at the end{seeds}"


def write_report(doc: dict, md: Path, png: Path) -> None:
    cfg, warm, runs = doc["config"], doc.get("warm", {}), doc["runs"]
    evals = f"after each of {cfg['segments']} equal segments" if cfg["segments"] > 1 else "at its end"
    lines = [
        "# RED ablations on the real model (SmolLM2-135M-Instruct, lookup world)",
        "",
        f"Written by `python -m bench.ablation` (raw numbers: `{md.stem}.json`). Demonstrations: {_demonstrations(cfg)}. "
        f"One warm start (SFT only, {cfg['warm_steps']} steps of 4 demonstrations) shared by every arm; then "
        f"{cfg['train_s']:.0f} s of training wall time per arm on this 2-core CPU machine, evaluated greedily on "
        f"the lookup world's {cfg['eval_limit']} held-out questions {evals}{_hotpot(cfg)}.",
        "",
    ]
    if warm:
        w, h = warm["lookup"], warm.get("hotpot", {})
        lines += [
            f"Warm start ({warm['steps']} SFT steps, {warm['train_s']:.0f} s): lookup F1 {_fmt(w.get('f1'))}, "
            f"EM {_fmt(w.get('em'))}, search_hit {_fmt(w.get('search_hit'))}; HotpotQA F1 "
            f"{_fmt(h.get('f1'))}, EM {_fmt(h.get('em'))}."
            + (f" Lookup F1 by relation: {_relations(w['by_relation'])}." if w.get("by_relation") else ""),
            "",
        ]
    mid_col = cfg["segments"] > 1
    lines += [
        "| arm | seed | steps (with RL / with SFT) | batches without advantage | train s | lookup F1 | EM | search_hit |"
        + (" F1 mid-way |" if mid_col else "")
        + " lookup F1 by relation | HotpotQA F1 | EM | rollout reward, first → last 5 steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if mid_col else ""),
    ]
    for arm in ARMS:
        for key in sorted(k for k in runs if k.startswith(arm + "/")):
            r = runs[key]
            end, h = r["points"][-1], r.get("hotpot", {})
            mid = r["points"][0]["lookup"].get("f1") if len(r["points"]) > 1 else None
            lines.append(
                f"| {ARMS[arm]} | {r['seed']} | {end['steps']} ({r['rl_steps']} / {r['sft_steps']}) | "
                f"{r.get('no_advantage_batches', '–')} | "
                f"{end['train_s']:.0f} | {_fmt(end['lookup'].get('f1'))} | {_fmt(end['lookup'].get('em'))} | "
                f"{_fmt(end['lookup'].get('search_hit'))} | "
                + (f"{_fmt(mid)} | " if mid_col else "")
                + f"{_relations(end['lookup'].get('by_relation'))} | "
                + f"{_fmt(h.get('f1'))} | "
                f"{_fmt(h.get('em'))} | {_fmt(r.get('reward_first'), 2)} → {_fmt(r.get('reward_last'), 2)} |"
            )
    lines += [
        "",
        "Mean over seeds:",
        "",
        "| arm | seeds | lookup F1 | EM | search_hit | lookup F1 by relation | HotpotQA F1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        rs = [r for k, r in runs.items() if k.startswith(arm + "/")]
        if not rs:
            continue
        ends = [r["points"][-1]["lookup"] for r in rs]
        rels = {rel for e in ends for rel in e.get("by_relation", {})}
        by_rel = {rel: _mean([e.get("by_relation", {}).get(rel) for e in ends]) for rel in sorted(rels)}
        lines.append(
            f"| {ARMS[arm]} | {len(rs)} | {_fmt(_mean([e.get('f1') for e in ends]))} | "
            f"{_fmt(_mean([e.get('em') for e in ends]))} | {_fmt(_mean([e.get('search_hit') for e in ends]))} | "
            f"{_relations(by_rel)} | {_fmt(_mean([r.get('hotpot', {}).get('f1') for r in rs]))} |"
        )
    lines += ["", "![held-out F1 against training wall time](ablation.png)", ""]
    notes = doc.get("notes")
    if notes:
        lines += ["## Outcome", "", notes, ""]
    md.write_text("\n".join(lines))
    _plot(doc, png)


def _plot(doc: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warm = doc.get("warm", {}).get("lookup", {}).get("f1")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, arm in enumerate(ARMS):
        rs = [r for k, r in doc["runs"].items() if k.startswith(arm + "/")]
        if not rs:
            continue
        color = f"C{i}"
        for r in rs:  # each seed, faint
            xs = [0.0] + [p["train_s"] for p in r["points"]]
            ys = [warm] + [p["lookup"].get("f1") for p in r["points"]]
            ax.plot(xs, ys, color=color, alpha=0.3, marker=".", linewidth=1)
        n = min(len(r["points"]) for r in rs)
        xs = [0.0] + [_mean([r["points"][j]["train_s"] for r in rs]) for j in range(n)]
        ys = [warm] + [_mean([r["points"][j]["lookup"].get("f1") for r in rs]) for j in range(n)]
        ax.plot(xs, ys, color=color, marker="o", linewidth=2, label=f"{ARMS[arm]} (mean of {len(rs)})")
    ax.set_xlabel("training wall time after the warm start (s, 2 CPU cores)")
    ax.set_ylabel("held-out lookup F1 (greedy, 72 questions)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # none before the first arm's run
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
