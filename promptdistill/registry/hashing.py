"""Canonical JSON and the hashes the registry stores (stdlib only).

A value is hashed as the sha256 of its canonical JSON: sorted keys, no whitespace,
UTF-8, no NaN or infinity. ``to_json_value`` is applied before anything is stored or
hashed, so what is hashed at publish time is exactly what a reader parses back
(tuples become lists, numpy scalars become Python numbers).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from promptdistill.errors import RegistryError

__all__ = ["canonical_json", "content_hash", "sha256_hex", "to_json_value"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the stable input of every hash.

    Raises:
        ValueError: the value holds NaN or infinity (not JSON).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(data: bytes | str) -> str:
    """``sha256:<hex>`` of bytes or of UTF-8 text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def content_hash(content: Any) -> str:
    """The hash of a template's content (what a service logs as "which template ran")."""
    return sha256_hex(canonical_json(content))


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RegistryError(f"{where}: {value!r} is not JSON; store None for a missing number")
        return value
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise RegistryError(f"{where}: key {k!r} is not a string")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    # numpy / pandas scalars and arrays, without importing them.
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return _plain(value.item(), where)
    if hasattr(value, "tolist") and callable(value.tolist):
        return _plain(value.tolist(), where)
    raise RegistryError(f"{where}: a {type(value).__name__} is not JSON (use str, number, bool, None, list or dict)")


def to_json_value(value: Any, where: str = "value") -> Any:
    """A plain-JSON copy of ``value``: dicts with str keys, lists, str, int, float, bool, None.

    Raises:
        RegistryError: naming the field (``where.key[0]``) that is not JSON.
    """
    return _plain(value, where)
