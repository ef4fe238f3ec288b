"""What the trainer reports: Prometheus gauges, a JSONL log line per step, wandb, and PNG plots.

One ``Observer`` takes each step's record (``metrics.StepRecord``) and fans it out: its measured fields are the
line of the log, the ``GAUGES`` among them the ``coda_trainer_<key>`` gauges, the ``PLOTTED`` ones the plots
(all named and described in ``services.trainer.metrics``). The JSONL log is append-only; after a resume, lines
of steps past the checkpoint are superseded by the retrained ones (the plots read the last line of each step).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.trainer.metrics import GAUGES, PLOTTED, REWARD_PREFIX, StepRecord, line
from shared.log import get_logger
from shared.metrics import LATENCY_BUCKETS, POLICY_VERSION

log = get_logger(__name__)


class Observer:
    def __init__(
        self,
        registry: CollectorRegistry | None,
        log_dir: str,
        plot_every: int = 10,
        wandb_project: str | None = None,
        wandb_mode: str = "offline",
        config: dict | None = None,
    ) -> None:
        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.dir / "train.jsonl"
        self.plot_every = plot_every
        self.gauges: dict[str, Gauge] = {}
        self.version = self.publish_hist = self.no_rl = None
        if registry is not None:
            self.gauges = {m.key: Gauge(m.prometheus, m.help, registry=registry) for m in GAUGES}
            self.version = Gauge(POLICY_VERSION, "Policy version live on the inference server", registry=registry)
            self.publish_hist = Histogram(
                "coda_trainer_publish_seconds_hist",
                "Weight publish latency",
                buckets=LATENCY_BUCKETS,
                registry=registry,
            )
            # Training on nothing must be visible: steps whose RL samples were all dropped (or untrained).
            self.no_rl = Counter(
                "coda_trainer_steps_without_rl",
                "Steps that trained no RL token, by what they "
                "trained instead (sft: demonstrations only; nothing: no step was taken)",
                ["trained"],
                registry=registry,
            )
        self.run = None
        if wandb_project:
            import wandb

            self.run = wandb.init(project=wandb_project, config=config or {}, dir=str(self.dir), mode=wandb_mode)

    def record(self, step: StepRecord) -> None:
        """Export one step's record everywhere (a value that is NaN is left out, like one not measured)."""
        rec = {k: v for k, v in line(replace(step, time=time.time())).items() if not math.isnan(v)}
        with open(self.jsonl, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        for key, gauge in self.gauges.items():
            if key in rec:
                gauge.set(rec[key])
        if self.run is not None:
            self.run.log({k: v for k, v in rec.items() if k != "step"}, step=int(rec.get("step", 0)))
        if int(rec.get("step", 0)) % self.plot_every == 0:
            self.plot()

    def without_rl(self, trained: bool) -> None:
        """A step (``trained``: SFT only) or a skipped step in which no RL sample was trained."""
        if self.no_rl is not None:
            self.no_rl.labels("sft" if trained else "nothing").inc()

    def published(self, version: int, seconds: float) -> None:
        if self.version is not None:
            self.version.set(version)
            self.publish_hist.observe(seconds)

    def history(self) -> dict[int, dict[str, float]]:
        """Last record per step from the JSONL log."""
        out: dict[int, dict[str, float]] = {}
        if self.jsonl.is_file():
            for line in self.jsonl.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    out[int(rec.get("step", 0))] = rec
        return out

    def plot(self) -> Path | None:
        """Redraw ``losses.png`` (loss terms) and ``rewards.png`` (reward components) from the log."""
        hist = self.history()
        if not hist:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = sorted(hist)
        reward_keys = sorted({k for r in hist.values() for k in r if k.startswith(REWARD_PREFIX)})
        for name, keys in (
            ("losses", [k for k in PLOTTED if any(k in r for r in hist.values())]),
            ("rewards", ["reward_mean", *reward_keys]),
        ):
            keys = [k for k in keys if any(k in r for r in hist.values())]
            if not keys:
                continue
            fig, axes = plt.subplots(len(keys), 1, figsize=(7, 1.8 * len(keys)), sharex=True, squeeze=False)
            for ax, key in zip(axes[:, 0], keys, strict=True):
                xs = [s for s in steps if key in hist[s]]
                ax.plot(xs, [hist[s][key] for s in xs], lw=1.2)
                ax.set_ylabel(key, fontsize=8)
                ax.grid(alpha=0.3)
            axes[-1, 0].set_xlabel("optimizer step")
            fig.tight_layout()
            tmp = self.dir / f".{name}.png"
            fig.savefig(tmp, dpi=80)
            plt.close(fig)
            os.replace(tmp, self.dir / f"{name}.png")
        return self.dir / "losses.png"

    def close(self) -> None:
        self.plot()
        if self.run is not None:
            self.run.finish()
