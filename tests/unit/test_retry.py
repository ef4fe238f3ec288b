"""``shared.retry``, the one rule for "is this failure transient?" and the one loop that sends again: the rule
as a table, the metric labels it keeps, the loop sync and async, and a check that the clients and loops use it
and no module grows a private rule again."""

from __future__ import annotations

import ast
from pathlib import Path

import aiohttp
import httpx
import pytest
import redis

from shared.inference_client import InferenceError
from shared.retry import Failure, RetryPolicy, arequest, classify, request, transient_status

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"inference": "http://llm:8002", "retriever": "http://retriever:8000/", "searcher": ""}
RETRIEVE = httpx.Request("POST", "http://retriever:8000/retrieve")


@pytest.mark.parametrize(
    ("status", "transient"),
    [(429, True), (502, True), (503, True), (504, True)]
    + [(s, False) for s in (400, 401, 404, 405, 409, 413, 422, 500, 501, 505)],
)
def test_statuses(status, transient):
    assert transient_status(status) is transient
    assert classify(InferenceError(status, "x")) == Failure("inference", "http", status, transient, transient)


def _answered(status: int) -> httpx.HTTPStatusError:
    return httpx.HTTPStatusError("x", request=RETRIEVE, response=httpx.Response(status, request=RETRIEVE))


class Key:
    """``aiohttp.ClientConnectorError`` wants a connection key; these are the fields it reads."""

    host, port, ssl = "llm", 8002, None


# exception → (label, transient, resend): resend is False for a timeout after the request went out.
TABLE = [
    (InferenceError(503, "loading"), "inference_http_503", True, True),
    (InferenceError(500, "this request failed"), "inference_http_500", False, False),
    (InferenceError(404, "no adapter"), "inference_http_404", False, False),
    (_answered(503), "retriever_http_503", True, True),
    (_answered(500), "retriever_http_500", False, False),
    (_answered(422), "retriever_http_422", False, False),
    (httpx.ConnectError("refused", request=RETRIEVE), "retriever_unreachable", True, True),
    (httpx.RemoteProtocolError("dropped", request=RETRIEVE), "retriever_unreachable", True, True),
    (httpx.ReadError("reset", request=RETRIEVE), "retriever_unreachable", True, True),
    (httpx.UnsupportedProtocol("no scheme", request=RETRIEVE), "retriever_unreachable", False, False),
    (httpx.ConnectTimeout("slow", request=RETRIEVE), "retriever_timeout", True, True),
    (httpx.PoolTimeout("busy", request=RETRIEVE), "retriever_timeout", True, True),
    (httpx.ReadTimeout("slow", request=RETRIEVE), "retriever_timeout", True, False),
    (httpx.ConnectError("refused"), "http_unreachable", True, True),  # no request: no service to name
    (aiohttp.ClientConnectorError(Key(), OSError(111, "refused")), "inference_unreachable", True, True),
    (aiohttp.ServerDisconnectedError(), "inference_unreachable", True, True),
    (aiohttp.ClientPayloadError("cut"), "inference_unreachable", True, True),
    (aiohttp.InvalidURL("nope"), "inference_unreachable", False, False),
    (aiohttp.ConnectionTimeoutError(), "inference_timeout", True, True),  # nothing sent yet
    (aiohttp.SocketTimeoutError(), "inference_timeout", True, False),
    (TimeoutError(), "inference_timeout", True, False),  # aiohttp's total timeout
    (redis.ConnectionError("refused"), "redis_error", True, True),
    (redis.BusyLoadingError("loading"), "redis_error", True, True),
    (redis.TimeoutError("slow"), "redis_error", True, False),
    (redis.ResponseError("NOGROUP"), "redis_error", False, False),
    (ValueError("bug"), "ValueError", False, False),
]


@pytest.mark.parametrize(("exc", "label", "transient", "resend"), TABLE, ids=[repr(row[0])[:40] for row in TABLE])
def test_the_rule(exc, label, transient, resend):
    failure = classify(exc, SERVICES)
    assert (failure.label, failure.transient, failure.resend) == (label, transient, resend)


# The places that once each decided on their own (and disagreed on 500); each now asks shared.retry (the
# trainer's outage waits now live in shared.retry itself).
CALLERS = [
    "shared/inference_client.py",
    "services/rollout/admission.py",
    "services/rollout/producer.py",
]
RULE = "shared/retry.py"
ERROR_MODULES = ("httpx", "aiohttp", "redis", "asyncio")


def _private_rules(tree: ast.AST) -> list[str]:
    """Collections (tuple, set, list, ``A | B``) of HTTP statuses that include a 5xx or 429, or of two or more
    exception classes of an HTTP/Redis library: the shape every private transience rule had."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.Set | ast.List):
            items = node.elts
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            items = [node.left, node.right]
        else:
            continue
        codes = [e.value for e in items if isinstance(e, ast.Constant) and type(e.value) is int]
        errors = [
            e
            for e in items
            if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id in ERROR_MODULES
        ]
        if sum(400 <= c < 600 for c in codes) >= 2 and any(c >= 500 or c == 429 for c in codes):
            found.append(f"line {node.lineno}: statuses {codes}")
        if len(errors) >= 2:
            found.append(f"line {node.lineno}: exceptions {[ast.unparse(e) for e in errors]}")
    return found


def _imports_rule(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "shared.retry" for n in ast.walk(tree))


@pytest.mark.parametrize("path", CALLERS)
def test_each_caller_asks_the_one_rule(path):
    tree = ast.parse((ROOT / path).read_text())
    assert _imports_rule(tree), f"{path} no longer imports shared.retry"
    assert not _private_rules(tree), f"{path} defines its own rule: {_private_rules(tree)}"


def test_no_module_defines_a_private_rule():
    offenders = {}
    for folder in ("shared", "services", "agents", "launcher", "tools", "testing"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative != RULE and (found := _private_rules(ast.parse(path.read_text()))):
                offenders[relative] = found
    assert not offenders, f"decide transience in shared.retry, not here: {offenders}"


def test_the_check_sees_the_old_rules():
    # The shapes the five places had before the one rule, so the check above cannot pass by seeing nothing.
    for old in (
        "OUTAGE_STATUS = {429, 502, 503, 504}",
        "TRANSIENT = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)",
        "OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, httpx.TransportError)",
        "ok = isinstance(exc, aiohttp.ClientError | asyncio.TimeoutError)",
        "retry = status in (500, 502, 503)",
    ):
        assert _private_rules(ast.parse(old)), old


OUTCOMES = [(503, 3), (429, 3), (500, 1), (404, 1), (httpx.ConnectError, 3), (httpx.ReadTimeout, 1)]
NO_WAIT = RetryPolicy(attempts=3, backoff_s=0.0, jitter=0.0)


def _server(outcome) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if isinstance(outcome, int):
            return httpx.Response(outcome, request=request)
        raise outcome("x", request=request)

    return httpx.MockTransport(handler), sent


@pytest.mark.parametrize(("outcome", "tries"), OUTCOMES)
def test_shared_retry_sends_again_only_what_the_rule_allows(outcome, tries):
    transport, sent = _server(outcome)
    client = httpx.Client(transport=transport, base_url="http://llm:8002")
    with client, pytest.raises(httpx.HTTPError):
        request(client, "POST", "/v1/completions", policy=NO_WAIT)
    assert len(sent) == tries  # a read timeout: the server may still be working on it, so it is not sent twice


@pytest.mark.parametrize(("outcome", "tries"), OUTCOMES)
async def test_the_async_loop_makes_the_same_decisions(outcome, tries):
    transport, sent = _server(outcome)
    async with httpx.AsyncClient(transport=transport, base_url="http://llm:8002") as client:
        with pytest.raises(httpx.HTTPError):
            await arequest(client, "POST", "/v1/completions", policy=NO_WAIT)
    assert len(sent) == tries


def test_a_resent_call_returns_the_first_answer(caplog):
    answers = iter([InferenceError(503, "loading"), InferenceError(502, "proxy"), "ok"])

    def send() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert NO_WAIT.call(send, "http://llm:8002/v1/completions") == "ok"
    assert caplog.text.count("transient failure, retrying") == 2
    with pytest.raises(ValueError):  # our own bug: raised at once, never sent again
        NO_WAIT.call(lambda: int("x"))
