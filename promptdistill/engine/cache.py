"""A disk cache of LM results, so re-running with the same seed makes no new LM calls.

``CachedEngine`` wraps any ``Engine``. A result is stored under
``sha256(engine.identity.key() + request.key())``: the same request to the same model on
the same engine build and hardware is answered from disk, anything else goes to the
engine. Misses of one ``generate`` call are sent to the wrapped engine as ONE batch.

What is not cached: results of requests that failed (``error`` set on an unconstrained
request, or a ``finish_reason`` of ``"error"``/``"abort"``), so a transient failure is
retried next time. Invalid structured replies *are* cached: at temperature 0 with a
seed they are what the model answers, and re-asking would only spend calls.

Timings of a cached result are those of the original call; a result served from the
cache has ``extra["cache_hit"] = True``. Do not fit TTFT models on cached results.

Example:
    >>> cached = CachedEngine(engine, ".promptdistill/lm_cache.sqlite")  # doctest: +SKIP
    >>> cached.generate([GenerationRequest(prompt="Hi")])                # doctest: +SKIP
    >>> cached.real_calls, cached.cache_hits                            # doctest: +SKIP
    (1, 0)
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Sequence

from promptdistill.engine.base import Engine, EngineWrapper, GenerationRequest, GenerationResult

__all__ = ["CachedEngine", "cache_key"]

_FAILED_FINISH = ("error", "abort")


def cache_key(engine: Engine, request: GenerationRequest) -> str:
    """The key a result is stored under: engine identity + every request field that can
    change the reply (``timeout_s`` cannot, so it is left out)."""
    content = request.replace(timeout_s=None) if request.timeout_s is not None else request
    return hashlib.sha256(f"{engine.identity.key()}:{content.key()}".encode()).hexdigest()


def _cacheable(request: GenerationRequest, result: GenerationResult) -> bool:
    if result.finish_reason in _FAILED_FINISH:
        return False
    # An error on a constrained request means an invalid reply (a real answer); on any
    # other request it means the request itself failed.
    return result.error is None or request.json_schema is not None or request.choices is not None


class CachedEngine(EngineWrapper):
    """An ``Engine`` that answers repeated requests from a SQLite file.

    Args:
        engine: The engine to call on a miss.
        path: The SQLite file (created with its parent folder if missing).

    Attributes:
        real_calls: Requests sent to the wrapped engine since creation.
        cache_hits: Requests answered from the cache since creation.
    """

    def __init__(self, engine: Engine, path: str | os.PathLike[str]):
        super().__init__(engine)
        self.path = Path(path)
        self.real_calls = 0
        self.cache_hits = 0
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, result TEXT NOT NULL)")
        self._db.commit()

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = False) -> list[GenerationResult]:
        """Answer from the cache where possible; send every miss to the engine in one batch."""
        keys = [cache_key(self.engine, r) for r in requests]
        found = self._lookup(set(keys))
        results: list[GenerationResult | None] = [None] * len(requests)
        misses: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            if key in found:
                results[i] = _result_from_json(found[key], cache_hit=True)
                self.cache_hits += 1
            else:
                misses.setdefault(key, []).append(i)
        if misses:
            # Identical requests within one batch are sent once.
            order = list(misses)
            fresh = self.engine.generate([requests[misses[k][0]] for k in order], progress=progress)
            self.real_calls += len(order)
            rows = []
            for key, result in zip(order, fresh):
                for n, i in enumerate(misses[key]):
                    results[i] = result if n == 0 else _result_from_json(_result_to_json(result), cache_hit=True)
                    self.cache_hits += n > 0
                if _cacheable(requests[misses[key][0]], result):
                    rows.append((key, _result_to_json(result)))
            self._store(rows)
        return [r for r in results if r is not None]

    def _lookup(self, keys: set[str]) -> dict[str, str]:
        if not keys:
            return {}
        out: dict[str, str] = {}
        keys_list = sorted(keys)
        with self._lock:
            for start in range(0, len(keys_list), 500):
                chunk = keys_list[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, value in self._db.execute(f"SELECT key, result FROM results WHERE key IN ({marks})", chunk):
                    out[key] = value
        return out

    def _store(self, rows: list[tuple[str, str]]) -> None:
        if not rows:
            return
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO results (key, result) VALUES (?, ?)", rows)
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        """Close the cache file (the wrapped engine stays open: its owner closes it)."""
        with self._lock:
            self._db.close()


def _result_to_json(result: GenerationResult) -> str:
    data = result.to_dict()
    data["extra"] = {k: v for k, v in data.get("extra", {}).items() if k != "cache_hit"}
    return json.dumps(data, ensure_ascii=False, default=str)


def _result_from_json(text: str, *, cache_hit: bool) -> GenerationResult:
    data = json.loads(text)
    extra = dict(data.pop("extra", {}) or {})
    extra["cache_hit"] = cache_hit
    return GenerationResult(**data, extra=extra)
