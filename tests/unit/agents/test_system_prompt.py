"""A recipe's ``system_prompt`` decides the system turn: some chat templates add their own when a prompt has
none (SmolLM2's names the model, 16 tokens), so leaving it out must be a choice, not an accident."""

from __future__ import annotations

import pytest

from recipes.core.tokenizer import HFTokenizer

# SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json ships it.
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(DEFAULT + SMOL_TEMPLATE + "Who wrote Hamlet?\n"))
    vocab = {c: i for i, c in enumerate(["<unk>", *chars])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    raw.decoder = decoders.Fuse()  # characters back to text with nothing between them
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = SMOL_TEMPLATE
    out = tmp_path_factory.mktemp("smol-template")
    tok.save_pretrained(out)
    return str(out)


QUESTION = [{"role": "user", "content": "Who wrote Hamlet?"}]


def test_none_leaves_the_template_its_own_system_turn(folder):
    tok = HFTokenizer(folder)
    assert DEFAULT in tok.decode(tok.render(QUESTION))


def test_the_default_said_explicitly_renders_the_same_ids(folder):
    assert HFTokenizer(folder, DEFAULT).render(QUESTION) == HFTokenizer(folder).render(QUESTION)


def test_an_empty_system_prompt_is_an_empty_turn_and_a_shorter_prompt(folder):
    empty, default = HFTokenizer(folder, ""), HFTokenizer(folder)
    text = empty.decode(empty.render(QUESTION))
    assert DEFAULT not in text and text.startswith("<|im_start|>system\n<|im_end|>")
    assert len(empty.render(QUESTION)) < len(default.render(QUESTION))


def test_a_prompt_with_its_own_system_turn_keeps_it(folder):
    own = [{"role": "system", "content": "Plan."}, *QUESTION]
    assert HFTokenizer(folder, "").render(own) == HFTokenizer(folder).render(own)
