"""Issue 57, 3: a row is verified against its published value within a stated tolerance or its seed interval.

Hand-worked values: a gap of 1.3 points passes the 1.5-point tolerance; 3.5 points fails it but passes when
the published value lies inside the row's seed interval; a row without a published value has no verdict."""

import doctest
import math

import pytest

from ddlib.scores import verify as verify_module
from ddlib.scores.verify import TOLERANCE, verify


def test_the_modules_examples_hold():
    failed, tried = doctest.testmod(verify_module)
    assert tried and not failed


def test_a_gap_within_the_tolerance_verifies():
    verdict = verify(45.2, 46.5)
    assert TOLERANCE == 1.5 and verdict.verified is True and verdict.by == "tolerance"
    assert verdict.gap == pytest.approx(-1.3)


def test_the_tolerance_bound_is_inclusive_and_the_gap_above_it_fails():
    assert verify(48.0, 46.5).verified is True  # exactly 1.5
    assert verify(48.01, 46.5).verified is False


def test_a_published_value_inside_the_seed_interval_verifies():
    inside = verify(43.0, 46.5, low=41.0, high=47.0)
    outside = verify(43.0, 46.5, low=42.0, high=44.0)
    assert (inside.verified, inside.by) == (True, "interval")
    assert outside.verified is False and "not verified" in str(outside) and "-3.50" in str(outside)


def test_one_seed_has_no_interval_to_fall_back_on():
    assert verify(43.0, 46.5).verified is False


def test_no_published_value_gives_no_verdict_not_false():
    assert verify(43.0, None).verified is None and verify(43.0, math.nan).verified is None
    assert str(verify(43.0, None)) == "no published value"


def test_a_tolerance_of_its_own():
    assert verify(43.0, 46.5, tolerance=4.0).verified is True
    with pytest.raises(ValueError, match="tolerance must be >= 0"):
        verify(43.0, 46.5, tolerance=-1)


def test_a_board_row_is_verified_against_its_published_row_value_by_value():
    """Hand-worked: the board holds fractions for HLR and IOR (points when shown) and LRS on 0-100.
    dm: HLR 31.5 against 33.0 published (-1.5: within), IOR 12.25 against 20.0 (-7.75, outside its interval
    [11.0, 13.5]): not verified. kcenter: LRS 40.0 against 41.2 (-1.2): verified. random: nothing published."""
    import pandas as pd

    from ddlib.report.published import with_verified

    board = pd.DataFrame([
        {"dataset": "cifar10", "ipc": 10, "method": "dm", "model": "convnet", "hlr_mean": 0.315, "hlr_low": 0.30,
         "hlr_high": 0.33, "ior_mean": 0.1225, "ior_low": 0.11, "ior_high": 0.135, "lrs_mean": 24.1},
        {"dataset": "cifar10", "ipc": 10, "method": "kcenter", "model": "convnet", "hlr_mean": 0.2, "ior_mean": 0.1,
         "lrs_mean": 40.0},
        {"dataset": "cifar10", "ipc": 10, "method": "random", "model": "convnet", "hlr_mean": 0.2, "ior_mean": 0.0,
         "lrs_mean": 30.0}])
    published = pd.DataFrame([
        {"dataset": "cifar10", "ipc": 10, "method": "DM", "model": None, "hlr_mean": 0.33, "ior_mean": 0.20,
         "lrs_mean": float("nan")},
        {"dataset": "cifar10", "ipc": 10, "method": "KCenter", "model": "convnet", "hlr_mean": float("nan"),
         "ior_mean": float("nan"), "lrs_mean": 41.2},
        {"dataset": "cifar10", "ipc": 1, "method": "random", "model": None, "hlr_mean": 0.1, "ior_mean": 0.0,
         "lrs_mean": 30.0}])
    out = with_verified(board, published)
    assert list(out["verified"]) == [False, True, None]
    dm, kcenter, rnd = out["verified_by"]
    assert dm.startswith("HLR verified (within the tolerance): 31.50 against 33.00") and "IOR not verified" in dm
    assert kcenter == "LRS verified (within the tolerance): 40.00 against 41.20 published (-1.20; tolerance 1.50)"
    assert rnd == ""
    assert with_verified(board, published.iloc[2:]).equals(board)  # nothing published matches: unchanged
