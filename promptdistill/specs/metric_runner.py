"""The child process that runs a project's metric function (``python -m promptdistill.specs.metric_runner``).

Started by :func:`promptdistill.specs.plugins.run_isolated`. JSON lines on stdin: first
``{"function", "project_dir", "where"}``, then one call a line (``record_id``, ``reply``,
``parsed``, ``expected``, ``inputs``, ``reference``). One JSON line back on stdout for
each: ``{"loaded": true}`` or ``{"error": ...}`` for the first, ``{"score": ...}`` or
``{"error": ...}`` for each call. Ends at the end of its input.

Before the project's module is imported, the replies get a descriptor of their own: the
module's prints go to stderr (which the parent captures) and its reads of stdin find
nothing, so nothing it does can forge or swallow a reply.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from promptdistill.core.errors import SpecError
from promptdistill.specs.plugins import call_function, load_function


def _reply(out: Any, message: dict[str, Any]) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # the project's prints land before the parent reads them
        except (OSError, ValueError):
            pass
    out.write(json.dumps(message) + "\n")
    out.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    header = json.loads(requests.readline() or "{}")
    function, where = header.get("function", ""), header.get("where", "")
    try:
        fn = load_function(function, header.get("project_dir"))
    except SpecError as e:
        _reply(replies, {"error": str(e)})
        return
    _reply(replies, {"loaded": True})
    for line in requests:
        call = json.loads(line)
        try:
            _reply(replies, {"score": call_function(fn, call, function=function, where=where)})
        except SpecError as e:
            _reply(replies, {"error": str(e)})
        except KeyboardInterrupt:
            _reply(replies, {"error": f"{where}: metric.function {function}: record {call.get('record_id')!r}: "
                                      "raised KeyboardInterrupt"})


if __name__ == "__main__":
    main()
