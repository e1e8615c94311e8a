"""Numbers as people read them (a leaf): figures in tables and headers, never e-notation for
an everyday magnitude.

    readable(1432.7) -> "1,433"    readable(14.32) -> "14.3"    readable(0.01234) -> "0.0123"
    readable(7) -> "7"             readable(5.0) -> "5"         readable(nan) -> "-"
    readable(2e-5) -> "2e-05"
"""
from __future__ import annotations

import math


def readable(v, digits: int = 3) -> str:
    """`digits` significant digits, but every digit of the integer part (with thousands
    separators), trailing zeros dropped; ints as they are; None and NaN as "-"; below 0.001,
    e-notation."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    v = float(v)
    if math.isnan(v):
        return "-"
    a = abs(v)
    if math.isinf(v) or a == 0:
        return str(v) if math.isinf(v) else "0"
    if a < 1e-3:
        return f"{v:.{digits}g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(a)))
    text = f"{v:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
