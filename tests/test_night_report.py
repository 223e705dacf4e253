"""The night report (pure): the clause diff, and a page built from stored files only.

The stored files come from a real ``optimize`` run on the FakeEngine (its folder, its
``result.json``, its Pareto plot), a summary run log and a TTFT model's figure in a
temporary registry: the report is then rebuilt from them as ``promptdistill report`` does.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from bundled_specs import PROMPTS
from fakes import FAKE_IDENTITY, LINEAR_TERMS, FakeEngine
from PIL import Image

from promptdistill.optimize import OptimizeBudget, optimize
from promptdistill.pipeline import night_report
from promptdistill.pipeline.night_report import (
    REPORT_PART,
    Night,
    diff_counts,
    latest_run_id,
    load_night,
    prompt_diff,
    prompt_rows,
    render_night_report,
    write_night_report,
)
from promptdistill.pipeline.report import failed_row, summary_frame, summary_row
from promptdistill.pipeline.stages import result_figures
from promptdistill.registry.store import Registry
from promptdistill.specs.clauses import split_text_clauses
from promptdistill.specs.diff import diff_text, diff_units
from promptdistill.specs.load import load_spec
from promptdistill.ttft.estimators import MonomialRegressor
from promptdistill.ttft.model import TTFTModel

# --- the diff ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "One.", "Be kind. Be brief!\n\nRules:\n- a\n- b.\n", "No end", "A.  B.\n\n\nC?",
                                  "  \n", "  Lead. Trail.  \n\n"])
def test_diff_units_join_back_to_the_text(text):
    assert "".join(diff_units(text)) == text
    ops = prompt_diff(text, "Other.")
    assert "".join(o.before for o in ops) == text and "".join(o.after for o in ops) == "Other."


def test_diff_units_are_the_shared_clauses_with_their_separators():
    # The distiller's cutter: nothing is cut inside quotes, nor after "e.g.".
    assert diff_units('Say "hi." Then stop, e.g. Now.\nRules:\n- One.\n') == \
        ['Say "hi." Then stop, e.g. Now.', "\nRules:", "\n- One.\n"]
    assert diff_units("A. B.") == [c.sep + c.text for c in split_text_clauses("A. B.")]
    assert prompt_diff is night_report.prompt_diff


def test_the_diff_marks_removed_added_and_rewritten_clauses():
    before = "You are helpful. Read the ticket carefully. Answer with one label.\n\nTicket: x\nAnswer: billing"
    after = "Answer with one label only.\n\nTicket: x\nAnswer: billing\n\nTicket: y\nAnswer: shipping"
    ops = prompt_diff(before, after)
    assert [o.kind for o in ops] == ["removed", "rewritten", "same", "added"]
    assert ops[0].before == "You are helpful. Read the ticket carefully."  # a clause's space goes before it
    assert ops[1].after.startswith("Answer with one label only.")
    # Both sides come back whole: the diff loses nothing.
    assert "".join(o.before for o in ops) == before and "".join(o.after for o in ops) == after
    assert diff_counts(ops) == {"removed": 2, "added": 2, "rewritten": 1}


def test_whitespace_alone_is_no_change_and_the_text_diff_reads():
    assert [o.kind for o in prompt_diff("A. B.", "A.  B.")] == ["same"]
    assert diff_text(prompt_diff("Be kind. Be brief.", "Be brief. Be quick.")) == "[-Be kind.-] Be brief. {+Be quick.+}"
    assert diff_text(prompt_diff("Use one, e.g. Foo. Stop.", "Use one, e.g. Bar. Stop.")) == \
        "[~Use one, e.g. Foo.~>Use one, e.g. Bar.~] Stop."
    assert diff_counts(prompt_diff("Be kind.\n- a\n- b", "Be kind.")) == {"removed": 2, "added": 0, "rewritten": 0}


# --- a page from stored files ----------------------------------------------------------------


def _png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), color).save(buf, format="PNG")
    return buf.getvalue()


def _ttft_model() -> TTFTModel:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(10, 1500, 60), rng.choice([0, 128], 60), rng.integers(0, 8, 60),
                         rng.uniform(0.3, 0.8, 60), rng.uniform(5, 9, 60)])
    return TTFTModel(MonomialRegressor(terms=LINEAR_TERMS).fit(X, 50 + 0.4 * X[:, 0]), "monomial", "linear",
                     FAKE_IDENTITY, metrics={"heldout": {"linear": {"mape": 0.02}}})


def _reply(req):
    text = req.chat()[-1]["content"].lower()
    return json.dumps({"label": "billing" if "charge" in text or "refund" in text else "technical"})


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A stored run: one optimized spec (FakeEngine), one failed spec, the TTFT figure."""
    root = tmp_path_factory.mktemp("night")
    state = root / "state"
    # The spec file the run used, with a larger allowed drop so that a shorter prompt can win.
    (root / "prompts").mkdir()
    (root / "datasets").mkdir()
    (root / "prompts" / "ticket_triage.yaml").write_text(
        (PROMPTS / "ticket_triage.yaml").read_text().replace("max_quality_drop: 0.05", "max_quality_drop: 0.3"))
    shutil.copy(PROMPTS.parent / "datasets" / "ticket_triage.jsonl", root / "datasets")
    spec = load_spec(root / "prompts" / "ticket_triage.yaml")
    assert spec.slo.max_quality_drop == 0.3
    short = spec.with_changes(instruction="Pick the team for this ticket.", constraints=spec.constraints[:3])
    model = _ttft_model()
    # The distiller's rewrite is the winner these tests render (the described variant would undercut it).
    budget = OptimizeBudget(max_lm_calls=600, screen_size=6, dev_size=40, test_size=6, fewshot_counts=(0, 2),
                            similar_counts=(), timing_records=1, formats=False, described=False)
    result = optimize(FakeEngine(reply=_reply), spec, ttft_model=model, budget=budget,
                      distill_candidates=[("r1-rewrite-judge@0.50", short)])
    key = "optimize-0123abcd"
    result.write(state / "optimize" / key)
    registry = Registry(root / "registry")
    registry.put_artifact("ttft-model", FAKE_IDENTITY.key(), {"model.json": b"{}", "figure-pred_vs_measured.png":
                          _png((200, 30, 30))}, metadata={"model_version": model.version})
    figures = result_figures({**result.to_json(), "folder": str(state / "optimize" / key)})
    rows = [summary_row(spec.name, figures, status="optimized", version=3, labels=["candidate", "production"],
                        promotion="gate passed", run_key=key),
            failed_row("broken", "SpecError: prompts/broken.yaml: user: unknown placeholder {tiket}")]
    run_id = "20250101T020000Z-abcdef12"
    registry.put_run_log(run_id, summary_frame(rows), part="summary")
    registry.put_run_log(run_id, prompt_rows(rows, state_dir=state, ttft={"reason": "fresh", "refreshed": False}),
                         part=REPORT_PART)
    return registry, run_id, state, result


class _Page(HTMLParser):
    """Sections, images and every URL the page would load."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.images: list[tuple[str, str]] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("data-spec", ""))
        if tag == "img":
            self.images.append((self.sections[-1], a["src"]))
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


def test_the_report_is_one_offline_page_with_every_spec(night, tmp_path):
    registry, run_id, state, result = night
    path = Path(write_night_report(registry, run_id, state_dir=state))
    assert path == Path(registry.root) / "runs" / run_id / "report.html"
    page = path.read_text(encoding="utf-8")
    parsed = _Page()
    parsed.feed(page)
    assert parsed.sections == ["ticket_triage", "broken"]
    # No external asset: images are data URIs, links are anchors within the page.
    assert all(u.startswith(("data:image/png;base64,", "#")) for u in parsed.urls), parsed.urls
    assert "<link" not in page and "<script" not in page and "@import" not in page
    plots = [src for spec, src in parsed.images if spec == "ticket_triage"]
    assert len(plots) == 2 and all(base64.b64decode(s.split(",", 1)[1]).startswith(b"\x89PNG") for s in plots)
    # The numbers and the decision.
    assert "summary" in page and "certify records" in page and result.reason.split(":")[0] in page
    assert re.search(r"LM calls", page) and "record plan" in page and "gate passed" in page
    # The failed spec shows its error, in full.
    assert "unknown placeholder {tiket}" in page


def test_the_prompt_diff_shows_what_the_winner_changed(night):
    registry, run_id, state, result = night
    page = render_night_report(load_night(registry, run_id, state_dir=state))
    assert not result.kept_baseline and result.winner["variant"] == "r1-rewrite-judge@0.50"
    # The baseline's instruction is struck, the new one marked as a rewrite; the context is shared.
    assert '<del class="rewritten">You are a helpful and friendly customer support' in page
    assert '<ins class="rewritten">Pick the team for this ticket.' in page
    assert "Team definitions:" in page and "baseline rendered from" in page


def test_the_report_is_rebuilt_from_run_logs_alone(night):
    registry, run_id, state, _ = night
    # The stage folder is gone: the prompts still come from the run log, the numbers from the summary.
    folder = state / "optimize" / "optimize-0123abcd"
    folder.rename(folder.with_name("moved"))
    try:
        loaded = load_night(registry, run_id, state_dir=state)
        page = render_night_report(loaded)
    finally:
        folder.with_name("moved").rename(folder)
    assert loaded.prompts["ticket_triage"]["published_system"].startswith("Pick the team")
    assert loaded.results == {} and any("is gone" in n for n in loaded.notes)
    tokens = registry.read_run_log(run_id, part="summary")["tokens_before"].iloc[0]  # a mean over records
    assert '<ins class="rewritten">Pick the team' in page and f">{tokens:.0f} → " in page and "not available" in page
    assert latest_run_id(registry) in (run_id, "20250102T020000Z-00000000")


def test_a_run_without_a_report_log_still_gets_a_page(night, tmp_path):
    registry, run_id, state, _ = night
    other = "20250102T020000Z-00000000"
    registry.put_run_log(other, registry.read_run_log(run_id, part="summary"), part="summary")
    night2 = load_night(registry, other, state_dir=state)
    page = render_night_report(night2)
    assert "prompts are not shown" in page and "data-plot=\"pareto\"" in page
    assert latest_run_id(registry) == other


def test_a_kept_baseline_is_shown_once():
    prompt = {"baseline_system": "Be kind.\n\nRules:\n- One.", "published_system": "Be kind.\n\nRules:\n- One.",
              "baseline_user": "Q: {q}", "published_user": "Q: {q}", "prompt_note": "baseline rendered from x.yaml"}
    row = summary_row("s", {}, status="baseline kept", version=1)
    page = render_night_report(Night("r1", [row], {"s": prompt}, {"s": {}}, {"s": {}}, {}, []))
    assert "Unchanged: the published prompt is the baseline" in page
    assert page.count("Rules:") == 1 and "<del" not in page.split("</style>")[1].split("Unchanged")[1]
