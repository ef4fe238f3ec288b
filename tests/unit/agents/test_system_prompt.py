"""A recipe's ``system_prompt`` decides the system turn: some chat templates add their own when a prompt has
none (SmolLM2's names the model, 16 tokens), so leaving it out must be a choice, not an accident."""

from __future__ import annotations

import pytest

from agents.prompts import HFTokenizer
from tests.unit.agents.helpers import DEFAULT_SYSTEM, smol_template_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return smol_template_folder(tmp_path_factory.mktemp("smol-template"))


QUESTION = [{"role": "user", "content": "Who wrote Hamlet?"}]


def test_none_leaves_the_template_its_own_system_turn(folder):
    tok = HFTokenizer(folder)
    assert DEFAULT_SYSTEM in tok.decode(tok.render(QUESTION))


def test_the_default_said_explicitly_renders_the_same_ids(folder):
    assert HFTokenizer(folder, DEFAULT_SYSTEM).render(QUESTION) == HFTokenizer(folder).render(QUESTION)


def test_an_empty_system_prompt_is_an_empty_turn_and_a_shorter_prompt(folder):
    empty, default = HFTokenizer(folder, ""), HFTokenizer(folder)
    text = empty.decode(empty.render(QUESTION))
    assert DEFAULT_SYSTEM not in text and text.startswith("<|im_start|>system\n<|im_end|>")
    assert len(empty.render(QUESTION)) < len(default.render(QUESTION))


def test_a_prompt_with_its_own_system_turn_keeps_it(folder):
    own = [{"role": "system", "content": "Plan."}, *QUESTION]
    assert HFTokenizer(folder, "").render(own) == HFTokenizer(folder).render(own)
