"""Where a method's set comes from: a selection baseline, the DM distiller, or a file.

A params grid names methods; each name maps to a *source spec*, a small dict with a ``kind``:

* ``{kind: random, seed: 0}``, ``{kind: kcenter, seed: 0}`` (DC-Bench's K-Center: the real images
  nearest per-class k-means centres) and ``{kind: kcenter_greedy}`` (greedy farthest-point
  selection): selection baselines (:mod:`ddlib.methods.select`);
* ``{kind: herding}`` (in K-Center's 1-epoch features), ``{kind: herding_dc}`` (DC/DSA/DM's herding:
  features of a ConvNet trained to convergence, L2-normalised), ``{kind: forgetting, epochs: 20}`` and
  ``{kind: el2n, epochs: 20, num_models: 10}``: the coreset baselines of the DD literature
  (:mod:`ddlib.methods.coresets`); ``{kind: aum, epochs: 20}`` and ``{kind: ccs, score: aum,
  hard_cutoff: 0.3, strata: 50}``: the pruning baselines of the coreset literature (:mod:`ddlib.methods.pruning`);
* ``{kind: dm, iterations: 200, ...}``: distil with :func:`ddlib.methods.dm.distribution_matching`;
* ``{kind: file, path: "sets/dc_cifar10_ipc{ipc}.pt"}``: a published set; ``{ipc}`` and
  ``{dataset}`` in the path are filled in per grid cell (any other brace is part of the file name),
  and the file's IPC must match; ``zca_space: true`` marks a set saved ZCA-whitened (MTT/DATM run
  with ``--zca``, see :mod:`ddlib.data.distilled`): the protocol turns it back into pixels before
  training; ``trusted: true`` lets a ``.pt`` file be fully unpickled when the safe loader refuses it
  (unpickling can run code: only for files you trust); ``experiment_index: 0`` picks one of a DC-format
  file's experiments (default: the last; ``--experiment-index`` of ``ddlib score``);
* ``{kind: full}``: the whole real training set, the reference every compression is measured
  against (the cell's ``ipc`` does not apply to it);
* ``{kind: checkpoint, path: "model_pool/BACON_ConvNet_CIFAR10_{ipc}_seed{seed}.pth", model: convnet}``:
  not a set but a released trained model (a state_dict), attacked by the ``adversarial`` protocol
  only (``{seed}`` in the path gives one model per seed; ``model`` defaults to the cell's).
  ``expected_accuracy`` (in %, like every accuracy shown; default: the ``_0.6995`` that ends BEARD's
  file names; required where the name has none, ``unknown`` to attack it unchecked) and
  ``accuracy_tolerance`` (points, default 4) say what clean test accuracy the model must reach on the
  cell's data: weights that load into the wrong architecture (max for average
  pooling, another normalisation layer) or were trained on other data pass every shape check, and
  only their accuracy shows it.

Two keys were renamed (:data:`RENAMED_KEYS`) so that a name means one thing across grids, the CLI
and the API: a file's ``experiment`` (a grid's ``experiment:`` is its MLflow experiment) is
``experiment_index``, and EL2N's ``models`` (elsewhere a list of architectures) ``num_models``. The
old names are still read, with a ``FutureWarning``, and cells keep the keys they had under them.

The names ``random``, ``kcenter``, ``kcenter_greedy``, ``herding``, ``herding_dc``, ``forgetting``, ``el2n``,
``aum``, ``ccs``, ``dm`` and ``full`` work without a spec.

What a set cost to make (:mod:`ddlib.methods.cost`) is its provenance's ``construction``: measured for a
set-making kind (``{seconds, flops, device, measured: true}``: the kind's ``flops`` meta counts its
networks' passes), and for any spec that declares it, ``construction: {gpu_hours: 12.5, device: A100}``
(``note`` optional), as declared (``declared: true``), whatever the kind; a ``file`` set may declare it in
its own provenance too (the spec's word wins). It is the one key every kind takes.

Each kind is a factory registered in :data:`SOURCES` (:class:`ddlib.specs.registry.Registry`): its
keyword-only parameters are the keys a spec may give, their annotations the types a given value must
have (a ``float`` takes an int too; a default of ``None`` means "decided elsewhere": the cell's
model, the file name) and their defaults what runs when a key is left out. The spec itself reaches
the config key as written (defaults are not filled in), so keys stay those of the dicts users wrote.
"""

from __future__ import annotations

import typing
import warnings
from dataclasses import dataclass
from pathlib import Path

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet, DistilledSetError, load
from ddlib.methods import cost
from ddlib.methods.revisions import SET_REVISIONS
from ddlib.specs.registry import Entry, Registry
from ddlib.specs.shown import shown

__all__ = ["SOURCES", "SetRequest", "MODEL_KINDS", "BUILTIN_SOURCES", "BUILTIN_REVISIONS", "builtin_revision",
           "resolve_source", "validate_source", "obtain_set", "shared_work", "full_set", "source_keys", "source_path",
           "load_file_source", "RENAMED_KEYS", "COMMON_KEYS", "construction_record"]

SOURCES: Registry = Registry("source kind")
# A spec key's old name -> its name now, per kind. The old name is read with a FutureWarning; the
# cells' keys still spell the key the old way (ddlib.protocols.placement), so a rename never makes
# stored cells look new.
# Keys every kind takes besides its parameters: a declared construction cost (ddlib.methods.cost).
COMMON_KEYS = ("construction",)
RENAMED_KEYS: dict[str, dict[str, str]] = {"file": {"experiment": "experiment_index"},
                                           "el2n": {"models": "num_models"}}  # `models` lists architectures elsewhere


@dataclass(frozen=True)
class SetRequest:
    """What every source kind is asked for: ``ipc`` images per class of ``dataset`` for ``method``."""

    method: str
    dataset: Dataset
    ipc: int
    device: str = "auto"
    progress: bool = False


# --------------------------------------------------------------------------- the kinds
# Meta: builtin (the kind's name works without a spec), flops ((spec with defaults, dataset, ipc) -> the
# FLOPs of the networks' passes that make its set: ddlib.methods.cost), revision (what its sets are, in the config
# key: bump it in ddlib.methods.revisions whenever the set it produces changes, so a rerun recomputes
# its cells instead of skipping them; 1 adds nothing to the key), runs (other kinds a spec also runs, for their revisions),
# needs (keys a spec must give), model (not a set but a trained model: the adversarial protocol attacks it),
# shares (spec -> names of the cached work its sets at every IPC reuse: see shared_work).


def _model(spec: dict, dataset: Dataset) -> str:
    from ddlib.methods.select import feature_model_name

    return spec.get("model") or feature_model_name(dataset)


def _feature_flops(spec: dict, dataset: Dataset, ipc: int) -> float:
    """K-Center's feature network trained and tested, then one embedding pass over the training set."""
    model = _model(spec, dataset)
    return (cost.training_flops(model, dataset, spec["epochs"])
            + cost.forward_flops(model, dataset) * len(dataset.train_labels))


def _score_flops(spec: dict, dataset: Dataset, ipc: int, score: str) -> float:
    """A score run (:mod:`ddlib.methods.coresets`): forgetting's and AUM's one network, EL2N's
    ``num_models`` and their scoring passes over the training set."""
    model = _model(spec, dataset)
    if score != "el2n":
        return cost.training_flops(model, dataset, spec["epochs"])
    models = spec["num_models"]
    return (cost.training_flops(model, dataset, spec["epochs"], models)
            + models * cost.forward_flops(model, dataset) * len(dataset.train_labels))


def _nothing(spec: dict, dataset: Dataset, ipc: int) -> float:
    return 0.0


@SOURCES.register("random", builtin=True, flops=_nothing)
def _random(req: SetRequest, *, seed: int = 0) -> DistilledSet:
    from ddlib.methods.select import random_subset

    return random_subset(req.dataset, req.ipc, seed=seed)


def _features(spec: dict) -> list[str]:
    """K-Center's feature network (:func:`ddlib.methods.select._feature_network`), cached per seed."""
    return [f"features model={spec.get('model') or ''} epochs={spec['epochs']} seed={spec['seed']}"]


@SOURCES.register("kcenter", builtin=True, revision=SET_REVISIONS["kcenter"], shares=_features, flops=_feature_flops)
def _kcenter(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 1, n_init: int = 10) -> DistilledSet:
    from ddlib.methods.select import kcenter_subset

    return kcenter_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs, n_init=n_init)


@SOURCES.register("kcenter_greedy", builtin=True, revision=SET_REVISIONS["kcenter_greedy"], shares=_features,
                  flops=_feature_flops)
def _kcenter_greedy(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 1) -> DistilledSet:
    from ddlib.methods.select import kcenter_greedy_subset

    return kcenter_greedy_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs)


@SOURCES.register("herding", builtin=True, revision=SET_REVISIONS["herding"], shares=_features, flops=_feature_flops)
def _herding(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 1) -> DistilledSet:
    from ddlib.methods.coresets import herding_subset

    return herding_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs)


@SOURCES.register("herding_dc", builtin=True, shares=_features, flops=_feature_flops)
def _herding_dc(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 50) -> DistilledSet:
    from ddlib.methods.coresets import herding_dc_subset

    return herding_dc_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs)


@SOURCES.register("forgetting", builtin=True, revision=SET_REVISIONS["forgetting"],
                  shares=lambda spec: [f"forgetting {sorted(spec.items())}"],
                  flops=lambda spec, dataset, ipc: _score_flops(spec, dataset, ipc, "forgetting"))
def _forgetting(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 20) -> DistilledSet:
    from ddlib.methods.coresets import forgetting_subset

    return forgetting_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs)


@SOURCES.register("el2n", builtin=True, revision=SET_REVISIONS["el2n"], shares=lambda spec: [f"el2n {sorted(spec.items())}"],
                  flops=lambda spec, dataset, ipc: _score_flops(spec, dataset, ipc, "el2n"))
def _el2n(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 20, num_models: int = 10) -> DistilledSet:
    from ddlib.methods.coresets import el2n_subset

    return el2n_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs,
                       num_models=num_models)


def _score_run(spec: dict) -> list[str]:
    """The score run an ``aum`` or ``ccs`` spec trains (cached per machine: :mod:`ddlib.methods.coresets`),
    named as the ``aum``, ``forgetting`` or ``el2n`` spec that trains it names it: ``aum`` and ``ccs``
    cells of one seed share AUM's run."""
    score = spec.get("score", "aum")
    keys = ("seed", "model", "epochs") + (("num_models",) if score == "el2n" else ())
    return [f"{score} {sorted({'kind': score, **{k: spec[k] for k in keys}}.items())}"]


@SOURCES.register("aum", builtin=True, revision=SET_REVISIONS["aum"], shares=_score_run,
                  flops=lambda spec, dataset, ipc: _score_flops(spec, dataset, ipc, "aum"))
def _aum(req: SetRequest, *, seed: int = 0, model: str = None, epochs: int = 20) -> DistilledSet:
    from ddlib.methods.pruning import aum_subset

    return aum_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, epochs=epochs)


@SOURCES.register("ccs", builtin=True, revision=SET_REVISIONS["ccs"], shares=_score_run,
                  runs=lambda spec: [spec.get("score", "aum")],
                  flops=lambda spec, dataset, ipc: _score_flops(spec, dataset, ipc, spec["score"]))
def _ccs(req: SetRequest, *, seed: int = 0, model: str = None, score: str = "aum", epochs: int = 20,
         num_models: int = 10, hard_cutoff: float = 0.3, strata: int = 50) -> DistilledSet:
    from ddlib.methods.pruning import ccs_subset

    return ccs_subset(req.dataset, req.ipc, seed=seed, model=model, device=req.device, score=score, epochs=epochs,
                      num_models=num_models, hard_cutoff=hard_cutoff, strata=strata)


def _dm_flops(spec: dict, dataset: Dataset, ipc: int) -> float:
    """Per iteration, a forward of each class's real batch and a forward and backward of the synthetic
    images; from K-Center images, K-Center's feature network too."""
    import torch

    real = sum(min(spec["batch_real"], int(n)) for n in torch.bincount(dataset.train_labels, minlength=dataset.num_classes))
    fwd = cost.forward_flops(spec["model"], dataset)
    synthetic = cost.TRAIN_FLOPS_PER_FORWARD * ipc * dataset.num_classes
    start = _feature_flops({"epochs": spec["init_epochs"]}, dataset, ipc) if spec["init"] == "kcenter" else 0.0
    return spec["iterations"] * fwd * (real + synthetic) + start


def _dm_shares(spec: dict) -> list[str]:
    """DM's real class means (cached per seed, whatever the start and IPC: :mod:`ddlib.methods.dm`)
    and, from K-Center images, K-Center's feature network."""
    real_side = sorted((k, v) for k, v in spec.items() if k in ("model", "iterations", "batch_real", "seed"))
    features = _features({"seed": spec["seed"], "epochs": spec["init_epochs"]}) if spec["init"] == "kcenter" else []
    return [f"dm real means {real_side}", *features]


@SOURCES.register("dm", builtin=True, revision=SET_REVISIONS["dm"],
                  runs=lambda spec: ["kcenter"] if spec.get("init") == "kcenter" else [], shares=_dm_shares,
                  flops=_dm_flops)
def _dm(req: SetRequest, *, iterations: int = 200, lr_img: float = 1.0, momentum: float = 0.5, batch_real: int = 64,
        model: str = "convnet", init: str = "real", init_epochs: int = 1, seed: int = 0) -> DistilledSet:
    from ddlib.methods.dm import distribution_matching

    return distribution_matching(req.dataset, req.ipc, iterations=iterations, lr_img=lr_img, momentum=momentum,
                                 batch_real=batch_real, model=model, init=init, init_epochs=init_epochs, seed=seed,
                                 device=req.device, progress=req.progress)


@SOURCES.register("file", needs=("path",))
def _file(req: SetRequest, *, path: str = None, normalized: bool | None = None, allow_unequal: bool = False,
          experiment_index: int = -1, zca_space: bool | None = None, trusted: bool = False) -> DistilledSet:
    spec = {"kind": "file", "path": path, "normalized": normalized, "allow_unequal": allow_unequal,
            "experiment_index": experiment_index, "zca_space": zca_space, "trusted": trusted}
    return load_file_source(req.method, spec, req.dataset, req.ipc)


@SOURCES.register("full", builtin=True, flops=_nothing)
def _full(req: SetRequest) -> DistilledSet:
    return full_set(req.dataset)


# The adversarial protocol reads these keys itself (ddlib.protocols.adversarial): model defaults to
# the cell's, expected_accuracy (in %, or unknown) to the one a BEARD file name ends with, accuracy_tolerance to 4 points.
@SOURCES.register("checkpoint", needs=("path",), model=True)
def _checkpoint(req: SetRequest, *, path: str = None, model: str = None, expected_accuracy: float | str = None,
                accuracy_tolerance: float = None) -> DistilledSet:
    """Declares the keys only: :func:`obtain_set` refuses a model kind before calling its factory."""
    raise AssertionError("a model kind makes no set")


MODEL_KINDS = tuple(name for name in SOURCES if SOURCES.entry(name).meta.get("model"))
BUILTIN_SOURCES = {name: {"kind": name} for name in SOURCES if SOURCES.entry(name).meta.get("builtin")}
# What each set-making kind produces, in the config key of its cells (ddlib.protocols.cell.cell_tags);
# a kind at revision 1 (absent) adds nothing to the key. Rows are split by the obtained set's digest
# as well (ddlib.protocols.common.obtain), bumped or not.
BUILTIN_REVISIONS: dict[str, int] = {name: SOURCES.entry(name).meta["revision"] for name in SOURCES
                                     if SOURCES.entry(name).meta.get("revision", 1) != 1}


def source_keys(kind: str) -> dict[str, type | tuple]:
    """The keys a ``kind`` spec may give, each with the type(s) its value must have: the kind's
    keyword-only parameters and their annotations (``float`` also takes an int; ``X | None`` None)."""
    entry: Entry = SOURCES.entry(kind)
    hints = typing.get_type_hints(entry.factory)
    keys: dict[str, type | tuple] = {}
    for name in entry.defaults:
        types: list[type] = []
        for t in typing.get_args(hints[name]) or (hints[name],):
            types += [int, float] if t is float else [t]
        keys[name] = types[0] if len(types) == 1 else tuple(types)
    return keys


def builtin_revision(spec: dict) -> str | None:
    """The revisions of what a set-making source runs (DM from K-Center images runs K-Center too),
    as text for the config key; None where every one is at revision 1 (file sources: their digest)."""
    kind = spec.get("kind")
    parts = {kind: BUILTIN_REVISIONS.get(kind, 1)}
    runs = SOURCES.entry(kind).meta.get("runs") if kind in SOURCES else None
    for other in runs(spec) if runs else ():
        parts[other] = BUILTIN_REVISIONS.get(other, 1)
    if all(v == 1 for v in parts.values()):
        return None
    return ", ".join(f"{k} revision {v}" for k, v in parts.items())


def shared_work(spec: dict) -> frozenset[str]:
    """Names of the cached, IPC-independent work a set of this spec does first and other cells reuse
    (K-Center's feature network, DM's real class means): the runner starts no two cells that would
    compute the same at once (:func:`ddlib.run.executors.next_job`). A scheduling hint only: an unknown
    or malformed spec shares nothing."""
    try:
        entry = SOURCES.entry(spec["kind"]) if spec["kind"] in SOURCES else None
        shares = entry.meta.get("shares") if entry is not None else None
        # the defaults filled in: a spec that leaves a key out shares with one that gives its default
        return frozenset(shares({**entry.defaults, **spec})) if shares else frozenset()
    except Exception:  # noqa: BLE001 - a hint: a spec the cell itself will reject shares nothing
        return frozenset()


def validate_source(method: str, spec: dict) -> dict:
    """Check a source spec, naming the method and the offending key; returns it, a key given by its
    old name (:data:`RENAMED_KEYS`) renamed in place."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"a method must be a name (a string), got {shown(method)}")
    if not isinstance(spec, dict):
        raise ValueError(f"method {method!r}: source must be a mapping with a 'kind' (e.g. {{kind: file, path: set.pt}}), "
                         f"got {shown(spec)}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind not in SOURCES:
        raise ValueError(f"method {method!r}: kind must be one of {SOURCES.names()}, got {kind!r}")
    for old, new in RENAMED_KEYS.get(kind, {}).items():
        if old in spec:
            if new in spec:
                raise ValueError(f"method {method!r}: give {new!r} only ({old!r} is its old name)")
            warnings.warn(f"method {method!r}: {old!r} of kind {kind!r} is now {new!r}", FutureWarning, stacklevel=2)
            spec[new] = spec.pop(old)
    allowed = source_keys(kind)
    for key, value in spec.items():
        if key == "kind":
            continue
        if key == "construction":
            if SOURCES.entry(kind).meta.get("flops"):
                raise ValueError(f"method {method!r}: construction is measured for kind {kind!r} (its set is made "
                                 "here); declare it for a set made elsewhere (kind: file)")
            cost.validate_declared(method, value)
            continue
        if key not in allowed:
            raise ValueError(f"method {method!r}: unknown key {key!r} for kind {kind!r}; allowed: {sorted(allowed)}")
        if (isinstance(value, bool) and allowed[key] is not bool
                and bool not in (allowed[key] if isinstance(allowed[key], tuple) else ())):
            raise ValueError(f"method {method!r}: {key} must be {allowed[key]}, got {value!r}")
        if not isinstance(value, allowed[key]):
            raise ValueError(f"method {method!r}: {key} has the wrong type: {shown(value)}")
    for key in SOURCES.entry(kind).meta.get("needs", ()):
        if key not in spec:
            raise ValueError(f"method {method!r}: kind {kind!r} needs a {key!r}")
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
    raise ValueError(f"method {method!r} has no source: add it under 'methods:' (kinds: {SOURCES.names()})")


def full_set(dataset: Dataset) -> DistilledSet:
    """The whole training set as a set, the reference of every compression (uint8 images stay uint8:
    the training loop converts them per batch, and a float copy of CIFAR-10 would take 600 MB)."""
    return DistilledSet(images=dataset.train_images, labels=dataset.train_labels, num_classes=dataset.num_classes,
                        method="full", source=f"the whole training set of {dataset.name} ({dataset.source})",
                        provenance={"images": len(dataset.train_labels)})


def obtain_set(method: str, spec: dict, dataset: Dataset, ipc: int, device="auto", progress: bool = False) -> DistilledSet:
    """Produce or load the set ``spec`` describes, with ``ipc`` images per class: its kind's factory,
    called with the keys the spec gives (the factory's defaults for the rest)."""
    spec = validate_source(method, spec)
    options = {k: v for k, v in spec.items() if k != "kind" and k not in COMMON_KEYS}
    kind = spec["kind"]
    if kind in MODEL_KINDS:
        raise ValueError(f"method {method!r}: kind {kind!r} is a trained model, not a set (the adversarial protocol "
                         "attacks it; no protocol can train on it)")
    entry = SOURCES.entry(kind)
    with cost.watch() as took:
        out = entry.factory(SetRequest(method, dataset, ipc, device, progress), **options)
    out.method = method
    construction = construction_record(method, spec, out.provenance.get("construction"))
    if construction is None and entry.meta.get("flops"):
        from ddlib.engine.device import resolve_device

        flops = entry.meta["flops"]({**entry.defaults, **options}, dataset, ipc)
        construction = cost.record(took, flops, resolve_device(device))
    if construction is not None:
        out.provenance["construction"] = construction
    return out


def construction_record(method: str, spec: dict, stored) -> dict | None:
    """A set's declared construction cost: the spec's (``declared: true`` added), else the one its file
    stored (a cost ddlib measured, kept as it is, or one declared there); None where there is none."""
    if "construction" in spec:
        return {**spec["construction"], "declared": True}
    if stored is None:
        return None
    if isinstance(stored, dict) and stored.get("measured") is True:
        return stored
    given = {k: v for k, v in stored.items() if k != "declared"} if isinstance(stored, dict) else stored
    return {**cost.validate_declared(method, given), "declared": True}


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
