"""Tiny model factory: a byte-level BPE tokenizer trained locally plus a random-init Qwen2 model, in HF format.

No hub access: the tokenizer is trained on bundled text, the model is built from a config. The folder holds
``config.json``, ``generation_config.json``, ``model.safetensors`` and the tokenizer files, so transformers,
our CPU server and vLLM all load the same directory. Deterministic for a seed (same inputs → same bytes).

The agent tags (``shared.tags.all_tag_tokens()``) are added tokens that are *not* special: they stay in
decoded text (stop strings such as ``</search>`` must match it) and each is one id.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from shared.tags import all_tag_tokens

# Qwen2's special tokens: <|endoftext|> pads (and is the unk Qwen2Tokenizer expects), <|im_end|> ends a turn.
PAD, EOS, IM_START = "<|endoftext|>", "<|im_end|>", "<|im_start|>"

# Qwen2's pre-tokenizer split. transformers ≥ 5 loads any qwen2-config folder with Qwen2Tokenizer, which
# installs this split and NFC itself; training with the same pieces keeps the saved tokenizer identical
# to the loaded one (otherwise the served tokenization would differ from the trained one).
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# A ChatML-style template (the layout Qwen2 uses), so chat-formatted prompts work with vLLM and with us.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

Size = Literal["tiny", "small", "base"]


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# About 1M, 5M and 30M parameters with the default 4096-token vocabulary (embeddings tied).
SHAPES: dict[str, Shape] = {
    "tiny": Shape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256),
    "small": Shape(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768),
    "base": Shape(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536),
}


def read_texts(paths: Iterable[str | Path], limit: int | None = None) -> Iterator[str]:
    """Lines of text files; for ``.jsonl`` the ``contents``/``text``/``question`` field of each row."""
    count = 0
    for path in paths:
        path = Path(path)
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                if path.suffix == ".jsonl":
                    row = json.loads(line)
                    line = next((str(row[k]) for k in ("contents", "text", "question") if k in row), "")
                if line:
                    yield line
                    count += 1
                    if limit is not None and count >= limit:
                        return


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, extra_tokens: Iterable[str] = ()):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with pad/eos/chat specials and the tags as added tokens.

    ``extra_tokens`` become single (non-special) tokens too, e.g. the entity names of a synthetic world
    that should each be one id whatever the BPE merges learned.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, IM_START, EOS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    added = list(dict.fromkeys([*all_tag_tokens(), *extra_tokens]))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, additional_special_tokens=[IM_START]
    )
    fast.padding_side = "left"
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(tokenizer, size: Size, max_len: int = 2048):
    from transformers import Qwen2Config

    shape = SHAPES[size]
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max_len,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )


def build_tiny_model(
    out_dir: str | Path,
    texts: Iterable[str],
    size: Size = "tiny",
    seed: int = 0,
    vocab_size: int = 4096,
    max_len: int = 2048,
    extra_tokens: Iterable[str] = (),
) -> Path:
    """Train the tokenizer on ``texts``, build a random-init Qwen2 of ``size``, save both to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size, extra_tokens)
    config = model_config(tokenizer, size, max_len)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model_dir: str | Path) -> int:
    from safetensors import safe_open

    total = 0
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), "np") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a dict)
                total += _numel(fh.get_slice(key).get_shape())
    return total


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
