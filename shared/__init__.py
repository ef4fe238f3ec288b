"""coda-stack's shared library: wire types, settings, logging, metrics, the Redis stream queue.

Every service imports this package; it never imports torch or vLLM so that it stays light.
"""
