"""The served model's own tokenizer and chat template, loaded without vLLM.

Features depend on exact token counts, so they come from the model's tokenizer and
its chat template, never from an approximation.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Sequence

from promptdistill.engine.base import Message
from promptdistill.errors import ModelNotFoundError

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

    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        text = messages if isinstance(messages, str) else self.apply_chat_template(messages)
        return len(self.tokenize(text))


@lru_cache(maxsize=4)
def cached_tokenizer(model: str) -> HFTokenizer:
    return HFTokenizer(model)
