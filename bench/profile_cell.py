#!/usr/bin/env python
"""Where the time of one LRS cell and one ARS cell goes. Writes bench/results/profile_cell.json and
prints a table.

    python bench/profile_cell.py              # digits, random IPC 10, soft-label preset (~2-4 min on 2 cores)
    python bench/profile_cell.py --cifar10    # DC CIFAR-10 (JPEG) IPC 10, the vs_ddranking workload (~30 min)

Each cell runs in this process against a scratch MLflow store, exactly as its notebook's code
does (``open_cell``, ``obtain``, ``evaluate``, ``close``), with timers wrapped around the functions
that do each kind of work. Every second is counted once, in the innermost category running
(exclusive times), so the rows add up to the cell's wall time:

* training steps (the loop: forward, loss, backward, optimizer; less what is counted below),
* augmentation (the ``Augment`` hook), teacher forward passes (``TeacherRelabel.teacher_logits``),
* test passes (the test set's conversion and the inference passes),
* teacher training or loading (all of ``get_teachers``: its training, test pass, MLflow writes),
* MLflow (every tracker write and lookup, model and image-grid artifacts),
* data loading (dataset, reduction, validation split, the distilled set),
* other (everything else: cell set-up, score arithmetic, Python).

Trainings of the learning-rate search (roles ``*-lr<value>-<split>``) are counted in their own
column, so "lr search" is the part of each row spent searching. Kernel start (a Jupyter kernel as
papermill starts one) and the imports of a notebook's first cell are measured apart, once: every
cell the runner executes pays them. Soft-label preset (both datasets): a ConvNet teacher relabels
every batch (KL, T = 4, no T^2), CutMix, lr searched on the grid {0.001 ... 0.1}; cosine schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("DDLIB_SHARED") or ROOT.parent / "shared") / "data"

CATEGORIES = ["training steps", "augmentation", "teacher forward passes", "test passes", "teacher training/loading",
              "MLflow", "data loading", "other"]
TEACHER = "teacher training/loading"
LR_ROLE = re.compile(r"-lr[0-9.e+-]+-(val|test)$")


class Profile:
    """Exclusive wall time per (category, context); context is "lr search" inside search trainings."""

    def __init__(self, device=None):
        self.totals: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [category, context, since]
        self.context = "main"
        self.device = device

    def _sync(self):
        if self.device is not None and self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def section(self, category: str):
        self._sync()
        now = time.perf_counter()
        if self.stack:
            top = self.stack[-1]
            self.totals[(top[0], top[1])] += now - top[2]
        frame = [category, self.context, now]
        self.stack.append(frame)
        self.calls[category] += 1
        try:
            yield
        finally:
            self._sync()
            now = time.perf_counter()
            self.stack.pop()
            self.totals[(frame[0], frame[1])] += now - frame[2]
            if self.stack:
                self.stack[-1][2] = now

    @contextlib.contextmanager
    def in_context(self, context: str):
        old, self.context = self.context, context
        if self.stack:  # the enclosing frame's time so far belongs to the old context
            now = time.perf_counter()
            top = self.stack[-1]
            self.totals[(top[0], top[1])] += now - top[2]
            top[1], top[2] = context, now
        try:
            yield
        finally:
            if self.stack:
                now = time.perf_counter()
                top = self.stack[-1]
                self.totals[(top[0], top[1])] += now - top[2]
                top[1], top[2] = old, now
            self.context = old

    def table(self) -> dict:
        """Seconds per category; everything run inside ``get_teachers`` (context "teacher") is one row."""
        out = {}
        for cat in CATEGORIES:
            if cat == TEACHER:
                items = [(ctx, v) for (c, ctx), v in self.totals.items() if ctx == "teacher"]
            else:
                items = [(ctx, v) for (c, ctx), v in self.totals.items() if c == cat and ctx != "teacher"]
            out[cat] = {"seconds": round(sum(v for _, v in items), 2),
                        "lr_search_seconds": round(sum(v for ctx, v in items if ctx == "lr search"), 2),
                        "calls": self.calls[cat]}
        return out


def _wrap(owner, name: str, profile: Profile, category: str):
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        with profile.section(category):
            return original(*args, **kwargs)

    setattr(owner, name, timed)
    return owner, name, original


def instrument(profile: Profile) -> list:
    """Wrap the functions doing each kind of work; returns what to restore."""
    from ddlib.store import tracking
    from ddlib.engine import labels, test_pass, train
    from ddlib.engine.augment import registry
    from ddlib.protocols import cell as cell_mod, teachers

    patches = [
        _wrap(train, "_train", profile, "training steps"),
        _wrap(registry.Augment, "__call__", profile, "augmentation"),
        _wrap(labels.TeacherRelabel, "teacher_logits", profile, "teacher forward passes"),
        _wrap(test_pass, "_confusion", profile, "test passes"),
        _wrap(test_pass, "_hits", profile, "test passes"),
        _wrap(test_pass, "_prepared", profile, "test passes"),
        _wrap(cell_mod, "load_dataset", profile, "data loading"),
        _wrap(cell_mod, "reduce_dataset", profile, "data loading"),
        _wrap(cell_mod, "hold_out_validation", profile, "data loading"),
        _wrap(cell_mod, "init_store", profile, "MLflow"),
        _wrap(teachers, "init_store", profile, "MLflow"),
        _wrap(cell_mod.Cell, "log_set", profile, "MLflow"),
        _wrap(cell_mod.Cell, "_store_model", profile, "MLflow"),
        _wrap(cell_mod.Cell, "_load_model", profile, "MLflow"),
    ]
    for method in ("start_run", "log_params", "set_tags", "log_metrics", "log_series", "_log", "log_artifact",
                   "log_dict", "end_run", "fail_run", "find_finished"):
        patches.append(_wrap(tracking.Tracker, method, profile, "MLflow"))

    original_train = cell_mod.train_and_test

    @functools.wraps(original_train)
    def train_in_context(*args, **kwargs):
        context = "lr search" if LR_ROLE.search(kwargs.get("desc", "")) else "main"
        with profile.in_context(context):
            return original_train(*args, **kwargs)

    cell_mod.train_and_test = train_in_context
    patches.append((cell_mod, "train_and_test", original_train))

    original_teachers = teachers.get_teachers

    @functools.wraps(original_teachers)
    def teachers_in_context(*args, **kwargs):
        with profile.in_context("teacher"), profile.section(TEACHER):
            return original_teachers(*args, **kwargs)

    teachers.get_teachers = teachers_in_context
    patches.append((teachers, "get_teachers", original_teachers))
    return patches


def restore(patches: list) -> None:
    for owner, name, original in reversed(patches):
        setattr(owner, name, original)


def kernel_start() -> dict:
    """Seconds to start a Jupyter kernel (as papermill does) and to run a notebook's first imports in it."""
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError as e:  # pragma: no cover - papermill brings jupyter_client
        return {"error": str(e)}
    t = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3", extra_arguments=["--log-level=CRITICAL"])
    started = time.perf_counter() - t
    try:
        t = time.perf_counter()
        reply = kc.execute_interactive("from ddlib.protocols import label_robust, augmentation_robust\n"
                                       "from ddlib.report.viz import show_set", timeout=300, output_hook=lambda m: None)
        imports = time.perf_counter() - t
        ok = reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return {"kernel_start_seconds": round(started, 2), "first_cell_imports_seconds": round(imports, 2),
            "imports_ok": ok}


def write_preset(path: Path, epochs: int, precision: str | None = None) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "method": "profile-soft-label",
        "citation": "bench/profile_cell.py: teacher relabelling (ConvNet teacher), KL T=4 without T^2, CutMix, lr search",
        "recipe": {"epochs": epochs, "batch_size": 256, "optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                   "weight_decay": 0.0005, "scheduler": "cosine", **({"precision": precision} if precision else {})},
        "labels": {"type": "teacher", "loss": {"name": "kl", "temperature": 4.0, "t_squared": False},
                   "teacher": {"arch": "convnet", "count": 1}},
        "augment": [{"cutmix": {"alpha": 1.0, "p": 1.0}}],
        "zca": False}, sort_keys=False))
    return path


def profile_protocol(protocol: str, params: dict, store: Path) -> dict:
    import torch

    from ddlib.store import tracking
    from ddlib.engine.device import resolve_device
    from ddlib.protocols import augmentation_robust, label_robust

    os.environ["DDLIB_MLRUNS"] = str(store)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if hasattr(tracking, "_CLIENTS"):
        tracking._CLIENTS.clear()
    module = label_robust if protocol == "lrs" else augmentation_robust
    profile = Profile(resolve_device(params.get("device", "auto")))
    patches = instrument(profile)
    load = os.getloadavg()[0]
    try:
        with profile.section("other"):
            t = time.perf_counter()
            cell = module.open_cell(**params)
            cell.progress = False
            with profile.section("data loading"):
                distilled = module.obtain(cell)
            result = module.evaluate(cell, distilled)
            cell.close()
            wall = time.perf_counter() - t
    finally:
        restore(patches)
    rows = profile.table()
    trainings = len(cell.tracker.client.search_runs(
        [cell.tracker.client.get_run(cell.run_id).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{cell.run_id}'", max_results=1000))
    return {"wall_seconds": round(wall, 2), "categories": rows, "trainings": trainings,
            "lr_search_seconds": round(sum(r["lr_search_seconds"] for r in rows.values()), 2),
            "summary": {k: round(v, 4) for k, v in result.summary.items() if k.endswith("_mean")},
            "threads": torch.get_num_threads(), "load_average_before_after": [round(load, 2),
                                                                              round(os.getloadavg()[0], 2)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cifar10", action="store_true", help="DC CIFAR-10 (JPEG) IPC 10 instead of digits")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, help="every training's epochs (digits 50, CIFAR-10 50)")
    ap.add_argument("--teacher-epochs", type=int, help="digits 30, CIFAR-10 20")
    ap.add_argument("--train-per-class", type=int, help="CIFAR-10: real images per class (default 200)")
    ap.add_argument("--test-size", type=int, help="CIFAR-10: stratified test subset (default: all 10,000)")
    ap.add_argument("--protocols", nargs="+", choices=["lrs", "ars"], default=["lrs", "ars"])
    ap.add_argument("--lr-select", choices=["validation", "test"], default="validation",
                    help="test: as the peer does (vs_ddranking.py's matched workload)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "auto"], help="every training's precision (default: the recipe's)")
    ap.add_argument("--no-kernel", action="store_true", help="skip the kernel-start measurement")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "profile_cell.json")
    args = ap.parse_args(argv)

    import torch

    epochs = args.epochs or 50
    teacher_epochs = args.teacher_epochs or (20 if args.cifar10 else 30)
    scratch = Path(tempfile.mkdtemp(prefix="profile-cell-"))
    try:
        preset = write_preset(scratch / "soft_preset.yaml", epochs, args.precision)
        common = dict(ipc=10, model="convnet", seeds=list(args.seeds), baseline_seed=0, device="auto",
                      preset=str(preset), teacher_recipe={"epochs": teacher_epochs, "batch_size": 256},
                      lr_policy="symmetric", lr_select=args.lr_select)
        if args.cifar10:
            from ddlib.data.loaders import cache_dir, extract_archive

            archive, dc = SHARED / "cifar10-jpeg.tar.gz", SHARED / "distilled" / "dc_cifar10_convnet_ipc10.pt"
            missing = [str(p) for p in (archive, dc) if not p.exists()]
            if missing:
                print(f"missing {missing}", file=sys.stderr)
                return 2
            tree = extract_archive(archive, cache_dir() / "cifar10-jpeg")
            common.update(dataset="cifar10", data_root=str(tree), method="dc", source={"kind": "file", "path": str(dc)},
                          train_per_class=args.train_per_class or 200, test_size=args.test_size)
            workload = "DC CIFAR-10 (JPEG) IPC 10"
        else:
            common.update(dataset="digits", method="random")
            workload = "digits, random subset IPC 10"
        params = {"lrs": {**common, "recipe": {"epochs": epochs, "scheduler": "cosine",
                                               **({"precision": args.precision} if args.precision else {})}},
                  "ars": dict(common)}
        result = {"benchmark": "profile_cell", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "workload": workload,
                  "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                              "threads": torch.get_num_threads(), "torch": torch.__version__,
                              "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                              "load_average_start": [round(v, 2) for v in os.getloadavg()]},
                  "settings": {"seeds": args.seeds, "epochs": epochs, "teacher_epochs": teacher_epochs,
                               "preset": preset.read_text(), "params": {k: {**v, "preset": "soft_preset.yaml"}
                                                                        for k, v in params.items()}},
                  "protocols": {}}
        if not args.no_kernel:
            result["kernel"] = kernel_start()
            print(f"kernel start {result['kernel']}", flush=True)
        for protocol in args.protocols:
            print(f"profiling {protocol} ...", flush=True)
            result["protocols"][protocol] = profile_protocol(protocol, params[protocol], scratch / f"mlruns-{protocol}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    print(table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


def table(result: dict) -> str:
    protocols = list(result["protocols"])
    head = f"{'':<26}" + "".join(f"{p.upper() + ' s':>10}{'%':>6}{'lr search':>11}" for p in protocols)
    lines = [f"{result['workload']}, seeds {result['settings']['seeds']}, {result['settings']['epochs']} epochs",
             head]
    for cat in CATEGORIES:
        line = f"{cat:<26}"
        for p in protocols:
            r, wall = result["protocols"][p]["categories"][cat], result["protocols"][p]["wall_seconds"]
            line += f"{r['seconds']:>10.1f}{100 * r['seconds'] / wall:>6.1f}{r['lr_search_seconds']:>11.1f}"
        lines.append(line)
    line = f"{'cell wall time':<26}"
    for p in protocols:
        r = result["protocols"][p]
        line += f"{r['wall_seconds']:>10.1f}{100.0:>6.1f}{r['lr_search_seconds']:>11.1f}"
    lines.append(line)
    lines.append("trainings: " + ", ".join(f"{p.upper()} {result['protocols'][p]['trainings']}" for p in protocols)
                 + "; load average " + ", ".join(f"{p.upper()} {result['protocols'][p]['load_average_before_after']}"
                                                 for p in protocols))
    if "kernel" in result:
        k = result["kernel"]
        lines.append(f"per notebook, before the cell: kernel start {k.get('kernel_start_seconds')} s, "
                     f"first-cell imports {k.get('first_cell_imports_seconds')} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
