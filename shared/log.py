"""One logger factory for every service: key=value lines (default) or JSON lines.

Extra fields travel in ``extra=``: ``log.info("published", extra={"group_id": g, "samples": 8})``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Literal

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is printed as a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}

LogFormat = Literal["kv", "json"]


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


def _kv_value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "='):
        return json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=info logger=… msg="…" key=value …``: greppable and readable."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_kv_value(record.getMessage())}",
        ]
        parts += [f"{k}={_kv_value(v)}" for k, v in _fields(record).items()]
        if record.exc_info:
            parts.append(f"exc={json.dumps(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


QUIET_LIBRARIES = ("httpx", "httpcore")


def configure_logging(level: str | None = None, fmt: LogFormat | None = None, path: Path | None = None) -> None:
    """Install the house format on the root logger, to stderr or appended to ``path``;
    ``CODA_LOG_LEVEL`` / ``CODA_LOG_FORMAT`` override."""
    level = (level or os.environ.get("CODA_LOG_LEVEL", "INFO")).upper()
    fmt = fmt or os.environ.get("CODA_LOG_FORMAT", "kv")  # type: ignore[assignment]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.StreamHandler(sys.stderr) if path is None else logging.FileHandler(path)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx/httpcore log every request at INFO: thousands of lines per minute from the rollout and the stack's
    # health polls, burying the services' own lines. Their warnings still show; CODA_LOG_LEVEL=DEBUG shows all.
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def get_logger(name: str) -> logging.Logger:
    """The one way to get a logger in this project."""
    return logging.getLogger(name)
