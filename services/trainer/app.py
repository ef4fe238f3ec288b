"""The trainer's HTTP face: ``/health`` (ready once the engine is built and the weights are published),
``/metrics`` (the ``coda_trainer_*`` gauges) and ``GET /status`` (step, version, last record).

Training runs in the main thread (DeepSpeed and signal handling want it); uvicorn serves this app from a
daemon thread.
"""

from __future__ import annotations

import threading

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from shared.http import create_app


def build_app(get_trainer) -> tuple[FastAPI, CollectorRegistry]:
    """The app; ``get_trainer()`` returns the ``Trainer`` (or None while it is being built)."""

    def engine_ready() -> str:
        trainer = get_trainer()
        if trainer is None or not trainer.ready.is_set():
            raise RuntimeError("engine not ready")
        return f"step {trainer.state.step}, version {trainer.state.version}"

    app, registry = create_app("trainer", description="GRPO + RED trainer", health_checks={"engine": engine_ready})

    @app.get("/status", tags=["ops"], summary="Step, policy version and counters of the running trainer")
    def status() -> dict:
        trainer = get_trainer()
        if trainer is None or not trainer.ready.is_set():
            return {"ready": False}
        st = trainer.state
        out = {
            "ready": True,
            "step": st.step,
            "version": st.version,
            "tokens": st.tokens,
            "groups_trained": st.groups_trained,
            "dropped_stale": st.dropped_stale,
            "steps_without_rl": trainer.steps_without_rl,
            "warnings": [],
        }
        if trainer.steps_without_rl:
            out["warnings"].append(
                f"no RL sample trained in the last {trainer.steps_without_rl} step(s)"
                " (stale or untrained samples): see coda_trainer_steps_without_rl_total"
            )
        return out

    return app, registry


def serve_in_thread(app: FastAPI, host: str, port: int) -> threading.Thread:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="trainer-http", daemon=True)
    thread.start()
    return thread
