#!/usr/bin/env python
"""Does ``torch.compile`` of the batched (vmapped) step lift it off its memory-traffic floor on a GPU?
(issue 25: 25 ConvNet-3 models at IPC 10 train 1.8-2.2x the sequential images/s on an H200 against a
10x target; the profile shows a dozen memory-bound elementwise passes that only fusion can remove.)

    python bench/batched_compile.py                 # on CUDA; one skip line where none
    python bench/batched_compile.py --device cpu    # the self-test (tiny)

Times the engine_throughput workload (random 32x32x3 images, SGD batch 256, S seeds in one
``train_and_test``) with the recipe's ``compile`` off and on (batched: ``StackedModels`` compiles its
vmapped forward; sequential: each model's), bf16 and fp32; the compile's own seconds are the first
(1-epoch) call's extra time. Agreement: each model's training loss per epoch, compiled against eager
(batched, fp32). Writes bench/results/batched_compile.json. (The first H200 numbers were taken with
the same ``torch.compile`` of the vmapped forward patched in from here, before the engine had it.)
The other levers (compile modes, stacked leaves with one foreach SGD, the whole step compiled or in a
CUDA graph, channels-last) and the issue-55 record are bench/engine_levers.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batched_profile import timed, train, workload, workload_arguments  # noqa: E402
from bench.machine import machine_info, write_results  # noqa: E402


def agreement(device, ipc, S, epochs) -> dict:
    """fp32: each model's per-epoch training loss, compiled against eager."""
    eager, _ = train(device, ipc, S, "batched", "fp32", epochs)
    comp, _ = train(device, ipc, S, "batched", "fp32", epochs, True)
    gaps = [max(abs(a - b) for a, b in zip(e.epoch_losses, c.epoch_losses)) for e, c in zip(eager, comp)]
    return {"epochs": epochs, "S": S, "max_loss_gap": max(gaps), "final_losses_eager": [e.epoch_losses[-1] for e in eager][:5],
            "final_losses_compiled": [c.epoch_losses[-1] for c in comp][:5]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_arguments(ap, "batched_compile")
    ap.add_argument("--variants", nargs="+", metavar="MODE:COMPILED:PREC[:S]",
                    help="rows to time, e.g. batched:1:bf16 sequential:0:fp32 batched:1:bf16:50 (default: six)")
    ap.add_argument("--no-agreement", action="store_true")
    args = ap.parse_args(argv)
    device, S, ipc, epochs = workload(args, "batched_compile", cpu_images=120)
    if device is None:
        return 0
    out = {"benchmark": "batched_compile", "machine": machine_info(), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "rows": []}
    print(f"{'mode':<11}{'compiled':<9}{'prec':<6}{'images/s':>10}{'TFLOP/s':>9}{'compile s':>10}", flush=True)
    variants = args.variants or ["batched:0:bf16", "batched:1:bf16", "batched:0:fp32", "batched:1:fp32",
                                 "sequential:0:fp32", "sequential:0:bf16"]
    for mode, compiled, precision, *size in (v.split(":") for v in variants):
        compiled = compiled in ("1", "true")
        s = int(size[0]) if size else S if mode == "batched" else max(1, S // 5)
        ep = epochs if mode == "batched" else max(2, epochs // 5)
        try:
            row = timed(device, ipc, s, mode, precision, ep, compiled=compiled)
        except Exception as exc:  # an experiment: record what broke and go on
            row = {"mode": mode, "compiled": compiled, "precision": precision, "error": repr(exc)[:400]}
            print(f"{mode:<11}{str(compiled):<9}{precision:<6} FAILED {row['error']}", flush=True)
        else:
            print(f"{mode:<11}{str(compiled):<9}{precision:<6}{row['images_per_second']:>10.0f}{row['tflops']:>9.2f}"
                  f"{row['first_call_extra_seconds']:>10.1f}", flush=True)
        out["rows"].append(row)
        write_results(out, args.out)
    if args.no_agreement:
        return 0
    try:
        out["agreement"] = agreement(device, ipc, min(S, 5), 5 if device.type == "cuda" else 2)
        print("agreement (fp32, per-epoch training loss, compiled vs eager):", out["agreement"]["max_loss_gap"])
    except Exception as exc:  # recorded; gpu_check fails on it
        out["agreement"] = {"error": repr(exc)[:400]}
        print("agreement FAILED", out["agreement"]["error"])
    write_results(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
