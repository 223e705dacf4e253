"""A project's own metric: ``metric: {kind: python, function: "module:callable"}``.

The module is looked up in the project that holds the spec (the folder above ``prompts/``:
``metrics/args.py`` for ``metrics.args:score``), then among installed modules. The
function is called once per reply::

    def score(reply_text: str, parsed: Any, expected: Any, inputs: Mapping[str, Any]) -> float | None

``parsed`` is the reply's JSON (None when it does not parse); ``expected`` is the record's
expected output (or, for label-free records, the baseline prompt's reply); the return
value is a score in [0, 1], or None when the record cannot be scored (it is then left out
of the mean, as an unscored judge verdict is). Anything else, or an exception, is an
error naming the spec, the function and the record: never a silent 0.

The module's source bytes are hashed into the spec's hash (:func:`source_hash`): a
changed metric invalidates cached results and shows in provenance.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import numbers
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from promptdistill.core.errors import SpecError

__all__ = ["MetricFunctionError", "check_score", "load_function", "source_hash"]

MetricFunction = Callable[[str, Any, Any, Any], Any]


class MetricFunctionError(SpecError):
    """A project metric function failed or returned something that is not a score."""


def _split(function: str) -> tuple[str, str]:
    module, sep, name = function.partition(":")
    if not sep or not module or not name or not all(p.isidentifier() for p in [*module.split("."), name]):
        raise SpecError(f"metric.function: must be 'module:callable' (for example 'metrics.args:score'), "
                        f"got {function!r}")
    return module, name


def _module_file(module: str, project_dir: str | None) -> Path | None:
    if project_dir is None:
        return None
    base = Path(project_dir, *module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@lru_cache(maxsize=64)
def _load(function: str, project_dir: str | None, mtime_ns: int) -> MetricFunction:
    module_name, attr = _split(function)
    path = _module_file(module_name, project_dir)
    try:
        if path is not None:
            # A private name: a project's metrics.py must not shadow (or be shadowed by) another's.
            unique = f"promptdistill_project_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}_{module_name}"
            spec = importlib.util.spec_from_file_location(unique, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[unique] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - the user's module: its error, even sys.exit()
        if path is not None:
            sys.modules.pop(unique, None)  # half-run: the next load starts afresh
        where = path or f"module {module_name!r} (not in {project_dir or 'the project'}, nor installed)"
        raise SpecError(f"metric.function: cannot import {where}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SpecError(f"metric.function: {function!r}: {path or module_name} has no callable {attr!r}")
    return fn


def load_function(function: str, project_dir: str | None) -> MetricFunction:
    """The project's metric function (reloaded when its file changes).

    Raises:
        SpecError: the reference is malformed, the module does not import, or the name is
            not a callable in it.
    """
    path = _module_file(_split(function)[0], project_dir)
    return _load(function, project_dir, path.stat().st_mtime_ns if path else 0)


def source_hash(function: str, project_dir: str | None) -> str:
    """sha256 of the metric module's source ('' for an installed module outside the project)."""
    path = _module_file(_split(function)[0], project_dir)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path else ""


def check_score(value: Any, *, function: str, where: str, record_id: Any) -> float | None:
    """A function's return value as a score, or MetricFunctionError naming the record."""
    if value is None:
        return None
    # numbers.Real: numpy's floats and ints are scores too (numpy.bool_ is not a Real).
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise MetricFunctionError(f"{where}: metric.function {function}: record {record_id!r}: returned {value!r}; "
                                  "a score must be a number in [0, 1] or None")
    return float(value)
