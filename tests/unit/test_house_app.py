"""The house FastAPI app: /health, /metrics without a redirect, 400 with a message for bad bodies, 413."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient
from pydantic import BaseModel, field_validator

from shared.http import ApiError, create_app
from shared.log import JsonFormatter, KeyValueFormatter, get_logger


class Body(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def _not_13(cls, v: int) -> int:
        if v == 13:
            raise ValueError("13 is unlucky")
        return v


def make_client(checks=None):
    app, _registry = create_app("demo", health_checks=checks, max_body_bytes=100)

    @app.post("/echo")
    def echo(body: Body) -> dict:
        if body.n < 0:
            raise ApiError("n must be >= 0, got -1")
        return {"n": body.n}

    return TestClient(app)


def test_health_and_metrics():
    client = make_client({"index": lambda: "loaded"})
    r = client.get("/health")
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["checks"] == {"index": "loaded"}
    client.post("/echo", json={"n": 1})
    m = client.get("/metrics", follow_redirects=False)
    assert m.status_code == 200
    assert 'coda_http_requests_total{route="/echo",service="demo",status="200"} 1.0' in m.text


def test_failing_health_check_is_503():
    def broken():
        raise RuntimeError("no index")

    r = make_client({"index": broken}).get("/health")
    assert r.status_code == 503 and "no index" in r.json()["checks"]["index"]


def test_bad_input_is_4xx_with_message():
    client = make_client()
    r = client.post("/echo", json={"n": "x"})
    assert r.status_code == 400 and "n: Input should be a valid integer" in r.json()["error"]["message"]
    r = client.post("/echo", json={"n": 13})  # a validator's ValueError is a 400 too, not a 500
    assert r.status_code == 400 and "13 is unlucky" in r.json()["error"]["message"]
    r = client.post("/echo", json={"n": -1})
    assert r.status_code == 400 and r.json()["error"]["message"] == "n must be >= 0, got -1"
    r = client.post("/echo", content=b'{"n": 1' + b" " * 200 + b"}", headers={"content-type": "application/json"})
    assert r.status_code == 413 and "exceeds the limit of 100 bytes" in r.json()["error"]["message"]


def _record(**extra) -> logging.LogRecord:
    record = logging.LogRecord("demo", logging.INFO, __file__, 1, "hello world", None, None)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_log_formats():
    line = KeyValueFormatter().format(_record(group_id="g1", n=3))
    assert 'msg="hello world"' in line and "group_id=g1" in line and "n=3" in line
    doc = JsonFormatter().format(_record(n=3))
    assert '"msg": "hello world"' in doc and '"n": 3' in doc
    assert get_logger("x") is logging.getLogger("x")


def test_no_log_call_overwrites_a_record_attribute():
    """``extra={"name": …}`` raises inside logging at INFO (a LoRA load once failed with a 400 for it)."""
    import re
    from pathlib import Path

    reserved = set(vars(_record())) | {"message", "asctime"}
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in list((root / "services").rglob("*.py")) + list((root / "shared").rglob("*.py")):
        for key in re.findall(r"extra=\{([^}]*)\}", path.read_text()):
            for name in re.findall(r'"(\w+)"\s*:', key):
                if name in reserved:
                    offenders.append(f"{path.relative_to(root)}: {name}")
    assert offenders == []


def test_http_client_request_lines_are_quiet_unless_debug():
    import logging

    from shared.log import QUIET_LIBRARIES, configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in QUIET_LIBRARIES}
    try:
        configure_logging("INFO")
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
        assert logging.getLogger("services.rollout").isEnabledFor(logging.INFO)
        configure_logging("DEBUG")
        assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:], level, levels = saved
        root.setLevel(level)
        for name, lvl in levels.items():
            logging.getLogger(name).setLevel(lvl)
