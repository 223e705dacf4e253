"""What a side's search costs at the engine, counted the same way for every side.

Every side's requests go through a :class:`~promptdistill.engine.meter.CallMeter` below
its own LM cache (ours: the pipeline stages' cache; a peer: DSPy's), so the meter counts
what reached the engine: calls, prompt tokens, the prompt tokens vLLM's prefix cache
served, and completion tokens. :func:`search_tokens` turns those counts into the goal's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from promptdistill.core.errors import PromptTooLongError
from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult

__all__ = ["FitToContext", "search_tokens"]


def search_tokens(rows: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Tokens of the requests that reached the engine, counted the same way for every side:
    ``search_tokens`` (prompt + completion) and ``computed_tokens`` (the prompt tokens the
    engine prefilled, i.e. not served by its prefix cache, + completion).

    ``rows``: counts (``CallCounts.to_dict()``, or a report's phase rows; a row written
    before cached tokens were counted counts none as cached).
    """
    prompt, completion = sum(r["prompt_tokens"] for r in rows), sum(r["completion_tokens"] for r in rows)
    cached = sum(r.get("cached_tokens", 0) for r in rows)
    return {"search_tokens": prompt + completion, "computed_tokens": prompt - cached + completion}


class FitToContext(EngineWrapper):
    """Answers a prompt longer than the context window alone, with an empty reply and an error.

    Such a prompt would fail the whole batch it came in; here it fails one DSPy call, not
    its batch-mates. The engine never sees it: it has zero tokens, and a meter wrapped by
    this one does not count it (``rejected`` does).
    """

    def __init__(self, engine: Engine):
        super().__init__(engine)
        self.rejected = 0

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        try:
            return self.engine.generate(requests, progress=progress)
        except PromptTooLongError:
            return self._generate_fitting(requests, progress)

    def _generate_fitting(self, requests: Sequence[GenerationRequest], progress: bool) -> list[GenerationResult]:
        limit = self.identity.max_model_len
        sizes = [self.count_tokens(r.chat() if r.messages is not None else r.prompt) for r in requests]
        fits = [i for i, n in enumerate(sizes) if n < limit]  # the engine's own rule (it caps the output)
        done = dict(zip(fits, self.engine.generate([requests[i] for i in fits], progress=progress))) if fits else {}
        self.rejected += len(requests) - len(fits)
        return [done.get(i) or GenerationResult(
            text="", prompt_tokens=0, completion_tokens=0, cached_tokens=0, finish_reason="length", ttft_ms=0.0,
            e2e_ms=0.0, valid=False if req.json_schema or req.choices else None,
            error=f"prompt too long: {sizes[i]} tokens, max_model_len {limit}")
            for i, req in enumerate(requests)]
