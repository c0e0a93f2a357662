#!/usr/bin/env python
"""The batched engine at the chip's limit (issue 55, item 2): images/s, TFLOP/s and share of the chip's
measured peak of the engine's batched mode and of each lever on it, each checked against the sequential mode.

    python bench/engine_levers.py --device cuda --record   # H200: writes bench/records/engine_cuda.json
    python bench/engine_levers.py --quick                  # CPU self-test: every CPU-capable variant, small

Workload (bench/engine_throughput.py's, bench/batched_compile.py's): ConvNet-3 (instance norm), random
32x32x3 uint8 images, 10 classes x IPC (10), SGD batch 256 (the default recipe: lr 0.01, momentum 0.9,
weight decay 5e-4, step schedule), S (25) models with their own seeds trained at once. Rows:

* ``engine-*`` and ``sequential``: ``train_and_test`` as users run it (batched eager, ``compile=True``;
  the sequential mode on S/5 models): ``batched_images_per_s`` and ``sequential_images_per_s``.
* the levers, run by :func:`lever_train` (the engine's batched step, with its parts swapped):
  ``compile_mode`` (``StackedModels(compile=<mode>)``: "reduce-overhead" is CUDA graphs,
  "max-autotune-no-cudagraphs"), ``leaves`` (``stacked_leaves``: one leaf per parameter name, no
  ``torch.stack`` per step, one :class:`~ddlib.engine.stacked.StackedSGD` of foreach launches for all
  models), ``step`` (:class:`~ddlib.engine.stacked.StackedTrainStep`: the whole step as one function,
  ``compile``d or captured in a CUDA graph), ``channels_last``, ``data`` ("one-pass": every model's batch
  gathered, converted and normalised in one pass on the device, bit for bit the per-seed values).
  ``loop`` is the engine's own step in this loop (it should match ``engine-eager``).

Each row: images/s (levers: steady state, after the first ``STEADY_FROM`` epochs, which hold compiles
and graph captures; also over all epochs), TFLOP/s (3 x forward FLOPs per image,
``ddlib.scores.beyond_accuracy``), share of the peak measured in this process (CUDA: a bf16 8192^3
matmul; CPU: ``ddlib.run.calibrate.peak`` in fp32), compile seconds (first 1-epoch call minus the
second), peak memory, and agreement with the sequential mode in fp32 (3 models at lrs 0.01/0.02/0.005,
IPC 10 at batch 25 on CUDA, IPC 2 at batch 5 on the CPU: 4 steps an epoch, so a CUDA graph replays;
3 epochs, the step schedule's drop included; TF32 off): per-epoch losses within rel 1e-4 and weights within
1e-4 (CUDA, tests/test_batched.py) / 1e-3 (CPU, its one-epoch instance-norm tolerance). A row that
disagrees is failing; its speed does not count for ``best_variant``.

Duration on an H200 (estimated from bench/README.md's runs, nothing measured yet: a compile ~31 s,
eager batched ~55k images/s): ~15 s for the start, CUDA init and the peak; ~8 s per eager row (250,000
images timed, two 1-epoch calls, the agreement) and ~65 s per compiled one (its bf16 compile and the
fp32 agreement's; 90 s for the whole-step compile, 180 s for max-autotune: ``ESTIMATE_S``). The list
runs cheap and telling first; ``--budget-seconds`` (default 225) starts no variant that would end
after it by those estimates, and the JSON (rewritten after every row) names the skipped ones: the
default call is about 4 minutes (the eight eager rows, ``engine-compile``,
``leaves-foreach-reduce-overhead`` and, if the estimates hold, no more); a second call with
``--variants`` takes the rest. Nothing here becomes the engine's default until a GPU has measured it
the winner (then ``StackedModels`` and ``train.py`` adopt it, tests/test_batched.py pinning its agreement).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine_throughput import PeakMemory, data  # noqa: E402
from bench.machine import machine_info, write_results  # noqa: E402
from ddlib.engine.device import autocast, generator, synchronize  # noqa: E402
from ddlib.engine.recipe import Recipe, _scheduler, optimizer_and_scheduler  # noqa: E402
from ddlib.engine.stacked import StackedModels, StackedSGD, StackedTrainStep, channels_last_batch  # noqa: E402
from ddlib.engine.test_pass import Normalize, as_pixels  # noqa: E402
from ddlib.engine.train import train_and_test  # noqa: E402
from ddlib.models import create_model  # noqa: E402
from ddlib.scores.beyond_accuracy import TRAIN_FLOPS_PER_FORWARD, flops_per_image  # noqa: E402

TARGET_IMAGES_PER_S, TARGET_TFLOPS = 200_000, 60.0
STEADY_FROM = 5  # lever rows: images/s over the epochs after these (compiles, graph warm-up and capture)
MEAN, STD = (0.5,) * 3, (0.25,) * 3
AGREE_LRS, AGREE_EPOCHS = (0.01, 0.02, 0.005), 3
AGREE_IPC_BATCH = {"cuda": (10, 25), "cpu": (2, 5)}  # 4 steps an epoch
LOSS_REL_TOL = 1e-4
WEIGHT_TOL = {"cuda": 1e-4, "cpu": 1e-3}

# name -> how it runs: "engine" (train_and_test) or the levers of lever_train
VARIANTS = {
    "engine-eager": {"engine": "batched"},
    "sequential": {"engine": "sequential"},
    "loop": {},
    "leaves-foreach": {"leaves": True, "data": "one-pass"},
    "step-eager": {"leaves": True, "data": "one-pass", "step": "eager"},
    "leaves-foreach-cl": {"leaves": True, "data": "one-pass", "channels_last": True},
    "step-cudagraph": {"leaves": True, "data": "one-pass", "step": "cudagraph"},
    "step-cudagraph-cl": {"leaves": True, "data": "one-pass", "step": "cudagraph", "channels_last": True},
    "engine-compile": {"engine": "batched", "compile": True},
    "leaves-foreach-reduce-overhead": {"leaves": True, "data": "one-pass", "compile_mode": "reduce-overhead"},
    "compile-reduce-overhead": {"compile_mode": "reduce-overhead"},
    "step-compile": {"leaves": True, "data": "one-pass", "step": "compile"},
    "step-compile-reduce-overhead": {"leaves": True, "data": "one-pass", "step": "compile",
                                     "compile_mode": "reduce-overhead"},
    "compile-max-autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
}
# estimated H200 seconds of a variant (its three timed calls and its agreement; a compile ~31 s in bf16,
# about as long again for the fp32 agreement): --budget-seconds starts none that would end after it
ESTIMATE_S = {"eager": 8, "compiled": 65, "step-compile": 90, "compile-max-autotune": 180}
CUDA_ONLY = {"step-cudagraph", "step-cudagraph-cl", "leaves-foreach-reduce-overhead", "compile-reduce-overhead",
             "step-compile-reduce-overhead"}


def lever_train(device, ipc: int, S: int, precision: str, epochs: int, lever: dict, batch: int = 256,
                lrs=None) -> dict:
    """The engine's batched training of S seeded ConvNet-3 models (its initialisation, data orders,
    recipe and schedule) with ``lever``'s parts swapped in. Returns epoch losses (S x epochs), the
    trained models, and the seconds of all epochs and of those from ``STEADY_FROM`` on."""
    images, labels, _, _ = data(ipc, device)
    n, recipe = len(images), Recipe(epochs=epochs, batch_size=batch, precision=precision)
    lrs = list(lrs or [recipe.lr] * S)
    models = []
    for seed in range(S):
        torch.manual_seed(seed)
        models.append(create_model("convnet", 3, 10, (32, 32)).to(device))
    normalize = Normalize(MEAN, STD).to(device)
    leaves, channels_last = lever.get("leaves", False), lever.get("channels_last", False)
    stack = StackedModels(models, compile=lever.get("compile_mode") if lever.get("step") != "compile" and
                          lever.get("compile_mode") else False, stacked_leaves=leaves, channels_last=channels_last)
    if leaves:
        optimizer = StackedSGD(stack.parameters(), lrs, momentum=recipe.momentum, weight_decay=recipe.weight_decay)
        schedulers = [s for s in [_scheduler(recipe, optimizer)] if s is not None]
        optimizers = [optimizer]
    else:
        by_lr = {}
        for model, lr in zip(models, lrs):
            by_lr.setdefault(lr, []).extend(model.parameters())
        steppers = [optimizer_and_scheduler(recipe, params, lr) for lr, params in by_lr.items()]
        optimizers, schedulers = [o for o, _ in steppers], [s for _, s in steppers if s is not None]
    whole = None
    if lever.get("step"):
        whole = StackedTrainStep(stack, optimizers[0], how=lever["step"], compile_mode=lever.get("compile_mode"),
                                 autocast=lambda: autocast(precision, device))
    order_gens = [generator(seed) for seed in range(S)]
    totals, steady_start = [], None
    synchronize(device)
    start = time.perf_counter()
    stack.train()
    for epoch in range(epochs):
        if epoch == min(STEADY_FROM, epochs - 1):
            synchronize(device)
            steady_start, steady_epochs = time.perf_counter(), epochs - epoch
        orders = [torch.randperm(n, generator=g) for g in order_gens]
        if lever.get("data") == "one-pass":
            orders = torch.stack(orders).to(device)
        else:
            orders = [o.to(device) for o in orders]
        total = torch.zeros(S, device=device)
        for i in range(0, n, batch):
            if lever.get("data") == "one-pass":
                idx = orders[:, i:i + batch]
                x, y = normalize(as_pixels(images[idx])), labels[idx]
            else:
                xs = [normalize(as_pixels(images[o[i:i + batch]])) for o in orders]
                x, y = torch.stack(xs), torch.stack([labels[o[i:i + batch]] for o in orders])
            if channels_last:
                x = channels_last_batch(x)
            if whole is not None:
                losses = whole(x, y)
            else:
                if "reduce-overhead" in (lever.get("compile_mode") or ""):
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast(precision, device):
                    logits = stack(x).float()
                    losses = torch.stack([F.cross_entropy(logits[s], y[s]) for s in range(S)])
                for optimizer in optimizers:
                    optimizer.zero_grad(set_to_none=True)
                losses.sum().backward()
                for optimizer in optimizers:
                    optimizer.step()
            total += losses.detach() * min(batch, n - i)
        for scheduler in schedulers:
            scheduler.step()
        totals.append(total)
    synchronize(device)
    end = time.perf_counter()
    return {"epoch_losses": (torch.stack(totals) / n).T.tolist(), "models": stack.release(),
            "seconds": end - start, "steady_seconds": end - steady_start, "steady_epochs": steady_epochs}


def engine_train(device, ipc, S, precision, epochs, lever, batch=256, lrs=None) -> dict:
    """``train_and_test`` as users run it (the engine's batched or sequential mode)."""
    images, labels, test, test_labels = data(ipc, device)
    recipe = Recipe(epochs=epochs, batch_size=batch, precision=precision, compile=lever.get("compile", False))
    results = train_and_test("convnet", images, labels, test, test_labels, num_classes=10, mean=MEAN, std=STD,
                             recipe=recipe, seeds=list(range(S)), lrs=lrs, device=device, keep_models=True,
                             batched=lever["engine"] == "batched")
    seconds = sum(r.train_seconds for r in results)
    return {"epoch_losses": [r.epoch_losses for r in results], "models": [r.model for r in results],
            "seconds": seconds, "steady_seconds": seconds, "steady_epochs": epochs}


def run_variant(device, ipc, S, precision, epochs, lever, **kw) -> dict:
    return (engine_train if "engine" in lever else lever_train)(device, ipc, S, precision, epochs, lever, **kw)


@contextlib.contextmanager
def full_fp32():
    """fp32 without TF32 (cuDNN's convolutions default to it on CUDA): the agreement compares the levers'
    arithmetic, not TF32's rounding of grouped against dense convolutions."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def agreement(device, lever: dict, reference: dict) -> dict:
    """fp32: the variant's per-epoch losses and final weights against the sequential mode's."""
    ipc, batch = AGREE_IPC_BATCH["cuda" if device.type == "cuda" else "cpu"]
    with full_fp32():
        got = run_variant(device, ipc, len(AGREE_LRS), "fp32", AGREE_EPOCHS, lever, batch=batch, lrs=AGREE_LRS)
    loss_gap = max(abs(a - b) / max(abs(b), 1e-12) for g, r in zip(got["epoch_losses"], reference["epoch_losses"])
                   for a, b in zip(g, r))
    weight_gap = 0.0
    for g, r in zip(got["models"], reference["models"]):
        sg, sr = g.state_dict(), r.state_dict()
        weight_gap = max([weight_gap] + [(sg[k].double() - sr[k].double()).abs().max().item() for k in sr])
    tol = WEIGHT_TOL["cuda" if device.type == "cuda" else "cpu"]
    ok = loss_gap <= LOSS_REL_TOL and weight_gap <= tol and all(
        torch.isfinite(torch.tensor(g)).all() for g in got["epoch_losses"])
    return {"agrees": bool(ok), "max_loss_rel_gap": float(f"{loss_gap:.3g}"), "max_weight_gap": float(f"{weight_gap:.3g}"),
            "weight_tolerance": tol, "loss_rel_tolerance": LOSS_REL_TOL, "models": len(AGREE_LRS),
            "epochs": AGREE_EPOCHS, "ipc": ipc, "batch": batch, "tf32": False}


def measured_peak_tflops(device) -> dict:
    """The chip's peak as measured here: CUDA a bf16 8192^3 matmul (best of 10); CPU calibrate.peak (fp32)."""
    if device.type == "cuda":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(10):
            begin, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            a @ b
            stop.record()
            stop.synchronize()
            best = min(best, begin.elapsed_time(stop) / 1e3)
        del a, b
        return {"how": "bf16 matmul 8192^3, best of 10", "tflops": round(2 * 8192 ** 3 / best / 1e12, 1)}
    from ddlib.run.calibrate import peak

    found = peak(torch.float32, batch=256)
    return {"how": "ddlib.run.calibrate.peak(fp32): ConvNet-3 convolutions and a 2048^2 matmul",
            "tflops": round(found["best_gflops"] / 1e3, 4), "gflops": found["gflops"]}


def machine(device) -> dict:
    info = machine_info(device)
    info.update({"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()
                 if torch.backends.cudnn.is_available() else None})
    if device.type == "cuda":
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() + ("+dirty" if dirty else "")) or os.environ.get("DDLIB_COMMIT")
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("DDLIB_COMMIT")


def time_variant(device, ipc, S, precision, epochs, lever, train_flops) -> dict:
    """Two 1-epoch calls (compile, allocator: the first's extra seconds over the second's are the
    compile's), then the timed call of ``epochs``, its peak memory measured."""
    torch._dynamo.reset()
    first = time.perf_counter()
    run_variant(device, ipc, S, precision, 1, lever)
    first = time.perf_counter() - first
    again = time.perf_counter()
    run_variant(device, ipc, S, precision, 1, lever)
    again = time.perf_counter() - again
    with PeakMemory(device) as mem:
        got = run_variant(device, ipc, S, precision, epochs, lever)
    images = S * 10 * ipc
    steady = images * got["steady_epochs"] / got["steady_seconds"]
    return {"S": S, "ipc": ipc, "epochs": epochs, "precision": precision, "images_per_s": round(steady, 1),
            "images_per_s_all_epochs": round(images * epochs / got["seconds"], 1),
            "tflops": round(steady * train_flops / 1e12, 4), "compile_seconds": round(first - again, 2),
            "peak_memory_mb": mem.delta_mb}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), help="default: all (CUDA-only ones on CUDA)")
    ap.add_argument("--models", type=int, help="S (default 25 on CUDA, 3 on the CPU)")
    ap.add_argument("--ipc", type=int, help="default 10 (CPU --quick: 2)")
    ap.add_argument("--images", type=int, help="training images per timed row (default 250,000 CUDA, 3,000 CPU)")
    ap.add_argument("--precision", help="default bf16 on CUDA, fp32 on the CPU")
    ap.add_argument("--quick", action="store_true", help="CPU self-test sizes (S 2, IPC 1, 160 images a row)")
    ap.add_argument("--budget-seconds", type=float, default=225.0,
                    help="start no variant that would end after this many seconds (on CUDA by ESTIMATE_S); "
                         "the JSON is written all the same")
    ap.add_argument("--record", action="store_true", help="write bench/records/engine_<device>.json")
    ap.add_argument("--out", type=Path, help="where the JSON goes (default bench/results/engine_levers_<device>.json)")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: engine_levers skipped")
        return 0
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    setattr(torch._dynamo.config, limit, 64)  # each variant compiles afresh (and resets dynamo first)
    cuda = device.type == "cuda"
    S = args.models or (25 if cuda else 2 if args.quick else 3)
    ipc = args.ipc or (1 if args.quick else 10)
    precision = args.precision or ("bf16" if cuda else "fp32")
    per_row = args.images or (250_000 if cuda else 160 if args.quick else 3_000)
    epochs = max(STEADY_FROM + 3, round(per_row / (S * 10 * ipc)))
    names = args.variants or [v for v in VARIANTS if cuda or v not in CUDA_ONLY]
    out_path = args.out or ROOT / "bench" / ("records" if args.record else "results") / (
        f"engine_{device.type}.json" if args.record else f"engine_levers_{device.type}.json")
    flops = TRAIN_FLOPS_PER_FORWARD * flops_per_image(lambda: create_model("convnet", 3, 10, (32, 32)), (3, 32, 32))
    peak = measured_peak_tflops(device)
    out = {"benchmark": "engine_levers", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": commit(),
           "machine": machine(device), "device": torch.cuda.get_device_name(device) if cuda else "cpu",
           "workload": f"ConvNet-3 (instance norm), random 32x32x3 images, S={S} models, IPC {ipc}, batch 256, "
                       f"{precision}, {epochs} epochs a timed row", "train_flops_per_image": flops,
           "peak": peak, "target": {"images_per_s": TARGET_IMAGES_PER_S, "tflops": TARGET_TFLOPS},
           "batched_images_per_s": None, "sequential_images_per_s": None, "best_variant": None,
           "target_met": False, "skipped": [], "rows": []}
    print(f"peak {peak['tflops']} TFLOP/s ({peak['how']}); S {S}, IPC {ipc}, {precision}, {epochs} epochs a row")
    print(f"{'variant':<32}{'images/s':>10}{'TFLOP/s':>9}{'peak %':>8}{'compile s':>10}{'MB':>8}  agrees")
    agree_ipc, agree_batch = AGREE_IPC_BATCH[device.type if cuda else "cpu"]
    with full_fp32():
        reference = engine_train(device, agree_ipc, len(AGREE_LRS), "fp32", AGREE_EPOCHS, {"engine": "sequential"},
                                 batch=agree_batch, lrs=AGREE_LRS)
    for name in names:
        lever = VARIANTS[name]
        if time.perf_counter() - began + (estimate(name, lever) if cuda else 0) > args.budget_seconds:
            out["skipped"].append(name)
            continue
        row = {"variant": name, "lever": lever}
        try:
            size = max(1, S // 5) if lever.get("engine") == "sequential" else S
            row.update(time_variant(device, ipc, size, precision, max(2, epochs // 5) if size != S else epochs,
                                    lever, flops))
            row["peak_share"] = round(row["tflops"] / peak["tflops"], 4)
            row["agreement"] = agreement(device, lever, reference)
        except Exception as exc:  # an experiment: record what broke and go on
            row["error"] = repr(exc)[:400]
            print(f"{name:<32} FAILED {row['error']}", flush=True)
        else:
            print(f"{name:<32}{row['images_per_s']:>10.0f}{row['tflops']:>9.3f}{100 * row['peak_share']:>8.2f}"
                  f"{row['compile_seconds']:>10.1f}{row['peak_memory_mb']:>8.0f}  {row['agreement']['agrees']}"
                  f" (loss {row['agreement']['max_loss_rel_gap']:.1e}, weights {row['agreement']['max_weight_gap']:.1e})",
                  flush=True)
        row["elapsed_s"] = round(time.perf_counter() - began, 1)
        out["rows"].append(row)
        summarise(out)
        write_results(out, out_path)
    summarise(out)
    out["seconds"] = round(time.perf_counter() - began, 1)
    write_results(out, out_path)
    if out["skipped"]:
        print(f"skipped (over --budget-seconds {args.budget_seconds}): {' '.join(out['skipped'])}")
    return 0


def estimate(name: str, lever: dict) -> float:
    if name in ESTIMATE_S:
        return ESTIMATE_S[name]
    if lever.get("step") == "compile":
        return ESTIMATE_S["step-compile"]
    return ESTIMATE_S["compiled" if lever.get("compile") or lever.get("compile_mode") else "eager"]


def summarise(out: dict) -> None:
    """The top-level fields from the rows: the engine's defaults, the best agreeing variant, the target."""
    rows = {r["variant"]: r for r in out["rows"] if "images_per_s" in r}
    if "engine-eager" in rows:
        out["batched_images_per_s"] = rows["engine-eager"]["images_per_s"]
    if "sequential" in rows:
        out["sequential_images_per_s"] = rows["sequential"]["images_per_s"]
    counted = [r for name, r in rows.items() if name != "sequential" and r.get("agreement", {}).get("agrees")]
    if counted:
        best = max(counted, key=lambda r: r["images_per_s"])
        out["best_variant"] = {k: best[k] for k in ("variant", "images_per_s", "tflops", "peak_share")}
        out["target_met"] = best["images_per_s"] >= TARGET_IMAGES_PER_S and best["tflops"] >= TARGET_TFLOPS
    out["failing"] = [name for name, r in rows.items() if not r.get("agreement", {}).get("agrees")] + [
        r["variant"] for r in out["rows"] if "error" in r]


if __name__ == "__main__":
    sys.exit(main())
