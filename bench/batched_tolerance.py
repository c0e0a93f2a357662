"""How far the batched mode's models drift from the sequential mode's, on this CPU's instruction set.

The tolerances in ``tests/test_batched.py`` must hold on every CPU a user or CI may have. This script
trains the test's workload (digits, IPC 10, ConvNet with instance norm and with batch norm, fp32,
one intra-op thread) in both modes for several seeds and epoch counts and writes, per model and
epoch count, the largest weight difference, the test-accuracy difference (images of 450) and the
difference of the mean test cross-entropy. Run it twice on one machine, with and without
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``, to see both kernel paths::

    python bench/batched_tolerance.py --out bench/results/batched_tolerance_native.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python bench/batched_tolerance.py --out ..._avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info  # noqa: E402
from ddlib.data.datasets import load_dataset  # noqa: E402
from ddlib.engine.train import Normalize, Recipe, train_and_test  # noqa: E402
from ddlib.methods.select import random_subset  # noqa: E402


def _state_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max((sa[k].double() - sb[k].double()).abs().max().item() for k in sa)


def _test_loss(model, ds) -> float:
    norm = Normalize(ds.mean, ds.std)
    with torch.no_grad():
        logits = model.eval()(norm(ds.test_images.float()))
    return F.cross_entropy(logits, ds.test_labels).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--epochs", type=int, nargs="+", default=[3, 10, 30])
    ap.add_argument("--models", nargs="+", default=["convnet", "convnet_bn"])
    ap.add_argument("--out", default="bench/results/batched_tolerance.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("digits")
    subset = random_subset(ds, 10, seed=0)
    n_test = len(ds.test_labels)
    rows = []
    for model in args.models:
        for epochs in args.epochs:
            recipe = Recipe(precision="fp32", epochs=epochs, batch_size=32)
            seeds = list(range(args.seeds))
            kw = dict(num_classes=10, mean=ds.mean, std=ds.std, recipe=recipe, seeds=seeds, device="cpu",
                      keep_models=True)
            seq = train_and_test(model, subset.images, subset.labels, ds.test_images, ds.test_labels, batched=False, **kw)
            bat = train_and_test(model, subset.images, subset.labels, ds.test_images, ds.test_labels, batched=True, **kw)
            for s, b in zip(seq, bat):
                rows.append({"model": model, "epochs": epochs, "seed": s.seed,
                             "weight_diff": _state_diff(s.model, b.model),
                             "acc_seq": s.test_accuracy, "acc_bat": b.test_accuracy,
                             "images_diff": round(abs(s.test_accuracy - b.test_accuracy) * n_test),
                             "loss_seq": _test_loss(s.model, ds), "loss_bat": _test_loss(b.model, ds)})
            sub = [r for r in rows if r["model"] == model and r["epochs"] == epochs]
            mean_diff = abs(sum(r["acc_seq"] - r["acc_bat"] for r in sub)) / len(sub)
            print(f"{model:10s} {epochs:3d} ep: weights <= {max(r['weight_diff'] for r in sub):.2e}; "
                  f"images differ {[r['images_diff'] for r in sub]} of {n_test}; mean acc diff {100 * mean_diff:.2f} pt; "
                  f"test loss diff <= {max(abs(r['loss_seq'] - r['loss_bat']) for r in sub):.2e}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                               "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"), "threads": 1,
                               "torch": torch.__version__, "python": platform.python_version(), "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
