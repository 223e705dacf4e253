"""Measures of an instruction's text: semantic density and clause count.

Word-level (not model tokens), so they do not depend on the tokenizer: the distiller
and the optimizer compare instructions with them, and the TTFT features record them.
"""

from __future__ import annotations

import re
from functools import lru_cache

from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

__all__ = ["FILLER_WORDS", "WORD", "content_words", "count_clauses", "semantic_density"]

FILLER_WORDS = frozenset(
    """please kindly thank thanks appreciate really basically actually just simply quite maybe
    perhaps possibly probably hopefully sure definitely certainly absolutely truly honestly
    obviously clearly essentially generally literally try note remember important importantly
    okay ok hello hi hey make don doesn didn isn aren wasn weren won can shouldn wouldn couldn
    haven hasn let""".split()
)
"""Politeness and hedging words treated as stop words on top of scikit-learn's English list
(``don``, ``won``... are the stems of contractions such as "don't")."""


_PLACEHOLDER = re.compile(r"\{\{?[A-Za-z_][A-Za-z0-9_]*\}?\}")
_QUOTED = re.compile(r"\"[^\"\n]+\"|“[^”\n]+”|`[^`\n]+`|(?<![A-Za-z0-9])'[^'\n]+'(?![A-Za-z0-9])")
_NUMBERISH = re.compile(r"(?<![A-Za-z])\d(?:[\d.,:/-]*\d)?(?:%|st|nd|rd|th)?(?![A-Za-z0-9])")
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_ENTITY = "\ue001"


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
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
    words = WORD.findall(norm.replace(_ENTITY, " "))
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
# Not the distiller's and the prompt diff's cutter (promptdistill.specs.clauses), on purpose:
# count_clauses is a TTFT model feature, and it also cuts at ";" and ":", before ", and" and
# the like, and drops one-word pieces, so the shared cutter counts fewer clauses on every
# bundled prompt (ticket_triage: 19 against 10). Swapping it would change fitted models' inputs.

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
        clauses += sum(1 for p in pieces if len(WORD.findall(p)) >= 2)
    return clauses


