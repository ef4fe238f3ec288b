"""The house error shape every service answers a refused request with, and the exception routes raise for it.

Its own module so that the body guard (an ASGI middleware that answers before any route runs) and the
FastAPI handlers in ``shared.http`` build the same body; ``shared.http`` re-exports both names.
"""

from __future__ import annotations


class ApiError(Exception):
    """Raise from a route to answer ``status_code`` with the house error body (a 4xx for bad input)."""

    headers: dict[str, str] | None = None  # sent with the answer (a 401's ``WWW-Authenticate``)

    def __init__(
        self, message: str, status_code: int = 400, type_: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.status_code, self.type_, self.param = message, status_code, type_, param


def error_body(message: str, code: int, type_: str = "BadRequestError", param: str | None = None) -> dict:
    """The error shape used across services (vLLM's ``ErrorResponse``: ``param`` names the offending field)."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
