"""How a figure is shown in text: the reports, the terminal summaries and the logs (stdlib only)."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["format_number"]


def format_number(value: Any, spec: str = ".0f") -> str:
    """``value`` formatted with the format ``spec``; ``-`` for a missing figure (None or NaN).

    Example:
        >>> format_number(0.8123, "+.2f"), format_number(None), format_number(float("nan"), ".3f")
        ('+0.81', '-', '-')
    """
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return "-"
    return format(value, spec)
