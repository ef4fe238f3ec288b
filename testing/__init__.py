"""Test and benchmark harness: the scripted fake LLM (vLLM API shape), the inference server run on a
thread, and any ASGI app served on a thread (``serving``). Not part of any service image."""
