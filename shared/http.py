"""The house FastAPI app: ``/health``, ``/metrics``, request metrics, a body-size cap, 4xx for bad input.

Services build on ``create_app`` so that every one of them answers the same way to operators and to bad
requests: malformed bodies get 400/413/422 with a message that says what is wrong, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from shared.health import HealthCheck, add_health_route
from shared.log import get_logger
from shared.metrics import instrument_app

log = get_logger(__name__)


class ApiError(Exception):
    """Raise from a route to answer ``status_code`` with the house error body (a 4xx for bad input)."""

    def __init__(self, message: str, status_code: int = 400, type_: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status_code, self.type_, self.param = message, status_code, type_, param


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def create_app(
    service: str,
    *,
    version: str = "0.1.0",
    description: str = "",
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager] | None = None,
    health_checks: dict[str, HealthCheck] | None = None,
    max_body_bytes: int = 64 * 1024 * 1024,
) -> tuple[FastAPI, CollectorRegistry]:
    """A FastAPI app with the house routes and error handling; returns it with its metrics registry."""
    app = FastAPI(title=f"coda-stack {service}", version=version, description=description, lifespan=lifespan)
    registry = instrument_app(app, service)
    add_health_route(app, service, health_checks)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):
        # Reject early on the declared length; a client that lies is still bounded by the server's limits.
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            return JSONResponse({"error": {"message": f"request body of {length} bytes exceeds the limit of "
                                                      f"{max_body_bytes} bytes", "type": "BadRequestError",
                                           "code": 413}}, status_code=413)
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message = _validation_message(exc)
        # jsonable_encoder: a validator's ValueError sits in the error's ctx and is not JSON by itself.
        return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": 400},
                             "detail": jsonable_encoder(exc.errors())}, status_code=400)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.status_code, exc.type_, exc.param),
                            status_code=exc.status_code)

    return app, registry


def error_body(message: str, code: int, type_: str = "BadRequestError", param: str | None = None) -> dict:
    """The error shape used across services (vLLM's ``ErrorResponse``: ``param`` names the offending field)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
