"""How bench_peers counts each side's search: ``CallMeter`` phases, and ``FitToContext`` for the peers.

Pure: scripted engines (tests/fakes.py) and the real LM cache; the product's own distiller
and optimizer on the scripted engine name the phases the report shows.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from bench.peers.counting import FitToContext, search_tokens
from bench.peers.ours import VERIFICATION_PHASE
from fakes import FakeEngine
from promptdistill.core.errors import PromptTooLongError
from promptdistill.engine.base import GenerationRequest, GenerationResult
from promptdistill.engine.cache import CachedEngine
from promptdistill.engine.meter import NO_PHASE, CallMeter, current_phase, phase


class PrefixCached(FakeEngine):
    """Every reply: 100 prompt tokens, 64 of them from the prefix cache, 5 completion tokens."""

    def generate(self, requests, *, progress=False):
        self.batches.append(len(requests))
        return [GenerationResult(text=f"ok {req.chat()[-1]['content']}", prompt_tokens=100, completion_tokens=5,
                                 cached_tokens=64, finish_reason="stop", ttft_ms=1.0, e2e_ms=2.0) for req in requests]


def asks(*texts: str) -> list[GenerationRequest]:
    return [GenerationRequest(messages=[{"role": "user", "content": t}], max_tokens=8) for t in texts]


def test_a_phase_tags_every_meter_the_calls_pass_through(tmp_path):
    """As in bench_peers' ours: the stage's meter over its LM cache over the bench's meter. Both
    meters count the step's calls under the same phase; the one below the cache only its misses."""
    below = CallMeter(PrefixCached())
    stage = CallMeter(CachedEngine(below, tmp_path / "lm.sqlite"))
    with below.phase("optimize"):
        with stage.phase("screening"):
            stage.generate(asks("a", "b"))
            assert current_phase() == "optimize: screening"

        @phase("race")
        def race():
            stage.generate(asks("a", "c"))  # "a" comes from the LM cache

        race()
    stage.generate(asks("d"))
    assert current_phase() == NO_PHASE
    assert {k: v.calls for k, v in stage.phases.items()} == {"optimize: screening": 2, "optimize: race": 2, NO_PHASE: 1}
    assert {k: v.calls for k, v in below.phases.items()} == {"optimize: screening": 2, "optimize: race": 1, NO_PHASE: 1}
    assert below.phases["optimize: race"].to_dict() == {"calls": 1, "prompt_tokens": 100, "cached_tokens": 64,
                                                         "completion_tokens": 5}
    assert (below.calls, below.prompt_tokens, below.cached_tokens, below.completion_tokens) == (4, 400, 256, 20)
    assert below.counts.to_dict() == {k: sum(v.to_dict()[k] for v in below.phases.values()) for k in below.counts.to_dict()}


def test_a_phase_ends_with_its_block_even_on_an_error_and_stays_in_its_thread():
    meter = CallMeter(PrefixCached())
    with pytest.raises(RuntimeError):
        with meter.phase("distill"):
            raise RuntimeError("a step failed")
    assert current_phase() == NO_PHASE
    with meter.phase("distill"):
        # Python starts a thread in an empty context: its calls count under its own phases.
        worker = threading.Thread(target=lambda: meter.generate(asks("t")))
        worker.start()
        worker.join()
    assert {k: v.calls for k, v in meter.phases.items()} == {NO_PHASE: 1}
    with pytest.raises(ValueError, match="joins nested phases"), phase("distill: race"):
        pass


def test_search_tokens_count_prefilled_and_plain_tokens_the_same_way_for_every_side():
    """Ours' meter (per phase) and a peer's (behind ``FitToContext``) are the same ``CallMeter``:
    the same three counts of the engine's results; computed = prompt - prefix-cached + completion."""
    peer, ours = CallMeter(PrefixCached()), CallMeter(PrefixCached())
    FitToContext(peer).generate(asks("a", "b", "c"))
    with ours.phase("optimize"), ours.phase("race"):
        ours.generate(asks("a", "b", "c"))
    assert peer.counts.to_dict() == {"calls": 3, "prompt_tokens": 300, "cached_tokens": 192, "completion_tokens": 15}
    assert list(ours.phases) == ["optimize: race"]
    row = ours.phases["optimize: race"].to_dict()
    expected = {"search_tokens": 315, "computed_tokens": 123}
    assert search_tokens([peer.counts.to_dict()]) == search_tokens([row]) == expected
    assert search_tokens([row, row]) == {"search_tokens": 630, "computed_tokens": 246}
    # A row written before cached tokens were counted (a merged old report) counts none as cached.
    assert search_tokens([{"prompt_tokens": 10, "completion_tokens": 1}]) == {"search_tokens": 11, "computed_tokens": 11}


class ShortContext(FakeEngine):
    """Refuses a whole batch holding a prompt of 20 tokens or more, as vLLM does."""

    def __init__(self):
        super().__init__(lambda req: "fine")
        self.identity = dataclasses.replace(self.identity, max_model_len=20)

    def generate(self, requests, *, progress=False):
        if any(self.count_tokens(r.chat()) >= self.identity.max_model_len for r in requests):
            raise PromptTooLongError("a prompt is longer than max_model_len")
        return super().generate(requests, progress=progress)


def test_an_over_long_prompt_fails_alone_and_the_meter_counts_only_what_reached_the_engine():
    engine = ShortContext()
    meter = CallMeter(engine)
    fitted = FitToContext(meter)
    long = "word " * 30
    results = fitted.generate([*asks("short one"), GenerationRequest(messages=[{"role": "user", "content": long}],
                                                                    json_schema={"type": "object"}), *asks("two")])
    assert [r.text for r in results] == ["fine", "", "fine"]
    assert results[1].valid is False and "prompt too long" in results[1].error and results[1].prompt_tokens == 0
    assert engine.batches == [2] and fitted.rejected == 1 and meter.calls == 2
    fitted.generate(asks("three"))
    assert meter.calls == 3 and fitted.rejected == 1


def test_the_product_stages_name_the_phases_the_report_shows():
    """The distiller and the optimizer, each inside the phase bench_peers names after its stage,
    on a scripted engine with every step switched on: each step's calls land in its named phase,
    and the verification (the phase the goal leaves out) is one of them."""
    from bundled_specs import load_spec
    from promptdistill.distill import distill
    from promptdistill.optimize import OptimizeBudget, optimize
    from promptdistill.search.splits import split_records
    from test_distill import records, small, triage_engine
    from test_optimize_unit import ttft_model, with_drop

    spec = load_spec("ticket_triage")
    sizes = {"screen_size": 8, "dev_size": 24, "test_size": 4}
    splits = split_records(spec, seed=0, **sizes)
    meter = CallMeter(triage_engine(records(splits)))
    with meter.phase("distill"):
        distilled = distill(meter, spec, config=small(ablate_clear=True, calibrate=True, **sizes), splits=splits)
    with meter.phase("optimize"):
        optimize(meter, with_drop(spec), ttft_model=ttft_model(mape=0.02), distill_candidates=distilled,
                 budget=OptimizeBudget(max_lm_calls=1000, **sizes, fewshot_counts=(0, 2), similar_counts=(),
                                       timing_records=0, format_size=4, described=False))
    assert set(meter.phases) == {
        "distill: clause judge", "distill: ablations", "distill: rewrites", "distill: screening", "distill: race",
        "distill: held-out test", "distill: calibration", "optimize: screening", "optimize: race",
        "optimize: example sets", "optimize: output formats", VERIFICATION_PHASE}
    assert sum(c.calls for c in meter.phases.values()) == meter.calls
    assert meter.phases[VERIFICATION_PHASE].calls >= sizes["test_size"]  # the baseline at least, on every test record
