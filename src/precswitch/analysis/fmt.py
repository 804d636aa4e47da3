"""Numbers for people: a fixed number of decimals per unit, signs only where they mean something.

- accuracy differences in points: 2 decimals (``+1.23``, ``−0.45``); a difference that rounds to zero is
  ``0.00`` (no sign: an exact tie and a 1e−15 rounding residue read the same);
- losses in nats: 3 decimals, the same zero rule;
- ratios (time, memory, throughput): 3 significant digits (``×0.873``, ``×1.02``, ``×12.3``);
- p-values: 3 decimals, ``< 0.001`` below, never rounded up to a usual alpha they are below.

A minus sign is U+2212; a missing value is ``n/a``.
"""

from __future__ import annotations

import math
from typing import Any

#: decimals of a difference, by its unit (Metric.delta_unit)
DECIMALS = {"points": 2, "MCC x 100": 2, "nats": 3}
#: the usual alphas: a p-value below one of them never prints as it (fmt_p)
P_THRESHOLDS = (0.2, 0.1, 0.05, 0.025, 0.01, 0.005)
NA = "n/a"


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def num(v: Any, decimals: int = 2, sign: bool = False) -> str:
    """``v`` with ``decimals`` decimals; one that rounds to zero prints as 0.00 whatever its sign."""
    if not finite(v):
        return NA
    s = f"{v:.{decimals}f}"
    if float(s) == 0:
        return f"{0:.{decimals}f}"
    if sign and v > 0:
        s = "+" + s
    return s.replace("-", "−")


def diff(v: Any, unit: str = "points") -> str:
    """A paired difference in its unit's decimals, signed: ``+1.23``, ``−0.45``, ``0.00``."""
    return num(v, DECIMALS.get(unit, 2), sign=True)


#: a ratio outside these bounds prints as the bound (``<0.001``, ``>1000``): such a value (an interval's end
#: from two noisy seeds) says only "uninformative", and its digits would read like a measurement
RATIO_BOUNDS = (0.001, 1000.0)


def ratio(v: Any) -> str:
    """A ratio to 3 significant digits: ``0.873``, ``1.02``, ``12.3``; ``<0.001`` and ``>1000`` beyond
    :data:`RATIO_BOUNDS` (no exponents)."""
    if not finite(v):
        return NA
    if v == 0:
        return "0"
    if abs(v) < RATIO_BOUNDS[0]:
        return f"<{RATIO_BOUNDS[0]:g}"
    if abs(v) > RATIO_BOUNDS[1]:
        return f">{RATIO_BOUNDS[1]:g}"
    dec = max(0, 2 - math.floor(math.log10(abs(v))))
    return f"{v:.{dec}f}".replace("-", "−")


def interval(lo: Any, hi: Any, one=diff, **kw) -> str:
    """``[lo, hi]`` formatted like the value (``one``); '' when either bound is missing."""
    if not (finite(lo) and finite(hi)):
        return ""
    return f"[{one(lo, **kw)}, {one(hi, **kw)}]"


def with_ci(mean: Any, lo: Any, hi: Any, one=diff, **kw) -> str:
    """``+1.23 [−0.40, +2.86]``; the value alone without an interval; n/a without a value."""
    if not finite(mean):
        return NA
    ci = interval(lo, hi, one, **kw)
    return f"{one(mean, **kw)} {ci}".rstrip()


def ratio_ci(r: dict | None) -> str:
    """``×0.873 [0.861, 0.885]`` of a ratio row of deltas."""
    if not r or not finite(r.get("mean")):
        return NA
    return "×" + with_ci(r["mean"], r.get("ci_low"), r.get("ci_high"), ratio)


def fmt_p(v: Any) -> str:
    """A p-value to 3 decimals ('< 0.001' below), with more digits where 3 decimals would round it up to a
    usual alpha (P_THRESHOLDS) that it is below: 0.0496 prints '0.0496', not '0.050' beside 'better'."""
    if not finite(v):
        return NA
    if v < 0.001:
        return "< 0.001"
    s = f"{v:.3f}"
    if v < float(s) and float(s) in P_THRESHOLDS:
        for nd in range(4, 10):
            s = f"{v:.{nd}f}"
            if float(s) < v or float(s) not in P_THRESHOLDS:
                break
    return s


def conf_level(alpha: float) -> str:
    """The confidence level of the (1 − alpha) intervals: '95', '97.5', '99.9' (alpha 0.001 is not '100')."""
    return f"{round((1 - alpha) * 100, 6):g}"


def mib(v: Any) -> str:
    """Bytes as MiB with one decimal: ``412.3``."""
    return num(v / 2**20, 1) if finite(v) else NA


def seeds(v: Any) -> str:
    """A seed count: a whole number, '> 10000' for infinity, n/a when unknown."""
    if isinstance(v, (int, float)) and v == math.inf:
        return "> 10000"
    return str(int(v)) if finite(v) else NA


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
