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

The project's code runs at arm's length (:func:`run_isolated`): a child process
(:mod:`promptdistill.specs.metric_runner`) imports the module and calls the function, with
JSON lines over a pipe, under a time bound for the import (``LOAD_TIMEOUT_ENV``) and one
per call (``CALL_TIMEOUT_ENV``). What the module prints is captured and shown in its
error only; an exit, a signal, a hang, an overflowing score or an exception whose
``str()`` fails is an error naming the spec, the function and the record. Checking a
spec (:func:`load_problem`) and ``spec validate``'s calls on records go through it; the
night's scoring makes each function's first call there and the rest in-process
(:func:`score_with`), where a hang at import or on a first record is what a broken
metric does.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from promptdistill.core.errors import ConfigError, SpecError

__all__ = ["CALL_TIMEOUT_ENV", "LOAD_TIMEOUT_ENV", "MetricFunctionError", "Outcome", "call_function", "check_score",
           "load_function", "load_problem", "run_isolated", "score_with", "source_hash", "takes_reference"]

CALL_TIMEOUT_ENV = "PROMPTDISTILL_METRIC_CALL_TIMEOUT_S"
"""The environment variable bounding one call of a project metric, in seconds (default 10)."""
LOAD_TIMEOUT_ENV = "PROMPTDISTILL_METRIC_LOAD_TIMEOUT_S"
"""The environment variable bounding the import of a project metric's module, in seconds (default 60)."""
_DEFAULT_TIMEOUT_S = {CALL_TIMEOUT_ENV: 10.0, LOAD_TIMEOUT_ENV: 60.0}
_SHOWN_OUTPUT_CHARS = 400
_SHOWN_VALUE_CHARS = 200

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
    except BaseException as e:  # noqa: BLE001 - the user's module: its error, even sys.exit()
        if path is not None:
            sys.modules.pop(unique, None)  # half-run: the next load starts afresh
        where = path or f"module {module_name!r} (not in {project_dir or 'the project'}, nor installed)"
        raise SpecError(f"metric.function: cannot import {where}: {_exception_text(e, plain=True)}") from None
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


def _exception_text(e: BaseException, *, plain: bool = False) -> str:
    """``Name: message`` for an Exception, ``Name(message)`` for another BaseException
    (``SystemExit(3)``), even when the exception's ``str()`` itself fails."""
    try:
        text = str(e)
    except BaseException as inner:  # noqa: BLE001 - the project's exception class
        text = f"(str() of the exception failed: {type(inner).__name__})"
    return f"{type(e).__name__}: {text}" if plain or isinstance(e, Exception) else f"{type(e).__name__}({text})"


def _shown(value: Any) -> str:
    """``repr(value)``, cut short, or what it is when its ``repr()`` fails."""
    try:
        text = repr(value)
    except BaseException as e:  # noqa: BLE001 - the project's class, or an int past str()'s digit limit
        return f"a value of type {type(value).__name__} (repr() failed: {_exception_text(e)})"
    return text if len(text) <= _SHOWN_VALUE_CHARS else text[:_SHOWN_VALUE_CHARS] + "..."


def check_score(value: Any, *, function: str, where: str, record_id: Any) -> float | None:
    """A function's return value as a score, or MetricFunctionError naming the record."""
    if value is None:
        return None
    shown = None
    # numbers.Real: numpy's floats and ints are scores too (numpy.bool_ is not a Real).
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            score = float(value)
        except OverflowError:
            shown = f"an {type(value).__name__} too large for a float"
        else:
            if math.isfinite(score) and 0.0 <= score <= 1.0:
                return score
    raise MetricFunctionError(f"{where}: metric.function {function}: record {record_id!r}: returned "
                              f"{shown or _shown(value)}; a score must be a number in [0, 1] or None")


@lru_cache(maxsize=64)
def takes_reference(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a ``reference`` keyword (by name or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it the old way
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "reference" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
               for p in params)


def call_function(fn: MetricFunction, call: Mapping[str, Any], *, function: str, where: str) -> float | None:
    """One call of the project's function on ``call`` (``record_id``, ``reply``, ``parsed``,
    ``expected``, ``inputs``, ``reference``), in this process; its score.

    Raises:
        MetricFunctionError: it raised (any BaseException but KeyboardInterrupt) or
            returned something that is not a score.
    """
    record_id = call["record_id"]
    extra = {"reference": call.get("reference")} if takes_reference(fn) else {}
    try:
        value = fn(call["reply"], call["parsed"], call["expected"], dict(call["inputs"]), **extra)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the project's code: any failure is reported as its own
        raise MetricFunctionError(f"{where}: metric.function {function}: record {record_id!r}: raised "
                                  f"{_exception_text(e)}") from None
    return check_score(value, function=function, where=where, record_id=record_id)


# --- at arm's length: a child process per run ---------------------------------------------------


class Outcome(NamedTuple):
    """One isolated call: its score, or the error naming the spec, the function and the record."""

    score: float | None = None
    error: str | None = None


def _timeout_s(name: str) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return _DEFAULT_TIMEOUT_S[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a positive number of seconds, got {raw!r}")
    return value


def _ended(returncode: int | None) -> str:
    if returncode is None:
        return "without a reply"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class _MetricProcess:
    """The child that runs one project function (see :mod:`promptdistill.specs.metric_runner`).

    Its stdout carries only our JSON replies (the runner moves the project's prints to its
    stderr), and its stderr goes to a temporary file, so a chatty metric can neither fill
    a pipe nor reach our output.
    """

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        self.output = tempfile.TemporaryFile()
        self.shown_up_to = 0
        self.buffer = b""
        # Its own session: stopping it also stops whatever the project's code started.
        self.proc = subprocess.Popen([sys.executable, "-m", "promptdistill.specs.metric_runner"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.output, env=env,
                                     start_new_session=True)

    def request(self, message: Mapping[str, Any], timeout_s: float) -> dict[str, Any] | str:
        """The child's reply to ``message``, or why there is none (``took longer ...``, ``ended (...)``)."""
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it has gone already
            return self._ended()
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.stop()
                return f"took longer than {timeout_s:g} s"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return self._ended()
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def _ended(self) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.stop()
            code = None
        return f"the metric's process ended ({_ended(code)})"

    def printed(self) -> str:
        """What the project's code printed since the last call, as `` (it printed: '...')``."""
        self.output.seek(self.shown_up_to)
        data = self.output.read()
        self.shown_up_to += len(data)
        text = data.decode("utf-8", "replace").strip()
        if not text:
            return ""
        return f" (it printed: {text if len(text) <= _SHOWN_OUTPUT_CHARS else '...' + text[-_SHOWN_OUTPUT_CHARS:]!r})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the runner ends at the end of its input
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.stop()
        self.proc.stdout.close()
        self.output.close()


def _target(function: str, project_dir: str | None) -> str:
    module = _split(function)[0]
    return str(_module_file(module, project_dir) or f"module {module!r}")


def run_isolated(function: str, project_dir: str | None, calls: Sequence[Mapping[str, Any]], *,
                 where: str) -> list[Outcome]:
    """Import the function in a child process and call it on each of ``calls`` (as
    :func:`call_function` takes them), each within its time bound.

    Returns:
        One outcome per call, in order; after a call that ended or hung the process, the
        rest are not made (the list is shorter).

    Raises:
        SpecError: ``metric.function: ...``: the reference is malformed, or the module does
            not import (an error, no such callable, longer than its bound, or an exit).
        ConfigError: a time bound's environment variable is not a positive number.
    """
    load_s, call_s = _timeout_s(LOAD_TIMEOUT_ENV), _timeout_s(CALL_TIMEOUT_ENV)
    target = _target(function, project_dir)
    child = _MetricProcess()
    try:
        reply = child.request({"function": function, "project_dir": project_dir, "where": where}, load_s)
        if isinstance(reply, str) or "error" in reply:
            why = reply if isinstance(reply, str) else None
            if why and why.startswith("took longer"):
                why += f" ({LOAD_TIMEOUT_ENV}); stopped"
            message = f"metric.function: importing {target} {why}" if why else reply["error"]
            raise SpecError(message + child.printed())
        outcomes = []
        for call in calls:
            named = f"{where}: metric.function {function}: record {call['record_id']!r}"
            try:
                reply = child.request(call, call_s)
            except (TypeError, ValueError) as e:  # a value JSON cannot carry
                outcomes.append(Outcome(error=f"{named}: cannot pass the record to the metric: {e}"))
                continue
            if isinstance(reply, str):
                if reply.startswith("took longer"):
                    reply += f" ({CALL_TIMEOUT_ENV}); stopped"
                outcomes.append(Outcome(error=f"{named}: {reply}{child.printed()}"))
                break
            if "error" in reply:
                outcomes.append(Outcome(error=reply["error"] + child.printed()))
            else:
                child.printed()  # a call that scored: its output is not shown
                outcomes.append(Outcome(score=check_score(reply["score"], function=function, where=where,
                                                          record_id=call["record_id"])))
        return outcomes
    finally:
        child.close()


@lru_cache(maxsize=64)
def _load_problem(function: str, project_dir: str | None, mtime_ns: int, load_s: float) -> str | None:
    try:
        run_isolated(function, project_dir, [], where="")
    except SpecError as e:
        return str(e)
    return None


def load_problem(function: str, project_dir: str | None) -> str | None:
    """Why the function cannot be loaded (``metric.function: ...``), found in a child process
    within the import's time bound; None when it loads. Remembered until the file changes."""
    try:
        path = _module_file(_split(function)[0], project_dir)
    except SpecError as e:
        return str(e)
    return _load_problem(function, project_dir, _mtime_ns(path), _timeout_s(LOAD_TIMEOUT_ENV))


def _mtime_ns(path: Path | None) -> int:
    try:
        return path.stat().st_mtime_ns if path else 0
    except OSError:
        return -1


_FIRST_CALL_MADE: set[tuple[str, str | None, int]] = set()


def score_with(function: str, project_dir: str | None, call: Mapping[str, Any], *, where: str) -> float | None:
    """Score one call for scoring at speed: a function's first call (per process and version
    of its file) runs at arm's length (:func:`run_isolated`), the rest in this process.

    Raises:
        MetricFunctionError: the call failed (see :func:`call_function`); SpecError: the
            function does not load.
    """
    key = (function, project_dir, _mtime_ns(_module_file(_split(function)[0], project_dir)))
    if key not in _FIRST_CALL_MADE:
        try:
            outcome = run_isolated(function, project_dir, [call], where=where)[0]
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
        if outcome.error:
            raise MetricFunctionError(outcome.error)
        _FIRST_CALL_MADE.add(key)
        return outcome.score
    return call_function(load_function(function, project_dir), call, function=function, where=where)
