"""Test and benchmark harness: the scripted fake LLM (vLLM API shape), the inference server run on a
thread, and any ASGI app served on a thread (``serving``); the docs check (``docs_check``) and the recorded
series of the alerts' promtool tests (``alert_cases``). Not part of any service image."""
