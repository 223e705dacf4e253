"""The ``summarize`` spec's metric: the notes' facts a digest keeps, and its shape.

``metric: {kind: python, function: "prompts.summarize_metric:score"}`` in
``prompts/summarize.yaml``. Deterministic and cheap, so it measures on any task model,
the embedded 135M one included (whose own judgement of a summary is no signal: as the
``judge_rubric`` judge it scored every summary 0).

A reply scores ``coverage * (0.7 + 0.3 * form) * 0.9 ** invented``, in [0, 1]:

* ``coverage``: the mean over the five facts of a record (``expected["facts"]``, written
  by ``datasets/generators/summarize.py``): the status update (the thing's key words and
  its go-live day), the problem's and the decision's key words, and each action item,
  whose task words, owner and deadline must stand in one statement (a key point, or the
  summary). Key words match leniently: case-insensitive, on word stems ("postponed"
  matches "postpone"); names and days match as whole words.
* ``form``: the mean of four checks of the constraints the prompt states: the reply is a
  JSON object with a text ``summary`` and a list of text ``key_points``; the summary is one
  or two sentences (three: half); there are two to five key points, none repeated; no
  small talk from the notes is retold.
* ``invented``: how many distinct capitalised words (names, days) the reply has that the
  notes do not (case-insensitive; label words such as "Problem" or "Decision" aside). A
  small model copies names from the prompt's example: each one costs a tenth.

Form only scales coverage: a tidy reply about something else still scores 0. A record
whose ``expected`` has no ``facts`` (label-free traffic, scored against the baseline's
reply) takes each reference key point as one fact of key words.

Example:
    >>> facts = {"status": {"owner": "Ana", "thing": "price list", "day": "Monday"},
    ...          "problem": {"owner": "Wei", "text": "the printer jams"}, "decision": "hire a temp",
    ...          "actions": [{"owner": "Ana", "task": "order paper", "deadline": "Friday"}], "small_talk": []}
    >>> reply = {"summary": "The price list goes live on Monday; the printer jams, so we hire a temp.",
    ...          "key_points": ["Printer jams.", "Ana will order paper by Friday."], "confidence_score": 0.8}
    >>> score("", reply, {"facts": facts}, {})
    1.0
"""

from __future__ import annotations

import re
from typing import Any, Mapping

FORM_WEIGHT = 0.3
"""The share of the score that form can take away (coverage carries the rest)."""

_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
_STOP = frozenset(
    "a an the to of for and or in on at by is are was were be been this that with from as it its our we they "
    "will has have had but not who some more than after about".split()
)
_SUFFIXES = ("ing", "ed", "es", "s", "e")
_CAPITALISED = re.compile(r"\b[A-Z][a-z]+\b")
_LABELS = frozenset("problem decision action actions item items status update key point points summary owner "
                    "deadline note notes".split())
INVENTED_FACTOR = 0.9
"""What each invented name or day multiplies the score by."""


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:5]


def _stems(text: str) -> set[str]:
    """The key-word stems of ``text``: lower-cased words without stop words, stemmed."""
    return {_stem(w) for w in _WORD.findall(text.casefold()) if w not in _STOP and (len(w) >= 3 or w.isdigit())}


def _names(text: str) -> set[str]:
    """Whole lower-cased words, for names and days."""
    return set(_WORD.findall(text.casefold()))


def _share(wanted: set[str], found: set[str]) -> float:
    return len(wanted & found) / len(wanted) if wanted else 1.0


def _units(reply_text: str, parsed: Any) -> list[str]:
    """The statements a fact may stand in: the summary and each key point (or the raw text's sentences)."""
    if isinstance(parsed, Mapping):
        units = [parsed.get("summary")] + (parsed.get("key_points") if isinstance(parsed.get("key_points"), list) else [])
        units = [u for u in units if isinstance(u, str) and u.strip()]
        if units:
            return units
    return [s for s in _SENTENCE_END.split(reply_text or "") if s.strip()]


def _action(action: Mapping[str, Any], units: list[str]) -> float:
    """The best statement's mean of: the task's key words, the owner named, the deadline named."""
    task = _stems(action.get("task", ""))
    owner, deadline = str(action.get("owner", "")).casefold(), str(action.get("deadline", "")).casefold()
    return max(
        ((_share(task, _stems(u)) + (owner in _names(u)) + (deadline in _names(u))) / 3 for u in units),
        default=0.0,
    )


def coverage(facts: Mapping[str, Any], units: list[str]) -> float:
    """The mean, over the record's facts, of how much of each fact the statements keep."""
    text = " ".join(units)
    stems, names = _stems(text), _names(text)
    status = facts.get("status") or {}
    parts = [
        (_share(_stems(status.get("thing", "")), stems) + (str(status.get("day", "")).casefold() in names)) / 2,
        _share(_stems((facts.get("problem") or {}).get("text", "")), stems),
        _share(_stems(facts.get("decision", "")), stems),
        *(_action(a, units) for a in facts.get("actions", [])),
    ]
    return sum(parts) / len(parts)


def _sentences(text: str) -> int:
    return len([s for s in _SENTENCE_END.split(text) if s.strip()])


def _small_talk_told(small_talk: list[str], facts_stems: set[str], reply_stems: set[str]) -> float:
    """The share of small-talk sentences retold: at least half of a sentence's own key words
    (those not also in a fact) appear in the reply."""
    told = 0
    for sentence in small_talk:
        own = _stems(sentence) - facts_stems
        told += bool(own) and len(own & reply_stems) * 2 >= len(own)
    return told / len(small_talk) if small_talk else 0.0


def form(parsed: Any, small_talk: list[str], facts_stems: set[str]) -> float:
    """The mean of the four shape checks (0 when the reply is not the JSON object asked for)."""
    if not isinstance(parsed, Mapping):
        return 0.0
    summary, points = parsed.get("summary"), parsed.get("key_points")
    if not isinstance(summary, str) or not isinstance(points, list) or not all(isinstance(p, str) for p in points):
        return 0.0
    n = _sentences(summary)
    one_or_two = 1.0 if n in (1, 2) else 0.5 if n == 3 else 0.0
    distinct = {" ".join(_WORD.findall(p.casefold())) for p in points} - {""}
    two_to_five = len(distinct) / len(points) if 2 <= len(points) <= 5 else 0.0
    reply_stems = _stems(" ".join([summary, *points]))
    no_small_talk = 1.0 - _small_talk_told(small_talk, facts_stems, reply_stems)
    return (1.0 + one_or_two + two_to_five + no_small_talk) / 4


def invented(units: list[str], inputs: Mapping[str, Any]) -> int:
    """How many distinct capitalised words of the reply the notes lack (0 without notes)."""
    notes = " ".join(v for v in inputs.values() if isinstance(v, str))
    if not notes.strip():
        return 0
    known = _names(notes) | _LABELS | _STOP
    return len({w.casefold() for u in units for w in _CAPITALISED.findall(u)} - known)


def _facts_of(expected: Any) -> dict[str, Any] | None:
    if not isinstance(expected, Mapping):
        return None
    if isinstance(expected.get("facts"), Mapping):
        return dict(expected["facts"])
    points = expected.get("key_points")
    if isinstance(points, list) and any(isinstance(p, str) and _stems(p) for p in points):
        # Label-free records: each reference key point is a fact of key words.
        return {"key_points": [p for p in points if isinstance(p, str) and _stems(p)]}
    return None


def _all_stems(facts: Mapping[str, Any]) -> set[str]:
    status, problem = facts.get("status") or {}, facts.get("problem") or {}
    texts = [status.get("thing", ""), problem.get("text", ""), facts.get("decision", ""),
             *(a.get("task", "") for a in facts.get("actions", [])), *facts.get("key_points", [])]
    return _stems(" ".join(texts))


def score(reply_text: str, parsed: Any, expected: Any, inputs: Mapping[str, Any]) -> float | None:
    """The reply's score in [0, 1]; None when ``expected`` holds neither facts nor key points.

    Args:
        reply_text: the model's reply.
        parsed: its JSON (None when it does not parse).
        expected: the record's expected reply, with ``facts`` (see the module docstring).
        inputs: the record's inputs: names and days absent from them count as invented.
    """
    facts = _facts_of(expected)
    if facts is None:
        return None
    units = _units(reply_text, parsed)
    if "key_points" in facts:
        reply_stems = _stems(" ".join(units))
        covered = sum(_share(_stems(p), reply_stems) for p in facts["key_points"]) / len(facts["key_points"])
    else:
        covered = coverage(facts, units)
    shape = form(parsed, list(facts.get("small_talk", [])), _all_stems(facts))
    return covered * (1.0 - FORM_WEIGHT + FORM_WEIGHT * shape) * INVENTED_FACTOR ** invented(units, inputs)
