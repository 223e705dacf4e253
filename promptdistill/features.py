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
* ``semantic_density`` and ``clause_count`` of that instruction text (defined below);
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
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from promptdistill.render import placeholders

if TYPE_CHECKING:
    from promptdistill.specs import Spec

__all__ = [
    "FEATURE_KEYS",
    "FILLER_WORDS",
    "cl100k_tokens",
    "content_words",
    "count_clauses",
    "features_from_messages",
    "layout_warnings",
    "prompt_features",
    "semantic_density",
    "static_prefix_chars",
    "token_entropy_bits",
]

FEATURE_KEYS = (
    "total_tokens", "static_prefix_tokens", "suffix_tokens", "fewshot_count", "fewshot_tokens",
    "instruction_tokens", "semantic_density", "entropy_bits", "clause_count", "cl100k_tokens",
)

FILLER_WORDS = frozenset(
    """please kindly thank thanks appreciate really basically actually just simply quite maybe
    perhaps possibly probably hopefully sure definitely certainly absolutely truly honestly
    obviously clearly essentially generally literally try note remember important importantly
    okay ok hello hi hey make don doesn didn isn aren wasn weren won can shouldn wouldn couldn
    haven hasn let""".split()
)
"""Politeness and hedging words treated as stop words on top of scikit-learn's English list
(``don``, ``won``... are the stems of contractions such as "don't")."""

_SENTINEL = "\ue000PD-INPUT\ue000"


class Tokenizer(Protocol):
    def tokenize(self, text: str) -> list[int]: ...
    def apply_chat_template(self, messages: Sequence[Mapping[str, str]]) -> str: ...


# --- semantic density ---------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{\{?[A-Za-z_][A-Za-z0-9_]*\}?\}")
_QUOTED = re.compile(r"\"[^\"\n]+\"|“[^”\n]+”|`[^`\n]+`|(?<![A-Za-z0-9])'[^'\n]+'(?![A-Za-z0-9])")
_NUMBERISH = re.compile(r"(?<![A-Za-z])\d(?:[\d.,:/-]*\d)?(?:%|st|nd|rd|th)?(?![A-Za-z0-9])")
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_ENTITY = "\ue001"


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return frozenset(ENGLISH_STOP_WORDS) | FILLER_WORDS


def _normalise_entities(text: str) -> str:
    text = text.replace("’", "'").replace("‘", "'")
    for pattern in (_PLACEHOLDER, _QUOTED, _NUMBERISH):
        text = pattern.sub(f" {_ENTITY} ", text)
    return text


def content_words(text: str) -> tuple[int, int]:
    """(content tokens, all tokens) of ``text`` as :func:`semantic_density` counts them."""
    norm = _normalise_entities(text)
    entities = norm.count(_ENTITY)
    words = _WORD.findall(norm.replace(_ENTITY, " "))
    stop = _stop_words()
    seen: set[str] = set()
    content = entities
    for w in words:
        key = w.casefold()
        base = key.split("'", 1)[0]
        if key in stop or base in stop or len(base) < 2 or key in seen:
            continue
        seen.add(key)
        content += 1
    return content, entities + len(words)


def semantic_density(text: str) -> float:
    """Share of an instruction's tokens that carry content, in [0, 1].

    Definition (word tokens, not model tokens, so it does not depend on the tokenizer):

    1. Entities become one token each: ``{placeholders}``, quoted literals ("...", '...',
       `...`, “...”) and numbers (3, 2.5, 2024-01-05, 10%, 3rd).
    2. The rest is split into words (letters, with an optional apostrophe part: "don't").
    3. An entity always carries content. A word carries content when, case-folded, it is
       not a stop word (scikit-learn's ``ENGLISH_STOP_WORDS`` plus :data:`FILLER_WORDS`),
       is at least two letters long, and has not already counted earlier in the text:
       restating a rule adds tokens but no content.
    4. Density = content tokens / all tokens; 0.0 for text without tokens.

    Example:
        >>> semantic_density("Reply with the label.")  # reply, label / 4 words
        0.5
    """
    content, total = content_words(text)
    return content / total if total else 0.0


# --- clauses -------------------------------------------------------------------------------

_ABBREV = re.compile(r"\b(e\.g|i\.e|etc|vs|approx|no)\.", re.I)
_SENTENCE_END = re.compile(r"[.!?;:](?=\s|$)|\n+")
_COORD_SPLIT = re.compile(
    r",\s*(?=(?:and|but|or|so|yet|which|because|although|though|unless|while|whereas|since|if|when|otherwise|then)\b)"
    r"|\s(?=(?:because|unless|although|whereas|otherwise)\b)",
    re.I,
)
_LEADING_SUBORDINATE = re.compile(r"^\s*(?:if|when|unless|because|although|though|while|since|once|before|after|whenever)\b", re.I)


def count_clauses(text: str) -> int:
    """Number of clauses in an instruction (and its rules).

    Definition: quoted literals are masked; the text is cut at sentence ends
    (``. ! ? ; :`` before whitespace or the end, and line breaks, after protecting
    "e.g." and similar); each sentence is cut again before a conjunction or
    subordinator that follows a comma ("..., and ...", "..., unless ..."), before a bare
    "because/unless/although/whereas/otherwise", and at the first comma of a sentence
    that opens with a subordinator ("If X, do Y" is two). A piece counts as a clause
    when it has at least two words, so a one-word bullet ("- billing") is not one.

    Example:
        >>> count_clauses("Read the ticket. If it mentions a refund, label it billing.")
        3
    """
    masked = _QUOTED.sub(" QUOTE ", text.replace("’", "'"))
    masked = _ABBREV.sub(lambda m: m.group(1).replace(".", ""), masked)
    clauses = 0
    for sentence in _SENTENCE_END.split(masked):
        pieces = []
        for part in _COORD_SPLIT.split(sentence):
            if _LEADING_SUBORDINATE.match(part) and "," in part:
                pieces += part.split(",", 1)
            else:
                pieces.append(part)
        clauses += sum(1 for p in pieces if len(_WORD.findall(p)) >= 2)
    return clauses


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
    import tiktoken

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
    spec: "Spec", inputs: Mapping[str, Any], tokenizer: Tokenizer, *, examples: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """Features of the prompt ``spec_messages(spec, inputs, examples=examples)`` (keys: FEATURE_KEYS)."""
    from promptdistill.render import render_text
    from promptdistill.specs import spec_messages

    messages = spec_messages(spec, inputs, examples=examples)
    first = re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", _mask_escapes(spec.user))
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


def _mask_escapes(template: str) -> str:
    """Replace ``{{``/``}}`` by two neutral characters so positions are kept."""
    return template.replace("{{", "\0\0").replace("}}", "\0\0")


# --- layout ------------------------------------------------------------------------------------

_VOLATILE = (
    ("a date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2},? \d{4}\b|\b\d{1,2} (?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]* \d{4}\b|\btoday(?:'s date)? is\b", re.I)),
    ("a time of day", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?\b")),
    ("a UUID", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)),
    ("a long hex id", re.compile(r"\b[0-9a-f]{16,}\b", re.I)),
    ("a counter", re.compile(r"(?:#\s?\d+\b|\b(?:request|session|run|attempt|call|batch|turn|message)\s+(?:no\.?\s*|number\s+)?\d+\b)", re.I)),
)
_MAX_STATIC_AFTER_INPUT_WORDS = 4


def layout_warnings(spec: "Spec") -> list[str]:
    """Prefix-cache problems in a spec's layout, as ``file: field: reason`` lines.

    Warns when static text comes after the first input value in ``template.user`` (it is
    recomputed on every request), and when the static system part (instruction, context,
    rules) holds something volatile: a date, a time, a UUID, a hex id or a counter. Few-shot
    examples are not checked: they are fixed records, not values that change per request.
    """
    out = []
    masked = _mask_escapes(spec.user)
    names = placeholders(spec.user)
    first = re.search(r"\{[A-Za-z_][A-Za-z0-9_]*\}", masked)
    if first:
        after = re.sub(r"\{[A-Za-z_][A-Za-z0-9_]*\}", " ", masked[first.end():])
        words = _WORD.findall(after)
        if len(words) > _MAX_STATIC_AFTER_INPUT_WORDS:
            out.append(
                f"{spec.where}: template.user: {len(words)} words of static text come after the first input "
                f"{{{names[0]}}}; the prefix cache stops at the first input, so they are recomputed on every "
                "request: move them into the system part"
            )
    texts = [("template.system.instruction", spec.instruction)]
    if spec.context:
        texts.append(("template.system.context", spec.context))
    texts += [(f"template.system.constraints[{i}]", c) for i, c in enumerate(spec.constraints)]
    for where, text in texts:
        for what, pattern in _VOLATILE:
            m = pattern.search(text)
            if m:
                out.append(
                    f"{spec.where}: {where}: holds {what} ({m.group(0)!r}) in the static part; if it changes, "
                    "every change invalidates the cached prefix: pass it as an input in template.user"
                )
    return out
