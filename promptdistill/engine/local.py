"""In-process backend: one ``vllm.LLM`` that batches every list of requests.

TTFT comes from vLLM's own per-request stats: ``RequestOutput.metrics.first_token_latency``
is the time from the request's arrival in the engine (``add_request``) to the engine
iteration that produced its first token. We use it rather than
``first_token_ts - scheduled_ts`` because the latter leaves out queueing, and a caller
waits through queueing too; for a request sent alone the two differ by well under a
millisecond. End-to-end adds the decode span ``last_token_ts - first_token_ts`` (both
on the engine core's monotonic clock).

Prompts are tokenized here with the model's chat template and sent as token ids, so the
prompt-token counts the features use are exactly what the engine ran.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from promptdistill.core.config import EngineConfig, block_size_to_start, has_gpu
from promptdistill.core.errors import EngineError, EngineTimeoutError, ModelNotFoundError, PromptTooLongError
from promptdistill.engine.base import (
    Engine,
    EngineIdentity,
    GenerationRequest,
    GenerationResult,
    Message,
    check_reply,
    hardware_fingerprint,
)
from promptdistill.engine.tokenizer import HFTokenizer

__all__ = ["LocalEngine"]


def _set_cpu_defaults(config: EngineConfig) -> None:
    # In-process, no worker processes: starts in seconds and needs no __main__ guard.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(config.kv_cache_gib)))))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Stats are on (for per-request timing); keep vLLM's periodic INFO lines out of the output.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


class LocalEngine(Engine):
    """The real vLLM engine, in this process.

    Args:
        config: engine settings; ``config.model`` must be an HF folder or name.
    """

    def __init__(self, config: EngineConfig, *, model_path: str | Path):
        self.config = config
        self.model_path = str(model_path)
        _set_cpu_defaults(config)
        try:
            import vllm
            from vllm import LLM
        except ImportError as e:
            raise EngineError(
                f"vLLM is not installed ({e}); install the CPU build with `pip install -e '.[cpu]'` "
                "or the GPU build with `pip install -e '.[gpu]'`"
            ) from None
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=True,
            seed=config.seed,
            # Per-request timing (RequestOutput.metrics) is only collected with stats on.
            disable_log_stats=False,
        )
        if has_gpu():
            kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        block_size = block_size_to_start(config)
        if block_size is not None:
            kwargs["block_size"] = block_size
        try:
            with _hide_modules_that_break_scans():
                self._llm = LLM(**kwargs)
        except (OSError, ValueError) as e:
            raise ModelNotFoundError(f"engine.model: vLLM could not load {self.model_path!r}: {e}") from None
        self._counter = itertools.count()
        self._tokenizer = HFTokenizer.wrap(self._llm.get_tokenizer(), self.model_path)
        self.identity = EngineIdentity(
            model=Path(self.model_path).name,
            backend="vllm-local",
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            hardware=hardware_fingerprint(),
            engine_version=f"vllm {vllm.__version__}",
            block_size=self._block_size(),
        )

    def _block_size(self) -> int | None:
        """The block size vLLM settled on (the platform may override the configured one)."""
        try:
            return int(self._llm.llm_engine.vllm_config.cache_config.block_size)
        except (AttributeError, TypeError, ValueError):
            return block_size_to_start(self.config)

    # -- tokenization -------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        return self._tokenizer.apply_chat_template(messages)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.tokenize(text)

    def reset_prefix_cache(self) -> bool:
        return bool(self._llm.reset_prefix_cache())

    # -- generation ---------------------------------------------------------------------
    def count_tokens(self, messages: Sequence[Message] | str) -> int:
        return self._tokenizer.count_tokens(messages)

    def _prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.prompt is not None:
            return self.tokenize(req.prompt)
        return self._tokenizer.encode_chat(req.chat())

    def _sampling_params(self, req: GenerationRequest, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        structured = None
        if req.json_schema is not None:
            structured = StructuredOutputsParams(json=req.schema)
        elif req.choices is not None:
            structured = StructuredOutputsParams(choice=list(req.choices))
        return SamplingParams(
            output_kind=RequestOutputKind.FINAL_ONLY,
            temperature=req.temperature,
            max_tokens=min(req.max_tokens, self.config.max_model_len - prompt_len),
            seed=req.seed,
            stop=list(req.stop) or None,
            structured_outputs=structured,
        )

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        """Run the requests as one vLLM batch; results in input order.

        Raises:
            PromptTooLongError: a prompt leaves no room for output in max_model_len.
            EngineTimeoutError: the batch outlived the longest request timeout
                (unfinished requests are aborted first).
        """
        if not requests:
            return []
        prompts, params = [], []
        for i, req in enumerate(requests):
            ids = self._prompt_ids(req)
            if len(ids) >= self.config.max_model_len:
                raise PromptTooLongError(
                    f"request {i}: the prompt has {len(ids)} tokens; max_model_len is "
                    f"{self.config.max_model_len} (engine.max_model_len in the config)"
                )
            prompts.append({"prompt_token_ids": ids})
            params.append(self._sampling_params(req, len(ids)))
        timeout_s = max((r.timeout_s or self.config.timeout_s) for r in requests)
        request_ids = []
        for prompt, param in zip(prompts, params):
            request_id = f"pd-{next(self._counter)}"
            self._llm.llm_engine.add_request(request_id, prompt, param)
            request_ids.append(request_id)
        outputs = self._run(request_ids, timeout_s, progress)
        return [self._result(req, outputs[rid]) for req, rid in zip(requests, request_ids)]

    def _run(self, request_ids: list[str], timeout_s: float, progress: bool) -> dict[str, Any]:
        engine = self._llm.llm_engine
        deadline = time.monotonic() + timeout_s
        done: dict[str, Any] = {}
        pending = set(request_ids)
        while pending and engine.has_unfinished_requests():
            if time.monotonic() > deadline:
                engine.abort_request(list(pending))
                raise EngineTimeoutError(
                    f"{len(pending)} of {len(request_ids)} requests unfinished after {timeout_s:.0f} s "
                    "(engine.timeout_s or the request's timeout_s); they were aborted"
                )
            for out in engine.step():
                if out.finished and out.request_id in pending:
                    done[out.request_id] = out
                    pending.discard(out.request_id)
                    if progress:
                        print(f"\r  generated {len(done)}/{len(request_ids)}", end="", file=sys.stderr)
        if progress:
            print(file=sys.stderr)
        if pending:
            raise EngineError(f"the engine stopped with {len(pending)} requests unfinished")
        return done

    def _result(self, req: GenerationRequest, out: Any) -> GenerationResult:
        completion = out.outputs[0]
        m = out.metrics
        ttft_s = float(getattr(m, "first_token_latency", 0.0) or 0.0)
        decode_s = max(0.0, float(m.last_token_ts - m.first_token_ts)) if m is not None else 0.0
        result = GenerationResult(
            text=completion.text,
            prompt_tokens=len(out.prompt_token_ids or ()),
            completion_tokens=len(completion.token_ids),
            cached_tokens=int(out.num_cached_tokens or 0),
            finish_reason=completion.finish_reason,
            ttft_ms=ttft_s * 1000.0,
            e2e_ms=(ttft_s + decode_s) * 1000.0,
        )
        result.valid, result.parsed, result.error = check_reply(req, result.text)
        return result

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - best effort on shutdown
                pass
            self._llm = None


@contextlib.contextmanager
def _hide_modules_that_break_scans() -> Iterator[None]:
    """Hide, while vLLM starts, modules holding objects that raise on ``hasattr``.

    vLLM's CPU platform scans every loaded module's attributes with ``hasattr(value,
    "__dict__")`` when it registers kernel overrides; context-local proxies such as
    Flask's ``current_app`` (imported by moto, for instance) raise RuntimeError there
    instead of AttributeError, and engine start-up fails. The modules are put back as
    they were right after.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None) or {}
        for value in list(namespace.values()):
            try:
                hasattr(value, "__dict__")
            except Exception:  # noqa: BLE001 - exactly what breaks vLLM's scan
                hidden[name] = module
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)

