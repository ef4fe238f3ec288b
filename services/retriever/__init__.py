"""The retriever service: hybrid BM25 + dense search behind a Search-R1-compatible ``POST /retrieve``."""
