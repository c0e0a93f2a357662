#!/usr/bin/env python
"""Where a batched training step's time goes on a GPU (issue 25: 25 ConvNet-3 models at IPC 10 ran
only 1.83x the sequential images/s on an H200, against a 10x target).

    python bench/batched_profile.py                 # on CUDA; one skip line where none
    python bench/batched_profile.py --device cpu    # the self-test (tiny)

Times the engine_throughput workload (random 32x32x3 images, ConvNet-3, SGD batch 256, S seeds in
one ``train_and_test`` call) in variants: sequential and batched, bf16 and fp32, cuDNN's benchmark
mode off and on; then profiles a few batched epochs (torch.profiler) and prints the kernels that
take the most device time, the device's busy time against the wall time (idle = the host is the
bottleneck), and the achieved TFLOP/s (ConvNet-3: 101.5 MFLOP per 32x32 image forward, x3 for a
training step). Writes bench/results/batched_profile.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine_throughput import data  # noqa: E402
from ddlib.engine.train import Recipe, train_and_test  # noqa: E402

FLOP_PER_IMAGE_STEP = 3 * 101.49e6  # ConvNet-3 at 32x32: forward (FlopCounterMode), x3 forward+backward


def train(device, ipc, S, mode, precision, epochs, compiled=False):
    """One ``train_and_test`` call on the workload: its results and wall seconds (``compiled``: the
    recipe's ``compile``)."""
    images, labels, test, test_labels = data(ipc, device)
    recipe = Recipe(epochs=epochs, batch_size=256, precision=precision, compile=compiled)
    start = time.perf_counter()
    results = train_and_test("convnet", images, labels, test, test_labels, num_classes=10, mean=(0.5,) * 3,
                             std=(0.25,) * 3, recipe=recipe, seeds=list(range(S)), device=device,
                             batched=mode == "batched")
    return results, time.perf_counter() - start


def timed(device, ipc, S, mode, precision, epochs, benchmark=False, compiled=False) -> dict:
    """images/s of ``epochs`` after two 1-epoch calls (kernel selection, allocator, a compile: the
    first call's extra seconds over the second are the compile's)."""
    torch.backends.cudnn.benchmark = benchmark
    try:
        _, first = train(device, ipc, S, mode, precision, 1, compiled)
        _, again = train(device, ipc, S, mode, precision, 1, compiled)
        results, _ = train(device, ipc, S, mode, precision, epochs, compiled)
    finally:
        torch.backends.cudnn.benchmark = False
    ips = S * epochs * 10 * ipc / sum(r.train_seconds for r in results)
    return {"mode": mode, "compiled": compiled, "precision": precision, "cudnn_benchmark": benchmark, "S": S,
            "ipc": ipc, "epochs": epochs, "ran_as": results[0].mode, "images_per_second": round(ips, 1),
            "tflops": round(ips * FLOP_PER_IMAGE_STEP / 1e12, 2), "first_call_extra_seconds": round(first - again, 2)}


def profile(device, ipc, S, precision, epochs) -> dict:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    images, labels, test, test_labels = data(ipc, device)
    recipe = Recipe(epochs=epochs, batch_size=256, precision=precision)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    train_and_test("convnet", images, labels, test, test_labels, num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3,
                   recipe=Recipe(epochs=1, batch_size=256, precision=precision), seeds=list(range(S)), device=device,
                   batched=True)
    start = time.perf_counter()
    with torch_profile(activities=acts) as prof:
        train_and_test("convnet", images, labels, test, test_labels, num_classes=10, mean=(0.5,) * 3,
                       std=(0.25,) * 3, recipe=recipe, seeds=list(range(S)), device=device, batched=True)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    rows = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:15]
    busy = sum(getattr(e, key, 0) for e in events) / 1e6
    table = [{"name": e.key[:90], "seconds": round(getattr(e, key, 0) / 1e6, 4), "calls": e.count} for e in rows]
    return {"precision": precision, "S": S, "epochs": epochs, "wall_seconds_profiled": round(wall, 2),
            "device_busy_seconds": round(busy, 3), "top": table}


def workload_arguments(ap: argparse.ArgumentParser, name: str) -> None:
    """The workload's options (also bench/batched_compile.py's)."""
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", type=int, default=25)
    ap.add_argument("--ipc", type=int, default=10)
    ap.add_argument("--images", type=int, default=50000, help="training images per timed row")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"{name}.json")


def workload(args, name: str, cpu_images: int):
    """(device, S, IPC, epochs) from the options: on the CPU a tiny self-test (S = 3, IPC 2,
    ``cpu_images`` per row); (None, ...) with one skip line where CUDA is asked for and absent."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device: {name} skipped")
        return None, 0, 0, 0
    S, ipc = (args.models, args.ipc) if device.type == "cuda" else (3, 2)
    per_row = args.images if device.type == "cuda" else cpu_images
    return device, S, ipc, max(2, round(per_row / (S * 10 * ipc)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(ap, "batched_profile")
    args = ap.parse_args(argv)
    device, S, ipc, epochs = workload(args, "batched_profile", cpu_images=300)
    if device is None:
        return 0
    variants = [("sequential", "bf16", False), ("batched", "bf16", False), ("batched", "fp32", False),
                ("sequential", "fp32", False), ("batched", "bf16", True), ("sequential", "bf16", True)]
    out = {"benchmark": "batched_profile", "device": torch.cuda.get_device_name(device) if device.type == "cuda"
           else "cpu", "torch": torch.__version__, "rows": []}
    print(f"{'mode':<11}{'prec':<6}{'bench':<6}{'images/s':>10}{'TFLOP/s':>9}")
    for mode, precision, bench in variants:
        if device.type != "cuda" and bench:
            continue
        seq_epochs = max(2, epochs // 5) if mode == "sequential" else epochs  # sequential: fewer, it is slow
        row = timed(device, ipc, S if mode == "batched" else max(1, S // 5), mode, precision, seq_epochs, bench)
        out["rows"].append(row)
        print(f"{mode:<11}{precision:<6}{str(bench):<6}{row['images_per_second']:>10.0f}{row['tflops']:>9.2f}", flush=True)
    prof = profile(device, ipc, S, "bf16", max(2, epochs // 4))
    out["profile"] = prof
    print(f"profiled batched bf16, {prof['epochs']} epochs: wall {prof['wall_seconds_profiled']} s, device busy "
          f"{prof['device_busy_seconds']} s")
    for r in prof["top"]:
        print(f"  {r['seconds']:8.4f} s {r['calls']:6d}x  {r['name']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
