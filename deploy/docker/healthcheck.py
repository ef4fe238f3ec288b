"""Container healthcheck: GET ``/health`` of this container's service on the port its settings resolve to.

    python deploy/docker/healthcheck.py retriever

The port is read from the service's settings class (defaults < recipe ``$CODA_RECIPE`` < environment), the
same way the service reads it, so a recipe or env override of the port never breaks the healthcheck.
Exit 0 when ``/health`` answers 200, 1 otherwise (Docker's contract for HEALTHCHECK).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import urllib.request

from shared.settings import ServiceSettings


def settings_class(service: str) -> type[ServiceSettings]:
    """The one ``ServiceSettings`` subclass defined in ``services/<service>/config.py``."""
    module = importlib.import_module(f"services.{service}.config")
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, ServiceSettings) and obj is not ServiceSettings and obj.__module__ == module.__name__
    ]
    if len(classes) != 1:
        raise LookupError(f"services/{service}/config.py defines {len(classes)} settings classes, expected 1")
    return classes[0]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    port = settings_class(argv[0]).load().port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:  # connection refused, timeout, HTTP 503 (HTTPError is an OSError)
        print(f"{argv[0]} on port {port} is not healthy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
