"""The real in-process vLLM engine on SmolLM2-135M-Instruct."""

from __future__ import annotations

import pytest

from promptdistill.engine import GenerationRequest
from promptdistill.core.errors import PromptTooLongError

pytestmark = pytest.mark.engine

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def test_a_batch_comes_back_in_order_with_counts_and_timings(engine):
    questions = [f"What is {i} plus {i}?" for i in range(6)]
    requests = [GenerationRequest(messages=[SYSTEM, {"role": "user", "content": q}], max_tokens=16) for q in questions]
    results = engine.generate(requests)
    assert len(results) == 6
    for req, r in zip(requests, results):
        assert r.prompt_tokens == engine.count_tokens(req.chat())
        assert 1 <= r.completion_tokens <= 16
        assert r.text
        assert 0 < r.ttft_ms <= r.e2e_ms
        assert r.finish_reason in ("stop", "length")


def test_structured_output_validates_against_its_schema(engine):
    schema = {
        "type": "object",
        "properties": {"category": {"type": "string", "enum": ["billing", "technical", "shipping"]},
                       "urgent": {"type": "boolean"}},
        "required": ["category", "urgent"],
        "additionalProperties": False,
    }
    tickets = ["I was charged twice this month.", "The app crashes on start.", "My parcel never arrived."]
    requests = [
        GenerationRequest(messages=[SYSTEM, {"role": "user", "content": f"Classify this ticket as JSON: {t}"}],
                          json_schema=schema, max_tokens=60)
        for t in tickets
    ]
    for r in engine.generate(requests):
        assert r.valid is True, r.error
        assert r.parsed["category"] in ("billing", "technical", "shipping")


def test_choices_constrain_the_reply(engine):
    r = engine.generate([GenerationRequest(messages=[SYSTEM, {"role": "user", "content": "Is water wet? yes or no"}],
                                           choices=["yes", "no"], max_tokens=4)])[0]
    assert r.text in ("yes", "no") and r.valid


def test_ttft_grows_with_prompt_length_on_a_cold_cache(engine):
    text = ("The customer wrote about a delayed shipment and asked for a refund of the order. " * 60).split()
    ttft = {}
    for n in (40, 1200):
        engine.reset_prefix_cache()
        # Median of three cold runs: the machine is shared and noisy.
        runs = []
        for _ in range(3):
            engine.reset_prefix_cache()
            r = engine.generate([GenerationRequest(prompt=" ".join(text[:n]), max_tokens=1)])[0]
            assert r.cached_tokens == 0
            runs.append(r.ttft_ms)
        ttft[n] = sorted(runs)[1]
    assert ttft[1200] > 1.5 * ttft[40], ttft


def test_a_warm_prefix_is_served_from_the_cache(engine):
    engine.reset_prefix_cache()
    static = "You answer questions about our return policy. " * 40
    first = engine.generate([GenerationRequest(messages=[{"role": "system", "content": static},
                                                         {"role": "user", "content": "Can I return shoes?"}], max_tokens=1)])[0]
    second = engine.generate([GenerationRequest(messages=[{"role": "system", "content": static},
                                                          {"role": "user", "content": "Can I return a hat?"}], max_tokens=1)])[0]
    assert first.cached_tokens == 0
    # vLLM caches whole KV blocks (128 tokens on the CPU build): the static part is
    # reused up to its last full block.
    static_tokens = engine.count_tokens([{"role": "system", "content": static}])
    assert static_tokens - 128 <= second.cached_tokens <= second.prompt_tokens
    assert second.cached_tokens > 0


def test_a_prompt_longer_than_max_model_len_is_a_clear_error(engine):
    with pytest.raises(PromptTooLongError, match="max_model_len"):
        engine.generate([GenerationRequest(prompt="word " * 3000, max_tokens=1)])


def test_reset_prefix_cache_reports_success(engine):
    assert engine.reset_prefix_cache() is True
