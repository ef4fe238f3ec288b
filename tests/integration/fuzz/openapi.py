"""Fuzz every route a running service lists in its ``/openapi.json`` with generated requests (Hypothesis).

Each route gets ``EXAMPLES`` requests (at least) drawn from a mix of:

- bodies valid for the route's JSON schema (``from_schema``: the schema subset pydantic writes), with hints for fields whose
  interesting values a schema cannot say (``Target.hints``: a method name, a known model);
- the same bodies broken one way: a field missing, an unknown field, a field of the wrong type, a huge or
  non-finite number (``NaN``/``Infinity`` literals, a 5,000-digit integer), an empty or very long string, a
  top level that is not an object;
- raw bytes that are not the JSON the route expects: truncated, not UTF-8, empty, too deeply nested, a lone
  surrogate, duplicate keys, a wrong ``Content-Type``;
- query parameters from the route's own ones plus unknown ones, and ``Authorization`` headers good and bad.

What every answer must be: not a 5xx, within ``TIMEOUT_S`` (a timeout is a hang), and a 4xx says what is wrong
in the house error body (``error.message``). A control route (``shared.http.CONTROL``) is fuzzed twice: with the
control token, and without it (no header, a wrong token, a wrong scheme), where nothing may succeed. A request
that would stop the server doing its work (``Target.forbid``: ``POST /pause?mode=wait``) is never sent with the
token. Then each path gets every method it does not declare (a 405) and a body its client abandons halfway, and
the service's own count of answers (``coda_http_requests_total``) may hold no 5xx, not even one no client saw.
The caller checks afterwards that the server still answers a valid request correctly.
"""

from __future__ import annotations

import json
import os
import re
import socket
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from shared.http import is_control_route

# Generated requests per route (and per auth mode of a control route), at least. The suite is derandomised (the
# same requests every run, as CI needs); CODA_FUZZ_EXAMPLES=2000 CODA_FUZZ_RANDOM=1 explores further by hand.
EXAMPLES = int(os.environ.get("CODA_FUZZ_EXAMPLES", "100"))
RANDOM = bool(os.environ.get("CODA_FUZZ_RANDOM"))
TIMEOUT_S = 30.0  # one request; longer is a hang
TOKEN = "fuzz-control-token"
BAD_AUTH = [
    None,
    "Bearer wrong-token",
    f"Basic {TOKEN}",
    "Bearer",
    f"bearer {TOKEN}x",
    f"Token {TOKEN}",
    f"Bearer {TOKEN} {TOKEN}",
    "x" * 5000,
]


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    body_schema: dict | None  # the JSON schema of the request body (refs resolved against ``components``)
    params: tuple[dict, ...]  # the declared query parameters
    control: bool

    @property
    def name(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class Target:
    """A running service: its URL, its app (which routes need the control token), and per-route hints."""

    url: str
    app: Any
    # "METHOD /path" -> {field: strategy of values worth trying that a schema cannot name}
    hints: dict[str, dict[str, st.SearchStrategy]] = field(default_factory=dict)
    # "METHOD /path" -> predicate on a request (params, body) that must never be sent with the token
    forbid: dict[str, Callable[[dict, Any], bool]] = field(default_factory=dict)


@dataclass
class Request:
    params: dict[str, str]
    headers: dict[str, str]
    content: bytes
    kind: str  # what the generator made: valid, mutated, raw, none
    body: Any = None  # the JSON value sent, when it is one

    def describe(self) -> str:
        return f"{self.kind} params={self.params!r} headers={self.headers!r} body={self.content[:300]!r}"


def operations(url: str, app) -> list[Operation]:
    """Every operation of ``/openapi.json``, checked against the app's routes: none may be missing from it."""
    spec = httpx.get(url + "/openapi.json", timeout=TIMEOUT_S).raise_for_status().json()
    components = spec.get("components", {})
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    control = {(m, r.path) for r in routes if is_control_route(r) for m in r.methods}
    listed = {(m, r.path) for r in routes if r.include_in_schema for m in r.methods}
    ops = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                body = {**body, "components": components}
            params = tuple(p for p in op.get("parameters", []) if p.get("in") == "query")
            ops.append(Operation(method.upper(), path, body, params, (method.upper(), path) in control))
    found = {(op.method, op.path) for op in ops}
    missing = {(m, p) for m, p in listed if m != "HEAD"} - found
    assert not missing, f"routes missing from /openapi.json: {sorted(missing)}"
    return ops


# --- generators ---------------------------------------------------------------------------------------------


def from_schema(schema: dict, root: dict | None = None) -> st.SearchStrategy:
    """Values valid for ``schema``: the JSON-schema subset pydantic writes (``$ref`` into ``components``,
    ``anyOf``, ``enum``/``const``, objects, arrays, strings, numbers with their bounds). hypothesis-jsonschema
    would do this, but its 0.23 release breaks on the Hypothesis the project pins (6.170)."""
    root = root if root is not None else schema
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return st.deferred(lambda: from_schema(target, root))
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(s, root) for s in schema.get("anyOf", schema.get("oneOf"))])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, root) for k in kind])
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        strategy = st.fixed_dictionaries(
            {k: from_schema(v, root) for k, v in props.items() if k in required},
            optional={k: from_schema(v, root) for k, v in props.items() if k not in required},
        )
        extra = schema.get("additionalProperties", True if not props else None)
        if isinstance(extra, dict):  # a mapping: {name: value of that schema}
            return st.dictionaries(st.text(max_size=10), from_schema(extra, root), max_size=4)
        return strategy
    if kind == "array":
        items = from_schema(schema.get("items", {}), root)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=schema.get("maxItems", 8))
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 40))
    if kind in ("integer", "number"):
        low, high = schema.get("exclusiveMinimum", schema.get("minimum")), schema.get("maximum")
        exclusive = "exclusiveMinimum" in schema
        if kind == "integer":
            low = None if low is None else int(low) + exclusive
            return st.integers(low, None if high is None else int(high))
        return st.floats(low, high, exclude_min=exclusive, allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10))  # {}: anything


# --- malformed requests ---------------------------------------------------------------------------------------------

HUGE_INTS = [2**31, 2**53 + 1, 2**63, -(2**63) - 1, 10**30, -(10**30), 10**300]
NASTY = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(["", " ", "\x00", "\u202e", "null", "0", "-1", "1e999", "NaN", "policy", "../../etc/passwd"]),
    st.text(max_size=40),
    st.just("x" * 70_000),
    st.integers(),
    st.sampled_from(HUGE_INTS),
    st.sampled_from([0, -1, 1, 0.5, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf")]),
    st.floats(),
    st.lists(st.integers(), max_size=6),
    st.lists(st.text(max_size=5), max_size=4),
    st.just([[[[]]]]),
    st.just(list(range(5000))),
    st.dictionaries(st.text(max_size=8), st.integers(), max_size=3),
)
UNKNOWN_KEY = st.text(string.ascii_letters + "_", min_size=1, max_size=12)
LONG_DIGITS = "1" + "0" * 5000  # more digits than Python's int(str) takes by default (4,300)


def _dumps(value: Any) -> bytes:
    # allow_nan: a NaN or infinity goes out as the NaN/Infinity literal, which Python's json (FastAPI's) reads
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """A hint: ``good`` values about four times in five, else ``bad`` ones."""
    return st.one_of(good, good, good, good, bad)


def _resolved(schema: dict) -> dict:
    while "$ref" in schema:
        target: Any = schema
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, "components": schema.get("components")}
    return schema


def _hinted(schema: dict, hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Schema-valid bodies; with hints, half of them plausible: the required fields plus the hinted ones, with
    values from the hints (mostly valid ones, so that many requests get past validation to the real work)."""
    base = from_schema(schema)
    if not hints:
        return base
    required = set(_resolved(schema).get("required", []))

    @st.composite
    def with_hints(draw):
        body = draw(base)
        if not isinstance(body, dict):
            return body
        plausible = draw(st.booleans())
        if plausible:
            body = {k: v for k, v in body.items() if k in required}
        for key, values in hints.items():
            if plausible or draw(st.integers(0, 3)) == 0:
                body[key] = draw(values)
        return body

    return with_hints()


@st.composite
def _mutated(draw, valid: st.SearchStrategy) -> Any:
    body = draw(valid)
    how = draw(st.sampled_from(["drop", "unknown", "retype", "whole", "nested"]))
    if how == "whole" or not isinstance(body, dict):
        return draw(st.one_of(NASTY, st.lists(NASTY, max_size=3)))
    keys = sorted(body)
    if how == "drop" and keys:
        body.pop(draw(st.sampled_from(keys)))
    elif how == "retype" and keys:
        body[draw(st.sampled_from(keys))] = draw(NASTY)
    elif how == "nested" and keys:
        body[draw(st.sampled_from(keys))] = draw(st.lists(NASTY, min_size=1, max_size=3))
    else:
        for _ in range(draw(st.integers(1, 3))):
            body[draw(UNKNOWN_KEY)] = draw(NASTY)
    return body


@st.composite
def _raw(draw, valid: st.SearchStrategy) -> bytes:
    body = draw(valid)
    text = _dumps(body)
    key = next(iter(body), "x") if isinstance(body, dict) and body else "x"
    return draw(
        st.sampled_from(
            [
                text[: max(1, len(text) // 2)],  # truncated
                text + b"}",
                b"",
                b"null",
                b"{",
                b'{"' + key.encode() + b'": ' + LONG_DIGITS.encode() + b"}",
                b'{"' + key.encode() + b'": 1e999999}',
                b'{"' + key.encode() + b'": NaN, "' + key.encode() + b'": -Infinity}',
                b'{"' + key.encode() + b'": "\\ud800"}',  # a lone surrogate
                b"[" * 200 + b"]" * 200,  # nested past the guard's limit
                b'{"a": ' * 60 + b"1" + b"}" * 60,
                b"\xff\xfe\x00{}",  # not UTF-8
                text.replace(b":", b"=", 1),
            ]
        )
        | st.binary(max_size=64)
    )


def _body(op: Operation, hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """(kind, JSON value or None, bytes, content type) of a request body."""
    if op.body_schema is None:  # a route without a body still gets junk bodies sometimes
        return st.one_of(
            st.just(("none", None, b"", None)),
            st.binary(max_size=32).map(lambda b: ("raw", None, b, "application/json")),
            NASTY.map(lambda v: ("mutated", v, _dumps(v), "application/json")),
        )
    valid = _hinted(op.body_schema, hints)
    good_type = st.sampled_from(["application/json"] * 4 + ["application/json; charset=utf-8"])
    any_type = st.sampled_from(
        ["application/json"] * 6 + [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
    )
    return st.one_of(
        st.tuples(valid, good_type).map(lambda t: ("valid", t[0], _dumps(t[0]), t[1])),
        st.tuples(valid, good_type).map(lambda t: ("valid", t[0], _dumps(t[0]), t[1])),
        st.tuples(_mutated(valid), any_type).map(lambda t: ("mutated", t[0], _dumps(t[0]), t[1])),
        st.tuples(_raw(valid), any_type).map(lambda t: ("raw", None, t[0], t[1])),
    )


def _params(op: Operation, hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    declared = {}
    for param in op.params:
        name = param["name"]
        values = st.one_of(st.text(max_size=20), st.sampled_from(["", "0", "-1", "x" * 3000, "%00", "\u00e9"]))
        if name in hints:
            values = st.one_of(hints[name], values)
        declared[name] = values
    known = st.fixed_dictionaries({}, optional=declared)
    unknown = st.dictionaries(UNKNOWN_KEY, st.text(max_size=10), max_size=2)
    return st.tuples(known, unknown).map(lambda t: {**t[1], **t[0]})


def requests(op: Operation, auth: str, hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Requests for ``op``; ``auth`` is "token" (the right header), "bad" (no or a wrong one) or "any"."""
    if auth == "token":
        header = st.just(f"Bearer {TOKEN}")
    elif auth == "bad":
        header = st.sampled_from(BAD_AUTH)
    else:
        header = st.sampled_from([None, f"Bearer {TOKEN}", "Bearer wrong"])

    def build(t) -> Request:
        (kind, body, content, content_type), params, authorization = t
        headers = {}
        if content_type is not None:
            headers["content-type"] = content_type
        if authorization is not None:
            headers["authorization"] = authorization
        return Request(params, headers, content, kind, body)

    return st.tuples(_body(op, hints), _params(op, hints), header).map(build)


# --- the run ------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


def check_response(op: Operation, auth: str, request: Request, response: httpx.Response) -> None:
    status = response.status_code
    where = f"{op.name} ({auth}) -> {status} {response.text[:400]!r}\nrequest: {request.describe()}"
    assert status < 500, f"server error: {where}"
    if auth == "bad":
        assert status >= 400, f"a control route did its work without the control token: {where}"
    if 400 <= status < 500:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"a 4xx without the house error body: {where}") from None
        assert isinstance(message, str) and message.strip(), f"a 4xx that does not say what is wrong: {where}"
    if status == 401:
        assert response.headers.get("www-authenticate") == "Bearer", where
    if status < 300 and response.headers.get("content-type", "").startswith("application/json"):
        response.json()  # a 2xx JSON body parses


def fuzz(target: Target, op: Operation, auth: str, examples: int = EXAMPLES) -> Outcome:
    """Send ``examples`` generated requests to ``op`` (``auth`` as in ``requests``); raise on the first bad answer
    (Hypothesis then shrinks it to a small failing request)."""
    outcome = Outcome()
    hints = target.hints.get(op.name, {})
    forbidden = target.forbid.get(op.name)
    client = httpx.Client(base_url=target.url, timeout=TIMEOUT_S)

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        report_multiple_bugs=False,
        print_blob=False,
    )
    @given(requests(op, auth, hints))
    def run(request: Request) -> None:
        if auth != "bad" and forbidden is not None and forbidden(request.params, request.body):
            request.params = {**request.params, **_defused(op)}
        try:
            response = client.request(
                op.method, op.path, params=request.params, headers=request.headers, content=request.content
            )
        except httpx.TimeoutException:
            raise AssertionError(
                f"no answer within {TIMEOUT_S:.0f} s (a hang): {op.name} {request.describe()}"
            ) from None
        outcome.sent += 1
        outcome.statuses[response.status_code] = outcome.statuses.get(response.status_code, 0) + 1
        check_response(op, auth, request, response)

    try:
        run()
    finally:
        client.close()
    assert outcome.sent >= examples, f"{op.name} ({auth}): only {outcome.sent} requests sent"
    return outcome


def _defused(op: Operation) -> dict[str, str]:
    """Parameters that turn a forbidden request into a refused one (only ``/pause`` has a rule so far)."""
    return {p["name"]: "abort" for p in op.params if p["name"] == "mode"}


def fuzz_service(target: Target, monkeypatch) -> dict[str, Outcome]:
    """Fuzz every route of ``target`` with the control token configured (``monkeypatch`` sets it); a control
    route twice (with and without the token). Returns what was sent per route and auth mode."""
    from shared.auth import CONTROL_TOKEN_ENV

    monkeypatch.setenv(CONTROL_TOKEN_ENV, TOKEN)
    results: dict[str, Outcome] = {}
    failures: list[str] = []
    for op in operations(target.url, target.app):
        for auth in ("token", "bad") if op.control else ("any",):
            try:
                results[f"{op.name} [{auth}]"] = fuzz(target, op, auth)
            except AssertionError as exc:  # every route is fuzzed; all failures are reported together
                failures.append(f"{op.name} [{auth}]: {exc}")
    failures += wrong_methods(target)
    failures += cut_bodies(target)
    failures += counted_server_errors(target)
    assert not failures, "\n\n".join(failures)
    return results


def cut_bodies(target: Target) -> list[str]:
    """Each route sent part of a body (and each control route without the token): the client leaves mid-body.
    Nobody hears the answer, so what is checked is the server's own count (``counted_server_errors``)."""
    host, port = target.url.removeprefix("http://").split(":")
    for op in operations(target.url, target.app):
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
            head = f"{op.method} {op.path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"
            sock.sendall(f"{head}Content-Length: 1000\r\n\r\n".encode() + b'{"cut": "')
            time.sleep(0.05)  # the server is reading the body when the client goes
    time.sleep(0.2)
    return []


def counted_server_errors(target: Target) -> list[str]:
    """The 5xx the service itself counted (``coda_http_requests_total``), including answers no client saw."""
    text = httpx.get(target.url + "/metrics", timeout=TIMEOUT_S).text
    counted = re.findall(r'^coda_http_requests_total\{([^}]*status="5\d\d"[^}]*)\} (\S+)$', text, re.MULTILINE)
    return [f"the service counted {float(n):.0f} server error(s): {labels}" for labels, n in counted if float(n) > 0]


def wrong_methods(target: Target) -> list[str]:
    """Each listed path sent each method it does not declare: a 405 in the house error body, never a 5xx."""
    spec = httpx.get(target.url + "/openapi.json", timeout=TIMEOUT_S).json()
    failures = []
    with httpx.Client(base_url=target.url, timeout=TIMEOUT_S) as client:
        for path, methods in spec["paths"].items():
            for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - {m.upper() for m in methods}:
                response = client.request(method, path, content=b"{}", headers={"content-type": "application/json"})
                try:
                    assert response.status_code == 405, "not a 405"
                    assert response.json()["error"]["message"], "no message"
                except (AssertionError, ValueError, KeyError, TypeError) as exc:
                    failures.append(f"{method} {path}: {exc}: {response.status_code} {response.text[:200]!r}")
    return failures


def summary(results: dict[str, Outcome]) -> str:
    return "\n".join(
        f"{name}: {o.sent} requests, statuses {dict(sorted(o.statuses.items()))}" for name, o in results.items()
    )
