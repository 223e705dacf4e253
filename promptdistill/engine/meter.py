"""Counting what reaches the engine: requests and tokens, for budgets and cost reports."""

from __future__ import annotations

from typing import Sequence

from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult

__all__ = ["CallMeter"]


class CallMeter(EngineWrapper):
    """Counts every request sent through it, and the tokens processed.

    Token counts go to the wrapped engine, so a stage counts exactly as the engine that
    serves it. Behind a ``CachedEngine`` the meter counts requests asked for; the cache
    counts which of them reached the model (``real_calls``).

    Attributes:
        calls: requests sent.
        prompt_tokens, completion_tokens: tokens of their results.
    """

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        results = self.engine.generate(requests, progress=progress)
        self.calls += len(requests)
        self.prompt_tokens += sum(r.prompt_tokens for r in results)
        self.completion_tokens += sum(r.completion_tokens for r in results)
        return results
