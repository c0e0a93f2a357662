"""Metric functions against the published DD-Ranking rows and their defining properties."""

import itertools
import math

import pytest

from ddlib import metrics

# DD-Ranking paper, CIFAR-10, w = 0.5; HLR / IOR in points, LRS as published (rounded).
PUBLISHED_LRS = [
    ("DC IPC1", 52.7, 12.4, 19.1),
    ("MTT IPC10", 23.7, 30.9, 28.4),
    ("SRe2L IPC50", 62.9, -6.5, 14.4),
]


@pytest.mark.parametrize("name,hlr_pts,ior_pts,expected", PUBLISHED_LRS)
def test_lrs_matches_published_rows(name, hlr_pts, ior_pts, expected):
    assert metrics.lrs(hlr_pts / 100, ior_pts / 100, w=0.5) == pytest.approx(expected, abs=0.15)


def test_ars_matches_published_row():
    # SRe2L ImageNet-1K IPC1: IOR without augmentation -1.2, with -1.5 -> ARS 26.3
    assert metrics.ars(ior_aug=-0.015, ior_noaug=-0.012, gamma=0.5) == pytest.approx(26.3, abs=0.15)


def test_hlr_and_ior_are_differences_of_fractions():
    assert metrics.hlr(0.9, 0.6) == pytest.approx(0.3)
    assert metrics.ior(0.6, 0.45) == pytest.approx(0.15)
    assert metrics.ior(0.4, 0.5) == pytest.approx(-0.1)


def test_score_endpoints():
    assert metrics.normalized_exp_score(-1.0) == pytest.approx(0.0)
    assert metrics.normalized_exp_score(1.0) == pytest.approx(100.0)
    # perfect distilled set: recovers full accuracy (HLR 0), far above random
    assert metrics.lrs(0.0, 1.0, w=1.0) == pytest.approx(100.0)
    assert metrics.lrs(1.0, -1.0, w=0.5) == pytest.approx(0.0)


def test_scores_stay_in_range_for_any_accuracies():
    grid = [0.0, 0.1, 0.37, 0.5, 0.93, 1.0]
    for real, syn, rdm, w in itertools.product(grid, grid, grid, [0.0, 0.1, 0.5, 0.9, 1.0]):
        score = metrics.lrs(metrics.hlr(real, syn), metrics.ior(syn, rdm), w)
        assert 0.0 <= score <= 100.0
        assert 0.0 <= metrics.ars(metrics.ior(syn, rdm), metrics.ior(rdm, syn), w) <= 100.0


def test_lrs_is_monotone_in_its_arguments():
    assert metrics.lrs(0.1, 0.2) > metrics.lrs(0.2, 0.2)  # better hard-label recovery
    assert metrics.lrs(0.1, 0.3) > metrics.lrs(0.1, 0.2)  # more improvement over random


def test_percent_inputs_are_refused():
    # The peer package's bug: points fed where fractions belong push scores out of range.
    with pytest.raises(ValueError, match="percent"):
        metrics.hlr(85.0, 60.0)
    with pytest.raises(ValueError, match="percent"):
        metrics.lrs(52.7, 12.4)
    with pytest.raises(ValueError):
        metrics.ars(-1.5, -1.2)
    with pytest.raises(ValueError):
        metrics.lrs(0.1, 0.1, w=1.5)
    with pytest.raises(ValueError):
        metrics.ior(float("nan"), 0.5)


def test_mean_std_is_population_std():
    mean, std = metrics.mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert std == pytest.approx(math.sqrt(2 / 3))
    assert all(math.isnan(x) for x in metrics.mean_std([]))
