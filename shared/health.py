"""The ``/health`` convention: 200 ``{"status": "ok", ...}`` when ready, 503 with the failing checks otherwise.

Orchestrators (compose healthchecks, ``make train``'s supervisor) poll it; it must stay cheap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

# A check returns a short detail string; raising means unhealthy.
HealthCheck = Callable[[], object]


def add_health_route(app: FastAPI, service: str, checks: dict[str, HealthCheck] | None = None) -> None:
    started = time.time()
    checks = checks if checks is not None else {}

    @app.get("/health", tags=["ops"], summary="Readiness of this service")
    def health() -> JSONResponse:
        details: dict[str, object] = {}
        ok = True
        for name, check in checks.items():
            try:
                details[name] = check()
            except Exception as exc:  # a failing check is the answer, not an error of the route
                ok = False
                details[name] = f"error: {exc}"
        body = {
            "status": "ok" if ok else "unavailable",
            "service": service,
            "uptime_s": round(time.time() - started, 3),
            "checks": details,
        }
        return JSONResponse(body, status_code=200 if ok else 503)
