"""bench/roofline.py: the FLOPs it counts for ConvNet-3 and the bounds it draws from a vs_ddranking run."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ConvNet-3 on one 3x32x32 image, counted by hand (a multiply-add = 2 FLOPs): three 3x3 convolutions
# to 128 channels at 32x32, 16x16 and 8x8 (inputs 3, 128, 128 channels), then a 2048 -> 10 linear layer.
CONVNET_FORWARD = 2 * (32 * 32 * 128 * 3 * 9 + 16 * 16 * 128 * 128 * 9 + 8 * 8 * 128 * 128 * 9 + 2048 * 10)


@pytest.fixture(scope="module")
def roofline():
    spec = importlib.util.spec_from_file_location("roofline", ROOT / "bench" / "roofline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_convnet_forward_flops_are_the_hand_count(roofline):
    assert roofline.convnet_flops() == CONVNET_FORWARD


def test_a_run_at_half_the_peak_is_bounded_at_twice_its_ratio(roofline, tmp_path):
    """A vs_ddranking record whose trials all ran at 100 GFLOP/s, set against a 200 GFLOP/s peak:
    half the peak attained, and no implementation could beat the peer by more than twice the measured
    ratio (the peer's wall times stay as recorded)."""
    epochs, rate = 20, 100e9
    trials = []
    for role, images in (("syn_hard-lr0.01-test", 100), ("rdm_any-lr0.1-test", 100), ("real_hard", 1000)):
        trials.append({"role": role, "train_seconds": 3 * CONVNET_FORWARD * images * epochs / rate,
                       "eval_seconds": CONVNET_FORWARD * 10000 / rate})
    trials.append({"role": "syn_hard-lr_search-s0", "train_seconds": float("nan"), "eval_seconds": float("nan")})
    seconds = sum(t["train_seconds"] + t["eval_seconds"] for t in trials[:3])
    record = {"settings": {"epochs": epochs, "ipc": 10},
              "ours": {"lrs": {"dataset": {"train": 1000, "test": 10000}, "trials": trials}},
              "ratio_matched": 3.0, "ratio_defaults": 4.0,
              "ratios": {"ddlib_wall_seconds": seconds, "matched_peer_wall_seconds": 3.0 * seconds,
                         "defaults_peer_wall_seconds": 4.0 * seconds}}
    path = tmp_path / "vs.json"
    path.write_text(json.dumps(record))
    bound = roofline.vs_ddranking_bound(path, peak_gflops=200.0)
    assert bound["attained_fraction_of_peak"] == pytest.approx(0.5, abs=1e-3)
    assert bound["least_seconds_at_peak"] == pytest.approx(seconds / 2, rel=1e-3)
    assert bound["ratio_bound"] == {"matched": pytest.approx(6.0, rel=1e-3), "defaults": pytest.approx(8.0, rel=1e-3)}
    assert [t["role"] for t in bound["trials"]] == [t["role"] for t in trials[:3]]  # the search's summary row skipped
    assert {t["train_gflops_per_s"] for t in bound["trials"]} == {100.0}


def test_the_peak_probe_reports_every_probe(roofline):
    import torch

    result = roofline.peak(torch.float32, batch=2)
    assert set(result["gflops"]) == {"conv 3->128 at 32x32", "conv 128->128 at 16x16", "conv 128->128 at 8x8",
                                     "matmul 2048"}
    assert result["best_gflops"] == max(result["gflops"].values()) > 0
