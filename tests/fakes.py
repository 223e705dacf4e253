"""Fakes for unit tests of pure logic. Integration tests use the real engine.

``FakeEngine`` answers with a function of the request, tokenizes on whitespace and
reports a made-up TTFT. It is here so that logic such as clause splitting, selection
rules or report building can be tested in milliseconds; never use it to claim that
something works on the real engine.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from promptdistill.engine.base import (
    Engine,
    EngineIdentity,
    GenerationRequest,
    GenerationResult,
    Message,
    validate_reply,
)

FAKE_IDENTITY = EngineIdentity(
    model="fake", backend="fake", dtype="none", max_model_len=2048, hardware="none", engine_version="0"
)


class FakeEngine(Engine):
    """A scripted engine: ``reply(request) -> text``; counts calls."""

    def __init__(self, reply: Callable[[GenerationRequest], str] | None = None, identity: EngineIdentity = FAKE_IDENTITY):
        self.reply = reply or (lambda req: "ok")
        self.identity = identity
        self.calls = 0
        self.batches: list[int] = []

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages)

    def tokenize(self, text: str) -> list[int]:
        return [hash(w) % 50000 for w in text.split()]

    def reset_prefix_cache(self) -> bool:
        return True

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        self.batches.append(len(requests))
        out = []
        for req in requests:
            self.calls += 1
            text = self.reply(req)
            if req.choices is not None and text not in req.choices:
                text = req.choices[0]
            prompt = req.prompt if req.prompt is not None else self.apply_chat_template(req.chat())
            n_prompt = len(self.tokenize(prompt))
            result = GenerationResult(
                text=text,
                prompt_tokens=n_prompt,
                completion_tokens=max(1, len(text.split())),
                cached_tokens=0,
                finish_reason="stop",
                ttft_ms=1.0 + 0.01 * n_prompt,
                e2e_ms=2.0 + 0.01 * n_prompt,
            )
            if req.json_schema is not None:
                result.parsed, result.error = validate_reply(text, req.schema)
                result.valid = result.error is None
            out.append(result)
        return out


def json_reply(obj: object) -> Callable[[GenerationRequest], str]:
    """A reply function that always answers ``obj`` as JSON."""
    return lambda req: json.dumps(obj)
