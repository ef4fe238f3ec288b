"""Policy servers announce themselves in Redis; the rollout reads who is there.

One key per server, ``<prefix><base URL>`` (value: the URL), written with a TTL and refreshed by a heartbeat
well inside it: a server that stops or dies drops out of the list by itself once its key expires, with no
clock shared between hosts (Redis expires the key). A server that stops cleanly deletes its key at once.
So a second host, or ``docker compose up --scale inference=3``, adds capacity without editing a recipe.

The inference server writes (``Heartbeat``, only when given a Redis URL and the URL others reach it at);
the rollout reads (``announced``) and unions the result with the servers its settings list.
"""

from __future__ import annotations

import threading

import redis

from shared.log import get_logger

log = get_logger(__name__)

DEFAULT_PREFIX = "inference:servers:"


def register(client: redis.Redis, prefix: str, url: str, ttl_s: float) -> None:
    """Announce ``url`` for ``ttl_s`` seconds (again: extends it)."""
    client.set(prefix + url, url, px=max(1, int(ttl_s * 1000)))


def unregister(client: redis.Redis, prefix: str, url: str) -> None:
    client.delete(prefix + url)


def announced(client: redis.Redis, prefix: str) -> list[str]:
    """The base URLs announced under ``prefix`` now, sorted. SCAN, not KEYS: a fleet is a handful of keys,
    but the Redis also holds the streams, and KEYS would block it while it walks every key."""
    urls = []
    for key in client.scan_iter(match=_escape(prefix) + "*", count=1000):
        key = key.decode() if isinstance(key, bytes) else key
        urls.append(key[len(prefix) :])
    return sorted(urls)


def _escape(pattern: str) -> str:
    """``prefix`` as a literal in a SCAN pattern (a URL has no glob characters, a prefix might)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in pattern)


class Heartbeat:
    """A daemon thread that keeps ``url`` announced every ``every_s`` seconds (TTL: three beats, so one
    slow beat is not a departure) and deletes the key on ``stop``. A Redis outage is logged and outlived:
    the key expires meanwhile, and the next beat that gets through announces the server again."""

    def __init__(self, client: redis.Redis, prefix: str, url: str, every_s: float) -> None:
        self.client, self.prefix, self.url, self.every_s = client, prefix, url, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        log.info("announcing this server in Redis", extra={"url": self.url, "key": self.prefix + self.url})
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            unregister(self.client, self.prefix, self.url)
        except redis.RedisError as exc:  # the key expires by itself within three beats
            log.warning("could not withdraw the announcement", extra={"error": repr(exc)[:200]})
        self.client.close()

    def _run(self) -> None:
        failing = False
        while True:
            try:
                register(self.client, self.prefix, self.url, 3 * self.every_s)
                if failing:
                    log.info("announcing this server again", extra={"url": self.url})
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("cannot announce this server in Redis", extra={"error": repr(exc)[:200]})
                failing = True
            if self._stop.wait(self.every_s):
                return
