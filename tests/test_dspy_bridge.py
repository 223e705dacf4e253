"""DSPy programs on the real engine through the batching bridge."""

from __future__ import annotations

import threading

import pytest

from promptdistill.engine.base import GenerationRequest

pytestmark = pytest.mark.engine


def test_dspy_predict_runs_on_the_engine(engine, tmp_path):
    import dspy

    from bench.dspy_bridge import make_dspy_lm

    lm = make_dspy_lm(engine, cache_dir=tmp_path / "dspy_cache", max_tokens=64)
    assert engine.identity.key() in lm.model
    # SmolLM2-135M does not follow ChatAdapter's field markers; JSONAdapter's schema is
    # enforced by the engine's constrained decoding, so the reply always parses.
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        predict = dspy.Predict("question -> answer: str, confidence: int")
        out = predict(question="What is the capital of France?")
    assert isinstance(out.answer, str) and isinstance(out.confidence, int)
    assert sum(lm.bridge.batches) >= 1


def test_concurrent_calls_are_gathered_into_batches(engine):
    from bench.dspy_bridge import BatchingEngine

    bridge = BatchingEngine(engine, window_s=0.2)
    results = [None] * 6

    def call(i):
        req = GenerationRequest(messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=4)
        results[i] = bridge.submit(req)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    bridge.close()
    assert all(r is not None and r.completion_tokens >= 1 for r in results)
    assert max(bridge.batches) > 1, bridge.batches
    assert sum(bridge.batches) == 6
