"""Policy inference: a CPU server speaking vLLM's OpenAI-compatible API subset, and a tiny model factory."""
