"""Request bodies the house app (``shared.http.create_app``) must refuse with a 4xx in the house error shape,
quickly and without buffering them: oversized (declared or chunked), too deeply nested, non-UTF-8, lone
surrogates, and inputs a 400 once could not echo (NaN, a million bad items). Real uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import BaseModel

from shared.http import ApiError, create_app
from shared.redis_server import free_port

CAP = 256 * 1024  # small, so that going over it is cheap


class Body(BaseModel):
    n: int
    text: str = ""
    ids: list[int] = []
    data: Any = None


def build_demo():
    app, _registry = create_app("demo", max_body_bytes=CAP)

    @app.post("/echo")
    async def echo(body: Body) -> dict:
        return {"n": body.n, "text": body.text, "ids": len(body.ids)}

    @app.post("/boom")
    async def boom() -> dict:
        # A message may quote what it refuses: here a lone surrogate, which strict UTF-8 cannot encode.
        raise ApiError("no \ud800 here", 422, param="k\udfff")

    return app


class Served:
    """uvicorn in a thread on a free port: ``with Served(app) as url``."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def base():
    with Served(build_demo()) as url:
        yield url


def post(base: str, content: bytes | str, path: str = "/echo", **kw) -> httpx.Response:
    return httpx.post(base + path, content=content, headers={"content-type": "application/json"}, timeout=20, **kw)


def assert_house_error(r: httpx.Response, status: int, *mentions: str) -> dict:
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert error["code"] == status and error["type"] and "param" in error
    for text in mentions:
        assert text in error["message"], error["message"]
    return error


def raw_response(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout_s`` passes: socket.timeout)."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def open_post(port: int, headers: str, path: str = "/echo") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n".encode())
    return sock


# --- size: the cap holds while the body streams in ---------------------------------------------------------


def test_declared_length_over_the_cap_is_413_before_any_body_is_sent(base):
    port = int(base.rsplit(":", 1)[1])
    with open_post(port, f"Content-Length: {CAP + 1}\r\n") as sock:
        reply = raw_response(sock, timeout_s=5)  # nothing of the body was sent: the answer cannot wait for it
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
    assert f"exceeds the limit of {CAP} bytes".encode() in payload


def test_chunked_body_over_the_cap_is_413_without_reading_the_rest(base):
    """The body is never finished: a server that waits for all of it (the old Content-Length check) hangs."""
    port = int(base.rsplit(":", 1)[1])
    chunk = b"x" * 65536
    with open_post(port, "Transfer-Encoding: chunked\r\n") as sock:
        for _ in range(CAP // len(chunk) + 1):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        start = time.perf_counter()
        reply = raw_response(sock, timeout_s=5)  # and the server closes: it reads nothing more
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply[:300]
    assert json.loads(payload)["error"]["code"] == 413 and time.perf_counter() - start < 2


def test_chunked_body_over_the_cap_from_a_client_is_413(base):
    """httpx sends a generator chunked (no Content-Length): the same refusal reaches an ordinary client."""

    def body():
        yield b'{"n": 1, "text": "'
        for _ in range((CAP + 1024 * 1024) // 65536):
            yield b"x" * 65536
        yield b'"}'

    assert_house_error(post(base, body()), 413, f"exceeds the limit of {CAP} bytes")


def test_chunked_body_under_the_cap_is_served(base):
    def body():
        yield b'{"n": 7, "text": "'
        for _ in range(3):
            yield b"y" * 50_000
        yield b'"}'

    r = post(base, body())
    assert r.status_code == 200 and r.json() == {"n": 7, "text": "y" * 150_000, "ids": 0}


# --- shape: nesting, big lists of bad items, values a 400 could not echo -----------------------------------


def test_deep_nesting_is_refused_at_once(base):
    start = time.perf_counter()
    r = post(base, '{"n": 1, "data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_house_error(r, 400, "nested deeper than 64 levels")
    assert time.perf_counter() - start < 1.0
    assert_house_error(post(base, '{"n": 1, "data": ' + '{"a": ' * 64 + "1" + "}" * 64 + "}"), 400, "deeper")


def test_nesting_up_to_the_limit_and_brackets_in_strings_are_fine(base):
    r = post(base, '{"n": 1, "data": ' + "[" * 63 + "]" * 63 + "}")  # 64 levels with the outer object
    assert r.status_code == 200, r.text
    text = "[{" * 500 + '\\"'
    r = post(base, json.dumps({"n": 2, "text": text, "data": [[1], {"k": "]]]"}]}))
    assert r.status_code == 200 and r.json()["text"] == text


def test_an_unterminated_string_full_of_escaped_quotes_is_refused_quickly(base):
    """The string scan must stay linear on input built to make a regex backtrack."""
    start = time.perf_counter()
    r = post(base, '{"n": 1, "text": "' + '\\"[' * 60_000)
    assert_house_error(r, 400, "invalid JSON")
    assert time.perf_counter() - start < 1.0


def test_many_bad_items_get_a_short_400(base):
    """50,000 failing items: a short message and body, not every error with its input echoed back."""
    start = time.perf_counter()
    r = post(base, json.dumps({"n": 1, "ids": [1.5] * 50_000}))
    error = assert_house_error(r, 400, "ids.0: Input should be a valid integer", "and 49990 more errors")
    assert len(r.content) < 5000 and len(r.json()["detail"]) == 10 and len(error["message"]) < 2000
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_a_failing_field_are_a_400(base, value):
    r = post(base, f'{{"n": {value}}}')
    assert_house_error(r, 400, "n: ")
    assert r.json()["detail"][0]["input"] in ("nan", "inf", "-inf")


def test_a_refusal_holding_a_lone_surrogate_is_still_sent(base):
    error = assert_house_error(post(base, b"{}", path="/boom"), 422, "no \\ud800 here")
    assert error["param"] == "k\\udfff"


# --- text: UTF-8 and surrogates ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        '{"n": 1, "text": "a \\ud800 b"}',  # lone high
        '{"n": 1, "text": "\\uDC00"}',  # lone low, upper-case hex
        '{"n": 1, "text": "\\ude00\\ud83d"}',  # a pair in the wrong order
        '{"n": 1, "text": "\\\\\\ud800"}',  # an escaped backslash, then a real escape
        '{"n": 1, "\\ud800": 2}',  # in a key
        '{"n": 1, "data": ["ok", {"deep": ["\\udbff"]}]}',
    ],
)
def test_a_lone_surrogate_anywhere_is_undecodable_text(base, body):
    assert_house_error(post(base, body), 400, "undecodable text")


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ('{"n": 1, "text": "smile \\ud83d\\ude00"}', "smile \U0001f600"),  # a valid pair is one character
        ('{"n": 1, "text": "\\\\ud800"}', "\\ud800"),  # an escaped backslash: plain text
        ('{"n": 1, "text": "caf\\u00e9 \\uD83D\\uDE00"}', "caf\u00e9 \U0001f600"),
    ],
)
def test_surrogate_pairs_and_escaped_backslashes_pass(base, body, text):
    r = post(base, body)
    assert r.status_code == 200 and r.json()["text"] == text


def test_invalid_utf8_is_a_400(base):
    assert_house_error(post(base, b'{"n": 1, "text": "\xff\xfe"}'), 400, "not valid UTF-8")
    assert_house_error(post(base, b'{"n": 1, "text": "\xed\xa0\x80"}'), 400, "not valid UTF-8")  # raw surrogate


def test_framework_refusals_use_the_house_shape(base):
    assert_house_error(httpx.get(base + "/nowhere"), 404, "Not Found")
    assert_house_error(httpx.get(base + "/echo"), 405, "Method Not Allowed")


def test_refusals_are_counted_in_the_metrics(base):
    def refused() -> float:
        text = httpx.get(base + "/metrics").text
        return sum(float(v) for v in re.findall(r'coda_http_requests_total\{[^}]*status="400"[^}]*\} (\S+)', text))

    before = refused()
    post(base, '{"n": 1, "text": "\\ud800"}')
    assert refused() == before + 1


# --- a real service: the searcher (its upstreams are never reached) --------------------------------------


@pytest.fixture(scope="module")
def searcher():
    from services.searcher.app import build_app
    from services.searcher.config import SearcherSettings

    nowhere = f"http://127.0.0.1:{free_port()}"
    settings = SearcherSettings(
        inference_url=nowhere, retriever_url=nowhere, tokenizer="char", retry_attempts=1, http_timeout_s=2
    )
    with Served(build_app(settings)) as url:
        yield url


def test_searcher_refuses_bad_bodies_before_the_route(searcher):
    assert_house_error(post(searcher, '{"query": "who \\udc00 was"}', path="/search"), 400, "undecodable text")
    deep = '{"query": "q", "x": ' + "[" * 10_000 + "]" * 10_000 + "}"
    assert_house_error(post(searcher, deep, path="/search"), 400, "nested deeper")
    with open_post(int(searcher.rsplit(":", 1)[1]), f"Content-Length: {128 * 1024 * 1024}\r\n", "/search") as sock:
        reply = raw_response(sock, timeout_s=5)
    assert reply.startswith(b"HTTP/1.1 413") and b"exceeds the limit of 67108864 bytes" in reply
