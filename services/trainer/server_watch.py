"""Keeps the inference server on the published weights across its restarts.

A restarted server (a crash, ``docker compose restart``, an OOM kill) comes back with the weights it was
started with and nobody would tell it otherwise: every group sampled from it would be many versions stale,
and a run without SFT data would never publish again to fix it. A thread on rank 0 asks the server every
``every_s`` seconds which version it serves and loads the last published one again when it is behind
(``Publisher.resend_if_lost``). It uses its own client: the loop's client may be waiting out an outage.
"""

from __future__ import annotations

import threading

import httpx

from services.trainer.publish import Publisher
from shared.inference_client import InferenceError, SyncInferenceClient
from shared.log import get_logger
from shared.retry import RetryPolicy

log = get_logger(__name__)


class ServerWatch:
    def __init__(self, publisher: Publisher, url: str, every_s: float) -> None:
        self.publisher = publisher
        self.every_s = every_s
        self.stop = threading.Event()
        self.client = SyncInferenceClient(url, retry=RetryPolicy(attempts=1), timeout=30.0)
        self.thread = threading.Thread(target=self._run, name="server-watch", daemon=True)
        self.resent = 0

    def start(self) -> ServerWatch:
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.client.close()

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                self.resent += self.publisher.resend_if_lost(self.client)
            except (InferenceError, httpx.HTTPError) as exc:
                # Down or still loading: the loop's own calls wait the outage out; we ask again next time.
                log.debug("inference server not answering the weight check", extra={"error": repr(exc)[:200]})
