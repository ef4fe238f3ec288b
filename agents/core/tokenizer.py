"""Tokenizers the agents use to build token-in/token-out prompts and observations.

The agents only ever *append*: a prompt is rendered and encoded once at the start of an episode, every
observation is encoded on its own and appended. ``HFTokenizer`` wraps the served model's own tokenizer
(``transformers``, no torch needed); ``CharTokenizer`` is a tiny deterministic tokenizer for fakes, tests
and benchmarks (one id per character).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from agents.prompts import Messages


class TokenizerLike(Protocol):
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def render(self, messages: Messages) -> list[int]: ...
    def tool_turn(self, content: str, role: str = "tool") -> str: ...


def with_system(messages: Messages, system_prompt: str | None) -> Messages:
    """``messages`` with a system turn first when ``system_prompt`` is set and they have none."""
    if system_prompt is None or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]


def plain_render(messages: Messages) -> str:
    """Base-model layout (no chat template): system text, the user text, then ``\\nAssistant: ``."""
    parts = [m["content"] for m in messages if m["role"] in ("system", "user")]
    return "\n\n".join(parts) + "\nAssistant: "


PLAIN_TOOL_TURN = "\n<tool_response>\n{content}\n</tool_response>\n"
PLAIN_USER_TURN = "\n\nUser: {content}\nAssistant: "  # plain_render's layout, for a model with no template

# Where environment text (observations, the invalid-action message, the final-answer nudge) goes: ``inline`` in
# the assistant's own turn (Search-R1's convention), or as a separate ``user``/``tool`` turn rendered by the
# model's chat template. An instruct model reads inline text as its own words and may continue it.
ENV_TURNS = ("inline", "user", "tool")
INLINE: tuple[str, str] = ("", "")  # the frame of inline environment text: nothing around it


def plain_turn(content: str, role: str) -> str:
    return (PLAIN_USER_TURN if role == "user" else PLAIN_TOOL_TURN).format(content=content)


def env_frame(tok: TokenizerLike, env_turn: str) -> tuple[str, str]:
    """``(before, after)`` put around environment text for ``env_turn``: nothing for ``inline``; else what ends the
    assistant's turn and opens one of that role, and what closes it and opens the assistant's next turn."""
    if env_turn not in ENV_TURNS:
        raise ValueError(f"env_turn must be one of {', '.join(ENV_TURNS)}, not {env_turn!r}")
    if env_turn == "inline":
        return INLINE
    marker = "\x00"
    before, _, after = tok.tool_turn(marker, role=env_turn).partition(marker)
    return before, after


class CharTokenizer:
    """One id per Unicode character (``ord + 3``); 0 = pad, 1 = EOS. Deterministic and dependency-free."""

    pad_token_id, eos_token_id, offset = 0, 1, 3

    def encode(self, text: str) -> list[int]:
        # UTF-32 code units are the code points: one vectorised pass instead of a Python loop per character.
        return (np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64) + self.offset).tolist()

    def decode(self, ids: list[int]) -> str:
        arr = np.asarray(ids, dtype=np.int64)
        return (arr[arr >= self.offset] - self.offset).astype(np.uint32).tobytes().decode("utf-32-le")

    def render(self, messages: Messages) -> list[int]:
        return self.encode(plain_render(messages))

    def tool_turn(self, content: str, role: str = "tool") -> str:
        return plain_turn(content, role)


class HFTokenizer:
    """The served model's tokenizer (``tokenizer.json`` / ``tokenizer_config.json`` in ``path``)."""

    def __init__(self, path: str, system_prompt: str | None = None) -> None:
        """``system_prompt``: the system turn put before any prompt that has none. ``None`` leaves it to the chat
        template, and some templates add one of their own (SmolLM2's: 16 tokens naming the model), so a recipe
        says what it wants; ``""`` is an empty system turn."""
        from transformers import AutoTokenizer  # heavy import: only where a real tokenizer is needed

        self.system_prompt = system_prompt
        self.tok = AutoTokenizer.from_pretrained(path)
        self.eos_token_id = self.tok.eos_token_id
        self.has_template = bool(getattr(self.tok, "chat_template", None))
        # The Rust tokenizer directly: same ids as ``tok.encode``, without the Python wrapper's per-call cost
        # (it runs once per observation and per prompt on the rollout's hot path).
        self.fast = getattr(self.tok, "backend_tokenizer", None)
        self._rendered: dict[tuple, list[int]] = {}
        self._short: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        # Observation wrappers and environment messages repeat on every turn: cache the short strings.
        if len(text) <= 256:
            ids = self._short.get(text)
            if ids is None:
                if len(self._short) >= 4096:
                    self._short.clear()
                ids = self._short[text] = self._encode(text)
            return list(ids)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        if self.fast is not None:
            return self.fast.encode(text, add_special_tokens=False).ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        if self.fast is not None:
            return self.fast.decode(ids, skip_special_tokens=False)
        return self.tok.decode(ids, skip_special_tokens=False)

    def render(self, messages: Messages) -> list[int]:
        """Prompt ids of ``messages``; cached, since the ``n`` samples of a group share their prompt."""
        messages = with_system(messages, self.system_prompt)
        key = tuple((m["role"], m["content"]) for m in messages)
        ids = self._rendered.get(key)
        if ids is None:
            if self.has_template:
                text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            else:
                text = plain_render(messages)
            ids = self.encode(text)
            if len(self._rendered) >= 4096:
                self._rendered.clear()
            self._rendered[key] = ids
        return list(ids)

    def tool_turn(self, content: str, role: str = "tool") -> str:
        """The text that closes an assistant turn that stopped mid-turn (at ``</tool_call>``, ``</search>``),
        holds ``content`` as a turn of ``role`` and opens the assistant's next turn, as the chat template
        renders it (plain layout without a template)."""
        if not self.has_template:
            return plain_turn(content, role)
        marker = "\x00CALL\x00"
        convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
        text = self.tok.apply_chat_template(
            [*convo, {"role": role, "content": content}], add_generation_prompt=True, tokenize=False
        )
        cut = text.rfind(marker)
        return text[cut + len(marker) :] if cut >= 0 else plain_turn(content, role)


def load_tokenizer(spec: str, system_prompt: str | None = None) -> TokenizerLike:
    if spec == "char":
        return CharTokenizer()
    if not spec:
        raise ValueError("set the tokenizer (CODA_ROLLOUT_TOKENIZER / --tokenizer): the served model's folder")
    return HFTokenizer(spec, system_prompt)
