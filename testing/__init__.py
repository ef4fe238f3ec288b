"""Test and benchmark harness: the scripted fake LLM (vLLM API shape) and the inference server run on a
thread. Not part of any service image."""
