"""How a figure is shown in text: the reports, the terminal summaries and the logs (stdlib only)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

__all__ = ["format_number", "text_table"]


def format_number(value: Any, spec: str = ".0f") -> str:
    """``value`` formatted with the format ``spec``; ``-`` for a missing figure (None or NaN).

    Example:
        >>> format_number(0.8123, "+.2f"), format_number(None), format_number(float("nan"), ".3f")
        ('+0.81', '-', '-')
    """
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return "-"
    return format(value, spec)


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], *, rule: bool = False) -> str:
    """A plain-text table: columns as wide as their widest cell, two spaces apart, no
    trailing spaces; ``rule`` draws a line of dashes under the header."""
    cells = [[str(c) for c in row] for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
