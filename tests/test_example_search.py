"""Example sets chosen by search: after the spec's rule and a label-balanced set, each further
set of ``OptimizeBudget.fixed_subsets`` is the best so far with one example swapped (seeded),
screened like the others; the best screen score is kept and named in the candidates table."""

from __future__ import annotations

import dataclasses
import json
import re

from bundled_specs import load_spec
from fakes import FakeEngine
from promptdistill.optimize import OptimizeBudget, optimize
from promptdistill.optimize.examples import swapped_subset
from promptdistill.specs.datasets import dataset_for, records
from test_optimize_unit import _triage_reply, ttft_model

SPEC = load_spec("ticket_triage")
TRAIN = records(dataset_for(SPEC), "train")


def ids(recs):
    return [str(r["id"]) for r in recs]


def test_a_swap_replaces_one_example_in_place_and_is_seeded():
    current = TRAIN[:3]
    swapped, what = swapped_subset(TRAIN, current, seed=4)
    assert swapped_subset(TRAIN, current, seed=4) == (swapped, what)
    changed = [i for i, (a, b) in enumerate(zip(ids(current), ids(swapped))) if a != b]
    assert len(changed) == 1 and ids(swapped)[changed[0]] not in ids(current)
    assert what == f"{ids(current)[changed[0]]} -> {ids(swapped)[changed[0]]}"
    # Sets already tried are not proposed again; with none left, None.
    tried = {tuple(sorted(ids(swapped)))}
    again, _ = swapped_subset(TRAIN, current, seed=4, tried=tried)
    assert tuple(sorted(ids(again))) not in tried
    assert swapped_subset(TRAIN[:3], current, seed=0) is None


def test_the_optimizer_searches_example_sets_by_swaps_and_keeps_the_best_screened():
    """The spec as written is wrong on 'hard' tickets unless its examples show a shipping
    reply: which set is best depends on the examples, and the search keeps the best."""
    def reply(req):
        system, ticket = req.chat()[0]["content"], req.chat()[-1]["content"]
        right = _triage_reply(req)
        if len(ticket) % 3 == 0 and '"label": "shipping"' not in system and "Answer: shipping" not in system:
            label = json.loads(right)["label"]
            return json.dumps({"label": "technical" if label != "technical" else "billing"})
        return right

    spec = SPEC.with_changes(slo=dataclasses.replace(SPEC.slo, max_quality_drop=0.2, ttft_ms=None))
    budget = OptimizeBudget(max_lm_calls=1500, screen_size=16, dev_size=66, test_size=8, fewshot_counts=(2,),
                            similar_counts=(), fixed_subsets=4, timing_records=0, formats=False, described=False,
                            reply_reminder=False, block_aligned=False, max_variants=1)
    result = optimize(FakeEngine(reply=reply), spec, ttft_model=ttft_model(mape=0.05), budget=budget)
    df = result.candidates.set_index("candidate_id")
    row = df.loc["original/fixed2"]
    note = re.search(r"example set chosen by screen score among ([^;]*)", row["notes"]).group(1)
    scores = dict(part.split("=") for part in note.split(", "))
    assert set(scores) >= {"swap1", "swap2"} and len(scores) == 4
    assert row["subset"] in scores and float(scores[row["subset"]]) == max(float(v) for v in scores.values())
    assert row["screen_quality"] == float(scores[row["subset"]])
    if row["subset"].startswith("swap"):
        assert "example set searched: " in row["notes"]
    assert result.lm_calls <= budget.max_lm_calls
