"""``BatchingRetriever`` lives beside the client it wraps, in ``shared.retriever_client``; this path is kept for
code that imports it from here."""

from shared.retriever_client import BatchingRetriever

__all__ = ["BatchingRetriever"]
