"""Is a measured row the published one? A reproduction audit's verdict, as a pure function.

Users most often ask of a released set whether it scores what its paper says (issue trackers report
sets that score 37 % instead of the paper's number, 57 % instead of 63 %). A board row whose method
has a published value is **verified** when its mean over seeds lies within ``tolerance`` of the
published value, in the value's shown unit (:mod:`ddlib.specs.units`: points for accuracies, HLR and
IOR; 0-100 for LRS and ARS), or when the published value lies inside the row's seed interval (the
bootstrap interval every board row carries): the looser of the two, so that a row of few noisy seeds
is not called wrong for its noise, nor a row of many tight seeds for a gap smaller than the tolerance.
A row without a published value has no verdict (``None``), never ``False``.

Example:
    >>> verify(45.2, 46.5).verified
    True
    >>> str(verify(43.0, 46.5, low=42.0, high=44.0))
    'not verified: 43.00 against 46.50 published (-3.50; tolerance 1.50, interval [42.00, 44.00])'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TOLERANCE", "Verdict", "verify"]

TOLERANCE = 1.5  # in the value's shown unit: 1.5 points of accuracy, 1.5 on LRS's 0-100


@dataclass(frozen=True)
class Verdict:
    """One row's verdict against its published value (all values in the shown unit)."""

    verified: bool | None  # None: no published value to check against
    measured: float
    published: float
    tolerance: float
    low: float = math.nan  # the row's seed interval (NaN with one seed)
    high: float = math.nan
    by: str = ""  # "tolerance", "interval" or "" (not verified / no verdict)

    @property
    def gap(self) -> float:
        """Measured minus published."""
        return self.measured - self.published

    def __str__(self) -> str:
        if self.verified is None:
            return "no published value"
        interval = "" if math.isnan(self.low) else f", interval [{self.low:.2f}, {self.high:.2f}]"
        head = f"verified (within the {self.by})" if self.verified else "not verified"
        return (f"{head}: {self.measured:.2f} against {self.published:.2f} published ({self.gap:+.2f}; "
                f"tolerance {self.tolerance:.2f}{interval})")


def verify(measured: float, published: float | None, *, low: float = math.nan, high: float = math.nan,
           tolerance: float = TOLERANCE) -> Verdict:
    """Verdict of a measured mean against a published value, both in the value's shown unit.

    Args:
        measured: the row's mean over seeds.
        published: the paper's (or the imported published row's) value; None or NaN: no verdict.
        low, high: the row's seed interval (NaN: none, as with one seed).
        tolerance: the largest gap that still verifies (default :data:`TOLERANCE`).
    """
    if not tolerance >= 0:
        raise ValueError(f"verify: tolerance must be >= 0, got {tolerance!r}")
    if published is None or math.isnan(published) or math.isnan(measured):
        return Verdict(None, measured, math.nan if published is None else published, tolerance, low, high)
    if abs(measured - published) <= tolerance:
        return Verdict(True, measured, published, tolerance, low, high, "tolerance")
    if not math.isnan(low) and low <= published <= high:
        return Verdict(True, measured, published, tolerance, low, high, "interval")
    return Verdict(False, measured, published, tolerance, low, high)
