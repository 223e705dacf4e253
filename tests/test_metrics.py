"""Reply scoring: tolerant like a careful grader, never crashing on garbage."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from promptdistill.specs.metrics import expected_error, last_number, parse_reply, score_reply
from promptdistill.specs import MetricSpec

EXACT_LABEL = MetricSpec(kind="exact", field="label")
SLUG = MetricSpec(kind="exact", field="slug", case_sensitive=True, pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
INVOICE = MetricSpec(kind="json_field", fields=("vendor", "total", "due_date"), tolerance=0.01)
NUMERIC = MetricSpec(kind="numeric", field="answer")


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": 1}', {"a": 1}),
        ('  ```json\n{"a": [1, 2]}\n```  ', {"a": [1, 2]}),
        ('Sure! Here it is: {"label": "billing"} Hope that helps.', {"label": "billing"}),
        ("[1, 2]", [1, 2]),
        ("no json here", None),
        ('{"unterminated": ', None),
        (None, None),
        (42, None),
    ],
)
def test_parse_reply(text, expected):
    assert parse_reply(text) == expected


@pytest.mark.parametrize(
    "text, number",
    [
        ("The answer is 28.", 28.0),
        ("20 + 8 = 28, so the answer is 28", 28.0),
        ("It costs $1,234.50 in total", 1234.5),
        ("5-3=2", 2.0),
        ("the temperature is -4 degrees", -4.0),
        ("no digits", None),
        ("", None),
        (7, 7.0),
        (True, None),
        (float("nan"), None),
    ],
)
def test_last_number(text, number):
    assert last_number(text) == number


@pytest.mark.parametrize(
    "reply, score",
    [
        ('{"label": "billing"}', 1.0),
        ('{"label": " Billing "}', 1.0),
        ("billing", 1.0),  # a bare label is the label
        ("  'Billing.'  ", 1.0),
        ('{"label": "shipping"}', 0.0),
        ('{"team": "billing"}', 0.0),  # JSON without the field has no answer
        ("", 0.0),
        ("billing or shipping", 0.0),
    ],
)
def test_exact_on_a_field_is_tolerant_of_case_space_quotes(reply, score):
    assert score_reply(EXACT_LABEL, reply, {"label": "billing"}) == score


def test_exact_takes_the_only_schema_property_when_no_field_is_set():
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    assert score_reply(MetricSpec(kind="exact"), '{"label": "account"}', {"label": "account"}, output_schema=schema) == 1.0


def test_exact_with_scalar_expected():
    assert score_reply(MetricSpec(kind="exact"), " Paris ", "paris") == 1.0
    assert score_reply(MetricSpec(kind="exact", case_sensitive=True), "paris", "Paris") == 0.0


@pytest.mark.parametrize(
    "reply, score",
    [
        ('{"slug": "mens-wool-scarf"}', 1.0),
        ('{"slug": "Mens-Wool-Scarf"}', 0.0),  # case is a format rule here
        ('{"slug": "mens--wool-scarf"}', 0.0),  # pattern: double hyphen
        ('{"slug": "mens-wool-scarf-"}', 0.0),
        ('{"slug": "mens wool scarf"}', 0.0),
        ('{"slug": "men-wool-scarf"}', 0.0),  # right format, wrong content
    ],
)
def test_pattern_and_content_both_count(reply, score):
    assert score_reply(SLUG, reply, {"slug": "mens-wool-scarf"}) == score


def test_json_field_gives_partial_credit():
    expected = {"vendor": "Acme Office Supplies", "total": 1234.5, "due_date": "2024-07-05"}
    assert score_reply(INVOICE, json.dumps(expected), expected) == 1.0
    half = {"vendor": "acme office supplies", "total": 1234.0, "due_date": "2024-07-05"}
    assert score_reply(INVOICE, json.dumps(half), expected) == pytest.approx(2 / 3)
    as_text = {"vendor": "Acme Office Supplies", "total": "$1,234.50", "due_date": "July 5"}
    assert score_reply(INVOICE, json.dumps(as_text), expected) == pytest.approx(2 / 3)
    assert score_reply(INVOICE, "not json", expected) == 0.0
    assert score_reply(INVOICE, "[1, 2]", expected) == 0.0


def test_json_field_defaults_to_every_expected_key_and_compares_lists_as_sets():
    metric = MetricSpec(kind="json_field")
    expected = {"tags": ["a", "B"], "n": 2, "none": None}
    assert score_reply(metric, '{"tags": ["b", "a"], "n": 2, "none": null}', expected) == 1.0
    assert score_reply(metric, '{"tags": ["a"], "n": "2 items", "none": 0}', expected) == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "reply, score",
    [
        ("20 + 8 = 28, so the answer is 28.", 1.0),
        ('{"answer": 28}', 1.0),
        ('{"answer": "28"}', 1.0),
        ("The answer is 28. Question: Sam has 5 apples", 0.0),  # the last number counts
        ("twenty-eight", 0.0),
        ('{"result": 28}', 0.0),
    ],
)
def test_numeric_parses_the_last_number(reply, score):
    assert score_reply(NUMERIC, reply, {"answer": 28, "working": "20 + 8 = 28"}) == score


def test_numeric_tolerance():
    metric = MetricSpec(kind="numeric", tolerance=0.5)
    assert score_reply(metric, "about 3.4", 3) == 1.0
    assert score_reply(metric, "about 3.6", 3) == 0.0


def test_contains_scores_the_share_of_needles():
    metric = MetricSpec(kind="contains")
    assert score_reply(metric, "Priya will write the NOTES by Friday", ["priya", "friday", "monday"]) == pytest.approx(2 / 3)
    assert score_reply(metric, "nothing", "priya") == 0.0


def test_judge_rubric_is_left_to_the_judge():
    assert score_reply(MetricSpec(kind="judge_rubric", rubric="r"), "anything", {"summary": "x"}) is None


@settings(max_examples=300, deadline=None)
@given(
    reply=st.one_of(st.text(), st.none(), st.integers(), st.binary().map(lambda b: b.decode("latin-1"))),
    metric=st.sampled_from([EXACT_LABEL, SLUG, INVOICE, NUMERIC, MetricSpec(kind="contains"), MetricSpec(kind="exact")]),
)
def test_garbage_never_crashes_and_stays_in_range(reply, metric):
    for expected in ({"label": "billing", "slug": "a-b", "vendor": "x", "total": 1.0, "due_date": "d", "answer": 3}, "billing", ["a"], None, 3):
        score = score_reply(metric, reply, expected)
        assert score is not None and 0.0 <= score <= 1.0


def test_pathological_replies_score_zero():
    deep = "[" * 100_000
    assert score_reply(INVOICE, deep, {"vendor": "x"}) == 0.0
    assert score_reply(EXACT_LABEL, '{"label": ' + deep, {"label": "x"}) == 0.0
    assert score_reply(NUMERIC, "9" * 5000, {"answer": 1}) == 0.0


@pytest.mark.parametrize(
    "metric, expected, problem",
    [
        (EXACT_LABEL, {"label": "billing"}, None),
        (EXACT_LABEL, {"team": "billing"}, "missing field 'label'"),
        (EXACT_LABEL, {"label": ["a"]}, "needs a string or number"),
        (NUMERIC, {"answer": "twelve"}, "not a number"),
        (NUMERIC, {"answer": 12}, None),
        (INVOICE, "x", "needs an object"),
        (INVOICE, {"vendor": "v"}, "missing field(s)"),
        (SLUG, {"slug": "Bad Slug"}, "does not match metric.pattern"),
        (MetricSpec(kind="contains"), 3, "string or a list of strings"),
        (MetricSpec(kind="judge_rubric", rubric="r"), None, "needs a reference"),
    ],
)
def test_expected_error_names_the_problem(metric, expected, problem):
    got = expected_error(metric, expected)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_a_backtracking_pattern_is_bounded_in_scoring_and_validation():
    """A pattern that backtracks exponentially ("(a|a)+b") must not hang on a model reply."""
    import time

    from promptdistill.specs.metrics import PATTERN_TIMEOUT_S

    evil = MetricSpec(kind="exact", pattern="(a|a)+b")
    reply = "a" * 40 + "c"
    t0 = time.perf_counter()
    assert score_reply(evil, reply, reply) == 0.0
    assert expected_error(evil, reply) is not None and "took longer than" in expected_error(evil, reply)
    assert time.perf_counter() - t0 < 20 * PATTERN_TIMEOUT_S + 1.0
    nested = MetricSpec(kind="exact", pattern="(a+)+b")  # the regex module does not backtrack on this one
    assert score_reply(nested, "a" * 10_000 + "c", "x") == 0.0
    assert score_reply(nested, "aaab", "aaab") == 1.0


# --- a record's reference: scoring data the prompt never sees ------------------------------

SENTINEL = "SENTINEL-7f3a-never-rendered"

REFERENCE_METRIC = '''
def score(reply_text, parsed, expected, inputs, reference=None):
    """The reply's time must be one the record's reference allows."""
    return float(isinstance(parsed, dict) and parsed.get("time") in reference["allowed"]["time"])
'''


def _reference_project(tmp_path, metric_source=REFERENCE_METRIC):
    from test_user_project import make_project

    from promptdistill.search.splits import split_records
    from promptdistill.specs.load import load_spec

    spec = load_spec(make_project(tmp_path, metric_source=metric_source))
    splits = split_records(spec, seed=0, screen_size=4, dev_size=20, test_size=12)

    def with_reference(r, allowed):
        return {**r, "reference": {"allowed": {"time": allowed}, "note": SENTINEL}}

    hour = lambda r: r["inputs"]["request"].rsplit(" ", 1)[-1]  # noqa: E731
    records = [with_reference(r, [hour(r)] if k % 2 == 0 else ["00:00"]) for k, r in enumerate(splits.screen)]
    examples = [with_reference(r, [hour(r)]) for r in splits.train[:2]]
    return spec, records, examples


def test_a_python_metric_taking_reference_gets_each_records_reference(tmp_path):
    from fakes import FakeEngine
    from test_user_project import reply_from_request

    from promptdistill.evaluate.evaluator import evaluate

    spec, records, examples = _reference_project(tmp_path)
    report = evaluate(FakeEngine(reply=reply_from_request), spec, records, examples=examples)
    # Right where the reference allows the hour, wrong where it allows only 00:00.
    assert report.scores == [1.0, 0.0, 1.0, 0.0]


def test_a_four_argument_metric_still_works_when_records_carry_a_reference(tmp_path):
    from fakes import FakeEngine
    from test_user_project import METRIC, reply_from_request

    from promptdistill.evaluate.evaluator import evaluate

    spec, records, _ = _reference_project(tmp_path, metric_source=METRIC)
    assert evaluate(FakeEngine(reply=reply_from_request), spec, records).scores == [1.0] * 4
    kwargs = MetricSpec(kind="python", function="metrics.calls:score", project_dir=str(tmp_path))
    (tmp_path / "metrics" / "calls.py").write_text("def score(reply, parsed, expected, inputs, **more):\n"
                                                   "    return float(more == {'reference': 'r'})\n")
    assert score_reply(kwargs, "x", None, reference="r") == 1.0


def test_a_records_reference_reaches_no_rendered_message(tmp_path):
    """Rendered with a sentinel reference on every record and every example: the sentinel is
    in no message the model gets, while the metric did see the reference."""
    from fakes import FakeEngine
    from test_user_project import reply_from_request

    from promptdistill.evaluate.evaluator import EvalItem, evaluate
    from promptdistill.specs.prompt import spec_messages, template_content

    spec, records, examples = _reference_project(tmp_path)
    seen = []

    def reply(req):
        seen.append(req)
        return reply_from_request(req)

    report = evaluate(FakeEngine(reply=reply), spec, records, examples=examples)
    assert len(seen) == len(records) and report.scores[0] == 1.0
    messages = [m for req in seen for m in req.chat()]
    messages += [m for r in records for m in spec_messages(spec, r["inputs"], examples=examples)]
    messages += [m for req in EvalItem(spec, records, examples).requests(0) for m in req.chat()]
    assert messages and not [m for m in messages if SENTINEL in m["content"]]
    assert SENTINEL not in json.dumps(template_content(spec, examples))


def test_the_rubric_judge_sees_the_records_reference_and_the_task_model_does_not(tmp_path):
    from fakes import FakeEngine
    from test_user_project import reply_from_request

    from promptdistill.evaluate.evaluator import evaluate

    spec, records, _ = _reference_project(tmp_path)
    spec = spec.with_changes(metric=MetricSpec(kind="judge_rubric", rubric="The time is one the request allows."))
    task, judge = [], []

    def reply(req):
        text = " ".join(m["content"] for m in req.chat())
        if "Score the answer from 1 to 5" in text:
            judge.append(text)
            return json.dumps({"score": 5 if SENTINEL in text else 1})
        task.append(text)
        return reply_from_request(req)

    labelled = [{**r, "expected": {"time": "07:00"}} for r in records]
    report = evaluate(FakeEngine(reply=reply), spec, labelled)
    assert report.scores == [1.0] * 4 and len(judge) == 4
    assert all("The time is one the request allows." in j for j in judge)
    assert task and not [t for t in task if SENTINEL in t]
