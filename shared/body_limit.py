"""The request-body guard of the house app: a size cap enforced while the body streams in, and the raw JSON
checks of ``shared.json_guard``, both answered with the house error body before any route runs.

A pure ASGI middleware rather than ``@app.middleware("http")``: it must see each body chunk as it arrives.
A check of the declared ``Content-Length`` alone lets a chunked body (no length) through, and the app then
buffers all of it (a 300 MB chunked body took a retriever from 0.6 to 2.3 GB). Here the body is read chunk
by chunk and refused the moment the running total passes the cap; the rest is never read, because the 413
closes the connection (``Connection: close`` makes uvicorn drop it instead of draining the body).

The whole body is read before the app runs (the services are JSON APIs: every route needs the full body
anyway), checked, and handed to the app as a single message, so nothing is copied twice.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.errors import error_body
from shared.json_guard import body_problem
from shared.log import get_logger

log = get_logger(__name__)


class BodyGuard:
    """ASGI middleware: 413 over ``max_bytes`` (declared or streamed), 400 for a JSON body ``json_guard``
    refuses; otherwise the app gets the body unchanged."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_json_depth: int) -> None:
        self.app, self.max_bytes, self.max_json_depth = app, max_bytes, max_json_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(
                scope, send, 413, f"request body of {declared} bytes exceeds the limit of {self.max_bytes} bytes"
            )
            return
        body = await self._read(scope, receive, send)
        if body is None:
            return
        if body and _is_json(headers.get("content-type")):
            problem = body_problem(body, self.max_json_depth)
            if problem is not None:
                await _refuse(scope, send, 400, problem)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None once the request has been answered (too large, or the client left)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                # Answered (nobody reads it; the server drops it) so that the request ends as a 499, nginx's
                # "client closed request": with no response at all the metrics middleware raised "No response
                # returned." and the request was logged as an exception and counted as a 500.
                await _refuse(scope, send, 499, f"the client disconnected after sending {size} bytes of the body")
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                log.warning(
                    "request body over the limit",
                    extra={"path": scope.get("path"), "bytes_read": size, "limit": self.max_bytes},
                )
                await _refuse(
                    scope,
                    send,
                    413,
                    f"request body exceeds the limit of {self.max_bytes} bytes (refused after {size} bytes)",
                )
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then defers to the server (disconnects)."""
    pending: list[bytes] = [body]

    async def replay() -> Message:
        if pending:
            # pop: the app holds the body from here on, so it is freed when the app lets it go.
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replay


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would parse the body as JSON (no type at all included: some versions parse that)."""
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    # Connection: close, so the server stops reading a body nobody will use instead of draining it.
    response = JSONResponse(error_body(message, status), status_code=status, headers={"connection": "close"})
    await response(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
