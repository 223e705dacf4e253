"""Scoring a reply against the expected output, as tolerant as a careful human grader.

``score_reply`` returns a score in [0, 1], or None for ``judge_rubric`` (the judge
scores those). It never raises on a reply: garbage scores 0. A ``python`` metric is the
project's own function (:mod:`promptdistill.specs.plugins`); its failures are errors.

Kinds:

* ``exact``: the answer (the reply, or ``field`` of the reply's JSON) equals the
  expected value after normalisation: surrounding whitespace, quotes and trailing
  punctuation removed, inner whitespace collapsed, case folded unless ``case_sensitive``.
  A plain-text reply counts as the field's value ("billing" for ``{"label": "billing"}``).
* ``json_field``: the reply parses as a JSON object; the score is the share of the
  compared fields (``fields``, default every key of ``expected``) that match. Numbers
  match within ``tolerance`` (numeric strings such as "$1,234.50" count); strings match
  as in ``exact``; lists match as sets of normalised items.
* ``numeric``: the last number in the reply (or ``field`` of its JSON) is within
  ``tolerance`` of the expected number.
* ``contains``: the share of the expected strings (one string or a list) that occur
  in the reply, case-insensitively.
* ``judge_rubric``: None here.

``pattern`` (not for ``json_field``), when set, is a regular expression the whole answer (whitespace and one
pair of surrounding quotes stripped, case kept) must match; otherwise the score is 0.
It is how format rules ("a lowercase slug", "an ISO date") are scored. Patterns run on
the ``regex`` module with a timeout (``PATTERN_TIMEOUT_S``), never on ``re``: a model
reply is untrusted input, and a backtracking pattern must not hang scoring. A match
that times out scores 0 (and is logged).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from typing import Any, Mapping, Sequence

import regex

from promptdistill.core.errors import SpecError
from promptdistill.specs.model import MetricSpec
from promptdistill.specs.plugins import MetricFunctionError, run_isolated, score_with

__all__ = ["PATTERN_TIMEOUT_S", "expected_error", "extract_answer", "last_number", "metric_call_errors", "parse_reply",
           "pattern_matches", "score_reply"]

logger = logging.getLogger("promptdistill.metrics")

PATTERN_TIMEOUT_S = 0.05
"""The longest one ``metric.pattern`` match may take (a validated pattern takes microseconds)."""

_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```$", re.S)
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\d.])-?\.\d+")
_QUOTES = "\"'`"
_TRAILING = ".,;:!?"
_MISSING = object()
_MAX_JSON_STARTS = 16


def parse_reply(text: Any) -> Any | None:
    """The JSON value in a reply: the whole text, a fenced block, or the first object in it.

    Returns None when nothing parses (never raises).
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    fenced = _FENCE.match(s)
    if fenced:
        s = fenced.group(1).strip()
    try:
        return json.loads(s)
    except (json.JSONDecodeError, RecursionError):
        pass
    decoder = json.JSONDecoder()
    # Try the first few openings only: a reply of nested brackets must not cost O(n^2).
    for m in itertools.islice(re.finditer(r"[{\[]", s), _MAX_JSON_STARTS):
        try:
            value, _ = decoder.raw_decode(s, m.start())
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, (dict, list)):
            return value
    return None


def last_number(text: Any) -> float | None:
    """The last number written in ``text`` ("1,234.5" -> 1234.5), or None."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    if not isinstance(text, str):
        return None
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _strip_quotes(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in _QUOTES:
        s = s[1:-1].strip()
    return s


def _norm(value: Any, case_sensitive: bool) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    s = _strip_quotes(s).rstrip(_TRAILING).strip().strip(_QUOTES)
    s = " ".join(s.split())
    return s if case_sensitive else s.casefold()


def _default_field(metric: MetricSpec, output_schema: Mapping[str, Any] | None) -> str | None:
    if metric.field:
        return metric.field
    props = (output_schema or {}).get("properties") if isinstance(output_schema, Mapping) else None
    if isinstance(props, Mapping) and len(props) == 1:
        return next(iter(props))
    return None


def extract_answer(reply_text: Any, field: str | None) -> Any:
    """The part of a reply that is compared: ``field`` of its JSON, else the stripped text.

    A reply that is a JSON object without ``field`` has no answer (returns a sentinel
    that matches nothing); a reply that is not JSON is taken as the answer itself.
    """
    if not isinstance(reply_text, str):
        return _MISSING
    if field is None:
        return reply_text.strip()
    parsed = parse_reply(reply_text)
    if isinstance(parsed, dict):
        return parsed.get(field, _MISSING)
    if parsed is None:
        return reply_text.strip()
    return _MISSING


def _expected_value(expected: Any, field: str | None) -> Any:
    if field and isinstance(expected, Mapping):
        return expected.get(field, _MISSING)
    return expected


def _values_match(got: Any, want: Any, tolerance: float, case_sensitive: bool) -> bool:
    if got is _MISSING or want is _MISSING:
        return False
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, bool) or isinstance(got, bool):
        return _norm(got, False) == _norm(want, False)
    if isinstance(want, (int, float)):
        # A string counts when it holds exactly one number ("$1,234.50", "12 kg").
        if isinstance(got, str) and len(_NUMBER.findall(got)) != 1:
            return False
        g = last_number(got)
        return g is not None and abs(g - float(want)) <= tolerance + 1e-9
    if isinstance(want, list):
        if not isinstance(got, list):
            return False
        return {_norm(x, case_sensitive) for x in got} == {_norm(x, case_sensitive) for x in want}
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and set(got) == set(want) and all(
            _values_match(got[k], want[k], tolerance, case_sensitive) for k in want
        )
    return _norm(got, case_sensitive) == _norm(want, case_sensitive)


def pattern_matches(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` matches the whole ``text``: None if it timed out or is invalid."""
    try:
        return regex.fullmatch(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        logger.warning("metric.pattern %r took longer than %.0f ms on a %d-character answer; scored as no match",
                       pattern, PATTERN_TIMEOUT_S * 1000, len(text))
        return None
    except (regex.error, OverflowError, RecursionError):
        return None


def _pattern_ok(pattern: str | None, answer: Any) -> bool:
    if pattern is None:
        return True
    if answer is _MISSING or answer is None:
        return False
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
    return bool(pattern_matches(pattern, _strip_quotes(text)))


def score_reply(
    metric: MetricSpec, reply_text: Any, expected: Any, *, output_schema: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None, record_id: Any = None, where: str = "spec", reference: Any = None,
) -> float | None:
    """Score one reply in [0, 1] (None for ``judge_rubric``). Never raises on the reply.

    Args:
        metric: the spec's metric.
        reply_text: the model's reply as text (anything else scores 0).
        expected: the dataset record's ``expected``.
        output_schema: the spec's output schema; a schema with exactly one property
            names the compared field when ``metric.field`` is unset.
        inputs, record_id, where: the record's inputs (a python metric gets them), its id
            and the spec's file, for a python metric's errors.
        reference: the record's ``reference`` (scoring data the prompt never shows); a
            python metric whose function takes a ``reference`` keyword (or ``**kwargs``)
            gets it as ``reference=``, so four-argument metrics keep working.

    Raises:
        MetricFunctionError: a python metric raised or returned something that is not a
            score: the project's function is wrong, and saying so beats scoring 0.

    Example:
        >>> score_reply(MetricSpec(kind="exact", field="label"), '{"label": " Billing"}', {"label": "billing"})
        1.0
    """
    if metric.kind == "judge_rubric":
        return None
    if metric.kind == "python":
        return _score_with_function(metric, reply_text, expected, inputs or {}, record_id, where, reference)
    if not isinstance(reply_text, str):
        return 0.0
    try:
        return _score(metric, reply_text, expected, output_schema)
    except (RecursionError, ValueError, TypeError, OverflowError):
        return 0.0


def _function_call(reply: Any, expected: Any, inputs: Mapping[str, Any], record_id: Any,
                   reference: Any) -> dict[str, Any]:
    text = reply if isinstance(reply, str) else ""
    return {"record_id": record_id, "reply": text, "parsed": parse_reply(text), "expected": expected,
            "inputs": dict(inputs), "reference": reference}


def _score_with_function(metric: MetricSpec, reply: Any, expected: Any, inputs: Mapping[str, Any], record_id: Any,
                         where: str, reference: Any = None) -> float | None:
    call = _function_call(reply, expected, inputs, record_id, reference)
    score = score_with(metric.function, metric.project_dir, call, where=where)
    problem = _not_binary(metric, score, record_id, where)
    if problem:
        raise MetricFunctionError(problem)
    return score


def _not_binary(metric: MetricSpec, score: float | None, record_id: Any, where: str) -> str | None:
    """Why a score breaks ``metric.scores: binary`` (None: it does not)."""
    if metric.scores == "binary" and score not in (None, 0.0, 1.0):
        return (f"{where}: metric.function {metric.function}: record {record_id!r}: returned {score!r}; "
                "metric.scores: binary allows only 0 and 1 (or None)")
    return None


def metric_call_errors(metric: MetricSpec, rows: Sequence[Mapping[str, Any]], *, where: str) -> list[str]:
    """A python metric called at arm's length on ``rows`` (``id``, ``inputs``, ``expected``,
    ``reference``), each with its own expected output as the reply (its JSON text), as
    scoring will call it: the problems, each naming the spec, the function and the record
    (see :func:`promptdistill.specs.plugins.run_isolated`)."""
    calls = [_function_call(json.dumps(r["expected"], ensure_ascii=False), r["expected"], r["inputs"], r["id"],
                            r.get("reference")) for r in rows]
    try:
        outcomes = run_isolated(metric.function, metric.project_dir, calls, where=where)
    except SpecError as e:  # spec_errors has seen it load; it may have changed since
        return [f"{where}: {e}"]
    return [o.error or _not_binary(metric, o.score, r["id"], where) for o, r in zip(outcomes, rows)
            if o.error or _not_binary(metric, o.score, r["id"], where)]


def _score(metric: MetricSpec, reply: str, expected: Any, output_schema: Mapping[str, Any] | None) -> float:
    kind = metric.kind
    if kind == "json_field":
        parsed = parse_reply(reply)
        if not isinstance(parsed, dict) or not isinstance(expected, Mapping):
            return 0.0
        fields = list(metric.fields) or list(expected)
        if not fields:
            return 0.0
        hits = sum(
            _values_match(parsed.get(f, _MISSING), expected.get(f, _MISSING), metric.tolerance, metric.case_sensitive)
            for f in fields
        )
        return hits / len(fields)
    field = _default_field(metric, output_schema)
    answer = extract_answer(reply, field)
    want = _expected_value(expected, field)
    if not _pattern_ok(metric.pattern, answer):
        return 0.0
    if kind == "exact":
        return float(_values_match(answer, want, 0.0, metric.case_sensitive))
    if kind == "numeric":
        got, target = last_number(answer if answer is not _MISSING else None), last_number(want)
        return float(got is not None and target is not None and abs(got - target) <= metric.tolerance + 1e-9)
    if kind == "contains":
        needles = [want] if isinstance(want, str) else list(want) if isinstance(want, list) else []
        if not needles or answer is _MISSING:
            return 0.0
        hay = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        hay = " ".join(hay.split()).casefold()
        return sum(" ".join(str(n).split()).casefold() in hay for n in needles) / len(needles)
    raise ValueError(f"unknown metric kind {kind!r}")


def expected_error(metric: MetricSpec, expected: Any) -> str | None:
    """Why ``expected`` cannot be scored by ``metric`` (None when it can)."""
    kind = metric.kind
    if kind == "python":
        return None  # the project's function decides what an expected value is
    if kind == "judge_rubric":
        return None if expected is not None else "a judge needs a reference (got null)"
    if kind == "json_field":
        if not isinstance(expected, Mapping):
            return f"a json_field metric needs an object, got {type(expected).__name__}"
        missing = [f for f in metric.fields if f not in expected]
        return f"missing field(s) {missing}" if missing else None
    if metric.field and isinstance(expected, Mapping) and metric.field not in expected:
        return f"missing field {metric.field!r}"
    value = _expected_value(expected, metric.field)
    if kind == "numeric":
        return None if last_number(value) is not None and not isinstance(value, bool) else f"not a number: {value!r}"
    if kind == "contains":
        ok = isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
        return None if ok else f"contains needs a string or a list of strings, got {value!r}"
    if not isinstance(value, (str, int, float, bool)):
        return f"an exact metric needs a string or number, got {type(value).__name__}"
    if metric.pattern and isinstance(value, str):
        matched = pattern_matches(metric.pattern, value)
        if matched is None:
            return (f"metric.pattern {metric.pattern!r} took longer than {PATTERN_TIMEOUT_S * 1000:.0f} ms on "
                    f"{_short(value)} (or is invalid)")
        if not matched:
            return f"{_short(value)} does not match metric.pattern {metric.pattern!r}"
    return None


def _short(value: str, limit: int = 80) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")
