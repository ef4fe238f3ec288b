"""Prometheus helpers: one registry per app, ``/metrics`` on a FastAPI app, and the common metric names.

Every exported name starts with ``coda_``; the Grafana dashboards refer to these names, so they are
constants here rather than strings scattered over the services.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Common names (per-service metrics add their own with the same prefix).
HTTP_REQUESTS = "coda_http_requests_total"
HTTP_LATENCY = "coda_http_request_seconds"
SERVICE_INFO = "coda_service_info"
POLICY_VERSION = "coda_policy_version"

# Latency buckets from 1 ms to 60 s: retrieval batches sit at the low end, episodes at the high end.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class HttpMetrics:
    """Request count and latency per route and status, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.requests = Counter(
            HTTP_REQUESTS, "HTTP requests served", ["service", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            HTTP_LATENCY, "HTTP request latency", ["service", "route"], buckets=LATENCY_BUCKETS, registry=registry
        )
        info = Gauge(SERVICE_INFO, "Always 1; labels say which service this is", ["service"], registry=registry)
        info.labels(service=service).set(1)
        self.service = service


def instrument_app(app: FastAPI, service: str, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Mount ``GET /metrics`` and count/time every request. Returns the registry for service metrics.

    A plain route (not ``app.mount``) so that ``/metrics`` answers 200 without a redirect to ``/metrics/``.
    """
    registry = registry or CollectorRegistry()
    http = HttpMetrics(registry, service)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        start = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            path = getattr(route, "path", "unmatched")
            if path != "/metrics":
                http.requests.labels(service, path, str(status)).inc()
                http.latency.labels(service, path).observe(time.perf_counter() - start)

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", include_in_schema=True)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.state.metrics_registry = registry
    return registry
