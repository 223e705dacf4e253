"""A real OpenAI-compatible vLLM server on 127.0.0.1, driven through the server backend."""

from __future__ import annotations

from dataclasses import replace

import pytest

from promptdistill.core.config import EngineConfig
from promptdistill.engine import GenerationRequest
from promptdistill.engine.server import ServerEngine
from promptdistill.core.errors import EngineUnavailableError, PromptTooLongError

pytestmark = [pytest.mark.server, pytest.mark.engine]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


@pytest.fixture(scope="module")
def server_engine(vllm_server, tokenizer):
    """The session's shared server (conftest), through the server backend."""
    config = EngineConfig(max_model_len=2048)
    return ServerEngine(replace(config, backend="server", server_urls=(vllm_server.url,), max_concurrency=4))


def test_server_tokenizer_matches_the_local_one(server_engine, tokenizer):
    # No role markers inside the value: the server tokenizes the templated text in one
    # go (markers would become special tokens there), while the local path splits them.
    msgs = [SYSTEM, {"role": "user", "content": "Count {these} tokens, {{literally}} please."}]
    assert server_engine.count_tokens(msgs) == tokenizer.count_tokens(msgs)
    assert server_engine.apply_chat_template(msgs) == tokenizer.apply_chat_template(msgs)


def test_concurrent_streamed_batch_with_timings(server_engine):
    requests = [GenerationRequest(messages=[SYSTEM, {"role": "user", "content": f"Say the number {i}."}], max_tokens=8)
                for i in range(5)]
    results = server_engine.generate(requests)
    assert len(results) == 5
    for req, r in zip(requests, results):
        assert r.prompt_tokens == server_engine.count_tokens(req.chat())
        assert 1 <= r.completion_tokens <= 8
        assert 0 < r.ttft_ms <= r.e2e_ms


def test_structured_output_over_http_validates(server_engine):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    r = server_engine.generate([GenerationRequest(messages=[SYSTEM, {"role": "user", "content": "2+2? JSON."}],
                                                  json_schema=schema, max_tokens=30)])[0]
    assert r.valid is True, r.error
    assert isinstance(r.parsed["answer"], int)


def test_cold_then_warm_prefix_over_http(server_engine):
    assert server_engine.reset_prefix_cache() is True
    static = "Policy: refunds within thirty days with a receipt. " * 30
    cold = server_engine.generate([GenerationRequest(prompt=static + "Q1", max_tokens=1)])[0]
    warm = server_engine.generate([GenerationRequest(prompt=static + "Q2", max_tokens=1)])[0]
    assert cold.cached_tokens == 0
    assert warm.cached_tokens > 0.5 * cold.prompt_tokens


def test_too_long_prompt_over_http_is_a_clear_error(server_engine):
    with pytest.raises(PromptTooLongError):
        server_engine.generate([GenerationRequest(prompt="word " * 3000, max_tokens=1)])


def test_unreachable_server_is_a_clear_error():
    config = EngineConfig(backend="server", server_urls=("http://127.0.0.1:9/v1",))
    with pytest.raises(EngineUnavailableError, match="no OpenAI-compatible server answers at http://127.0.0.1:9/v1"):
        ServerEngine(config)
