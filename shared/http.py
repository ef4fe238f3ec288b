"""The house FastAPI app: ``/health``, ``/metrics``, request metrics, a body guard, 4xx for bad input.

Services build on ``create_app`` so that every one of them answers the same way to operators and to bad
requests: malformed bodies get 400/413/422 with a message that says what is wrong, never a 500 or a hang.
The body guard (``shared.body_limit``) refuses oversized, non-UTF-8, too deeply nested and lone-surrogate
JSON bodies before a route runs; the handlers here put every other refusal into the house error body. A route
that changes a service's state takes ``dependencies=CONTROL``: the control token of ``shared.auth``.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from http import HTTPStatus
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.auth import refusal
from shared.body_limit import BodyGuard
from shared.errors import ApiError, error_body
from shared.health import HealthCheck, add_health_route
from shared.metrics import instrument_app

__all__ = ["CONTROL", "ApiError", "create_app", "error_body", "is_control_route", "json_safe"]

# A 400 lists this many validation errors: a list of a million bad items fails a million times, and
# formatting and sending every one of them (with its input) took longer than any client waits.
MAX_REPORTED_ERRORS = 10
# Inputs are echoed as short reprs: the raw input can be huge, NaN (not JSON) or hold a lone surrogate
# (not UTF-8), and each of those once turned the 400 itself into a 500.
_INPUT_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
_INPUT_REPR.maxlevel, _INPUT_REPR.maxlist, _INPUT_REPR.maxdict = 2, 4, 4
_INPUT_REPR.maxstring = _INPUT_REPR.maxother = _INPUT_REPR.maxlong = 60


def create_app(
    service: str,
    *,
    version: str = "0.1.0",
    description: str = "",
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager] | None = None,
    health_checks: dict[str, HealthCheck] | None = None,
    max_body_bytes: int = 64 * 1024 * 1024,
    max_json_depth: int = 64,
    registry: CollectorRegistry | None = None,
) -> tuple[FastAPI, CollectorRegistry]:
    """A FastAPI app with the house routes and error handling; returns it with its metrics registry
    (``registry``, or a new one)."""
    app = FastAPI(title=f"coda-stack {service}", version=version, description=description, lifespan=lifespan)
    # Added before the metrics middleware, so it runs inside it and its refusals are counted too.
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes, max_json_depth=max_json_depth)
    registry = instrument_app(app, service, registry)
    add_health_route(app, service, health_checks)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_body(exc), status_code=400)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            json_safe(error_body(exc.message, exc.status_code, exc.type_, exc.param)),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own refusals (404, 405, "There was an error parsing the body") in the house shape too.
        body = error_body(str(exc.detail), exc.status_code, _http_error_type(exc.status_code))
        return JSONResponse(json_safe(body), status_code=exc.status_code, headers=exc.headers)

    return app, registry


async def require_control_token(request: Request) -> None:
    """The dependency of every control route: a 401 (with ``WWW-Authenticate: Bearer``) unless the request
    carries the control token, or none is configured and it comes from loopback (``shared.auth``)."""
    reason = refusal(request.client.host if request.client else None, request.headers.get("authorization", ""))
    if reason is not None:
        error = ApiError(reason, 401, "UnauthorizedError")
        error.headers = {"WWW-Authenticate": "Bearer"}
        raise error


CONTROL = [Depends(require_control_token)]  # ``@app.post(path, dependencies=CONTROL)``


def is_control_route(route: APIRoute) -> bool:
    """Whether ``route`` requires the control token (what the route-inventory test checks)."""
    return any(dep.dependency is require_control_token for dep in route.dependencies)


def validation_error_body(exc: RequestValidationError) -> dict:
    """The house 400 body of a validation error: the first ``MAX_REPORTED_ERRORS`` errors and a count."""
    errors = exc.errors()
    shown = errors[:MAX_REPORTED_ERRORS]
    message = "; ".join(_error_line(err) for err in shown) or "invalid request"
    if len(errors) > len(shown):
        message += f"; and {len(errors) - len(shown)} more errors"
    body = error_body(message, 400)
    body["detail"] = [_brief_error(err) for err in shown]
    return json_safe(body)


def json_safe(value: Any) -> Any:
    """``value`` with what ``JSONResponse`` cannot encode made printable: non-finite floats as their repr,
    lone surrogates as backslash escapes (``JSONResponse`` refuses NaN and encodes strict UTF-8)."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (bool, int)):
        return value
    return json_safe(str(value))


def _error_line(err: dict) -> str:
    loc = err.get("loc", ())
    if err.get("type") == "json_invalid":  # FastAPI's decode error: loc ends with the character offset
        return f"invalid JSON at character {loc[-1] if loc else '?'}: {(err.get('ctx') or {}).get('error', '')}"
    return f"{'.'.join(str(p) for p in loc if p != 'body') or 'body'}: {err.get('msg', 'invalid')}"


def _brief_error(err: dict) -> dict:
    """One validation error, small and JSON-safe: the input as a bounded repr, ctx values as text
    (a validator's ValueError sits in ctx and is not JSON by itself)."""
    ctx = {k: v if isinstance(v, (bool, int, str)) else str(v) for k, v in (err.get("ctx") or {}).items()}
    brief = {
        "type": err.get("type"),
        "loc": list(err.get("loc", ())),
        "msg": err.get("msg"),
        "input": _INPUT_REPR.repr(err.get("input")),
    }
    return {**brief, "ctx": ctx} if ctx else brief


def _http_error_type(status: int) -> str:
    """vLLM-style error type from the status: 404 → NotFoundError, 405 → MethodNotAllowedError."""
    try:
        return HTTPStatus(status).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return "HTTPError"
