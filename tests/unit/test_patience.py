"""Waiting out a dependency's outage (``shared.retry.Patience``): retry while unreachable, log the outage once
and its end, give up after the configured time, stop waiting soon once told to stop, never retry a wrong call."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest
import redis

from shared.inference_client import InferenceError
from shared.retry import DependencyDown, Patience, is_outage


class Flaky:
    """Fails ``failures`` times with ``error``, then returns ``"ok"``."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok", args, kwargs


def test_outage_is_waited_out_with_one_warning_and_a_back_line(caplog):
    fn = Flaky(4, redis.ConnectionError("Connection refused"))
    with caplog.at_level(logging.INFO, logger="shared.retry"):
        assert Patience(give_up_s=10, backoff_s=0.01).call("redis", fn, 1, k=2) == ("ok", (1,), {"k": 2})
    assert fn.calls == 5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == ["redis unreachable: waiting for it"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == ["redis is back"]


def test_gives_up_after_give_up_s():
    fn = Flaky(10**6, redis.TimeoutError("Timeout reading from socket"))
    start = time.monotonic()
    with pytest.raises(DependencyDown, match=r"redis unreachable .*give-up"):
        Patience(give_up_s=0.3, backoff_s=0.01, max_backoff_s=0.05).call("redis", fn)
    assert 0.3 <= time.monotonic() - start < 1.5 and fn.calls > 3


def test_a_wrong_call_is_not_retried():
    fn = Flaky(1, redis.ResponseError("WRONGTYPE"))
    with pytest.raises(redis.ResponseError):
        Patience(give_up_s=10, backoff_s=0.01).call("redis", fn)
    assert fn.calls == 1


def test_stop_cuts_a_long_wait_to_the_grace():
    stop = threading.Event()
    patience = Patience(give_up_s=600, stop=stop, stop_grace_s=0.2, backoff_s=5, max_backoff_s=5)
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    with pytest.raises(DependencyDown, match="while stopping"):
        patience.call("redis", Flaky(10**6, redis.ConnectionError("gone")))
    assert time.monotonic() - start < 2  # neither the 5 s backoff nor the 600 s give-up


def test_what_counts_as_an_outage():
    assert is_outage(redis.ConnectionError()) and is_outage(redis.TimeoutError())
    assert is_outage(redis.BusyLoadingError())  # a restarted Redis still loading its AOF
    assert is_outage(httpx.ConnectError("refused")) and is_outage(httpx.ReadTimeout("slow"))
    assert is_outage(InferenceError(503, "loading")) and is_outage(InferenceError(429, "busy"))
    assert not is_outage(InferenceError(404, "no adapter")) and not is_outage(InferenceError(500, "bad weights"))
    assert not is_outage(redis.ResponseError("NOGROUP")) and not is_outage(ValueError())
