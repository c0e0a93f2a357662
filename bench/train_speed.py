"""Speed of the training loop and of the demo grid. Writes bench/results/train_speed.json and prints a table.

    python bench/train_speed.py            # training-loop throughput (about a minute on a 2-core CPU)
    python bench/train_speed.py --demo     # also the wall time of the demo grid in a scratch MLflow store

Throughput is measured with ddlib.engine.train.train_and_test itself (the loop every protocol uses),
on the device `auto` picks, so CPU and GPU numbers are comparable run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlib.engine.device import resolve_device  # noqa: E402
from ddlib.engine.train import Recipe, train_and_test  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CASES = [  # name, image shape, images, epochs, batch size
    ("digits-ipc10", (1, 8, 8), 100, 100, 256),
    ("digits-full", (1, 8, 8), 1347, 5, 256),
    ("cifar-ipc10", (3, 32, 32), 100, 50, 256),
    ("cifar-ipc50", (3, 32, 32), 500, 10, 256),
]


def measure(shape, n, epochs, batch, device):
    g = torch.Generator().manual_seed(0)
    images = torch.rand((n, *shape), generator=g)
    labels = torch.arange(n) % 10
    test = torch.rand((1000, *shape), generator=g)
    (r,) = train_and_test("convnet", images, labels, test, torch.arange(1000) % 10, num_classes=10,
                              mean=(0.5,) * shape[0], std=(0.25,) * shape[0],
                              recipe=Recipe(epochs=epochs, batch_size=batch), seeds=[0], device=device)
    steps = epochs * -(-n // batch)
    return {"train_seconds": r.train_seconds, "steps": steps, "steps_per_second": steps / r.train_seconds,
            "images_per_second": epochs * n / r.train_seconds, "eval_seconds_1000": r.eval_seconds}


def demo_wall_time() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DDLIB_MLRUNS": tmp}
        env.pop("MLFLOW_TRACKING_URI", None)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ddlib", "run", "params/demo.yaml", "--workers", "2"], cwd=ROOT,
                       env=env, check=True, capture_output=True)
        run = time.perf_counter() - start
        subprocess.run([sys.executable, "-m", "ddlib", "summary"], cwd=ROOT, env=env, check=True, capture_output=True)
        return {"demo_run_seconds": run, "demo_total_seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true", help="also time the demo grid end to end")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "train_speed.json"))
    args = parser.parse_args()
    device = resolve_device("auto")
    result = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpu_count": os.cpu_count(), "machine": platform.machine(), "cases": {}}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    print(f"device {device}, {result['threads']} threads")
    print(f"{'case':<14}{'steps':>7}{'steps/s':>10}{'images/s':>11}{'eval 1k (s)':>13}")
    for name, shape, n, epochs, batch in CASES:
        m = measure(shape, n, epochs, batch, device)
        result["cases"][name] = m
        print(f"{name:<14}{m['steps']:>7}{m['steps_per_second']:>10.1f}{m['images_per_second']:>11.0f}{m['eval_seconds_1000']:>13.3f}")
    if args.demo:
        result.update(demo_wall_time())
        print(f"demo grid: {result['demo_run_seconds']:.0f} s run, {result['demo_total_seconds']:.0f} s with summary")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
