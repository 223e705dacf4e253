"""bench/peer_export: a DSPy program exported as a template sends what the program sends.

Pure: the programs are built as MIPROv2/GEPA leave them (a new instruction, bootstrapped
and labeled demos, one incomplete demo) and never run on a model; the one test that runs a
program does it through the real DSPy bridge on ``FakeEngine``.
"""

from __future__ import annotations

import json

import pytest

from bench import peer_export as pe
from bench.peers.dspy_program import make_signature, to_example
from bundled_specs import load_spec
from fakes import FakeEngine
from promptdistill.specs.datasets import dataset_for, records

dspy = pytest.importorskip("dspy")

# As GEPA writes them: braces (an input named in braces, a JSON sketch), indentation, several lines.
NEW_INSTRUCTION = ("Read the {ticket} or {document} carefully.\n  Reply as {\"field\": \"value\"}; {{not a placeholder}}.\n"
                   "\tThen stop.")


def optimized_program(name: str):
    """(spec, predictor) as an optimizer leaves it: new instruction, 2 bootstrapped demos
    (augmented, all fields), 2 labeled ones, one labeled demo whose last output is None)."""
    spec = load_spec(name)
    train = records(dataset_for(spec), "train")
    program = dspy.Predict(make_signature(spec).with_instructions(NEW_INSTRUCTION))
    boot = [dspy.Example(augmented=True, **to_example(spec, r).toDict()) for r in train[:2]]
    labeled = [to_example(spec, r) for r in train[2:4]]
    partial = to_example(spec, train[4]).toDict()
    partial[list(program.signature.output_fields)[-1]] = None  # present but None: kept, as incomplete
    program.demos = [*boot, *labeled, dspy.Example(**partial).with_inputs(*spec.inputs)]
    return spec, program


@pytest.mark.parametrize("adapter", ["JSONAdapter", "ChatAdapter"])
@pytest.mark.parametrize("name", ["ticket_triage", "invoice_extraction"])
def test_the_template_renders_the_adapters_messages_for_every_test_record(name, adapter):
    spec, program = optimized_program(name)
    a = getattr(dspy, adapter)()
    content = pe.export_program(spec.name, program.signature, program.demos, a, max_tokens=48)
    # 4 complete demos and the incomplete one: 5 user/assistant pairs between system and user.
    assert len(content["turns"]) == 10 and content["adapter"] == adapter
    test = records(dataset_for(spec), "test")
    assert len(test) >= 30
    for r in test:
        assert pe.render(content, r["inputs"]) == a.format(program.signature, program.demos, dict(r["inputs"])), r["id"]
    # JSON-serialisable (it goes into the report) and equal after a round trip.
    back = json.loads(json.dumps(content))
    assert pe.render(back, test[0]["inputs"]) == a.format(program.signature, program.demos, dict(test[0]["inputs"]))


def test_a_value_that_looks_like_a_placeholder_or_marker_is_inserted_as_is():
    spec, program = optimized_program("ticket_triage")
    a = dspy.JSONAdapter()
    content = pe.export_program(spec.name, program.signature, program.demos, a, max_tokens=48)
    for value in ("my {ticket} broke {{x}} }", "[[ ## label ## ]]\nbilling", "", "  padded  \n"):
        assert pe.render(content, {"ticket": value}) == a.format(program.signature, program.demos, {"ticket": value})


def test_the_bridge_sends_what_the_template_sends_and_the_prediction_is_our_parse():
    """The program run through the real DSPy bridge (``make_dspy_lm``) on a fake engine:
    every request equals the template's request (messages, schema text, max_tokens,
    temperature, seed), and DSPy's prediction equals ``parse_reply`` of the same reply."""
    from bench.dspy_bridge import make_dspy_lm

    spec, program = optimized_program("invoice_extraction")
    test = records(dataset_for(spec), "test")[:4]
    sent = []

    def reply(req):
        sent.append(req)
        return '{\n  "vendor": "Acme", "invoice_number": 42, "total": "1234.5", "currency": "\'EUR\'", "due_date": "x"}'

    lm = make_dspy_lm(FakeEngine(reply), cache_dir=None, max_tokens=512)
    task_lm = lm.copy(max_tokens=2 * spec.max_tokens + 16, temperature=0.0)  # as bench_peers makes it
    try:
        with dspy.context(lm=task_lm, adapter=dspy.JSONAdapter()):
            preds = [program(**r["inputs"]) for r in test]
    finally:
        lm.bridge.close()
    content = pe.export_program(spec.name, program.signature, program.demos, dspy.JSONAdapter(),
                                max_tokens=task_lm.kwargs["max_tokens"])
    ours = pe.requests(content, test, seed=0)
    assert len(sent) == len(test)
    for theirs, mine in zip(sent, ours):
        assert theirs.messages == mine.messages
        assert theirs.json_schema == mine.json_schema and theirs.json_schema is not None
        assert (theirs.max_tokens, theirs.temperature, theirs.seed, theirs.stop) == (
            mine.max_tokens, mine.temperature, mine.seed, mine.stop)
    parsed = pe.parse_reply(content, reply(None))
    assert parsed == {"vendor": "Acme", "invoice_number": "42", "total": 1234.5, "currency": "EUR", "due_date": "x"}
    for p in preds:
        assert {k: p[k] for k in content["output_fields"]} == parsed


JSON_REPLIES = {
    "ticket_triage": [
        '{\n  "label": "billing"\n}', '{"label":"shipping"}', '```json\n{"label": "account"}\n```',
        'Sure! {"label": "technical"} Hope it helps.', '{"label": "\'billing\'"}', '{"label": "Literal[\'account\']"}',
        '{"label": " shipping "}', '{"label": "refunds"}', '{"label": "billing", "why": "a charge"}', '{}',
        'billing', '', '{"label": ["billing"]}', '{"label": "billing"', "{'label': 'billing'}",
        '[1] {"label": "shipping"}',  # json_repair reads a list: the adapter's regex finds the object
    ],
    "invoice_extraction": [
        '{"vendor": "Acme", "invoice_number": "A-1", "total": 12.5, "currency": "USD", "due_date": "2024-01-31"}',
        '{"vendor": "Acme", "invoice_number": 7, "total": "12.50", "currency": "GBP", "due_date": "2024-01-31"}',
        '{"vendor": "Acme", "invoice_number": "7", "total": "1,250.00", "currency": "GBP", "due_date": "2024-01-31"}',
        '{"vendor": "Acme", "invoice_number": "7", "total": "$12", "currency": "GBP", "due_date": "2024-01-31"}',
        '{"vendor": null, "invoice_number": "7", "total": 3, "currency": "EUR", "due_date": null}',
        '{"vendor": {"name": "Acme"}, "invoice_number": "7", "total": true, "currency": "EUR", "due_date": 2024}',
        '{"vendor": "Acme", "invoice_number": "7", "total": 3, "currency": "eur", "due_date": "2024-01-31"}',
        '{"vendor": "Acme", "invoice_number": "7", "total": 3, "currency": "EUR"}',
        'The total is 12. {"vendor": "Acme", "invoice_number": "7", "total": 12, "currency": "USD", "due_date": "d"} ok',
    ],
}


@pytest.mark.parametrize("name", sorted(JSON_REPLIES))
def test_replies_parse_to_the_same_fields_as_the_json_adapter(name):
    spec, program = optimized_program(name)
    a = dspy.JSONAdapter()
    content = pe.export_program(spec.name, program.signature, program.demos, a, max_tokens=48)
    # The demos' own assistant turns are replies in the adapter's format.
    replies = [t["content"] for t in content["turns"] if t["role"] == "assistant"] + JSON_REPLIES[name]
    assert_same_parses(a, program.signature, content, replies)


def test_replies_parse_to_the_same_fields_as_the_chat_adapter():
    spec, program = optimized_program("invoice_extraction")
    a = dspy.ChatAdapter()
    content = pe.export_program(spec.name, program.signature, program.demos, a, max_tokens=48)
    assert content["output_schema"] is None and content["response_format"] == "none"
    head = "[[ ## vendor ## ]]\nAcme Ltd\n\n[[ ## invoice_number ## ]]\n17\n\n"
    replies = [t["content"] for t in content["turns"] if t["role"] == "assistant"] + [
        head + "[[ ## total ## ]]\n12.5\n\n[[ ## currency ## ]]\nUSD\n\n[[ ## due_date ## ]]\n2024-01-31\n\n[[ ## completed ## ]]",
        head + "[[ ## total ## ]] 12\n[[ ## currency ## ]] 'GBP'\n[[ ## due_date ## ]]\nline one\nline two\n[[ ## total ## ]]\n99",
        head + "[[ ## total ## ]]\ntwelve\n\n[[ ## currency ## ]]\nUSD\n\n[[ ## due_date ## ]]\nsoon",
        head + "[[ ## total ## ]]\n12\n\n[[ ## currency ## ]]\nUSD",
        '{"vendor": "Acme"}',
    ]
    assert_same_parses(a, program.signature, content, replies)


def assert_same_parses(adapter, signature, content, replies):
    """Every reply parses to the adapter's fields (values and their types) or is refused by
    both; both outcomes occur, so parsed and refused replies were compared."""
    outcomes = set()
    for text in replies:
        try:
            theirs = adapter.parse(signature, text)
        except dspy.utils.exceptions.AdapterParseError:
            theirs = None
        try:
            mine = pe.parse_reply(content, text)
        except pe.ParseError:
            mine = None
        assert mine == theirs, text
        if mine is not None:
            assert [type(v) for v in mine.values()] == [type(v) for v in theirs.values()], text
        outcomes.add(mine is None)
    assert outcomes == {True, False}


def test_reply_text_is_what_the_programs_metric_scores():
    """``reply_text`` gives the text ``bench.peers.dspy_program.reply_of`` makes of the program's
    prediction (the fields' JSON), and "" for a reply the adapter refuses."""
    from bench.peers.dspy_program import reply_of

    spec, program = optimized_program("invoice_extraction")
    content = pe.export_program(spec.name, program.signature, program.demos, dspy.JSONAdapter(), max_tokens=48)
    text = '{"vendor": "Acme", "invoice_number": 7, "total": "12.50", "currency": "GBP", "due_date": "2024-01-31"}'
    fields = dspy.JSONAdapter().parse(program.signature, text)
    assert pe.reply_text(content, text) == reply_of(spec, dspy.Prediction(**fields))
    assert pe.reply_text(content, "no JSON here") == ""


def test_bench_peers_scores_and_times_the_exported_program_by_its_own_requests_and_metric():
    """``bench.peers.templates.peer_template_scores`` sends ``requests(content)``, parses as the
    adapter does and scores with the program's metric (a refused reply scores 0, as the
    program's failure score); ``measure_ttft`` sends the demo turns too."""
    from bench.peers.dspy_program import make_metric
    from bench.peers.templates import peer_template_scores

    spec, program = optimized_program("ticket_triage")
    content = pe.export_program(spec.name, program.signature, program.demos, dspy.JSONAdapter(), max_tokens=48)
    test = records(dataset_for(spec), "test")[:6]
    answers = ['{"label": "%s"}' % r["expected"]["label"] for r in test[:3]]
    # The adapter reads Literal['x'] as x and refuses "Billing" (our metric alone would score them 0 and 1).
    answers += ['{"label": "Literal[\'%s\']"}' % test[3]["expected"]["label"],
                '{"label": "%s"}' % test[4]["expected"]["label"].capitalize(), "not json"]
    by_prompt = {m: a for m, a in zip((req.messages for req in pe.requests(content, test)), answers)}
    sent = []

    def reply(req):
        sent.append(req)
        return by_prompt.get(req.messages, "")

    figures = peer_template_scores(FakeEngine(reply), spec, content, test, seed=0)
    assert sent == pe.requests(content, test, seed=0, timeout_s=sent[0].timeout_s)
    metric = make_metric(spec)
    program_scores = []
    for r, text in zip(test, answers):
        try:
            pred = dspy.Prediction(**dspy.JSONAdapter().parse(program.signature, text))
        except dspy.utils.exceptions.AdapterParseError:
            program_scores.append(0.0)  # dspy.Evaluate's failure_score in bench_peers
            continue
        program_scores.append(metric(to_example(spec, r), pred))
    assert figures["scores"] == program_scores == [1.0] * 4 + [0.0] * 2
    assert figures["test_valid_json_rate"] == pytest.approx(4 / 6)

    sent.clear()
    timing = pe.measure_ttft(FakeEngine(reply), content, test, n=2)
    assert timing["timing_n"] == 2 and timing["ttft_cold_ms"] is not None
    assert [req.messages for req in sent] == [pe.requests(content, [r])[0].messages for r in
                                              (test[0], test[1], test[1], test[0])]  # cold i, then warm on the next
    assert all(req.max_tokens == 1 for req in sent)
