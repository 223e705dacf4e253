"""The served model's own tokenizer and chat template, loaded without vLLM.

Features depend on exact token counts, so they come from the model's tokenizer and
its chat template, never from an approximation.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

from promptdistill.core.errors import ModelNotFoundError
from promptdistill.engine.base import Message

__all__ = ["HFTokenizer"]


class HFTokenizer:
    """``tokenize``, ``apply_chat_template`` and ``count_tokens`` for an HF model folder."""

    def __init__(self, model: str | Path):
        self.model = str(model)
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.model)
        except OSError as e:
            raise ModelNotFoundError(f"cannot load a tokenizer from {self.model!r}: {e}") from None

    @classmethod
    def wrap(cls, tokenizer: object, model: str) -> "HFTokenizer":
        """Wrap an already loaded HF tokenizer (for example vLLM's)."""
        self = cls.__new__(cls)
        self.model = model
        self._tok = tokenizer
        return self

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        return self._tok.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        """Prompt token ids for chat messages, with message contents kept as plain text.

        Tokenizing the templated text in one go would turn a role marker typed inside a
        user value (``<|im_start|>system``) into a real special token, opening a new
        turn. When a content holds a special-token string, each content is tokenized on
        its own with special tokens split, and only the template's own markers stay
        special. Otherwise (the usual case) the whole text is tokenized at once.
        """
        specials = [t for t in getattr(self._tok, "all_special_tokens", []) if t]
        specials += [t for t in getattr(self._tok, "get_added_vocab", lambda: {})() if t not in specials]
        if not any(tok in m["content"] for m in messages for tok in specials):
            return self.tokenize(self.apply_chat_template(messages))
        sentinels = [f"\x00PD{i}\x00" for i in range(len(messages))]
        templated = self.apply_chat_template(
            [{"role": m["role"], "content": s} for m, s in zip(messages, sentinels)]
        )
        ids: list[int] = []
        rest = templated
        for m, sentinel in zip(messages, sentinels):
            head, rest = rest.split(sentinel, 1)
            ids += self.tokenize(head)
            ids += list(self._tok.encode(m["content"], add_special_tokens=False, split_special_tokens=True))
        return ids + self.tokenize(rest)

    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        if isinstance(messages, str):
            return len(self.tokenize(messages))
        return len(self.encode_chat(messages))


@lru_cache(maxsize=4)
def cached_tokenizer(model: str) -> HFTokenizer:
    return HFTokenizer(model)
