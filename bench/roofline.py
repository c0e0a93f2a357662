#!/usr/bin/env python
"""How near ddlib's trainings and test passes run to this machine's arithmetic peak, and what that
bounds: the least time a workload can take doing the arithmetic it does, and so the best speed ratio
any implementation could reach against a peer that does the same arithmetic (issue 25's
``vs_ddranking`` targets). Writes bench/results/roofline.json and prints a summary.

    python bench/roofline.py                                   # this machine's peak only (~20 s)
    python bench/roofline.py --vs-ddranking bench/results/vs_ddranking_avx2.json
    python bench/roofline.py --store /tmp/ds --experiment label_robust --threads 1   # a grid's store

Run it on the kernel path of the numbers it reads (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``
for a forced-AVX2 run) and with the threads each model trained with (``--threads 1`` for a grid of
2 workers on 2 cores): the peak depends on both.

The peak is the best throughput of fp32 (and, where the CPU computes it natively, bf16) 3x3
convolutions at ConvNet-3's layer shapes (batch 1024, a test pass's, forward, no autograd) and of a 2048x2048 matrix
product, each the best of five runs: a favourable peak, so the bounds below are generous. FLOPs
are :func:`ddlib.scores.beyond_accuracy.flops_per_image` (``torch.utils.flop_counter``, a multiply-add counts 2);
a training costs 3 x forward x images seen, a test pass forward x test images. The teacher's forward
passes of soft-label roles are not counted: the work is understated, so the least time is too and
every ratio bound is an upper bound.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import machine_info, write_results  # noqa: E402  (bench/machine.py)

from ddlib.scores.beyond_accuracy import TRAIN_FLOPS_PER_FORWARD, flops_per_image  # noqa: E402
from ddlib.run.calibrate import CONV_SHAPES, peak  # noqa: E402,F401  (the peak probe, shared with ddlib's estimates)
from ddlib.engine.device import bf16_supported, tune_cpu_allocator  # noqa: E402
from ddlib.models import create_model  # noqa: E402


def convnet_flops(channels: int = 3, side: int = 32, classes: int = 10) -> float:
    return flops_per_image(lambda: create_model("convnet", channels, classes, (side, side)), (channels, side, side))


def vs_ddranking_bound(path: Path, peak_gflops: float) -> dict:
    """The least time ddlib's part of a ``vs_ddranking.py`` run could take at ``peak_gflops`` and the
    best ratios against the peer's recorded wall times (the teacher is excluded on both sides, as there)."""
    run = json.loads(path.read_text())
    settings, ours = run["settings"], run["ours"]
    forward = convnet_flops()
    epochs, per_side = settings["epochs"], settings["ipc"] * 10
    rows, total_flops, measured = [], 0.0, 0.0
    for protocol, result in ours.items():
        test_images = result["dataset"]["test"]
        real_images = result["dataset"]["train"]
        for trial in result["trials"]:
            if not (trial["train_seconds"] == trial["train_seconds"]):  # an lr search's summary row
                continue
            images = real_images if trial["role"].startswith("real") else per_side
            train = TRAIN_FLOPS_PER_FORWARD * forward * images * epochs
            test = forward * test_images
            total_flops += train + test
            measured += trial["train_seconds"] + trial["eval_seconds"]
            rows.append({"protocol": protocol, "role": trial["role"], "train_gflops_per_s": round(
                train / trial["train_seconds"] / 1e9, 1), "test_gflops_per_s": round(test / trial["eval_seconds"] / 1e9, 1)})
    least = total_flops / (peak_gflops * 1e9)
    ratios = run["ratios"]
    out = {"json": str(path), "json_date": run.get("date"), "json_machine": run.get("machine"),
           "forward_mflops_per_image": round(forward / 1e6, 2), "trials": rows, "total_tflops": round(total_flops / 1e12, 2),
           "ddlib_wall_seconds": ratios["ddlib_wall_seconds"], "ddlib_trial_seconds": round(measured, 1),
           "attained_fraction_of_peak": round(total_flops / measured / 1e9 / peak_gflops, 3),
           "least_seconds_at_peak": round(least, 1),
           "ratio_measured": {"matched": run.get("ratio_matched"), "defaults": run.get("ratio_defaults")},
           # no peer in the JSON (vs_ddranking.py --ours-only): no bound against it
           "ratio_bound": {mode: round(ratios[f"{mode}_peer_wall_seconds"] / least, 2)
                           if f"{mode}_peer_wall_seconds" in ratios else None for mode in ("matched", "defaults")}}
    return out


def store_bound(store: str, experiment: str, peak_gflops: float) -> dict:
    """Every finished evaluation of ``experiment`` in the store at ``store``: its logged FLOPs against
    its logged train and test seconds."""
    if "://" not in store:
        store = f"sqlite:///{Path(store) / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = store
    from ddlib.store import tracking
    evals = tracking.runs(experiment, kind="eval")
    rows, flops, seconds = [], 0.0, 0.0
    for _, r in evals.iterrows():
        f = r.get("metrics.train_flops", math.nan) + r.get("metrics.test_flops", math.nan)
        s = r.get("metrics.train_seconds", math.nan) + r.get("metrics.eval_seconds", math.nan)
        if not (f == f and s == s and s > 0):
            continue
        flops, seconds = flops + f, seconds + s
        rows.append({"role": r.get("tags.ddlib.role"), "gflops_per_s": round(f / s / 1e9, 1), "seconds": round(s, 2)})
    return {"store": store, "experiment": experiment, "evaluations": len(rows), "total_tflops": round(flops / 1e12, 3),
            "model_seconds": round(seconds, 1), "least_model_seconds_at_peak": round(flops / peak_gflops / 1e9, 1),
            "attained_fraction_of_peak": round(flops / seconds / 1e9 / peak_gflops, 3) if seconds else math.nan,
            "evaluations_by_rate": sorted(rows, key=lambda r: r["gflops_per_s"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vs-ddranking", type=Path, help="a vs_ddranking.py JSON to bound")
    ap.add_argument("--store", help="an MLflow store (folder or URI) whose evaluations to set against the peak")
    ap.add_argument("--experiment", default="label_robust")
    ap.add_argument("--threads", type=int, help="torch threads for the peak (default: torch's)")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="which peak the bounds use (the precision the numbers were measured in)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "roofline.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tune_cpu_allocator()  # as every ddlib process does: no page faults on each fresh output
    out = {"benchmark": "roofline", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info("cpu"),
           "peak": {"fp32": peak(torch.float32)}}
    if bf16_supported(torch.device("cpu")):
        out["peak"]["bf16"] = peak(torch.bfloat16)
    if args.precision not in out["peak"]:
        ap.error(f"--precision {args.precision}: this CPU does not compute it natively")
    best = out["peak"][args.precision]["best_gflops"]
    print(f"peak at {torch.get_num_threads()} thread(s): " + "; ".join(
        f"{p} {v['best_gflops']:.0f} GFLOP/s ({', '.join(f'{k} {g:.0f}' for k, g in v['gflops'].items())})"
        for p, v in out["peak"].items()))
    if args.vs_ddranking:
        b = out["vs_ddranking"] = vs_ddranking_bound(args.vs_ddranking, best)
        print(f"{args.vs_ddranking}: {b['total_tflops']} TFLOP in ddlib's trials ({b['ddlib_trial_seconds']} s of "
              f"{b['ddlib_wall_seconds']} s wall, {100 * b['attained_fraction_of_peak']:.0f} % of the {args.precision} "
              f"peak); at the peak {b['least_seconds_at_peak']} s, so against the peer at best "
              f"{b['ratio_bound']['matched']}x matched and {b['ratio_bound']['defaults']}x at its defaults "
              f"(measured {b['ratio_measured']['matched']}x and {b['ratio_measured']['defaults']}x)")
    if args.store:
        s = out["store_bound"] = store_bound(args.store, args.experiment, best)
        print(f"{args.store} ({args.experiment}): {s['evaluations']} evaluations, {s['total_tflops']} TFLOP in "
              f"{s['model_seconds']} s of training and testing ({100 * s['attained_fraction_of_peak']:.0f} % of the "
              f"{args.precision} peak; {s['least_model_seconds_at_peak']} s at the peak)")
    out["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
