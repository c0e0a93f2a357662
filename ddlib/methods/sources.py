"""Where a method's set comes from: a selection baseline, the DM distiller, or a file.

A params grid names methods; each name maps to a *source spec*, a small dict with a ``kind``:

* ``{kind: random, seed: 0}``, ``{kind: kcenter, seed: 0}`` (DC-Bench's K-Center: the real images
  nearest per-class k-means centres) and ``{kind: kcenter_greedy}`` (greedy farthest-point
  selection): selection baselines (:mod:`ddlib.methods.select`);
* ``{kind: dm, iterations: 200, ...}``: distil with :func:`ddlib.methods.dm.distribution_matching`;
* ``{kind: file, path: "sets/dc_cifar10_ipc{ipc}.pt"}``: a published set; ``{ipc}`` and
  ``{dataset}`` in the path are filled in per grid cell (any other brace is part of the file name),
  and the file's IPC must match; ``zca_space: true`` marks a set saved ZCA-whitened (MTT/DATM run
  with ``--zca``, see :mod:`ddlib.data.distilled`): the protocol turns it back into pixels before
  training; ``trusted: true`` lets a ``.pt`` file be fully unpickled when the safe loader refuses it
  (unpickling can run code: only for files you trust);
* ``{kind: full}``: the whole real training set, the reference every compression is measured
  against (the cell's ``ipc`` does not apply to it);
* ``{kind: checkpoint, path: "model_pool/BACON_ConvNet_CIFAR10_{ipc}_seed{seed}.pth", model: convnet}``:
  not a set but a released trained model (a state_dict), attacked by the ``adversarial`` protocol
  only (``{seed}`` in the path gives one model per seed; ``model`` defaults to the cell's).
  ``expected_accuracy`` (a fraction; default: the ``_0.6995`` that ends BEARD's file names, where the
  name has one) and ``accuracy_tolerance`` (default 0.04) say what clean test accuracy the model
  must reach on the cell's data: weights that load into the wrong architecture (max for average
  pooling, another normalisation layer) or were trained on other data pass every shape check, and
  only their accuracy shows it.

The names ``random``, ``kcenter``, ``kcenter_greedy``, ``dm`` and ``full`` work without a spec.
"""

from __future__ import annotations

from pathlib import Path

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet, DistilledSetError, load
from ddlib.shown import shown

__all__ = ["SOURCE_KINDS", "MODEL_KINDS", "BUILTIN_SOURCES", "BUILTIN_REVISIONS", "builtin_revision", "resolve_source", "validate_source", "obtain_set", "full_set",
           "source_path", "load_file_source"]

# kind -> allowed keys (besides "kind") with their expected types
SOURCE_KINDS: dict[str, dict[str, type | tuple]] = {
    "random": {"seed": int},
    "kcenter": {"seed": int, "model": str, "epochs": int, "n_init": int},
    "kcenter_greedy": {"seed": int, "model": str, "epochs": int},
    "dm": {"iterations": int, "lr_img": (int, float), "momentum": (int, float), "batch_real": int,
           "model": str, "init": str, "init_epochs": int, "seed": int},
    "file": {"path": str, "normalized": (bool, type(None)), "allow_unequal": bool, "experiment": int,
             "zca_space": (bool, type(None)), "trusted": bool},
    "full": {},
    "checkpoint": {"path": str, "model": str, "expected_accuracy": (int, float), "accuracy_tolerance": (int, float)},
}
# What each kind that *makes* a set (no file to digest) produces, in the config key of its cells
# (ddlib.protocols.cell.cell_tags): bump a kind's entry whenever the set it produces changes, so a
# rerun recomputes its cells instead of skipping them. A kind at revision 1 (absent) adds nothing to
# the key. kcenter 2: DC-Bench's k-means selection with fp32 features (keys before it were unchanged).
# Rows are split by the obtained set's digest as well (ddlib.protocols.common.obtain), bumped or not.
BUILTIN_REVISIONS: dict[str, int] = {"kcenter": 2}
MODEL_KINDS = ("checkpoint",)


def builtin_revision(spec: dict) -> str | None:
    """The revisions of what a set-making source runs (DM from K-Center images runs K-Center too),
    as text for the config key; None where every one is at revision 1 (file sources: their digest)."""
    kind = spec.get("kind")
    parts = {kind: BUILTIN_REVISIONS.get(kind, 1)}
    if kind == "dm" and spec.get("init") == "kcenter":
        parts["kcenter"] = BUILTIN_REVISIONS.get("kcenter", 1)
    if all(v == 1 for v in parts.values()):
        return None
    return ", ".join(f"{k} revision {v}" for k, v in parts.items())  # sources that are trained models, not sets: no set to obtain
BUILTIN_SOURCES = {"random": {"kind": "random"}, "kcenter": {"kind": "kcenter"},
                   "kcenter_greedy": {"kind": "kcenter_greedy"}, "dm": {"kind": "dm"}, "full": {"kind": "full"}}


def validate_source(method: str, spec: dict) -> dict:
    """Check a source spec, naming the method and the offending key."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"a method must be a name (a string), got {shown(method)}")
    if not isinstance(spec, dict):
        raise ValueError(f"method {method!r}: source must be a mapping with a 'kind' (e.g. {{kind: file, path: set.pt}}), "
                         f"got {shown(spec)}")
    kind = spec.get("kind")
    if kind not in SOURCE_KINDS:
        raise ValueError(f"method {method!r}: kind must be one of {sorted(SOURCE_KINDS)}, got {kind!r}")
    allowed = SOURCE_KINDS[kind]
    for key, value in spec.items():
        if key == "kind":
            continue
        if key not in allowed:
            raise ValueError(f"method {method!r}: unknown key {key!r} for kind {kind!r}; allowed: {sorted(allowed)}")
        if isinstance(value, bool) and allowed[key] is not bool and bool not in (allowed[key] if isinstance(allowed[key], tuple) else ()):
            raise ValueError(f"method {method!r}: {key} must be {allowed[key]}, got {value!r}")
        if not isinstance(value, allowed[key]):
            raise ValueError(f"method {method!r}: {key} has the wrong type: {shown(value)}")
    if kind in ("file", "checkpoint") and "path" not in spec:
        raise ValueError(f"method {method!r}: kind {kind!r} needs a 'path'")
    if "path" in spec:
        try:
            spec["path"].encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"method {method!r}: path {shown(spec['path'])} holds bytes that are not UTF-8; "
                             "rename the file (MLflow records paths as UTF-8 text)") from None
    return spec


def resolve_source(method: str, methods: dict | None = None) -> dict:
    """The source spec for ``method``: from the grid's ``methods`` section, else a built-in."""
    methods = methods or {}
    if not isinstance(method, str) or not method:
        raise ValueError(f"a method must be a name (a string), got {shown(method)}")
    if method in methods:
        return validate_source(method, dict(methods[method]))
    if method in BUILTIN_SOURCES:
        return dict(BUILTIN_SOURCES[method])
    raise ValueError(f"method {method!r} has no source: add it under 'methods:' (kinds: {sorted(SOURCE_KINDS)})")


def full_set(dataset: Dataset) -> DistilledSet:
    """The whole training set as a set, the reference of every compression (uint8 images stay uint8:
    the training loop converts them per batch, and a float copy of CIFAR-10 would take 600 MB)."""
    return DistilledSet(images=dataset.train_images, labels=dataset.train_labels, num_classes=dataset.num_classes,
                        method="full", source=f"the whole training set of {dataset.name} ({dataset.source})",
                        provenance={"images": len(dataset.train_labels)})


def obtain_set(method: str, spec: dict, dataset: Dataset, ipc: int, device="auto", progress: bool = False) -> DistilledSet:
    """Produce or load the set ``spec`` describes, with ``ipc`` images per class."""
    spec = validate_source(method, spec)
    options = {k: v for k, v in spec.items() if k != "kind"}
    kind = spec["kind"]
    if kind in MODEL_KINDS:
        raise ValueError(f"method {method!r}: kind {kind!r} is a trained model, not a set (the adversarial protocol "
                         "attacks it; no protocol can train on it)")
    if kind == "random":
        from ddlib.methods.select import random_subset

        out = random_subset(dataset, ipc, **options)
    elif kind == "kcenter":
        from ddlib.methods.select import kcenter_subset

        out = kcenter_subset(dataset, ipc, device=device, **options)
    elif kind == "kcenter_greedy":
        from ddlib.methods.select import kcenter_greedy_subset

        out = kcenter_greedy_subset(dataset, ipc, device=device, **options)
    elif kind == "dm":
        from ddlib.methods.dm import distribution_matching

        out = distribution_matching(dataset, ipc, device=device, progress=progress, **options)
    elif kind == "full":
        out = full_set(dataset)
    else:
        out = load_file_source(method, spec, dataset, ipc)
    out.method = method
    return out


def source_path(spec: dict, ipc: int, dataset_name: str) -> Path:
    """The file a ``file`` source names for one cell: ``{ipc}`` and ``{dataset}`` filled in, every
    other character (braces included) taken literally."""
    return Path(spec["path"].replace("{ipc}", str(ipc)).replace("{dataset}", dataset_name)).expanduser()


def load_file_source(method: str, spec: dict, dataset: Dataset, ipc: int) -> DistilledSet:
    """Load and check the set a ``file`` source names for one cell (its IPC must be the cell's)."""
    options = {k: v for k, v in spec.items() if k not in ("kind", "path")}
    path = source_path(spec, ipc, dataset.name)
    out = load(path, dataset, method=method, **options)
    if out.ipc != ipc:
        raise DistilledSetError(f"{path}: holds {out.ipc} images per class, but the grid cell asks for ipc={ipc}")
    return out
