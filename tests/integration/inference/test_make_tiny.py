"""``make-tiny``: a deterministic HF-format folder (tokenizer with the agent tags, random-init Qwen2)."""

from __future__ import annotations

import hashlib

import pytest

from services.inference.__main__ import main
from services.inference.factory import SHAPES, model_config, train_tokenizer
from shared.tags import all_tag_tokens
from tests.integration.inference.conftest import corpus


def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_make_tiny_is_deterministic_and_loadable(tmp_path, capsys):
    args = [
        "make-tiny",
        "--size",
        "tiny",
        "--seed",
        "3",
        "--text",
        str(corpus()),
        "--max-texts",
        "300",
        "--vocab-size",
        "600",
        "--max-len",
        "128",
    ]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert "parameters" in capsys.readouterr().out
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(
        digest(tmp_path / "a")
    )
    assert (
        main(
            [
                *args[:-6],
                "--text",
                str(corpus()),
                "--max-texts",
                "300",
                "--vocab-size",
                "600",
                "--seed",
                "4",
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    assert digest(tmp_path / "c")["model.safetensors"] != digest(tmp_path / "a")["model.safetensors"]

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    for tag in all_tag_tokens():
        ids = tok(f"x {tag} y", add_special_tokens=False)["input_ids"]
        assert tok.convert_tokens_to_ids(tag) in ids  # one id per tag
        assert tag in tok.decode(ids, skip_special_tokens=True)  # tags are not special: they stay in text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # however transformers loads the folder (here: Qwen2Tokenizer), it tokenizes as the trained tokenizer.json
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
    for text in ["Ed Wood (film)\nEd Wood is a 1994 film.  don't  <think>x</think>", "123 4567\t tabs", "é ü ß"]:
        assert tok(text, add_special_tokens=False)["input_ids"] == raw.encode(text, add_special_tokens=False).ids
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n")


def test_extra_tokens_are_single_ids(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("Zorblax Quintara\nVelmo\n")
    assert (
        main(
            [
                "make-tiny",
                "--out",
                str(tmp_path / "m"),
                "--text",
                str(corpus()),
                "--max-texts",
                "200",
                "--vocab-size",
                "500",
                "--max-len",
                "64",
                "--extra-tokens",
                str(names),
            ]
        )
        == 0
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    ids = tok("Who rules Zorblax Quintara?", add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("Zorblax Quintara") in ids
    assert tok.decode(ids) == "Who rules Zorblax Quintara?"


def test_missing_text_file_is_a_clear_error(tmp_path, capsys):
    assert main(["make-tiny", "--out", str(tmp_path), "--text", str(tmp_path / "none.txt")]) == 2
    assert "not found" in capsys.readouterr().err


@pytest.mark.parametrize(("size", "low", "high"), [("tiny", 0.5e6, 2e6), ("small", 2e6, 8e6), ("base", 20e6, 35e6)])
def test_sizes_span_1m_to_30m_parameters(size, low, high):
    import torch
    from transformers import Qwen2ForCausalLM

    tok = train_tokenizer(["a small text to train on"] * 10, vocab_size=4096)
    tok_len = 4096  # the default vocabulary make-tiny trains on the bundled corpus
    config = model_config(tok, size)
    config.vocab_size = tok_len
    with torch.device("meta"):
        params = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
    assert low < params < high, (size, params, SHAPES[size])
