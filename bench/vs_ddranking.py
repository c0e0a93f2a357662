#!/usr/bin/env python
"""ddlib and the peer package DD-Ranking (``ddranking==0.2.0``) on the same workload.

Workload: the DC-distilled CIFAR-10 set at IPC 10 (``../shared/data/distilled/dc_cifar10_convnet_ipc10.pt``)
scored with

* the soft-label Label-Robust Score (teacher relabelling every CutMix batch, KL loss): the peer's
  ``LabelRobustScoreSoft`` and ``ddlib.protocols.label_robust`` with a preset whose labels come
  from a teacher;
* the soft-label Augmentation-Robust Score: the peer's ``AugmentationRobustScore`` and
  ``ddlib.protocols.augmentation_robust`` with the same preset;

with the same model (ConvNet-3, instance norm), epochs, optimizer, lr grid, teacher (trained once
by ddlib, handed to the peer as its checkpoint), random subset, seeds and data (CIFAR-10 (JPEG)
from ``../shared/data/cifar10-jpeg.tar.gz``, decoded by ddlib and written in torchvision's
``cifar-10-batches-py`` layout for the peer, once, under ``${DDLIB_CACHE:-~/.cache/ddlib}``).

The peer runs in its own virtual environment (``${DDLIB_CACHE:-~/.cache/ddlib}/venv-ddranking``, or
``$DDLIB_PEER_VENV``; created on first use, reused after, shared with ``tests/peer.py``) through
``bench/ddranking_wrapper.py``, which holds every workaround for the peer's
defects. ddlib runs in this process against a scratch MLflow store (``DDLIB_MLRUNS`` in a temporary
folder), one for both protocols as users run them (``--store shared``): ARS then reuses the lr
searches of LRS's soft-label sides, which train the same models (same numbers, fewer trainings).
``--store separate`` gives each protocol its own store, so neither reuses the other's models.

Writes ``bench/results/vs_ddranking.json`` and prints a comparison table.

    .venv/bin/python bench/vs_ddranking.py --quick   # ~15 min on a 2-core Zen 5 EPYC (first run: + ~2 min venv setup)
    .venv/bin/python bench/vs_ddranking.py           # default reductions, 2 seeds
    .venv/bin/python bench/vs_ddranking.py --peer-defaults [--quick] [--seeds 0 1 2 3 4]

``--peer-defaults`` runs the peer twice, as users run it (its defaults wherever they do not crash:
a test every 20 epochs with the best test accuracy kept, 4 DataLoader workers, the lr searched on
the test set in every evaluation run) and in the matched mode (one test after the last epoch, no
workers), on the full 10,000-image test set, and writes ``ratio_defaults`` and ``ratio_matched``
(peer wall time / ddlib wall time, LRS + ARS, teacher training excluded) at the top level of the JSON.
``time_breakdown`` says where each side's time goes (training, test passes, data loading, python/other);
``--record`` also writes the short ``bench/records/vs_ddranking_<device>.json``.

On a GPU (``--device cuda``; the peer gets the same device) with an interpreter that imports ddranking
already (no venv, no network), the device machine's one call, after the wheels' install into /tmp/site
(exit 3: the budget stopped it, partial JSON and record; copy bench/records/vs_ddranking_cuda.json to $OUT):

    DDLIB_SHARED=$PWD/.devdata PYTHONPATH=/tmp/site:$PWD DDLIB_BENCH_COMMIT=<sha> timeout 440 \
        python3 bench/vs_ddranking.py --device cuda --peer-defaults --peer-python "$(command -v python3)" \
        --budget-seconds 410 --record --out $OUT/vs_ddranking_cuda_full.json

Sizes on CUDA with ``--peer-defaults`` (:data:`GPU_PEER_DEFAULTS`): those of the CPU runs' ``--quick
--peer-defaults`` (1 seed, 20 epochs, teacher 10 epochs, 100 real images per class, the full 10,000-image
test set), the workload of the documented CPU ratios. Estimate for a fresh H200 machine (not measured;
from bench/README.md's GPU runs and this CPU): start, imports and CUDA ~15 s; extracting and decoding
60,000 JPEGs (threaded) and the torchvision copies <= 40 s; the teacher ~3 s; ddlib LRS + ARS ~60 s
(26 trainings of 20 steps, 26 test passes; the GPU check's cells took 20-35 s each); the peer matched
~85 s (start and probes ~15 s; 38 trainings x (20 epochs x ~15 ms + one 10,000-image test through PIL,
~1.5 s)); the peer at its defaults ~100-190 s (38 trainings x 20 epochs x 4 DataLoader worker processes
forked per epoch, 0.1-0.2 s an epoch on 16 cores, 0.6-1.8 s on the 2-core CPU, + one test each).
About 300-390 s of an 8-minute call; 50 epochs (the CPU's non-quick ``--peer-defaults``) would be
500-700 s, and the full 50,000 training images would add ~2.5 M PIL loads per peer mode: neither fits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddlib.specs import units
from ddlib.store.cache import cache_dir
from ddlib.store.tracking import run_metrics

os.environ.setdefault("TQDM_DISABLE", "1")  # before anything imports tqdm

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED = Path(os.environ.get("DDLIB_SHARED") or ROOT.parent / "shared") / "data"
ARCHIVE = SHARED / "cifar10-jpeg.tar.gz"
DC_FILE = SHARED / "distilled" / "dc_cifar10_convnet_ipc10.pt"
# One peer venv per machine (~6 GB), shared by this script and the conformance tests (tests/peer.py).
PEER_VENV = Path(os.environ.get("DDLIB_PEER_VENV") or cache_dir() / "venv-ddranking")
WRAPPER = BENCH / "ddranking_wrapper.py"
RESULTS = BENCH / "results" / "vs_ddranking.json"

PEER_PACKAGE = "ddranking==0.2.0"
# Installed after `pip install --no-deps ddranking==0.2.0`: what its source imports (read from its
# files: torch, torchvision, timm, kornia, numpy, pandas, tqdm, yaml). torch/torchvision are the
# exact pins of this project (any other version is a multi-GB download). The peer declares
# numpy<2.0.0, so numpy 1.26.4, and pandas 2.2.3 (pandas 3 needs numpy >= 2). It declares scipy
# but never imports it (not installed) and imports yaml without declaring it (pyyaml installed).
PEER_PINS = ["torch==2.14.1", "torchvision==0.29.1", "numpy==1.26.4", "pandas==2.2.3", "timm==1.0.31",
             "kornia==0.9.0", "tqdm==4.70.1", "pyyaml==6.0.3"]

LR_GRID = [0.001, 0.005, 0.01, 0.05, 0.1]  # the peer's hard-coded grid (soft_label.py, aug_robust.py)
IPC = 10
PEER_MODEL = "ConvNet-3"  # = ddlib "convnet": width 128, depth 3, GroupNorm(C, C) instance norm, avg pool

QUICK = dict(seeds=[0], epochs=10, teacher_epochs=10, train_per_class=100, test_size=1000)
DEFAULT = dict(seeds=[0, 1], epochs=20, teacher_epochs=20, train_per_class=200, test_size=2000)
# --peer-defaults: the peer also at its defaults (tests every 20 epochs, keeps the best, 4 DataLoader
# workers), on the full 10,000-image test set; 50 epochs (20 in --quick, so that it tests at all).
PEER_DEFAULTS = dict(seeds=[0], epochs=50, teacher_epochs=20, train_per_class=200, test_size=None)
PEER_DEFAULTS_QUICK = dict(seeds=[0], epochs=20, teacher_epochs=10, train_per_class=100, test_size=None)
# --device cuda --peer-defaults (not --quick): the workload of the CPU's --quick --peer-defaults runs,
# sized to fit one 8-minute device call with ddlib and both peer modes (the estimate in the docstring)
GPU_PEER_DEFAULTS = dict(PEER_DEFAULTS_QUICK)
PEER_TEST_INTERVAL = 20  # the peer's default (LabelRobustScoreSoft / AugmentationRobustScore.__init__)


# --------------------------------------------------------------------------- the peer's venv


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


VERSION_NAMES = ["ddranking", "torch", "torchvision", "numpy", "pandas", "timm", "kornia", "tqdm", "pyyaml"]


def _peer_versions(py: Path | None = None, extra: bool = False) -> dict | None:
    """The versions ``py`` (default: the peer venv's Python) sees; ``extra``: also kornia_rs, pillow,
    scipy and what torch was built with (CUDA, cuDNN), which imports torch (a few seconds)."""
    py = py or peer_python()
    if not py.exists():
        return None
    names = VERSION_NAMES + (["kornia_rs", "pillow", "scipy"] if extra else [])
    code = ("import importlib.metadata as m, json, sys\n"
            f"names={names!r}\n"
            "out={}\n"
            "for n in names:\n"
            "    try: out[n]=m.version(n)\n"
            "    except m.PackageNotFoundError: out[n]=None\n"
            + ("import torch\n"
               "out['python']=sys.version.split()[0]\n"
               "out['torch_cuda']=torch.version.cuda\n"
               "out['cudnn']=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None\n"
               "out['cuda_available']=torch.cuda.is_available()\n" if extra else "")
            + "print(json.dumps(out))")
    try:
        return json.loads(_run([str(py), "-c", code], env={**os.environ}).stdout)
    except (subprocess.CalledProcessError, json.JSONDecodeError):
        return None


def given_peer_env(python: Path) -> dict:
    """``--peer-python``: an interpreter that imports ddranking already (the device machine's ``python3``
    with the wheels on ``PYTHONPATH``); no venv is made. Records what it sees."""
    t = time.perf_counter()
    versions = _peer_versions(python, extra=True)
    if not versions or not versions.get("ddranking"):
        raise RuntimeError(f"{python} cannot import ddranking (PYTHONPATH={os.environ.get('PYTHONPATH')!r}): "
                           f"versions seen {versions}")
    return {"path": str(python), "reused": None, "given": True, "pythonpath": os.environ.get("PYTHONPATH"),
            "setup_seconds": round(time.perf_counter() - t, 1), "versions": versions}


def ensure_peer_venv() -> dict:
    """Create the peer's venv (:data:`PEER_VENV`) with the peer and its imports, or reuse it if it
    has them. Under an exclusive lock, so two processes never build it at once."""
    import fcntl

    wanted = {p.split("==")[0]: p.split("==")[1] for p in [PEER_PACKAGE, *PEER_PINS]}

    def ok(v):
        return v is not None and all((v.get(k) or "").split("+")[0] == want for k, want in wanted.items())

    t = time.perf_counter()
    PEER_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(PEER_VENV.parent / f".{PEER_VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        versions = _peer_versions()
        reused = ok(versions)
        if not reused:
            versions = _install_peer(ok, wanted)
    return {"path": str(PEER_VENV), "reused": reused, "setup_seconds": round(time.perf_counter() - t, 1),
            "install": [f"pip install --no-deps {PEER_PACKAGE}", "pip install " + " ".join(PEER_PINS)],
            "versions": versions}


def _install_peer(ok, wanted) -> dict:
    """``pip install --no-deps`` the peer, then the pins of what its source imports, into :data:`PEER_VENV`."""
    print(f"creating {PEER_VENV} (pip install --no-deps {PEER_PACKAGE}; then {' '.join(PEER_PINS)}) ...", flush=True)
    if not peer_python().exists():
        _run([sys.executable, "-m", "venv", str(PEER_VENV)])
    pip = [str(peer_python()), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run([*pip, "--no-deps", PEER_PACKAGE])
    _run([*pip, *PEER_PINS])
    versions = _peer_versions()
    if not ok(versions):
        raise RuntimeError(f"{PEER_VENV}: installed versions {versions} differ from the pins {wanted}")
    return versions


# --------------------------------------------------------------------------- data


def data_digest(images_nchw, labels) -> str:
    """SHA-256 of uint8 NCHW images and int64 labels (the wrapper computes the same on the peer's view)."""
    import numpy as np

    h = hashlib.sha256()
    for a in (np.ascontiguousarray(np.asarray(images_nchw)), np.asarray(labels, dtype=np.int64)):
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def write_torchvision_cifar10(ds, dest: Path) -> Path:
    """Write a ddlib Dataset in torchvision's ``cifar-10-batches-py`` layout under ``dest`` (once).

    ``data_batch_1..5`` split the training images in order, ``test_batch`` holds the test images;
    each is a pickled dict with ``data`` (uint8 rows, CHW order, 3072 values) and ``labels``;
    ``batches.meta`` holds ``label_names``. Written to a temporary sibling, then renamed, so a
    crash never leaves a half-written folder that later looks complete. The md5 sums are not the
    official ones: torchvision's check must be bypassed to read it (the wrapper does)."""
    import numpy as np

    base = dest / "cifar-10-batches-py"
    manifest = dest / "ddlib-manifest.json"
    if manifest.exists() and (base / "test_batch").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        out = tmp / "cifar-10-batches-py"
        out.mkdir()
        train_x = ds.train_images.numpy().reshape(len(ds.train_labels), -1)
        train_y = ds.train_labels.numpy()
        for i, idx in enumerate(np.array_split(np.arange(len(train_y)), 5)):
            entry = {"batch_label": f"training batch {i + 1} of 5", "labels": train_y[idx].tolist(),
                     "data": np.ascontiguousarray(train_x[idx], dtype=np.uint8),
                     "filenames": [f"train_{j:05d}.png" for j in idx]}
            with open(out / f"data_batch_{i + 1}", "wb") as f:
                pickle.dump(entry, f, protocol=2)
        test_x = ds.test_images.numpy().reshape(len(ds.test_labels), -1)
        entry = {"batch_label": "testing batch 1 of 1", "labels": ds.test_labels.numpy().tolist(),
                 "data": np.ascontiguousarray(test_x, dtype=np.uint8),
                 "filenames": [f"test_{j:05d}.png" for j in range(len(test_x))]}
        with open(out / "test_batch", "wb") as f:
            pickle.dump(entry, f, protocol=2)
        with open(out / "batches.meta", "wb") as f:
            pickle.dump({"label_names": list(ds.class_names), "num_cases_per_batch": 10000, "num_vis": 3072}, f, protocol=2)
        (tmp / "ddlib-manifest.json").write_text(json.dumps({
            "written_by": "bench/vs_ddranking.py", "from": ds.source,
            "train": len(train_y), "test": len(test_x), "classes": list(ds.class_names),
            "train_digest": data_digest(ds.train_images.numpy(), train_y),
            "test_digest": data_digest(ds.test_images.numpy(), ds.test_labels.numpy()),
        }, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


# --------------------------------------------------------------------------- ddlib side


def write_preset(path: Path, cfg: dict) -> Path:
    """The workload as a ddlib method preset (a temporary YAML file; presets may be paths)."""
    import yaml

    preset = {
        "method": "vs-ddranking",
        "citation": "bench/vs_ddranking.py workload: DD-Ranking 0.2.0 LabelRobustScoreSoft / AugmentationRobustScore "
                    "with soft_label_mode M (teacher relabelling), KL, CutMix",
        "recipe": {"epochs": cfg["epochs"], "batch_size": cfg["batch_size"], "optimizer": "sgd", "lr": 0.01,
                   "momentum": 0.9, "weight_decay": 0.0005, "scheduler": "cosine",
                   **({"precision": cfg["precision"]} if cfg.get("precision") else {})},
        "labels": {"type": "teacher",
                   "loss": {"name": "kl", "temperature": cfg["temperature"], "t_squared": False},
                   "teacher": {"arch": "convnet", "count": 1}},
        "augment": [{"cutmix": {"alpha": cfg["cutmix_beta"], "p": 1.0}}],
        "zca": False,
    }
    path.write_text(yaml.safe_dump(preset, sort_keys=False))
    return path


def _child_trials(cell) -> list[dict]:
    """Every model the cell trained (child runs): role, seed, accuracy, seconds."""
    client = cell.tracker.client
    run = client.get_run(cell.run_id)
    children = client.search_runs([run.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{cell.run_id}'", max_results=1000)
    out = []
    for r in children:
        m, p = run_metrics(r), r.data.params  # fractions, as the peer's side of the JSON
        out.append({"role": p.get("role"), "seed": int(p.get("seed", -1)),
                    "lr": float(p["recipe.lr"]) if "recipe.lr" in p else None,
                    "acc": m.get("test_accuracy"), "train_seconds": round(m.get("train_seconds", float("nan")), 2),
                    "eval_seconds": round(m.get("eval_seconds", float("nan")), 2)})
    return sorted(out, key=lambda r: (str(r["role"]), r["seed"]))


def run_ours(protocol: str, params: dict, store: Path, teacher_recipe: dict, export_teacher: Path | None) -> dict:
    """One ddlib cell against the MLflow store ``store``; the teacher is trained first (timed apart)."""
    import torch

    os.environ["DDLIB_MLRUNS"] = str(store)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    from ddlib.protocols.teachers import get_teachers
    from ddlib.protocols import augmentation_robust, label_robust
    from ddlib.engine.train import Normalize, Recipe, model_accuracy

    module = label_robust if protocol == "lrs" else augmentation_robust
    cuda = str(params.get("device", "cpu")).startswith("cuda")

    def sync():  # a timer ends when the device's queued work has
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    load_before = os.getloadavg()
    cell = module.open_cell(**params)
    cell.progress = False  # no per-training progress bars in the benchmark's output
    sync()
    t_open = time.perf_counter() - t0
    ds = cell.dataset

    t = time.perf_counter()
    # keyed as the cell's own call keys it (the protocol's revision is in a teacher's key), so the cell finds
    # this teacher instead of training its own inside the timed part (it did until 2026-11-29: ~52 s of
    # LRS's 434 s on a 2-core Zen 3)
    (teacher,) = get_teachers(ds, "convnet", 1, Recipe.from_dict(teacher_recipe), seeds=[0], device=cell.device,
                              protocol=cell.protocol)
    sync()
    teacher_seconds = time.perf_counter() - t
    state = {k: v.detach().cpu().clone() for k, v in teacher.state_dict().items()}
    teacher_digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in state.values())).hexdigest()[:24]
    teacher_acc = model_accuracy(teacher, ds.test_images, ds.test_labels, Normalize(ds.mean, ds.std).to(cell.device))
    if export_teacher is not None:
        export_teacher.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, export_teacher)

    t1 = time.perf_counter()
    distilled = module.obtain(cell)
    result = module.evaluate(cell, distilled)
    cell.close()
    sync()
    t_eval = time.perf_counter() - t1

    metrics = cell.tracker.client.get_run(cell.run_id).data.metrics
    return {  # accuracies as fractions, as the peer's side and every earlier record of this JSON
        "per_seed": [{k: v if k == "seed" else units.computed(k, v) for k, v in row.items()}
                     for row in result.per_seed.to_dict("records")],
        "summary": {k: units.computed(k, v) for k, v in result.summary.items()},
        "lr_chosen": {k[:-3]: v for k, v in metrics.items() if k.endswith("_lr")},
        # lr searches this cell ran and those it found in the store (a search is keyed by what it
        # trains, so with one store ARS reuses the searches of LRS's soft-label sides)
        "lr_searches": {"run": metrics.get("lr_searches_run"), "reused": metrics.get("lr_searches_reused")},
        "trials": _child_trials(cell),
        "open_seconds": round(t_open, 2), "evaluate_seconds": round(t_eval, 2),
        "wall_seconds": round(t_open + t_eval, 2),  # teacher excluded: the peer gets it as a file
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "teacher": {"seconds": round(teacher_seconds, 2), "test_acc": teacher_acc, "state_digest": teacher_digest},
        "dataset": {"source": ds.source, "train": len(ds.train_labels), "test": len(ds.test_labels),
                    "train_digest": data_digest(ds.train_images.cpu().numpy(), ds.train_labels.cpu().numpy()),
                    "test_digest": data_digest(ds.test_images.cpu().numpy(), ds.test_labels.cpu().numpy())},
        "_cell_dataset": ds, "_distilled": distilled,
    }


# --------------------------------------------------------------------------- comparison


def peer_per_iteration(peer: dict, protocol: str, seeds: list[int], w: float) -> list[dict]:
    """The peer's accuracies per evaluation run (from the instrumented helpers), as fractions, with
    its own (percent-scale) score next to ddlib's formula applied to the same accuracies."""
    from ddlib.scores import metrics
    raw = peer[protocol]
    rows = []
    for i, seed in enumerate(seeds):
        h = [x for x in raw["helpers"] if x["iteration"] == i]

        def pick(helper, side):
            hits = [x for x in h if x["helper"] == helper and x["side"] == side]
            return hits[0] if hits else None

        row = {"seed": seed}
        if protocol == "lrs":
            parts = {"acc_syn_hard": pick("_compute_hard_label_metrics_helper", "syn"),
                     "acc_real_hard": pick("_compute_hard_label_metrics_helper", "real"),
                     "acc_syn_any": pick("_compute_soft_label_metrics_helper", "syn"),
                     "acc_rdm_any": pick("_compute_soft_label_metrics_helper", "rdm")}
        else:
            parts = {"acc_syn_aug": pick("_compute_with_aug_metrics_helper", "syn"),
                     "acc_rdm_aug": pick("_compute_with_aug_metrics_helper", "rdm"),
                     "acc_syn_noaug": pick("_compute_without_aug_metrics_helper", "syn"),
                     "acc_rdm_noaug": pick("_compute_without_aug_metrics_helper", "rdm")}
        for k, x in parts.items():
            row[k] = x["acc_percent"] / 100 if x else float("nan")
            row[k.replace("acc_", "lr_")] = x["best_lr"] if x else None
        if protocol == "lrs":
            fixed = [t for t in raw["trials"] if t["iteration"] == i and t["kind"] == "hard" and t["side"] == "syn"
                     and t["lr"] == 0.01]
            row["acc_syn_hard_at_lr0.01"] = fixed[0]["acc_percent"] / 100 if fixed else float("nan")
            row["hlr"] = row["acc_real_hard"] - row["acc_syn_hard"]
            row["ior"] = row["acc_syn_any"] - row["acc_rdm_any"]
            row["score_ddlib_formula"] = metrics.lrs(row["hlr"], row["ior"], w)
        else:
            row["ior_aug"] = row["acc_syn_aug"] - row["acc_rdm_aug"]
            row["ior_noaug"] = row["acc_syn_noaug"] - row["acc_rdm_noaug"]
            row["score_ddlib_formula"] = metrics.ars(row["ior_aug"], row["ior_noaug"], w)
        rows.append(row)
    # the peer's own per-run score, from the CSV it saved (column lrs / ars_list)
    csv = raw.get("saved_csv") or ""
    lines = [ln for ln in csv.strip().splitlines() if ln]
    if lines:
        header = lines[0].split(",")
        col = header.index("lrs" if protocol == "lrs" else "ars_list")
        for row, line in zip(rows, lines[1:]):
            row["score_peer"] = float(line.split(",")[col])
    return rows


def run_peer(spec: dict, spec_file: Path, python: Path, timeout: float | None = None) -> dict:
    """One run of the wrapper with the peer's Python: its raw JSON, wall time and the load average around
    it. Stopped after ``timeout`` seconds (the budget's time left): then ``failed`` is "timeout" and
    ``partial_raw`` holds the protocols it finished (the wrapper writes its JSON after each)."""
    spec_file.write_text(json.dumps(spec, indent=1))
    t = time.perf_counter()
    load_before = os.getloadavg()
    log_file = spec_file.with_suffix(".log")
    with open(log_file, "w") as log:
        try:
            proc = subprocess.run([str(python), str(WRAPPER), str(spec_file)], stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TQDM_DISABLE": "1"}, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.perf_counter() - t
    log_text = log_file.read_text()
    if code != 0:
        out = Path(spec["out"])
        partial = json.loads(out.read_text()) if out.exists() else None
        return {"failed": code, "log_tail": log_text[-8000:], "process_seconds": round(wall, 1),
                "partial_raw": partial}
    raw = json.loads(Path(spec["out"]).read_text())
    raw["process_log_tail"] = log_text[-4000:]
    return {"raw": raw, "process_seconds": round(wall, 1),
            "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]}


def peer_summary(raw: dict, protocols: list[str], cfg: dict) -> dict:
    """The peer's run per protocol: accuracies per seed, what it returned, its seconds and clock."""
    return {protocol: {
        "per_seed": peer_per_iteration(raw, protocol, cfg["seeds"], cfg["w"] if protocol == "lrs" else cfg["gamma"]),
        "returned": raw[protocol]["returned"], "wall_seconds": raw[protocol]["wall_seconds"],
        "setup_seconds": raw[protocol]["setup_seconds"], "compute_seconds": raw[protocol]["compute_seconds"],
        "clock": raw[protocol].get("clock"),
        "test_interval": raw.get("test_interval", {}).get(protocol),
        "num_workers": raw.get("num_workers", {}).get(protocol),
        "trials": raw[protocol]["trials"]} for protocol in protocols}


def ratios(results: dict, protocols: list[str]) -> dict:
    """Peer wall time / ddlib wall time over the protocols run (LRS + ARS), per mode and per protocol.
    ddlib's wall time excludes teacher training (the peer is handed the teacher as a file); the
    peer's is its metric objects' construction and compute_metrics (not its process start)."""
    ours = sum(results["ours"][p]["wall_seconds"] for p in protocols)
    out = {"ratios": {"ddlib_wall_seconds": round(ours, 1), "per_protocol": {}}}
    for key, mode in (("ratio_matched", "peer"), ("ratio_defaults", "peer_defaults")):
        peer = results.get(mode)
        if not peer or any(p not in peer for p in protocols):
            continue
        wall = sum(peer[p]["wall_seconds"] for p in protocols)
        out[key] = round(wall / ours, 3)
        out["ratios"][f"{key.removeprefix('ratio_')}_peer_wall_seconds"] = round(wall, 1)
        for p in protocols:
            out["ratios"]["per_protocol"].setdefault(p, {})[key.removeprefix("ratio_")] = round(
                peer[p]["wall_seconds"] / results["ours"][p]["wall_seconds"], 3)
    return out


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"minimal run: {QUICK} (with --peer-defaults: "
                                                         f"{PEER_DEFAULTS_QUICK})")
    ap.add_argument("--peer-defaults", action="store_true",
                    help=f"also run the peer at its defaults (test every {PEER_TEST_INTERVAL} epochs, keep the best; "
                         f"4 loader workers) beside the matched mode, full test set; defaults {PEER_DEFAULTS} "
                         f"(--device cuda: {GPU_PEER_DEFAULTS}, one 8-minute device call)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "auto"],
                    help="ddlib's training precision (Recipe.precision; default: the recipe's default)")
    ap.add_argument("--seeds", type=int, nargs="+", help=f"default {DEFAULT['seeds']}")
    ap.add_argument("--epochs", type=int, help=f"epochs of every training on a 100-image set and of the full-data "
                                               f"reference (the peer uses one number for both); default {DEFAULT['epochs']}")
    ap.add_argument("--teacher-epochs", type=int, help=f"teacher training epochs; default {DEFAULT['teacher_epochs']}")
    ap.add_argument("--train-per-class", type=int, help=f"real training images per class; default {DEFAULT['train_per_class']}")
    ap.add_argument("--test-size", type=int, help=f"stratified test subset; default {DEFAULT['test_size']}")
    ap.add_argument("--full-data", action="store_true", help="all 50,000 / 10,000 images (GPU-scale; hours on a CPU)")
    ap.add_argument("--temperature", type=float, default=4.0, help="KL temperature (both tools); default 4")
    ap.add_argument("--protocols", nargs="+", choices=["lrs", "ars"], default=["lrs", "ars"])
    ap.add_argument("--lr-select", choices=["test", "validation"], default="test",
                    help="ddlib's lr policy; 'test' mirrors the peer (the same workload), 'validation' is ddlib's default")
    ap.add_argument("--store", choices=["shared", "separate"], default="shared",
                    help="ddlib's MLflow store: 'shared' (default) is how users run it, one store for LRS and ARS, "
                         "so ARS reuses the lr searches of LRS's soft-label sides (the same trainings, the same "
                         "numbers); 'separate' gives each protocol its own store and reuses nothing")
    ap.add_argument("--ours-only", action="store_true",
                    help="ddlib's side alone (no peer venv, no peer run, no ratios): for roofline.py's bound on this machine")
    ap.add_argument("--no-probes", action="store_true", help="skip the peer's defect probes (a few seconds)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where both tools train and test (ddlib's cells; the peer's device argument); default cpu")
    ap.add_argument("--peer-python", type=Path,
                    help="an interpreter that imports ddranking already (e.g. the device machine's python3 with "
                         "PYTHONPATH=/tmp/site:$PWD): no venv is made; the versions it sees go to peer_env")
    ap.add_argument("--budget-seconds", type=float,
                    help="stop before a step that clearly would not fit in this many seconds from the start, and "
                         "give a started peer run the time left as its timeout; the JSON then says partial")
    ap.add_argument("--record", action="store_true",
                    help="also write bench/records/vs_ddranking_<device>.json (ratios, accuracies, time "
                         "breakdown, machine, commit at the top level)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (MLflow stores, peer workdir)")
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() "
              "is False)", file=sys.stderr)
        return 2
    if args.peer_python is not None and not args.peer_python.exists():
        print(f"error: --peer-python {args.peer_python} does not exist", file=sys.stderr)
        return 2

    if args.peer_defaults:
        base = dict(PEER_DEFAULTS_QUICK if args.quick else GPU_PEER_DEFAULTS if args.device == "cuda" else PEER_DEFAULTS)
    else:
        base = dict(QUICK if args.quick else DEFAULT)
    for key in ("seeds", "epochs", "teacher_epochs", "train_per_class", "test_size"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    if args.full_data:
        base["train_per_class"] = base["test_size"] = None
    if base["epochs"] > 100:
        print("note: with more than 100 epochs the peer's full-data StepLR(100) decays once; ddlib's real_recipe "
              "keeps a constant lr, so the full-data references then differ", file=sys.stderr)
    cfg = {**base, "quick": args.quick, "temperature": args.temperature, "cutmix_beta": 1.0, "batch_size": 256,
           "lr_grid": LR_GRID, "lr_select": args.lr_select, "ipc": IPC, "w": 0.5, "gamma": 0.5,
           "model": {"ddlib": "convnet", "peer": PEER_MODEL}, "baseline_seed": 0, "device": args.device,
           "optimizer": "sgd, momentum 0.9, weight decay 5e-4", "scheduler": "cosine annealing to 0 (per epoch)",
           "full_data_recipe": "sgd lr 0.01 constant (the peer's REAL_DATA_TRAINING_CONFIG with StepLR(100) "
                               "never decaying below 100 epochs), batch 256, same epochs",
           "teacher_recipe": {"epochs": base["teacher_epochs"], "batch_size": 256, "optimizer": "sgd", "lr": 0.01,
                              "momentum": 0.9, "weight_decay": 0.0005, "scheduler": "step"},
           "threads": None, "peer_defaults": args.peer_defaults, "precision": args.precision,
           "store": args.store}
    for need in (ARCHIVE, DC_FILE):
        if not need.exists():
            print(f"missing {need}", file=sys.stderr)
            return 2

    cfg["threads"] = torch.get_num_threads()
    cfg["budget_seconds"] = args.budget_seconds
    sys.path.insert(0, str(BENCH))
    from machine import machine_info  # bench/machine.py, beside this script
    from vs_ddranking_report import Budget, defects
    from ddlib.data.datasets import load_dataset, reduce_dataset
    from ddlib.data.loaders import extract_archive

    results: dict = {"benchmark": "vs_ddranking", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "ratio_defaults": None, "ratio_matched": None,
                     "machine": {**machine_info(cfg["device"]), "python": platform.python_version(),
                                 "cuda": torch.cuda.is_available()},
                     "settings": cfg, "ours": {}, "peer": {}}
    budget = Budget(args.budget_seconds, t_all)

    # 1. the peer's venv (or the interpreter given)
    if not args.ours_only:
        try:
            results["peer_env"] = given_peer_env(args.peer_python) if args.peer_python else ensure_peer_venv()
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        env = results["peer_env"]
        how = "given" if env.get("given") else "reused" if env["reused"] else "created"
        print(f"peer python: {env['path']} ({how}, {env['setup_seconds']} s; ddranking {env['versions']['ddranking']}, "
              f"torch {env['versions']['torch']}, numpy {env['versions']['numpy']})", flush=True)

    # 2. data: one decode (ddlib), written once in torchvision's layout for the peer
    t = time.perf_counter()
    tree = extract_archive(ARCHIVE, cache_dir() / "cifar10-jpeg")
    full = load_dataset("cifar10", tree)
    full_tv = None if args.ours_only else write_torchvision_cifar10(full, cache_dir() / "cifar10-jpeg-torchvision")
    reduced = reduce_dataset(full, cfg["train_per_class"], cfg["test_size"])
    if args.ours_only:
        peer_root = None
    elif reduced is full:
        peer_root = full_tv
    else:
        tag = f"train{cfg['train_per_class']}pc-test{cfg['test_size']}-seed0"
        peer_root = write_torchvision_cifar10(reduced, cache_dir() / "cifar10-jpeg-torchvision-reduced" / tag)
    results["data"] = {"archive": str(ARCHIVE), "extracted_tree": str(tree), "torchvision_full": str(full_tv),
                       "peer_root": str(peer_root), "label": "CIFAR-10 (JPEG)",
                       "reduction": "ddlib.data.datasets.reduce_dataset(train_per_class, test_size, seed 0): the same images "
                                    "for both tools (the peer reads them from peer_root)",
                       "seconds": round(time.perf_counter() - t, 1)}
    print(f"data: {peer_root} ({len(reduced.train_labels)} train / {len(reduced.test_labels)} test)", flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="vs-ddranking-"))
    teacher_file = scratch / "teachers" / "CIFAR10" / PEER_MODEL / "ckpt_best.pt"
    try:
        # 3. ddlib
        preset = write_preset(scratch / "vs_ddranking_preset.yaml", cfg)
        hard_recipe = {"epochs": cfg["epochs"], "batch_size": 256, "optimizer": "sgd", "lr": 0.01, "momentum": 0.9,
                       "weight_decay": 0.0005, "scheduler": "cosine",
                       **({"precision": cfg["precision"]} if cfg.get("precision") else {})}
        shared = dict(dataset="cifar10", data_root=str(tree), method="dc",
                      source={"kind": "file", "path": str(DC_FILE)}, ipc=IPC, model="convnet", seeds=list(cfg["seeds"]),
                      baseline_seed=0, device=args.device, train_per_class=cfg["train_per_class"], test_size=cfg["test_size"],
                      preset=str(preset), preset_epochs=None, teacher_recipe=cfg["teacher_recipe"],
                      lr_select=cfg["lr_select"], lr_grid=LR_GRID,
                      lr_policy="symmetric",  # the peer searches every side when no syn_lr is passed
                      # searched on the test set as the peer does: no validation split, so ddlib's real
                      # pool (teacher, full-data reference) is the peer's training set, image for image
                      val_fraction=None if cfg["lr_select"] == "test" else 0.1)
        params = {"lrs": {**shared, "recipe": hard_recipe, "real_recipe": {"scheduler": "none"}, "w": cfg["w"]},
                  "ars": {**shared, "gamma": cfg["gamma"]}}
        cfg["ddlib_params"] = {k: {**v, "preset": "vs_ddranking_preset.yaml (temporary; see settings.preset)"}
                               for k, v in params.items()}
        cfg["preset"] = preset.read_text()
        ds = distilled = None
        for i, protocol in enumerate(args.protocols):
            # a later protocol reuses the first's lr searches: at least a third of its time (CPU runs: ~half)
            if i and not budget.allows(f"ddlib {protocol}", results["ours"][args.protocols[0]]["wall_seconds"] / 3):
                return _partial(results, args, t_all, budget)
            print(f"ddlib {protocol} ...", flush=True)
            store = scratch / ("mlruns" if cfg["store"] == "shared" else f"mlruns-{protocol}")
            out = run_ours(protocol, params[protocol], store, cfg["teacher_recipe"], teacher_file if i == 0 else None)
            ds, distilled = out.pop("_cell_dataset"), out.pop("_distilled")
            results["ours"][protocol] = out
            print(f"  {out['wall_seconds']:.0f} s (+ teacher {out['teacher']['seconds']:.0f} s; lr searches run "
                  f"{out['lr_searches']['run']}, reused {out['lr_searches']['reused']})", flush=True)
        digests = {results["ours"][p]["teacher"]["state_digest"] for p in args.protocols}
        results["teacher"] = {"arch": "convnet = ConvNet-3", "recipe": cfg["teacher_recipe"],
                              "same_weights_in_every_store": len(digests) == 1,
                              "test_acc_ddlib": results["ours"][args.protocols[0]]["teacher"]["test_acc"]}
        if args.ours_only:
            results.update(ratios(results, args.protocols))
            return _finish(results, args, t_all)

        # 4. the peer's inputs: the DC tensor as stored (normalised), ddlib's random subset (normalised)
        from ddlib.methods.select import baseline_subset

        dc = torch.load(DC_FILE, map_location="cpu", weights_only=False)
        syn_images, syn_labels = dc["data"][-1]
        syn_images, syn_labels = torch.as_tensor(syn_images).float(), torch.as_tensor(syn_labels).long()
        class_major = bool(torch.equal(syn_labels, torch.arange(10).repeat_interleave(IPC)))
        mean = torch.tensor(ds.mean).view(1, 3, 1, 1)
        std = torch.tensor(ds.std).view(1, 3, 1, 1)
        rdm = baseline_subset(ds, IPC, 0)  # ddlib's baseline at baseline_seed 0 (its own stream)
        rdm_images = (rdm.images.cpu() - mean) / std
        ours_syn = (distilled.images.cpu() - mean) / std
        results["inputs"] = {"dc_labels_class_major": class_major,
                             "max_abs_diff_dc_tensor_vs_ddlib_loaded": float((ours_syn - syn_images).abs().max()),
                             "random_subset": "ddlib.methods.select.baseline_subset(reduced data, ipc 10, seed 0), normalised"}
        if not class_major:
            raise RuntimeError("the DC set is not stored class-major; the peer would mislabel it")
        tensors = scratch / "peer_inputs.pt"
        torch.save({"syn_images": syn_images, "rdm_images": rdm_images, "rdm_labels": rdm.labels.cpu()}, tensors)

        # 5. the peer: matched mode, then (--peer-defaults) at its defaults
        modes = ["matched", "defaults"] if args.peer_defaults else ["matched"]
        python = args.peer_python or peer_python()
        raws = {}
        for i, mode in enumerate(modes):
            key = "peer" if mode == "matched" else "peer_defaults"
            # lower bounds: the peer is slower than ddlib (CPU: 2.3-4.5x), its defaults than its matched mode
            estimate = (sum(results["ours"][p]["wall_seconds"] for p in args.protocols) if mode == "matched"
                        else results["peer"]["process_seconds"])
            if not budget.allows(f"peer {mode}", estimate):
                return _partial(results, args, t_all, budget)
            spec = {"data_root": str(peer_root), "teacher_dir": str(scratch / "teachers"),
                    "workdir": str(scratch / f"peer-{mode}"), "tensors": str(tensors),
                    "out": str(scratch / f"peer_out_{mode}.json"), "seeds": cfg["seeds"],
                    "epochs": cfg["epochs"], "ipc": IPC, "model_name": PEER_MODEL, "optimizer": "sgd",
                    "lr_scheduler": "cosineannealing", "weight_decay": 0.0005, "momentum": 0.9,
                    "temperature": cfg["temperature"], "cutmix_beta": cfg["cutmix_beta"], "batch_size": 256,
                    "w": cfg["w"], "gamma": cfg["gamma"], "protocols": args.protocols, "device": args.device,
                    "probes": not args.no_probes and i == 0, "threads": cfg["threads"], "mode": mode,
                    # matched: one test after the last epoch, no loader workers; defaults: the peer's own
                    "test_interval": cfg["epochs"] if mode == "matched" else None,
                    "num_workers": 0 if mode == "matched" else None}
            print(f"DD-Ranking ({mode}) ...", flush=True)
            run = run_peer(spec, scratch / f"peer_spec_{mode}.json", python, timeout=budget.left())
            if run.get("failed") == "timeout":
                done = [p for p in args.protocols if p in (run["partial_raw"] or {})]
                results[key] = {**peer_summary(run["partial_raw"], done, cfg), "process_seconds": run["process_seconds"],
                                "stopped": f"timeout: the budget's {budget.seconds} s ran out"} if done else {}
                budget.skipped.append({"step": f"peer {mode}", "stopped_after_seconds": run["process_seconds"],
                                       "protocols_finished": done})
                return _partial(results, args, t_all, budget)
            if "failed" in run:
                results[key] = run
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1, default=str))
                print(run["log_tail"][-4000:], file=sys.stderr)
                print(f"the peer failed ({mode}, exit {run['failed']}); partial results in {args.out}", file=sys.stderr)
                return 1
            raw = raws[mode] = run["raw"]
            summary = peer_summary(raw, args.protocols, cfg)
            if mode == "matched":
                results["peer_raw"] = raw
                results["peer_process_seconds"] = run["process_seconds"]
                results["peer_load_average_before_after"] = run["load_average_before_after"]
                results["peer"] = {**summary, "process_seconds": run["process_seconds"]}
            else:
                results["peer_defaults"] = {**summary, "process_seconds": run["process_seconds"],
                                            "load_average_before_after": run["load_average_before_after"],
                                            "workarounds": raw.get("workarounds")}
        raw = raws["matched"]
        results["teacher"]["test_acc_peer"] = raw["teacher_test_acc_percent"] / 100
        results["data"]["digests"] = {
            "ddlib_train": results["ours"][args.protocols[0]]["dataset"]["train_digest"],
            "ddlib_test": results["ours"][args.protocols[0]]["dataset"]["test_digest"],
            "peer_train": raw["data"]["train_digest"], "peer_test": raw["data"]["test_digest"]}
        d = results["data"]["digests"]
        results["data"]["same_images"] = d["ddlib_train"] == d["peer_train"] and d["ddlib_test"] == d["peer_test"]
        results.update(ratios(results, args.protocols))
        results["peer_defects"] = defects(raw, cfg, PEER_PINS)
    finally:
        if args.keep:
            print(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return _finish(results, args, t_all)


def _partial(results: dict, args, t_all: float, budget) -> int:
    """The budget ran out: write what there is, marked partial (ratios only where both sides finished)."""
    done = [p for p in args.protocols if p in results["ours"]]
    results["partial"] = {"why": f"--budget-seconds {budget.seconds}", "skipped": budget.skipped,
                          "ratios_over": done}  # a ratio is given only where the peer finished all of them
    results.update(ratios(results, done))
    _write(results, args, t_all, done)
    print(f"partial: {budget.skipped}; wrote {args.out}" + (f" and {results['record']}" if args.record else ""),
          file=sys.stderr)
    return 3


def _write(results: dict, args, t_all: float, protocols: list[str]) -> None:
    """The JSON (``--out``), with where each side's time went, and the record under ``--record``."""
    from vs_ddranking_report import time_breakdown, write_record  # bench/, beside this script

    results["total_seconds"] = round(time.perf_counter() - t_all, 1)
    results["machine"]["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    results["time_breakdown"] = time_breakdown(results, protocols)
    results["out"] = str(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    if args.record:
        results["record"] = str(write_record(results, protocols, results["settings"]["device"]))


def _finish(results: dict, args, t_all: float) -> int:
    """Write the JSON and print the comparison (ddlib's side alone under ``--ours-only``)."""
    from vs_ddranking_report import breakdown_table, defaults_table, table

    cfg = results["settings"]
    _write(results, args, t_all, args.protocols)
    if args.ours_only:
        for p, out in results["ours"].items():
            print(f"ddlib {p}: {out['wall_seconds']:.0f} s, summary {out['summary']}")
        print(breakdown_table(results["time_breakdown"]))
        print(f"\nwrote {args.out}{' and ' + results['record'] if args.record else ''} ({results['total_seconds']:.0f} s in all)")
        return 0

    s = cfg
    print(f"\nDC CIFAR-10 (JPEG) IPC {IPC}, ConvNet-3, seeds {s['seeds']}, {s['epochs']} epochs, teacher "
          f"{s['teacher_epochs']} epochs, train {s['train_per_class']}/class, test {s['test_size'] or 'all'}, "
          f"KL T={s['temperature']}, CutMix, lr grid {LR_GRID} on test")
    print(f"same images in both tools: {results['data']['same_images']}; teacher test acc ddlib "
          f"{results['teacher']['test_acc_ddlib'] * 100:.1f}% / peer {results['teacher']['test_acc_peer'] * 100:.1f}%")
    print(table(results))
    if results.get("peer_defaults"):
        print(defaults_table(results, args.protocols))
    print(f"\nratio_matched (peer / ddlib wall time, {' + '.join(p.upper() for p in args.protocols)}): "
          f"{results.get('ratio_matched')}; ratio_defaults: {results.get('ratio_defaults')}  "
          f"(load average {results['machine']['load_average_start']} -> {results['machine']['load_average_end']}, "
          f"{cfg['threads']} threads)")
    hit = [d["id"] for d in results["peer_defects"] if d["hit"]]
    latent = [d["id"] for d in results["peer_defects"] if not d["hit"]]
    print(f"\npeer defects met on this workload ({len(hit)}): {', '.join(hit)}")
    print(f"latent peer defects shown by probes ({len(latent)}): {', '.join(latent)}")
    print(breakdown_table(results["time_breakdown"]))
    print(f"\nwrote {args.out}{' and ' + results['record'] if args.record else ''} ({results['total_seconds']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
