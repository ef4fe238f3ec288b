"""A tiny random Qwen2 causal LM built in-process (no tokenizer, no files): the trainer's test model."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(vocab: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(cfg).eval()
