"""Bootstrap intervals over seeds, paired comparisons, rank groups and Kendall's tau (ddlib.scores.stats)."""

import math

import numpy as np
import pandas as pd
import pytest

from ddlib.scores import metrics

from ddlib.scores import stats
def test_percentile_interval_of_three_seeds_is_their_range():
    # 3 seeds: the resample mean is 1 (all three draws seed 1) with probability 1/27 = 3.7 % > 2.5 %,
    # and 3 likewise, so the 95 % percentile interval is exactly [1, 3]; the estimate is the mean.
    ci = stats.bootstrap_ci([1.0, 2.0, 3.0])
    assert (ci.estimate, ci.low, ci.high, ci.seeds) == (2.0, 1.0, 3.0, 3)
    assert ci.level == 0.95 and ci.resamples == 2000 and "percentile" in ci.method


def test_interval_narrows_with_more_seeds_and_is_reproducible():
    few = np.array([0.58, 0.60, 0.62])
    many = np.tile(few, 10)  # the same spread over 30 seeds
    w_few = stats.bootstrap_ci(few)
    w_many = stats.bootstrap_ci(many)
    assert (w_many.high - w_many.low) < (w_few.high - w_few.low)
    assert stats.bootstrap_ci(many) == w_many  # same data, same generator seed: same interval
    assert stats.bootstrap_ci(many, seed=5) != w_many


def test_one_seed_gives_no_interval():
    ci = stats.bootstrap_ci([0.7])
    assert ci.estimate == 0.7 and math.isnan(ci.low) and math.isnan(ci.high) and ci.seeds == 1
    assert "no interval" in str(ci)


def test_a_non_linear_score_is_recomputed_from_the_resampled_tuples():
    """LRS of the mean HLR and IOR over the drawn seeds: the estimate is the score of the seeds' tuples
    (not the mean of per-seed scores), and every resample value is such a score of drawn tuples."""
    tuples = np.array([[0.95, 0.60, 0.60, 0.30],   # real_hard, syn_hard, syn_any, rdm_any per seed
                       [0.95, 0.20, 0.20, 0.25],
                       [0.94, 0.55, 0.55, 0.50]])

    def lrs_of_means(t):
        return metrics.lrs(metrics.hlr(t[:, 0].mean(), t[:, 1].mean()), metrics.ior(t[:, 2].mean(), t[:, 3].mean()))

    ci = stats.bootstrap_ci(tuples, lrs_of_means)
    # by hand: the seeds' alphas (w IOR - (1 - w) HLR, w = 0.5) are -0.025, -0.4 and -0.17; the score of
    # their mean -0.19833 is 100 (e^alpha - e^-1) / (e - e^-1) = 19.2400 (the mean of the seeds' scores
    # would be 19.6513)
    assert ci.estimate == pytest.approx(19.2400, abs=1e-4)
    # alpha = w IOR - (1 - w) HLR of the drawn means is the mean of the drawn seeds' alphas (-0.025,
    # -0.4, -0.17 by hand), so the lowest resample is seed 1 three times and the highest seed 0 three
    # times, each drawn with probability 1/27 > 2.5 %: the 95 % interval is LRS at alpha -0.4 and -0.025,
    # 100 (e^alpha - e^-1) / (e - e^-1) = 12.8676 and 25.8437
    assert (ci.low, ci.high) == pytest.approx((12.8676, 25.8437), abs=1e-4)
    # the interval of the score is not the score at the interval ends of its inputs
    syn = stats.bootstrap_ci(tuples[:, 1])
    naive_low = metrics.lrs(metrics.hlr(0.947, syn.low), metrics.ior(syn.low, tuples[:, 3].mean()))
    assert ci.low != pytest.approx(naive_low, abs=0.5)


def test_the_vectorised_mean_intervals_use_the_same_draws():
    rng = np.random.default_rng(2)
    values = rng.uniform(0, 1, (5, 3))
    values[1, 2] = np.nan  # a value missing for one seed is left out of that resample's mean
    low, high = stats.bootstrap_mean_intervals(values)
    for c in range(2):
        ci = stats.bootstrap_ci(values[:, c])
        assert (low[c], high[c]) == pytest.approx((ci.low, ci.high))
    assert np.isfinite(low[2]) and low[2] <= np.nanmean(values[:, 2]) <= high[2]
    one_low, one_high = stats.bootstrap_mean_intervals(values[:1])
    assert np.isnan(one_low).all() and np.isnan(one_high).all()


def test_pairing_by_seed_finds_a_small_consistent_lead_that_unpaired_resampling_calls_noise():
    # seed-to-seed spread (+-10 points) far larger than the lead (+1 point on every seed)
    base = np.array([0.50, 0.70, 0.60, 0.80, 0.55])
    a, b = base + 0.01, base
    paired = stats.paired_difference(a, b, seeds_a=[0, 1, 2, 3, 4], seeds_b=[0, 1, 2, 3, 4])
    assert paired.paired and paired.significant and paired.difference == pytest.approx(0.01)
    assert paired.low == pytest.approx(0.01) and paired.high == pytest.approx(0.01)
    unpaired = stats.paired_difference(a, b)
    assert not unpaired.paired and not unpaired.significant and unpaired.low < 0 < unpaired.high


def test_pairs_are_matched_by_seed_id_not_position():
    a = np.array([0.61, 0.81, 0.71])  # seeds 0, 2, 1
    b = np.array([0.70, 0.60, 0.80])  # seeds 1, 0, 2: a leads by 1 point on each seed
    cmp = stats.paired_difference(a, b, seeds_a=[0, 2, 1], seeds_b=[1, 0, 2])
    assert cmp.paired and cmp.significant and cmp.low == pytest.approx(0.01) and cmp.seeds == 3
    # only the shared seeds are used; fewer than two shared: unpaired
    assert stats.paired_difference(a, b, seeds_a=[0, 2, 1], seeds_b=[1, 5, 6]).paired is False


def test_no_significance_from_a_single_seed():
    cmp = stats.paired_difference([0.9], [0.1])
    assert cmp.difference == pytest.approx(0.8) and not cmp.significant and math.isnan(cmp.low)


def test_rank_groups_separate_only_significant_differences():
    names, scores = ["A", "B", "C"], [70.0, 69.0, 50.0]
    both_beat_c = {frozenset("AC"), frozenset("BC")}
    ranks = stats.rank_groups(names, scores, lambda i, j: frozenset(names[i] + names[j]) in both_beat_c)
    assert list(ranks["rank"]) == [1, 1, 3]
    assert list(ranks["tied_with"]) == [["B"], ["A"], []]
    # a chain: A ~ B, B ~ C, but A > C
    chain = {frozenset("AC")}
    ranks = stats.rank_groups(names, scores, lambda i, j: frozenset(names[i] + names[j]) in chain)
    assert list(ranks["rank"]) == [1, 1, 2] and list(ranks["tied_with"]) == [["B"], ["A", "C"], ["B"]]
    # lower is better (e.g. HLR)
    low = stats.rank_groups(names, scores, lambda i, j: True, higher_is_better=False)
    assert list(low["rank"]) == [3, 2, 1]
    # each pair is tested once, so "tied with" is symmetric whatever the test
    asked = []
    stats.rank_groups(list("ABCD"), [4.0, 3.0, 2.0, 1.0], lambda i, j: asked.append((i, j)) or i == 0)
    assert sorted(asked) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


def test_kendall_tau_and_rank_stability():
    assert stats.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert stats.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert stats.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)  # one discordant pair of 6
    assert math.isnan(stats.kendall_tau([1, 2], [5, 5])) and math.isnan(stats.kendall_tau([1], [2]))
    scores = pd.DataFrame({"w=0.1": [1.0, 2.0, 3.0], "w=0.5": [1.0, 3.0, 2.0], "w=0.9": [3.0, 2.0, 1.0]},
                          index=["random", "kcenter", "dm"])
    table = stats.rank_stability(scores, reference="w=0.5").set_index("setting")
    assert list(table.index) == ["w=0.1", "w=0.9"]
    assert table.loc["w=0.1", "tau"] == pytest.approx(1 / 3) and table.loc["w=0.9", "tau"] == pytest.approx(-1 / 3)
    assert set(stats.rank_stability(scores)["reference"]) == {"mean over settings"}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one tuple of values per seed"):
        stats.bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        stats.bootstrap_ci([1, 2], level=95)
    with pytest.raises(ValueError, match="seeds_a"):
        stats.paired_difference([1, 2], [1, 2], seeds_a=[0], seeds_b=[0, 1])
