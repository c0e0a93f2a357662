"""Coreset baselines (issue 27.4): herding, forgetting and EL2N on hand-worked cases, then each as a
source a grid names, through a tiny digits label_robust cell."""

from __future__ import annotations

import math

import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.engine.device import generator
from ddlib.methods import coresets
from ddlib.methods.coresets import (HERDING_DC_EPOCHS, el2n_scores, el2n_subset, forgetting_counts, forgetting_subset,
                                    herding_dc_subset, herding_indices, herding_subset, top_indices)
from ddlib.methods.sources import BUILTIN_SOURCES, obtain_set, resolve_source

pytestmark = pytest.mark.usefixtures("one_thread")  # 8x8 digits: a second thread only adds overhead


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_herding_moves_the_running_mean_to_the_class_mean():
    """One class, 1-D features 0, 92, 98, 109, 201 (mean 100), stored in the order 109, 0, 98, 201, 92.
    Herding's t-th pick is the x minimising |100 t - (sum of the chosen) - x|:
      t=1: target 100        -> 98  (|2|; 92 is 8 away, 109 is 9)
      t=2: target 200-98=102 -> 109 (|7|; 92 is 10 away)      nearest-to-mean would take 92 here
      t=3: target 300-207=93 -> 92  (|1|)
      t=4: target 400-299=101 -> 201 (|100|; 0 is 101 away)   nearest-to-mean would take 0 here
      t=5: 0.
    Rows: 98 is row 2, 109 row 0, 92 row 4, 201 row 3, 0 row 1."""
    features = torch.tensor([[109.0], [0.0], [98.0], [201.0], [92.0]])
    assert herding_indices(features, 5).tolist() == [2, 0, 4, 3, 1]
    assert herding_indices(features, 2).tolist() == [2, 0]  # not [2, 4], the two nearest the mean
    # 2-D: the same values on a line at 45 degrees, and a second coordinate that is constant: the same picks
    assert herding_indices(torch.cat([features, features, torch.full((5, 1), 7.0)], 1), 4).tolist() == [2, 0, 4, 3]


def _icarl_herding(features: torch.Tensor, k: int) -> list[int]:
    """iCaRL's released herding (Rebuffi's main_cifar_100_theano ``utils_icarl`` loop, restated): unit-norm
    features D, mu their mean, w = mu; repeatedly take argmax <w, d>, count it once, and w += mu - d."""
    d = features.double() / features.double().norm(dim=1, keepdim=True)
    mu = d.mean(0)
    w, picked = mu.clone(), []
    for _ in range(1000):
        if len(picked) == k:
            break
        i = int((d @ w).argmax())
        if i not in picked:
            picked.append(i)
        w = w + mu - d[i]
    return picked


def test_herding_dc_is_dcs_baseline_herded_as_icarl(digits, monkeypatch):
    """``herding_dc``: the feature network trained to convergence (not K-Center's 1 epoch) and every
    embedding L2-normalised, so its picks are those of iCaRL's own herding loop; ``herding`` keeps the
    unnormalised 1-epoch features under its own name. Features with very unequal norms tell the two
    apart."""
    gen = torch.Generator().manual_seed(3)
    n = len(digits.train_labels)
    feats = torch.randn(n, 6, generator=gen) * torch.exp(2 * torch.randn(n, 1, generator=gen))
    asked = []

    def embeddings(dataset, seed, model, device, epochs):
        asked.append(epochs)
        return feats, {"feature_epochs": epochs}

    monkeypatch.setattr(coresets, "_embeddings", embeddings)
    dc = herding_dc_subset(digits, 3, device="cpu")
    plain = herding_subset(digits, 3, device="cpu")
    assert asked == [HERDING_DC_EPOCHS, 1] and HERDING_DC_EPOCHS >= 30
    assert dc.method == "herding_dc" and dc.provenance["features_l2_normalised"] is True
    expected = []
    for c in range(digits.num_classes):
        idx = torch.nonzero(digits.train_labels == c).flatten()
        expected += idx[_icarl_herding(feats[idx], 3)].tolist()
    assert dc.provenance["indices"] == sorted(expected)
    assert plain.provenance["indices"] != dc.provenance["indices"]  # the features' norms decide the old picks
    assert resolve_source("herding_dc") == {"kind": "herding_dc"} and "herding_dc" in BUILTIN_SOURCES


def test_forgetting_counts_on_a_hand_made_history():
    """Presentations (rows) x examples (columns), 1 = classified correctly at that presentation:
    a: 1 0 1 0 0 -> forgotten at presentations 2 and 4: 2 (it was learned once more in between: 1)
    b: 1 1 1 1 1 -> 0
    c: 0 0 0 0 0 -> never learned: infinite (Toneva et al. rank these first)
    d: 0 1 0 0 1 -> forgotten once: 1
    e: 0 0 0 0 1 -> learned at the end, never forgotten: 0"""
    history = torch.tensor([[1, 0, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [0, 1, 0, 0, 1], [0, 0, 0, 0, 1]]).T
    assert forgetting_counts(history.bool()).tolist() == [2.0, 0.0, math.inf, 1.0, 0.0]


def test_the_most_forgotten_are_kept_and_ties_are_broken_by_the_seed():
    counts = torch.tensor([0.0, 2.0, math.inf, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert sorted(top_indices(counts, 3, generator(0)).tolist()) == [1, 2, 3]
    # the fourth is one of the five zeros: the same for a seed, not always the same across seeds
    picks = {tuple(top_indices(counts, 4, generator(s)).tolist()) for s in range(20)}
    assert all(p[:3] == (2, 1, 3) for p in picks) and len({p[3] for p in picks}) > 1
    assert top_indices(counts, 4, generator(5)).tolist() == top_indices(counts, 4, generator(5)).tolist()


def test_el2n_on_hand_made_probabilities():
    """Two models, two examples of three classes (labels 0 and 2):
    example 0: p = (0.6, 0.4, 0) and (0.6, 0, 0.4): |p - e0| = sqrt(0.16 + 0.16) = 0.565685 for both -> 0.565685
      (the norm of the mean prediction, (0.6, 0.2, 0.2), would be sqrt(0.16 + 0.04 + 0.04) = 0.489898);
    example 1: p = (0.1, 0.1, 0.8) -> sqrt(0.01 + 0.01 + 0.04) = 0.244949 and p = (0.5, 0.5, 0) ->
      sqrt(0.25 + 0.25 + 1) = 1.224745: the mean 0.734847."""
    p = torch.tensor([[[0.6, 0.4, 0.0], [0.1, 0.1, 0.8]],
                      [[0.6, 0.0, 0.4], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    scores = el2n_scores(p, torch.tensor([0, 2]))
    assert scores.tolist() == pytest.approx([0.565685, 0.734847], abs=1e-6)


def test_the_coresets_are_per_class_seeded_and_cached(digits, monkeypatch, tmp_path):
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    a = forgetting_subset(digits, 2, seed=0, device="cpu", epochs=3)
    b = forgetting_subset(digits, 2, seed=0, device="cpu", epochs=3)
    assert a.class_counts == [2] * 10 and a.method == "forgetting"
    assert a.provenance["indices"] == b.provenance["indices"]
    assert (a.provenance["scores_from"], b.provenance["scores_from"]) == ("computed", "cache")
    e = el2n_subset(digits, 2, seed=0, device="cpu", epochs=1, num_models=2)
    assert e.class_counts == [2] * 10 and e.provenance["score_models"] == 2
    assert el2n_subset(digits, 2, seed=0, device="cpu", epochs=1, num_models=2).provenance["scores_from"] == "cache"
    h = herding_subset(digits, 2, seed=0, device="cpu", epochs=1)
    assert h.class_counts == [2] * 10 and h.provenance["selection"].startswith("herding")
    assert len({tuple(s.provenance["indices"]) for s in (a, e, h)}) == 3  # three rules, three subsets


@pytest.mark.parametrize("kind,spec", [("herding", {}), ("forgetting", {"epochs": 2}), ("el2n", {"epochs": 1, "num_models": 2})])
def test_each_coreset_is_a_built_in_method_and_scores_in_a_label_robust_cell(kind, spec, mlflow_store, monkeypatch,
                                                                              tmp_path):
    from ddlib.scoring import _run_steps, resolve_cell

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    assert kind in BUILTIN_SOURCES and resolve_source(kind) == {"kind": kind}
    grid = {"protocol": "label_robust",
            "params": {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 2, "batch_size": 64},
                       "real_recipe": {"epochs": 1}, "lr_policy": "fixed", "device": "cpu"},
            "grid": {"method": [kind], "ipc": [1]}, "methods": {kind: {"kind": kind, **spec}}}
    protocol, experiment, cell = resolve_cell(grid)
    result = _run_steps(protocol, experiment, cell, progress=False)
    assert "lrs_mean" in result.summary and not math.isnan(result.summary["lrs_mean"])
    made = obtain_set(kind, {"kind": kind, **spec}, load_dataset("digits"), 1, device="cpu")
    assert made.method == kind and made.class_counts == [1] * 10
