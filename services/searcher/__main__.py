"""``python -m services.searcher serve`` — the frozen search agent behind ``POST /search``."""

from __future__ import annotations

import argparse

from services.searcher.config import SearcherSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.searcher",
        description="Searcher service: a frozen model runs a multi-turn search "
        "loop against the retriever and answers one query.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve POST /search, /health and /metrics")
    SearcherSettings.add_arguments(serve)
    args = parser.parse_args(argv)
    import uvicorn

    from services.searcher.app import build_app
    from shared.log import configure_logging

    configure_logging()
    settings = SearcherSettings.from_args(args)
    uvicorn.run(build_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
