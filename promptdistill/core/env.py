"""Process defaults for an offline, quiet run, set once before heavy libraries are imported.

Each is only a default (``os.environ.setdefault``): a value the user exported wins.
The CLI, the flows, the tests and the benchmarks call :func:`apply_defaults` first.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULTS", "apply_defaults"]

DEFAULTS = {
    # litellm (under DSPy) downloads a price list at import time unless told not to.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "TOKENIZERS_PARALLELISM": "false",
    # The in-process engine without worker processes: starts in seconds, needs no __main__ guard.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_LOGGING_LEVEL": "WARNING",
    # Prefect's ephemeral server: no analytics calls out, and time to start on 2 busy cores.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


def apply_defaults() -> None:
    """Set every default that is not already set; create ``PREFECT_HOME`` if it is set.

    Prefect's ephemeral server opens its SQLite database in ``PREFECT_HOME`` without
    creating the folder ("unable to open database file" on a fresh checkout).
    """
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    home = os.environ.get("PREFECT_HOME")
    if home:
        os.makedirs(os.path.expanduser(home), exist_ok=True)
