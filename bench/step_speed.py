#!/usr/bin/env python
"""Speed and accuracy of the training loop's faster-step switches (Recipe ``precision``,
``channels_last``, ``compile``). Writes bench/results/step_speed.json and prints a table.

    python bench/step_speed.py              # images/s per switch, CIFAR-shaped batches of 10, 100, 256 (~3 min)
    python bench/step_speed.py --quick      # batches of 100 only, fewer steps (~1 min)
    python bench/step_speed.py --accuracy   # also DC CIFAR-10 (JPEG) IPC 10, 5 seeds, per switch (~30 min on 2 cores)

Throughput is measured with ``ddlib.engine.train.train_and_test`` itself (ConvNet-3, random
32x32x3 images, one SGD step per batch), on the device ``auto`` picks; ``compile`` is timed after a
warm-up run (its compile time is reported apart). The accuracy check trains the DC-distilled
CIFAR-10 IPC 10 set (``../shared/data/distilled/dc_cifar10_convnet_ipc10.pt``) with the default
recipe (300 epochs, no augmentation) for seeds 0-4 under each switch and tests on the full
10,000-image test set: a switch may be on by default only if its mean stays within 0.5 points
of fp32 (``keeps_accuracy`` in the JSON). Machine, threads and load average are recorded.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import write_results  # noqa: E402

from ddlib.engine.device import bf16_supported, resolve_device  # noqa: E402
from ddlib.engine.train import Recipe, train_and_test  # noqa: E402

SHARED = Path(os.environ.get("DDLIB_SHARED") or ROOT.parent / "shared") / "data"
SWITCHES = {  # name -> Recipe overrides (the recipe's default precision is "auto": every row says its own)
    "fp32": {"precision": "fp32"},
    "bf16": {"precision": "bf16"},
    "channels_last": {"precision": "fp32", "channels_last": True},
    "bf16+channels_last": {"precision": "bf16", "channels_last": True},
    "compile": {"precision": "fp32", "compile": True},
    "compile+bf16": {"precision": "bf16", "compile": True},
}
TOLERANCE_POINTS = 0.5


def machine(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device": str(device), "bf16_native": bf16_supported(device),
            "load_average_start": [round(v, 2) for v in os.getloadavg()]}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def throughput(batch: int, steps: int, overrides: dict, device: torch.device) -> dict:
    """images/s of ``steps`` training steps on ``batch`` random CIFAR-shaped images (one step per epoch)."""
    g = torch.Generator().manual_seed(0)
    images = torch.rand((batch, 3, 32, 32), generator=g)
    labels = torch.arange(batch) % 10
    test = torch.rand((10, 3, 32, 32), generator=g)
    recipe = Recipe(epochs=steps, batch_size=batch, **overrides)
    kw = dict(num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3, recipe=recipe, seeds=[0], device=device)
    warm = 0.0
    if overrides.get("compile"):
        t = time.perf_counter()
        train_and_test("convnet", images, labels, test, torch.arange(10), **{**kw, "recipe": Recipe(
            epochs=2, batch_size=batch, **overrides)})
        warm = time.perf_counter() - t
    (r,) = train_and_test("convnet", images, labels, test, torch.arange(10), **kw)
    return {"images_per_second": round(steps * batch / r.train_seconds, 1), "steps": steps,
            "train_seconds": round(r.train_seconds, 3), "compile_warmup_seconds": round(warm, 1) if warm else None,
            "load_average": round(os.getloadavg()[0], 2)}


def test_pass(batch: int, precision: str, device: torch.device, n: int = 4096) -> dict:
    """images/s of a test pass (inference mode, test set prepared once) of a ConvNet-3 at ``batch``."""
    from ddlib.engine.train import Normalize, model_accuracy
    from ddlib.models import create_model

    g = torch.Generator().manual_seed(0)
    images = (torch.rand((n, 3, 32, 32), generator=g) * 255).to(torch.uint8)
    labels = torch.arange(n) % 10
    model = create_model("convnet", 3, 10, (32, 32)).to(device)
    normalize = Normalize((0.5,) * 3, (0.25,) * 3).to(device)
    model_accuracy(model, images, labels, normalize, batch, precision)  # prepares the set once, warms up
    t = time.perf_counter()
    model_accuracy(model, images, labels, normalize, batch, precision)
    return {"batch": batch, "precision": precision, "images_per_second": round(n / (time.perf_counter() - t), 1),
            "load_average": round(os.getloadavg()[0], 2)}


def accuracy(overrides: dict, seeds: list[int], device: torch.device, epochs: int) -> dict:
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import load
    from ddlib.data.loaders import cache_dir, extract_archive

    tree = extract_archive(SHARED / "cifar10-jpeg.tar.gz", cache_dir() / "cifar10-jpeg")
    ds = load_dataset("cifar10", tree)
    dc = load(SHARED / "distilled" / "dc_cifar10_convnet_ipc10.pt", ds)
    t = time.perf_counter()
    results = train_and_test("convnet", dc.images, dc.labels, ds.test_images, ds.test_labels,
                                 num_classes=ds.num_classes, mean=ds.mean, std=ds.std,
                                 recipe=Recipe(epochs=epochs, **overrides), seeds=seeds, device=device)
    accs = [r.test_accuracy * 100 for r in results]
    return {"per_seed": [round(a, 2) for a in accs], "mean": round(statistics.mean(accs), 3),
            "std": round(statistics.pstdev(accs), 3), "seconds": round(time.perf_counter() - t, 1),
            "train_seconds_mean": round(statistics.mean(r.train_seconds for r in results), 2),
            "precision": results[0].precision, "load_average": round(os.getloadavg()[0], 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="batch 100 only, fewer steps")
    ap.add_argument("--switches", nargs="+", choices=list(SWITCHES), default=list(SWITCHES))
    ap.add_argument("--accuracy", action="store_true", help="also the DC CIFAR-10 IPC 10 accuracy check")
    ap.add_argument("--accuracy-switches", nargs="+", choices=list(SWITCHES), default=["fp32", "bf16"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=300, help="accuracy check epochs (the default recipe's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_speed.json")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    result = {"benchmark": "step_speed", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(device),
              "throughput": [], "test_passes": [], "accuracy": {}}
    batches = [100] if args.quick else [10, 100, 256]
    print(f"device {device}, {torch.get_num_threads()} threads, bf16 native: {result['machine']['bf16_native']}, "
          f"load {result['machine']['load_average_start']}")
    print(f"{'switch':<22}{'batch':>7}{'images/s':>11}{'x fp32':>8}{'load':>7}")
    for batch in batches:
        steps = max(3, (600 if not args.quick else 300) // batch)
        base = None
        for name in args.switches:
            row = {"switch": name, "batch": batch, **throughput(batch, steps, SWITCHES[name], device)}
            base = row["images_per_second"] if name == "fp32" else base
            row["speedup_vs_fp32"] = round(row["images_per_second"] / base, 2) if base else None
            result["throughput"].append(row)
            print(f"{name:<22}{batch:>7}{row['images_per_second']:>11.0f}"
                  f"{row['speedup_vs_fp32'] or float('nan'):>8.2f}{row['load_average']:>7.2f}", flush=True)
    print(f"\ntest passes (inference mode, prepared test set), 4096 images\n{'precision':<12}{'batch':>7}{'images/s':>11}")
    for precision in ("fp32", "bf16"):
        for batch in ([1024] if args.quick else [256, 1024, 4096]):
            row = test_pass(batch, precision, device)
            result["test_passes"].append(row)
            print(f"{precision:<12}{batch:>7}{row['images_per_second']:>11.0f}", flush=True)
    if args.accuracy:
        need = [SHARED / "cifar10-jpeg.tar.gz", SHARED / "distilled" / "dc_cifar10_convnet_ipc10.pt"]
        missing = [str(p) for p in need if not p.exists()]
        if missing:
            print(f"accuracy check skipped: missing {missing}", file=sys.stderr)
        else:
            print(f"\nDC CIFAR-10 (JPEG) IPC 10, ConvNet-3, {args.epochs} epochs, seeds {args.seeds}, full test set")
            for name in args.accuracy_switches:
                acc = accuracy(SWITCHES[name], args.seeds, device, args.epochs)
                result["accuracy"][name] = acc
                print(f"  {name:<20} {acc['mean']:.2f} ± {acc['std']:.2f} %  per seed {acc['per_seed']}  "
                      f"({acc['seconds']:.0f} s, {acc['precision']}, load {acc['load_average']})", flush=True)
            if "fp32" in result["accuracy"]:
                ref = result["accuracy"]["fp32"]["mean"]
                for name, acc in result["accuracy"].items():
                    acc["delta_vs_fp32_points"] = round(acc["mean"] - ref, 3)
                    acc["keeps_accuracy"] = abs(acc["mean"] - ref) <= TOLERANCE_POINTS
                    print(f"  {name:<20} delta {acc['delta_vs_fp32_points']:+.2f} points: "
                          f"{'keeps' if acc['keeps_accuracy'] else 'LOSES'} accuracy (tolerance {TOLERANCE_POINTS})")
    result["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    write_results(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
