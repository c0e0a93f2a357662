"""Pruning baselines and the cost of making a set (issue 57.2): AUM and CCS on hand-worked cases, then as
sources a grid names (a tiny digits label_robust cell each); the construction cost, measured and declared."""

from __future__ import annotations

import math

import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.data.distilled import save
from ddlib.engine.device import generator
from ddlib.methods import cost, pruning
from ddlib.methods.pruning import aum_scores, aum_subset, ccs_budgets, ccs_indices, ccs_subset, margins
from ddlib.methods.sources import BUILTIN_SOURCES, obtain_set, resolve_source, validate_source

pytestmark = pytest.mark.usefixtures("one_thread")  # 8x8 digits: a second thread only adds overhead


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


# --------------------------------------------------------------------------- AUM


def test_margins_and_aum_on_hand_made_logits():
    """Logits of two examples over three classes, both labelled 0 (Pleiss: z_y - max_{j != y} z_j):
      epoch 1: a (2, 1, 0.5) -> 2 - 1 = 1;    b (0, 3, 1)   -> 0 - 3 = -3
      epoch 2: a (4, 1, 0)   -> 3;            b (1, 2, 0)   -> -1
      epoch 3: a (0, 1, 0.5) -> -1;           b (2, 1, 0.5) -> 1
    AUM = the mean over the epochs: a (1 + 3 - 1) / 3 = 1, b (-3 - 1 + 1) / 3 = -1."""
    labels = torch.tensor([0, 0])
    epochs = [torch.tensor([[2.0, 1, 0.5], [0, 3, 1]]), torch.tensor([[4.0, 1, 0], [1, 2, 0]]),
              torch.tensor([[0.0, 1, 0.5], [2, 1, 0.5]])]
    history = torch.stack([margins(z, labels) for z in epochs])
    assert history.tolist() == [[1.0, -3.0], [3.0, -1.0], [-1.0, 1.0]]
    assert aum_scores(history).tolist() == pytest.approx([1.0, -1.0])
    # the label's logit is excluded from the max even where it is the largest, and a label other than 0
    assert margins(torch.tensor([[5.0, 7.0, 6.0]]), torch.tensor([2])).tolist() == [-1.0]


def test_aum_keeps_the_lowest_per_class(digits, monkeypatch):
    """Hardest first, as forgetting and EL2N: per class the ``ipc`` lowest AUM."""
    n = len(digits.train_labels)
    aum = torch.randperm(n, generator=torch.Generator().manual_seed(0)).double() - n / 2  # distinct, half negative
    monkeypatch.setattr(pruning, "_aum_scores", lambda *a: (aum, {"scores_from": "test"}))
    picked = aum_subset(digits, 3, device="cpu")
    expected = []
    for c in range(digits.num_classes):
        idx = torch.nonzero(digits.train_labels == c).flatten()
        expected += idx[aum[idx].argsort()[:3]].tolist()
    assert picked.provenance["indices"] == sorted(expected)
    assert picked.method == "aum" and picked.class_counts == [3] * 10


# --------------------------------------------------------------------------- CCS


def _official_bin_allocate(num: int, bins: list[int]) -> list[int]:
    """CCS's released allocation (haizhongzheng/Coverage-centric-coreset-selection, core/data/Coreset.py,
    ``bin_allocate``), restated: strata by size ascending, each min(size, budget left // strata left)."""
    order = sorted(range(len(bins)), key=lambda i: bins[i])
    out, rest = [0] * len(bins), num
    for i, b in enumerate(order):
        out[b] = min(bins[b], rest // (len(bins) - i))
        rest -= out[b]
    return out


def test_ccs_budgets_on_hand_worked_strata():
    """Strata of 4, 2, 2 images, budget 4: the smallest first (stratum 1: 4 // 3 = 1; stratum 2: 3 // 2 = 1),
    the largest takes what is left (2).  1, 5, 10 with 9: 1 (9 // 3 = 3, but it holds 1), then 8 // 2 = 4,
    then 4.  0, 2, 10 with 9: the empty stratum takes 0, then min(2, 9 // 2) = 2, then 7.  One image over
    50 strata goes to the largest (49 strata get 1 // k = 0 first); ten go one to each of the ten largest."""
    assert ccs_budgets([4, 2, 2], 4) == [2, 1, 1]
    assert ccs_budgets([1, 5, 10], 9) == [1, 4, 4]
    assert ccs_budgets([0, 2, 10], 9) == [0, 2, 7]
    sizes = [3] * 49 + [4]
    assert ccs_budgets(sizes, 1) == [0] * 49 + [1]
    sizes = list(range(1, 51))
    assert ccs_budgets(sizes, 10) == [0] * 40 + [1] * 10
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):  # the released code's allocation on random strata
        sizes = torch.randint(0, 20, (int(torch.randint(1, 60, (1,), generator=gen)),), generator=gen).tolist()
        budget = int(torch.randint(0, sum(sizes) + 1, (1,), generator=gen))
        assert ccs_budgets(sizes, budget) == _official_bin_allocate(budget, sizes)
        assert sum(ccs_budgets(sizes, budget)) == budget


def test_ccs_indices_cut_the_hardest_and_sample_every_stratum():
    """Difficulties 0 1 2 3 4 5 9 10 11 20 (rows 0..9), beta 0.2, 3 strata, 4 images: the 2 hardest (11, 20:
    rows 8, 9) go; the rest span 0..10, strata [0, 3.33) = rows 0-3, [3.33, 6.67) = rows 4-5, [6.67, 10] =
    rows 6-7, of 4, 2, 2 images: budgets 2, 1, 1 (above)."""
    difficulty = torch.tensor([0.0, 1, 2, 3, 4, 5, 9, 10, 11, 20])
    seen = set()
    for seed in range(30):
        picks = ccs_indices(difficulty, 4, generator(seed), hard_cutoff=0.2, strata=3).tolist()
        assert len(picks) == 4 and not {8, 9} & set(picks)
        assert len([i for i in picks if i <= 3]) == 2 and len([i for i in picks if i in (4, 5)]) == 1
        assert len([i for i in picks if i in (6, 7)]) == 1
        seen.add(tuple(sorted(picks)))
        assert picks == ccs_indices(difficulty, 4, generator(seed), hard_cutoff=0.2, strata=3).tolist()  # seeded
    assert len(seen) > 5  # uniform draws inside the strata: seeds differ
    # beta 0: nothing cut, the hardest (20) alone in the top stratum of [0, 20]: strata of 8, 1, 1 images
    assert 9 in ccs_indices(difficulty, 3, generator(0), hard_cutoff=0.0, strata=3).tolist()
    # at least k images stay: beta 0.5 of 5 would cut 2, leaving 3 < 4: only 1 goes (the hardest)
    assert sorted(ccs_indices(torch.tensor([0.0, 1, 2, 3, 4]), 4, generator(0), hard_cutoff=0.5).tolist()) == [0, 1, 2, 3]
    # never-learned images (forgetting: inf) left after the cut join the hardest stratum
    # (0 0 1 2 inf inf, beta 1/6 cuts one inf; the other counts as 2: strata [0, 1) = rows 0, 1 and [1, 2] =
    # rows 2, 3 and the inf left: one image each)
    inf = torch.tensor([0.0, 0, 1, 2, math.inf, math.inf])
    for seed in range(5):
        picks = ccs_indices(inf, 2, generator(seed), hard_cutoff=1 / 6, strata=2).tolist()
        assert len({0, 1} & set(picks)) == 1 and len({2, 3, 4, 5} & set(picks)) == 1


def test_aum_and_ccs_are_built_in_seeded_cached_and_costed(digits, monkeypatch, tmp_path):
    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    assert {"aum", "ccs"} <= set(BUILTIN_SOURCES) and resolve_source("ccs") == {"kind": "ccs"}
    first = obtain_set("aum", {"kind": "aum", "epochs": 2}, digits, 2, device="cpu")
    made = first.provenance["construction"]
    # FLOPs by hand: ConvNet-3 on 8x8x1: conv 1->128 at 8x8 (2*9*128*64 = 147,456), 128->128 at 4x4
    # (2*9*128*128*16 = 4,718,592) and 2x2 (1,179,648), linear 128->10 (2,560): 6,048,256 per forward;
    # 2 epochs of 1,347 images at 3 forwards each, plus the 450 test images once.
    assert cost.forward_flops("convnet", digits) == 6_048_256
    assert made["flops"] == 6_048_256 * (3 * 1347 * 2 + 450) and made["measured"] is True
    assert made["seconds"] > 0 and made["device"].startswith("cpu: ")
    # CCS on the same AUM run reads it from the cache and costs what the run cost when computed
    ccs = obtain_set("ccs", {"kind": "ccs", "epochs": 2}, digits, 2, device="cpu")
    assert ccs.provenance["scores_from"] == "cache" and ccs.provenance["hard_cutoff"] == 0.3
    assert ccs.provenance["construction"]["seconds"] >= made["seconds"] * 0.9
    assert ccs.provenance["construction"]["flops"] == made["flops"]
    again = ccs_subset(digits, 2, seed=0, device="cpu", epochs=2)
    other = ccs_subset(digits, 2, seed=1, device="cpu", epochs=2)  # another AUM run and other draws
    assert again.provenance["indices"] == ccs.provenance["indices"] != other.provenance["indices"]
    assert ccs.class_counts == [2] * 10 and len({tuple(s.provenance["indices"]) for s in (first, ccs)}) == 2
    by_forgetting = ccs_subset(digits, 2, device="cpu", epochs=2, score="forgetting")
    assert by_forgetting.provenance["score"] == "forgetting" and by_forgetting.class_counts == [2] * 10
    with pytest.raises(ValueError, match="score must be one of"):
        ccs_subset(digits, 2, device="cpu", score="loss")
    assert obtain_set("random", {"kind": "random"}, digits, 1).provenance["construction"]["flops"] == 0


def test_a_declared_construction_cost_is_checked_and_carried_as_declared(digits, tmp_path):
    declared = {"gpu_hours": 12.5, "device": "A100"}
    path = save(obtain_set("random", {"kind": "random"}, digits, 1), tmp_path / "set.pt")
    spec = {"kind": "file", "path": str(path), "construction": declared}
    made = obtain_set("mtt", dict(spec), digits, 1)
    assert made.provenance["construction"] == {"gpu_hours": 12.5, "device": "A100", "declared": True}
    # a file saved from a built set keeps the cost ddlib measured; the spec's word wins over the file's
    assert obtain_set("mine", {"kind": "file", "path": str(path)}, digits, 1).provenance["construction"]["measured"]
    for bad, message in [({"device": "A100"}, "construction needs 'gpu_hours'"),
                         ({"gpu_hours": -1, "device": "A100"}, "gpu_hours must be a non-negative number"),
                         ({"gpu_hours": 1, "device": ""}, "device must be non-empty text"),
                         ({"gpu_hours": 1, "device": "A100", "hours": 2}, "unknown key 'hours'"),
                         ("12 h", "must be a mapping")]:
        with pytest.raises(ValueError, match=f"method 'mtt': construction.*{message}|{message}"):
            validate_source("mtt", {**spec, "construction": bad})
    with pytest.raises(ValueError, match="construction is measured for kind 'dm'"):
        validate_source("dm", {"kind": "dm", "construction": declared})


@pytest.mark.parametrize("kind,spec", [("aum", {"epochs": 2}), ("ccs", {"epochs": 2, "strata": 5})])
def test_aum_and_ccs_score_in_a_label_robust_cell(kind, spec, mlflow_store, monkeypatch, tmp_path):
    from ddlib.scoring import _run_steps, resolve_cell

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    grid = {"protocol": "label_robust",
            "params": {"dataset": "digits", "seeds": [0], "recipe": {"epochs": 2, "batch_size": 64},
                       "real_recipe": {"epochs": 1}, "lr_policy": "fixed", "device": "cpu"},
            "grid": {"method": [kind], "ipc": [1]}, "methods": {kind: {"kind": kind, **spec}}}
    protocol, experiment, cell = resolve_cell(grid)
    result = _run_steps(protocol, experiment, cell, progress=False)
    assert "lrs_mean" in result.summary and not math.isnan(result.summary["lrs_mean"])
    # the set's construction cost is on the cell's run (metrics, how it was obtained, the machine)
    from ddlib.store import tracking

    run = tracking.client().get_run(result.run_id)
    assert run.data.metrics["construction_seconds"] > 0 and run.data.metrics["construction_flops"] > 0
    assert run.data.tags["ddlib.construction"] == "measured" and run.data.tags["ddlib.construction.device"]
    # ... and on the board, as a readable column (the numbers in the CSV's columns)
    from ddlib.boards.table import format_leaderboard
    from ddlib.protocols.ddranking_boards import lrs_leaderboard

    board = lrs_leaderboard(experiment)
    assert board["construction_flops"].iloc[0] == run.data.metrics["construction_flops"]
    assert "FLOPs" in format_leaderboard(board)["construction"].iloc[0]


def test_aum_and_ccs_name_the_score_run_they_share():
    """The runner starts no two cells that would train one cached score run at once: ``ccs`` names the
    run its ``score`` kind names, and its config key carries that kind's revision."""
    from ddlib.methods.sources import builtin_revision, shared_work

    assert shared_work({"kind": "ccs"}) == shared_work({"kind": "aum"}) != shared_work({"kind": "aum", "seed": 1})
    assert shared_work({"kind": "ccs", "score": "forgetting"}) == shared_work({"kind": "forgetting"})
    assert shared_work({"kind": "ccs", "score": "el2n", "epochs": 3}) == shared_work({"kind": "el2n", "epochs": 3})
    assert builtin_revision({"kind": "aum"}) is None and builtin_revision({"kind": "ccs"}) is None
    assert builtin_revision({"kind": "ccs", "score": "el2n"}) == "ccs revision 1, el2n revision 2"
