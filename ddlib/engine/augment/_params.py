"""Validation of op parameters read from YAML: numbers (YAML reads ``1e-3`` and ``3/4`` as strings:
:func:`ddlib.specs.registry.parse_number`), integers and ``[low, high]`` pairs, range-checked, each error
naming the op and the key."""

from __future__ import annotations

import numbers

from ddlib.specs.registry import parse_number


def _number(op: str, key: str, value, *, lo=None, hi=None, lo_open=False) -> float:
    """A float from YAML (which reads ``1e-3`` or ``3/4`` as strings), range-checked, naming op and key."""
    v = parse_number(value, f"augmentation op {op!r}: {key!r}")
    if (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
        bounds = f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"augmentation op {op!r}: {key!r} must be in {bounds}, got {value!r}")
    return v


def _int_param(op: str, key: str, value, lo: int, hi: int | None = None) -> int:
    bad_type = isinstance(value, bool) or not isinstance(value, numbers.Integral)
    if bad_type or value < lo or (hi is not None and value > hi):
        bounds = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"augmentation op {op!r}: {key!r} must be an integer {bounds}, got {value!r}")
    return int(value)


def _pair(op: str, key: str, value, *, lo_open=False) -> tuple[float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"augmentation op {op!r}: {key!r} must be a pair [low, high], got {value!r}")
    a, b = (_number(op, key, v, lo=0.0, lo_open=lo_open) for v in value)
    if a > b:
        raise ValueError(f"augmentation op {op!r}: {key!r} must have low <= high, got {value!r}")
    return a, b
