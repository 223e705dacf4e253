"""Load measurement through a real vLLM server: two templates interleaved at a rate and a
concurrency, the command's report, and a small load profile that fits a load TTFT model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from promptdistill.load.driver import chat_requests
from promptdistill.load.measure import LoadPlan, measure_loads
from promptdistill.load.report import load_figures
from promptdistill.specs.model import Load

pytestmark = [pytest.mark.server, pytest.mark.engine]

SERVED = "smollm2-135m"


@pytest.fixture(scope="module")
def triage():
    from promptdistill.load.run import spec_records
    from promptdistill.optimize.examples import fixed_spec
    from promptdistill.optimize.variants import described_variant
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import select_examples, template_content
    from promptdistill.search.splits import split_records

    spec = load_spec("prompts/ticket_triage.yaml")
    train = split_records(spec, seed=0, screen_size=1, dev_size=2, test_size=0).train
    base = template_content(spec, select_examples(spec, train, seed=0))
    short = template_content(fixed_spec(described_variant(spec), []), [])
    return spec, base, short, spec_records(spec, n=40)


def test_two_templates_at_a_rate_and_a_concurrency_interleaved_in_paired_blocks(vllm_server, triage):
    spec, base, short, records = triage
    reqs = {"baseline": chat_requests("baseline", base, records, model=SERVED),
            "winner": chat_requests("winner", short, records, model=SERVED)}
    plan = LoadPlan(loads=(Load(rate_rps=3.0), Load(concurrency=4)), requests_per_block=10, blocks=2, warmup=2)
    rows = measure_loads(vllm_server.url, reqs, plan)
    assert len(rows) == plan.requests * 2 and all(r["ok"] for r in rows), [r["error"] for r in rows if not r["ok"]]
    for load_kind in ("rate", "concurrency"):
        for b in range(2):
            ids = {t: [r["record_id"] for r in rows if r["load_kind"] == load_kind and r["block"] == b
                       and r["template"] == t] for t in reqs}
            assert ids["baseline"] == ids["winner"]  # a pair: the same records, in the same order
    # Open loop: arrivals spread at about the rate (10 requests at 3 req/s: ~3 s, whatever the replies do).
    sends = [r["sent_s"] for r in rows if r["load_kind"] == "rate" and r["block"] == 0 and r["template"] == "winner"]
    assert 1.0 < max(sends) - min(sends) < 10.0
    # Closed loop: never more than 4 in flight.
    block = [r for r in rows if r["load_kind"] == "concurrency" and r["block"] == 0 and r["template"] == "baseline"]
    events = sorted([(r["sent_s"], 1) for r in block] + [(r["sent_s"] + r["e2e_ms"] / 1000, -1) for r in block])
    assert max(np.cumsum([e for _, e in events])) <= 4
    base_tokens = np.mean([r["prompt_tokens"] for r in rows if r["template"] == "baseline"])
    short_tokens = np.mean([r["prompt_tokens"] for r in rows if r["template"] == "winner"])
    assert short_tokens < base_tokens / 2  # the described variant drops the rules and the examples
    fig = load_figures(rows, templates=["baseline", "winner"], target_ms=spec.slo.ttft_ms)
    at = fig.at(Load(rate_rps=3.0))
    assert at["templates"]["baseline"]["p95_ttft_ms"]["n"] == 16 and "difference" in at
    assert at["templates"]["winner"]["p50_ttft_ms"]["value"] > 0


def test_the_load_command_writes_its_report_through_a_configured_server(vllm_server, tmp_path, triage):
    from promptdistill.registry.store import Registry

    spec, base, short, _ = triage
    Registry(str(tmp_path / "registry")).publish("ticket_triage", short, labels=["production"])
    env = {**os.environ, "PROMPTDISTILL_BACKEND": "server", "PROMPTDISTILL_SERVER_URLS": vllm_server.url,
           "PROMPTDISTILL_REGISTRY": str(tmp_path / "registry"), "PROMPTDISTILL_STATE_DIR": str(tmp_path / "state")}
    out = subprocess.run([sys.executable, "-m", "promptdistill", "load", "ticket_triage", "--rate", "2",
                          "--requests", "8", "--blocks", "1"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "state" / "load" / "ticket_triage" / "report.json").read_text())
    assert report["figures"]["templates"] == ["baseline", "ticket_triage:1"]
    assert len(report["requests"]) == 16 and report["figures"]["per_load"][0]["load"] == "2 req/s"
    assert "P95 TTFT ms" in out.stdout and "ticket_triage:1 - baseline" in out.stdout


@pytest.fixture(scope="session")
def load_profile_cells(vllm_server):
    """A small real load profile: ticket_triage as written and described, and invoice_extraction
    described (short and long replies), at concurrency 1, 4 and 8 and two rates, two rounds."""
    from dataclasses import replace

    from promptdistill.core.config import EngineConfig
    from promptdistill.engine.server import ServerEngine
    from promptdistill.load.profile import LoadProfileConfig, profile_cells, profile_templates, run_load_profile
    from promptdistill.optimize.examples import fixed_spec
    from promptdistill.optimize.variants import described_variant
    from promptdistill.search.splits import split_records
    from promptdistill.specs.load import load_spec
    from promptdistill.specs.prompt import select_examples

    engine = ServerEngine(replace(EngineConfig(), backend="server", server_urls=(vllm_server.url,)))
    triage, invoice = load_spec("prompts/ticket_triage.yaml"), load_spec("prompts/invoice_extraction.yaml")
    train = split_records(triage, seed=0, screen_size=1, dev_size=2, test_size=0).train
    variants = [("ticket_triage/baseline", triage, list(select_examples(triage, train, seed=0))),
                ("ticket_triage/described", fixed_spec(described_variant(triage), []), []),
                ("invoice_extraction/described", fixed_spec(described_variant(invoice), []), [])]
    templates = profile_templates(variants, tokenizer=engine, block_tokens=engine.identity.block_size or 16,
                                  model=SERVED, records=12)
    config = LoadProfileConfig(concurrencies=(1, 4, 8), rate_shares=(0.3, 0.6), requests=8, solo_requests=2,
                               warmup=1, repeats=2, records=12)
    rows = run_load_profile(vllm_server.url, templates, config)
    return engine, templates, rows, profile_cells(rows)


def test_a_load_profile_fits_a_model_that_queues_with_the_load(load_profile_cells, tmp_path):
    from promptdistill.load.fit import load_error_table
    from promptdistill.load.model import LoadTTFTModel
    from promptdistill.load.store import load_load_model, publish_load_model
    from promptdistill.registry.store import Registry

    engine, templates, rows, cells = load_profile_cells
    kinds = {(r["load_kind"], r["load_value"]) for r in rows}
    assert {("concurrency", 1.0), ("concurrency", 4.0), ("concurrency", 8.0)} <= kinds
    assert all(r["failed"] == 0 for r in rows)
    # Each template at two rates of its own capacity, in both rounds.
    for t in templates:
        mine = [r for r in rows if r["prompt_id"] == t.prompt_id and r["load_kind"] == "rate"]
        assert len(mine) == 4 and len({r["load_value"] for r in mine}) == 2
    model = LoadTTFTModel().fit(cells)
    for t in templates:
        g = np.mean([c["completion_tokens"] for c in cells if c["prompt_id"] == t.prompt_id])
        x = {**t.features, "completion_tokens": g}
        assert model.seconds_per_request(x) > 0
        # A queue only grows with the load: more in flight, or faster arrivals, never a lower percentile.
        assert model.predict_one(x, "concurrency", 8) >= model.predict_one(x, "concurrency", 1) * 0.9
        rates = sorted({r["load_value"] for r in rows if r["prompt_id"] == t.prompt_id and r["load_kind"] == "rate"})
        assert model.predict_one(x, "rate", rates[1]) >= model.predict_one(x, "rate", rates[0]) * 0.9
    # Longer replies hold the batch: the invoice template (tens of tokens a reply) costs more a request.
    short, long_ = (next(t for t in templates if t.prompt_id == pid) for pid in
                    ("ticket_triage/described", "invoice_extraction/described"))
    g = {t.prompt_id: np.mean([c["completion_tokens"] for c in cells if c["prompt_id"] == t.prompt_id])
         for t in templates}
    assert g[long_.prompt_id] > 2 * g[short.prompt_id]
    assert model.seconds_per_request({**long_.features, "completion_tokens": g[long_.prompt_id]}) > \
        model.seconds_per_request({**short.features, "completion_tokens": g[short.prompt_id]})
    table = load_error_table(cells)
    assert {r["load"] for r in table} >= {"concurrency 4", "concurrency 8"}
    assert all(r["cells"] > 0 and r.get("floor") is not None for r in table)
    registry = Registry(str(tmp_path / "registry"))
    publish_load_model(registry, model, engine.identity, model_name="SmolLM2-135M-Instruct")
    again, meta = load_load_model(registry, engine.identity, "SmolLM2-135M-Instruct")
    assert again.to_dict() == model.to_dict() and meta["model_name"] == "SmolLM2-135M-Instruct"


def test_a_spec_that_declares_a_load_is_decided_and_verified_at_it(load_profile_cells, engine, ttft_model,
                                                                   vllm_server):
    """ticket_triage at 1 req/s on the real engine: candidates priced by the profile's load
    model, the reason names P95 at that load, and a winner is measured there before it stands."""
    import dataclasses

    from promptdistill.load.fit import load_error_table
    from promptdistill.load.model import LoadTTFTModel
    from promptdistill.optimize import optimize
    from promptdistill.optimize.predict import LoadPricing
    from promptdistill.pipeline.budgets import budget_preset
    from promptdistill.specs.load import load_spec

    _, _, _, cells = load_profile_cells
    spec = load_spec("prompts/ticket_triage.yaml")
    spec = spec.with_changes(slo=dataclasses.replace(spec.slo, load=Load(rate_rps=1.0), ttft_ms=None))
    pricing = LoadPricing.from_model(LoadTTFTModel().fit(cells), spec.slo, load_error_table(cells),
                                     server=(vllm_server.url, SERVED))
    preset = budget_preset("smoke")
    result = optimize(engine, spec, ttft_model=ttft_model, budget=preset["budget"], selection=preset["selection"],
                      load_pricing=pricing)
    assert result.selection.latency == "P95 TTFT at 1 req/s"
    assert result.provenance["latency"] == "P95 TTFT at 1 req/s"
    priced = result.candidates.dropna(subset=["ttft_load_ms"])
    assert len(priced) == len(result.candidates)  # every candidate was priced at the load
    check = result.verification.get("load_check")
    if not result.kept_baseline:  # a winner that stands was measured at the load and not found slower
        assert check is not None and check["verdict"] != "slower"
    if check is not None:
        assert check["latency"] == "P95 TTFT at 1 req/s" and check["n"] > 0
        assert check["verdict"] in ("slower", "faster", "not shown")
        assert ("REVERTED at load" in result.reason) == (check["verdict"] == "slower")
    if "P95 TTFT at 1 req/s" not in result.reason:  # only a race that certified nothing names no latency
        assert result.reason.startswith("kept: no candidate certified")
