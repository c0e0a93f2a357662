#!/usr/bin/env python
"""Many models per step: images/s and peak memory of the training loop's sequential and batched
modes. Writes bench/results/engine_throughput.json (one row per device x IPC x S x mode) and prints
a table, with the mode the engine's rule picks (``ddlib.engine.train.choose_mode``) beside the one
measured faster.

    python bench/engine_throughput.py            # S = 1, 5, 25 at IPC 1, 10, 50 (~10 min on 2 CPU cores)
    python bench/engine_throughput.py --quick    # S = 1, 5 at IPC 1, 10 on the CPU (~1 min)

Workload: ConvNet-3 (``convnet``, instance norm) on random CIFAR-shaped images (10 classes x IPC),
the default recipe's SGD with batch 256, S seeds trained by one ``train_and_test`` call
(``batched=False`` / ``True``). images/s = S x epochs x images / wall time of the training (test
passes excluded). Peak memory: CUDA ``max_memory_allocated``; CPU the peak resident set size
above the row's start, sampled every 5 ms. Runs on the CPU and, when present, on CUDA. Each
(device, IPC, mode) is warmed up once first (kernel selection, allocator), outside the timings.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.machine import write_results  # noqa: E402

from ddlib.engine.train import Recipe, choose_mode, train_and_test  # noqa: E402

BATCH = 256
GAIN = 1.10  # "faster" means at least 10 % more images/s


class PeakMemory:
    """Peak memory of a block: CUDA's allocator peak, or the CPU's resident set sampled in a thread."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.base = self.peak = self._rss()
        self.stop = threading.Event()

        def sample():
            while not self.stop.wait(0.005):
                self.peak = max(self.peak, self._rss())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, self._rss())
        return False

    @property
    def delta_mb(self) -> float:
        return round((self.peak - self.base) / 2**20, 1)


def data(ipc: int, device: torch.device):
    g = torch.Generator().manual_seed(ipc)
    images = (torch.rand((10 * ipc, 3, 32, 32), generator=g) * 255).to(torch.uint8)
    labels = torch.arange(10).repeat_interleave(ipc)
    test = (torch.rand((10, 3, 32, 32), generator=g) * 255).to(torch.uint8)
    return images.to(device), labels.to(device), test.to(device), torch.arange(10, device=device)


def run(device, ipc, S, mode, epochs):
    images, labels, test, test_labels = data(ipc, device)
    recipe = Recipe(epochs=epochs, batch_size=BATCH)
    with PeakMemory(device) as mem:
        t = time.perf_counter()
        results = train_and_test("convnet", images, labels, test, test_labels, num_classes=10,
                                     mean=(0.5,) * 3, std=(0.25,) * 3, recipe=recipe, seeds=list(range(S)),
                                     device=device, batched=mode == "batched")
        wall = time.perf_counter() - t
    train_seconds = sum(r.train_seconds for r in results)
    return {"images_per_second": round(S * epochs * len(images) / train_seconds, 1),
            "train_seconds": round(train_seconds, 3), "wall_seconds": round(wall, 2), "epochs": epochs,
            "ran_as": results[0].mode, "peak_memory_mb": mem.delta_mb, "load_average": round(os.getloadavg()[0], 2)}


def epochs_for(ipc: int, S: int, images_per_row: int) -> int:
    return max(1, round(images_per_row / (S * 10 * ipc)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="S = 1, 5 at IPC 1, 10, CPU only (about a minute)")
    ap.add_argument("--ipc", type=int, nargs="+")
    ap.add_argument("--models", type=int, nargs="+", help="values of S")
    ap.add_argument("--devices", nargs="+", help="default: cpu, and cuda when present")
    ap.add_argument("--images-per-row", type=int, help="training images per row (sets the epochs)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads on the CPU (default: torch's)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "engine_throughput.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ipcs = args.ipc or ([1, 10] if args.quick else [1, 10, 50])
    sizes = args.models or ([1, 5] if args.quick else [1, 5, 25])
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() and not args.quick else []))
    per_row = args.images_per_row or (1500 if args.quick else 6000)
    result = {"benchmark": "engine_throughput", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                          "threads": torch.get_num_threads(), "torch": torch.__version__,
                          "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                          "load_average_start": [round(v, 2) for v in os.getloadavg()]},
              "workload": f"convnet (ConvNet-3, instance norm), random 32x32x3 uint8 images, 10 classes x IPC, "
                          f"SGD batch {BATCH}, S seeds per train_and_test call",
              "rule": choose_mode.__doc__.split("\n\n")[1].strip(), "gain_threshold": GAIN, "rows": [], "choices": []}
    print(f"load average {result['machine']['load_average_start']}, {torch.get_num_threads()} threads")
    print(f"{'device':<7}{'ipc':>4}{'S':>4}  {'mode':<11}{'epochs':>7}{'images/s':>10}{'peak MB':>9}{'load':>6}")
    for dev_name in devices:
        device = torch.device(dev_name)
        for ipc in ipcs:
            for mode in ("sequential", "batched"):
                run(device, ipc, 2, mode, 1)  # warm-up, not recorded
            for S in sizes:
                pair = {}
                for mode in ("sequential", "batched"):
                    row = {"device": dev_name, "ipc": ipc, "S": S, "mode": mode,
                           **run(device, ipc, S, mode, epochs_for(ipc, S, per_row))}
                    pair[mode] = row
                    result["rows"].append(row)
                    print(f"{dev_name:<7}{ipc:>4}{S:>4}  {mode:<11}{row['epochs']:>7}{row['images_per_second']:>10.0f}"
                          f"{row['peak_memory_mb']:>9.0f}{row['load_average']:>6.1f}", flush=True)
                ratio = pair["batched"]["images_per_second"] / pair["sequential"]["images_per_second"]
                measured = "batched" if ratio >= GAIN else "sequential"
                picked = choose_mode(None, device, S)
                result["choices"].append({"device": dev_name, "ipc": ipc, "S": S,
                                          "batched_over_sequential": round(ratio, 2), "measured_best": measured,
                                          "rule_picks": picked, "agrees": picked == measured or S == 1})
    result["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    agree = [c for c in result["choices"] if c["S"] > 1]
    result["rule_agrees_with_measurement"] = f"{sum(c['agrees'] for c in agree)}/{len(agree)}"
    print("\nbatched / sequential images/s (>= {:.2f}: batched pays):".format(GAIN))
    for c in result["choices"]:
        print(f"  {c['device']:<5} IPC {c['ipc']:>3} S {c['S']:>3}: {c['batched_over_sequential']:.2f}  "
              f"measured best {c['measured_best']:<10} rule picks {c['rule_picks']}")
    print(f"rule agrees with the measurement in {result['rule_agrees_with_measurement']} cases with S > 1")
    write_results(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
