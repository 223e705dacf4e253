"""Canonical JSON and the hashes the registry stores (stdlib only).

A value is hashed as the sha256 of its canonical JSON: sorted keys, no whitespace,
UTF-8, no NaN or infinity. ``to_json_value`` is applied before anything is stored or
hashed, so what is hashed at publish time is exactly what a reader parses back
(tuples become lists, numpy scalars become Python numbers).
"""

from __future__ import annotations

import hashlib
from typing import Any

from promptdistill.core.errors import RegistryError
from promptdistill.core.jsonio import NotJSONError, canonical_json
from promptdistill.core.jsonio import to_json_value as core_to_json_value

__all__ = ["content_hash", "sha256_hex", "to_json_value"]


def sha256_hex(data: bytes | str) -> str:
    """``sha256:<hex>`` of bytes or of UTF-8 text."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def content_hash(content: Any) -> str:
    """The hash of a template's content (what a service logs as "which template ran")."""
    return sha256_hex(canonical_json(content))


def to_json_value(value: Any, where: str = "value") -> Any:
    """A plain-JSON copy of ``value`` (see :func:`promptdistill.core.jsonio.to_json_value`).

    Raises:
        RegistryError: naming the field (``where.key[0]``) that is not JSON, or holds a
            lone surrogate (``"\\ud800"``: not Unicode text, UTF-8 cannot store it), or the
            value that nests deeper than the interpreter's recursion limit.
    """
    try:
        plain = core_to_json_value(value, where)
        _check_text(plain, where)
        return plain
    except NotJSONError as e:
        raise RegistryError(str(e)) from None
    except RecursionError:
        raise RegistryError(f"{where}: nested too deeply") from None


def _check_text(value: Any, where: str) -> None:
    """Raise RegistryError naming the first string (or key) in ``value`` that is not valid
    Unicode text: a lone surrogate from a ``"\\ud800"`` JSON escape would otherwise fail
    later, as a UnicodeEncodeError, when the record is encoded to be stored."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RegistryError(f"{where}: holds a lone surrogate {value[e.start]!r} at char {e.start}; "
                                "not valid Unicode text (UTF-8 cannot store it)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, f"{where}: key {key!r}")
            _check_text(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_text(item, f"{where}[{i}]")
