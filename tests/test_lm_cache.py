"""The LM result cache: hits, misses, batching, persistence; and on the real engine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fakes import FAKE_IDENTITY, FakeEngine
from promptdistill.engine.base import GenerationRequest
from promptdistill.engine.cache import CachedEngine, cache_key


def req(text: str, **kw) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], **kw)


def test_second_run_makes_no_real_calls(tmp_path):
    fake = FakeEngine(lambda r: r.chat()[0]["content"].upper())
    cached = CachedEngine(fake, tmp_path / "c.sqlite")
    first = cached.generate([req("a"), req("b")])
    second = cached.generate([req("a"), req("b")])
    assert [r.text for r in first] == [r.text for r in second] == ["A", "B"]
    assert (cached.real_calls, cached.cache_hits, fake.calls) == (2, 2, 2)
    assert [r.extra.get("cache_hit") for r in second] == [True, True]
    assert len(cached) == 2


def test_misses_go_to_the_engine_as_one_batch_in_order(tmp_path):
    fake = FakeEngine(lambda r: r.chat()[0]["content"])
    cached = CachedEngine(fake, tmp_path / "c.sqlite")
    cached.generate([req("b")])
    out = cached.generate([req("a"), req("b"), req("c"), req("a")])
    assert [r.text for r in out] == ["a", "b", "c", "a"]
    assert fake.batches == [1, 2]  # the duplicate "a" is sent once, "b" came from the cache
    assert (cached.real_calls, cached.cache_hits) == (3, 2)


def test_cache_persists_across_instances(tmp_path):
    path = tmp_path / "state" / "lm_cache.sqlite"
    CachedEngine(FakeEngine(lambda r: "x"), path).generate([req("q", seed=3)])
    fake = FakeEngine(lambda r: "y")
    again = CachedEngine(fake, path)
    assert again.generate([req("q", seed=3)])[0].text == "x"
    assert fake.calls == 0
    assert again.generate([req("q", seed=4)])[0].text == "y"  # another seed is another request


def test_the_timeout_does_not_change_the_key(tmp_path):
    fake = FakeEngine(lambda r: "x")
    cached = CachedEngine(fake, tmp_path / "c.sqlite")
    cached.generate([req("q", timeout_s=10.0)])
    cached.generate([req("q", timeout_s=3600.0), req("q")])
    assert fake.calls == 1 and cached.cache_hits == 2


def test_the_key_includes_the_engine_identity(tmp_path):
    path = tmp_path / "c.sqlite"
    a = FakeEngine(lambda r: "from a")
    b = FakeEngine(lambda r: "from b", identity=replace(FAKE_IDENTITY, model="other"))
    assert cache_key(a, req("q")) != cache_key(b, req("q"))
    CachedEngine(a, path).generate([req("q")])
    assert CachedEngine(b, path).generate([req("q")])[0].text == "from b"


def test_invalid_structured_replies_are_cached_failures_are_not(tmp_path):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    fake = FakeEngine(lambda r: "not json")
    cached = CachedEngine(fake, tmp_path / "c.sqlite")
    bad = cached.generate([req("q", json_schema=schema)])[0]
    assert bad.valid is False and bad.error
    again = cached.generate([req("q", json_schema=schema)])[0]
    assert again.extra["cache_hit"] and again.valid is False and again.error == bad.error

    def failing(r):
        return "partial"

    failing_engine = FakeEngine(failing)
    original = failing_engine.generate

    def generate(requests, *, progress=False):
        results = original(requests, progress=progress)
        for res in results:
            res.finish_reason, res.error = "error", "engine failed"
        return results

    failing_engine.generate = generate  # type: ignore[method-assign]
    flaky = CachedEngine(failing_engine, tmp_path / "c2.sqlite")
    flaky.generate([req("z")])
    flaky.generate([req("z")])
    assert flaky.real_calls == 2 and flaky.cache_hits == 0


def test_results_round_trip_every_field(tmp_path):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    cached = CachedEngine(FakeEngine(lambda r: json.dumps({"x": 1})), tmp_path / "c.sqlite")
    fresh = cached.generate([req("q", json_schema=schema)])[0]
    hit = cached.generate([req("q", json_schema=schema)])[0]
    a, b = fresh.to_dict(), hit.to_dict()
    a.pop("extra"), b.pop("extra")
    assert a == b and hit.parsed == {"x": 1}


@pytest.mark.engine
def test_real_engine_rerun_is_served_from_the_cache(engine, tmp_path):
    cached = CachedEngine(engine, tmp_path / "c.sqlite")
    requests = [req("Name one colour.", max_tokens=8), req("Say yes.", max_tokens=4, seed=1)]
    first = cached.generate(requests)
    second = cached.generate(requests)
    assert cached.real_calls == 2 and cached.cache_hits == 2
    assert [r.text for r in first] == [r.text for r in second]
    assert cached.identity == engine.identity
