"""The sync check's probe prompt: an ordinary question through the model's chat template unless one is set
(special-token ids as a prompt made fp32 kernel noise alone exceed the 1e-4 the check is read against)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from services.trainer.sync_check import PROBE_QUESTION, probe_prompt
from tests.unit.agents.helpers import smol_template_folder


def test_the_probe_is_a_chat_prompt_unless_one_is_configured(tmp_path):
    folder = smol_template_folder(tmp_path / "smol")
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.decode(probe_prompt(folder))
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        f"<|im_start|>user\n{PROBE_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert probe_prompt(folder, [5, 6, 7]) == [5, 6, 7]


def test_without_a_template_the_probe_is_the_plain_question(tmp_path):
    folder = smol_template_folder(tmp_path / "plain")
    for template in Path(folder).glob("chat_template.*"):
        template.unlink()
    config = Path(folder) / "tokenizer_config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "chat_template"}))
    assert AutoTokenizer.from_pretrained(folder).decode(probe_prompt(folder)) == PROBE_QUESTION
