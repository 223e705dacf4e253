"""Prompt features for the TTFT models and the optimizer, computed with the served tokenizer.

``prompt_features`` returns exactly these keys (token counts with the served model's
tokenizer, over the prompt text the model sees: chat template applied, generation
prompt included):

* ``total_tokens``: every prompt token;
* ``static_prefix_tokens``: the leading tokens fully determined by static text, i.e.
  everything before the first input value, which a prefix cache can serve. Exactly: the
  length of the common prefix of the token ids of the whole prompt and of the prompt
  text cut at the first input value (a token straddling the boundary is not static);
* ``suffix_tokens``: ``total_tokens - static_prefix_tokens``;
* ``fewshot_count`` and ``fewshot_tokens`` (how many tokens the examples add to the prompt);
* ``instruction_tokens``: tokens of ``Spec.instruction_text()`` (instruction + rules);
* ``semantic_density`` and ``clause_count`` of that instruction text (:mod:`promptdistill.specs.text`);
* ``entropy_bits``: Shannon entropy of the prompt's token-id distribution;
* ``cl100k_tokens``: tiktoken cl100k_base tokens of the message contents, for cost reports.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import tiktoken

from promptdistill.specs.model import Spec
from promptdistill.specs.prompt import spec_messages
from promptdistill.specs.render import mask_escapes, render_text
from promptdistill.specs.text import count_clauses, semantic_density

__all__ = [
    "FEATURE_KEYS",
    "cl100k_tokens",
    "features_from_messages",
    "prompt_features",
    "static_prefix_chars",
    "token_entropy_bits",
]

FEATURE_KEYS = (
    "total_tokens", "static_prefix_tokens", "suffix_tokens", "fewshot_count", "fewshot_tokens",
    "instruction_tokens", "semantic_density", "entropy_bits", "clause_count", "cl100k_tokens",
)

_SENTINEL = "\ue000PD-INPUT\ue000"


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...
    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str: ...



# --- token statistics ------------------------------------------------------------------------


def token_entropy_bits(token_ids: Sequence[int]) -> float:
    """Shannon entropy, in bits, of the distribution of token ids: -sum p log2 p (0.0 if empty)."""
    n = len(token_ids)
    if n == 0:
        return 0.0
    return max(0.0, -sum((c / n) * math.log2(c / n) for c in Counter(token_ids).values()))


@lru_cache(maxsize=1)
def _cl100k() -> Any:
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        # Offline: litellm ships the cl100k file in tiktoken's cache layout.
        spec = importlib.util.find_spec("litellm")
        if spec and spec.submodule_search_locations:
            folder = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
            if folder.is_dir():
                os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
    return tiktoken.get_encoding("cl100k_base")


def cl100k_tokens(text: str) -> int:
    """Token count with tiktoken's cl100k_base (for cost reports; works offline)."""
    return len(_cl100k().encode(text, disallowed_special=()))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _static_prefix_chars(messages: Sequence[Mapping[str, str]], tokenizer: Tokenizer, *, user_static_chars: int = 0) -> int:
    """Characters of the chat-templated prompt before the first variable text.

    The first non-system message is taken as variable from its ``user_static_chars``-th
    character on (0: the whole message is variable). Found by rendering the prompt with a
    sentinel at that point, so it is exact for any chat template.
    """
    msgs = [dict(m) for m in messages]
    idx = next((i for i, m in enumerate(msgs) if m["role"] != "system"), None)
    if idx is None:
        return len(tokenizer.apply_chat_template(msgs))
    content = msgs[idx]["content"]
    msgs[idx]["content"] = content[:user_static_chars] + _SENTINEL + content[user_static_chars:]
    text = tokenizer.apply_chat_template(msgs)
    return text.index(_SENTINEL)


static_prefix_chars = _static_prefix_chars


def features_from_messages(
    messages: Sequence[Mapping[str, str]],
    tokenizer: Tokenizer,
    *,
    static_prefix_chars: int | None = None,
    instruction_text: str | None = None,
    fewshot_count: int = 0,
    fewshot_tokens: int = 0,
) -> dict[str, Any]:
    """The feature dict for any chat prompt (the TTFT profiler's synthetic prompts too).

    Args:
        messages: chat messages.
        tokenizer: anything with ``tokenize`` and ``apply_chat_template``.
        static_prefix_chars: characters of the chat-templated prompt that are static;
            None: everything before the first non-system message's content.
        instruction_text: text for density/clauses/instruction tokens; None: the first
            system message's content (or '').
        fewshot_count, fewshot_tokens: passed through (the caller knows its examples).
    """
    prompt = tokenizer.apply_chat_template(messages)
    ids = tokenizer.tokenize(prompt)
    if static_prefix_chars is None:
        static_prefix_chars = _static_prefix_chars(messages, tokenizer)
    static_ids = tokenizer.tokenize(prompt[:static_prefix_chars])
    static = _common_prefix(ids, static_ids)
    if instruction_text is None:
        instruction_text = next((m["content"] for m in messages if m["role"] == "system"), "")
    return {
        "total_tokens": len(ids),
        "static_prefix_tokens": static,
        "suffix_tokens": len(ids) - static,
        "fewshot_count": int(fewshot_count),
        "fewshot_tokens": int(fewshot_tokens),
        "instruction_tokens": len(tokenizer.tokenize(instruction_text)) if instruction_text else 0,
        "semantic_density": semantic_density(instruction_text),
        "entropy_bits": token_entropy_bits(ids),
        "clause_count": count_clauses(instruction_text),
        "cl100k_tokens": sum(cl100k_tokens(m["content"]) for m in messages),
    }


def prompt_features(
    spec: Spec, inputs: Mapping[str, Any], tokenizer: Tokenizer, *, examples: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Features of the prompt ``spec_messages(spec, inputs, examples=examples)`` (keys: FEATURE_KEYS)."""
    messages = spec_messages(spec, inputs, examples=examples)
    first = re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", mask_escapes(spec.user))
    lead = render_text(spec.user[: first.start()], {}) if first else messages[-1]["content"]
    static_chars = _static_prefix_chars(messages, tokenizer, user_static_chars=len(lead))
    fewshot_tokens = 0
    if examples:
        bare = spec_messages(spec, inputs)
        fewshot_tokens = len(tokenizer.tokenize(tokenizer.apply_chat_template(messages))) - len(
            tokenizer.tokenize(tokenizer.apply_chat_template(bare))
        )
    return features_from_messages(
        messages,
        tokenizer,
        static_prefix_chars=static_chars,
        instruction_text=spec.instruction_text(),
        fewshot_count=len(examples),
        fewshot_tokens=fewshot_tokens,
    )


