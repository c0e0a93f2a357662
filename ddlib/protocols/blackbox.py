"""Black-box transfer attacks on the model pool (issue 26): a surrogate x target robust-accuracy matrix.

A cell is one *surrogate*: the models trained on its set (``method``, ``ipc``, ``model``, one per seed),
exactly the adversarial protocol's (the same parameters give the same pool keys: a model that cell
stored is reused, never retrained). Every attack of ``attacks`` is crafted white-box on the surrogate
(:func:`ddlib.attacks.transfer_attack`: the adversarial protocol's seeded batches, targets and space)
and the adversarial images are scored on each model of ``target_models``, the same seed's model of
another method (``dm``), another architecture (``{method: dm, model: mlp}``), another IPC
(``{method: dm, ipc: 10}``), the full-data model (``full``), a released checkpoint (a grid method of
kind ``checkpoint``), or the surrogate itself (its own method: the white-box diagonal). Each target
is taken from the pool the same way (trained and stored once where the pool lacks it). This is
BEARD's black-box evaluation (``Code/evaluate_model_blackbox.py``: the adversarial batch of its
``net_eval`` classified by every model of its ``eval_nets``); a grid ``method: [dc, dm, random]`` with
``target_models: [dc, dm, random, full]`` fills the whole matrix, each surrogate's images crafted once.

Per seed the cell logs, per attack, the white-box robust accuracy on the surrogate with the crafting's
time and queries (``<attack>.robust_acc``, ``.attack_seconds``, ``.queries``), per target the robust
accuracy under transfer (``transfer.<attack>.<target>``) and, in targeted mode, the share hitting the
target class (``hit.<attack>.<target>``), and each target's clean accuracy (``clean.<target>``); the
long table is the artifact ``transfer_matrix.csv`` (and ``.json``). The board ``blackbox``
(:mod:`ddlib.protocols.blackbox_boards`) turns the cells of one setting into a target x surrogate matrix per
attack, ranked by the target's mean robust accuracy over the *other* surrogates. Results are cached
by (surrogate model, target models, attack, mode, space, test subset, seed, device).

The board ``blackbox_irr`` scores each surrogate x target pair over the attacks with ROME's I-RR (and
BEARD's RR), as BEARD's toolkit does after converting a transfer log into one white-box log per target
(``Code/metrics/black_box/convert_to_white_box.py``, ``calculate_rr(..., 'rome')``): ROME's black-box
heatmap, from the logged accuracies. Out of scope: a black-box AE/CREI (the transfer log's times are the
surrogate's, the same for every target); ensembles of surrogates; input-diversity or momentum transfer
attacks other than the registry's (``difgsm``, ``mifgsm``, ``tifgsm`` are there). Target entries with a
file or checkpoint source are keyed by their path, not their content, in the cell's config (the models themselves are keyed by
their training tensors or weights, so no result is ever reused for another model).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ddlib.attacks import PixelModel, clean_pass, parse_attacks, targeted_skip_reason, transfer_attack
from ddlib.data.digest import tensor_digest
from ddlib.data.distilled import DistilledSet
from ddlib.methods.sources import obtain_set, resolve_source, validate_source
from ddlib.models import list_models
from ddlib.protocols import adversarial
from ddlib.protocols.cell import Cell, TrainedModel, device_name
from ddlib.protocols.common import SET_PARAMS, _from_zca_space
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.specs.shown import shown

__all__ = ["SPEC", "PARAMS", "validate", "group_identity", "fill_sources", "open_cell", "obtain", "train_models",
           "target_entries", "target_label", "evaluate", "BlackboxResult"]

_ADV = adversarial.SPEC.params
SPEC = ProtocolSpec(
    name="blackbox", revision=3, order=31, title="BEARD black-box: transfer attacks (surrogate x target)",
    summary="attacks crafted on the set's models (the surrogate) scored on other pooled models: robust accuracy per "
            "surrogate x target and attack",
    params={
        **SET_PARAMS,
        "seeds": _ADV["seeds"], "recipe": _ADV["recipe"], "real_recipe": _ADV["real_recipe"],
        "augment": _ADV["augment"], "number_sign": _ADV["number_sign"], "training": _ADV["training"],
        "target_models": Param(["random", "full"], "scored on the surrogate's images: methods, full, or {method: m, "
                                                   "model: arch, ipc: n}", "list"),
        "attacks": Param(list(adversarial.BEARD_ATTACKS), "crafted white-box on the surrogate (ddlib.attacks)", "list"),
        "mode": _ADV["mode"], "target": _ADV["target"], "attack_size": _ADV["attack_size"],
        "attack_seed": _ADV["attack_seed"], "attack_batch_size": _ADV["attack_batch_size"], "space": _ADV["space"],
    },
    boards=(Board("blackbox", "BEARD black-box: robust accuracy under transfer (target x surrogate, per attack)",
                  "ddlib.protocols.blackbox_boards:transfer_leaderboard", "transfer_acc", "transfer acc",
                  columns=(("clean_acc", "the target's clean accuracy"),
                           ("transfer_acc", "robust accuracy under transfer: mean over the other surrogates"),
                           ("white_box_acc", "robust accuracy with itself as the surrogate (white-box)")),
                  more_columns=True, variant=("attack", "mode", "space", "training", "model"),
                  heading="BEARD black-box: accuracy (%) under transfer (target x surrogate, per attack)"),
            Board("blackbox_irr", "BEARD black-box: ROME's I-RR per surrogate x target (over the attacks)",
                  "ddlib.protocols.blackbox_boards:irr_leaderboard", "rr_rome", "I-RR",
                  columns=(("rr_rome", "ROME's I-RR of the target under the surrogate's attacks (0-100)"),
                           ("rr", "BEARD's RR of the same accuracies (0-100)")),
                  more_columns=True, variant=("surrogate", "mode", "space", "training", "model"))),
    headline="blackbox",
    history=(f"2: {LAYOUT_REVISION}",
             f"3: {IDENTITY_REVISION}; board blackbox_irr (ROME's I-RR per surrogate x target)"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()
_LABEL = re.compile(r"[A-Za-z0-9_\-/]+")  # an MLflow metric name part, without the '.' that separates parts


def target_label(entry: dict, p: dict) -> str:
    """A target's name in metrics and the matrix: its method, with its model and IPC where they are not
    the cell's (``dm``, ``dm/mlp``, ``dm/ipc10``)."""
    parts = [entry["method"]]
    if entry["model"] != p["model"]:
        parts.append(entry["model"])
    if entry.get("ipc") is not None and entry["ipc"] != p["ipc"]:
        parts.append(f"ipc{entry['ipc']}")
    return "/".join(parts)


def target_entries(value, p: dict) -> list[dict]:
    """``target_models`` as ``{method, model, ipc, source}`` entries (a name: the cell's model and IPC,
    the built-in source or the one the runner filled in from the grid's ``methods``)."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"target_models must be a non-empty list of methods, got {shown(value)}")
    out, labels = [], []
    for i, entry in enumerate(value):
        where = f"target_models[{i}]"
        entry = {"method": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or "method" not in entry or not set(entry) <= {"method", "model", "ipc", "source"}:
            raise ValueError(f"{where}: a method name or {{method: name, model: arch, ipc: n}}, got {shown(entry)}")
        method = entry["method"]
        try:
            source = validate_source(method, entry["source"]) if entry.get("source") is not None else resolve_source(method)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        model = entry.get("model") or (source.get("model") if source["kind"] == "checkpoint" else None) or p["model"]
        if source["kind"] == "checkpoint" and source.get("model") not in (None, model):
            raise ValueError(f"{where}: the checkpoint is a {source['model']!r} but model is {model!r}")
        if model not in list_models():
            raise ValueError(f"{where}: unknown model {model!r}; known: {list_models()}")
        ipc = None if source["kind"] == "full" else entry.get("ipc", p["ipc"])
        if ipc is not None and (not isinstance(ipc, int) or isinstance(ipc, bool) or ipc < 1):
            raise ValueError(f"{where}: method {method!r} needs an ipc (a positive integer), got {shown(ipc)}"
                             + (" (the cell's method is full: give {method: ..., ipc: N})" if not p["ipc"] else ""))
        resolved = {"method": method, "model": model, "ipc": ipc, "source": source}
        label = target_label(resolved, p)
        if not _LABEL.fullmatch(label):
            raise ValueError(f"{where}: {label!r} must be letters, digits, '_', '-' (it names metrics)")
        if label in labels:
            raise ValueError(f"{where}: {label!r} is listed twice")
        labels.append(label)
        out.append(resolved)
    return out


def validate(params: dict) -> dict:
    """Check a blackbox cell's params before anything runs (one-line errors naming the key)."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for protocol {PROTOCOL}; known: {sorted(PARAMS)}")
    shared = {k: v for k, v in {**PARAMS, **params}.items() if k in adversarial.PARAMS}
    p = {k: v for k, v in adversarial.validate(shared).items() if k in PARAMS}
    p["target_models"] = target_entries({**PARAMS, **params}["target_models"], p)
    return p


def group_identity(params: dict) -> dict:
    """The leaderboard row (one surrogate): attacks by their resolved description, ``target`` only in
    targeted mode, without ``target_models``: they are the row's columns, so the surrogates of one
    setting are one family whatever targets each scored (a later cell of the same surrogate replaces
    the earlier one's seeds, as in every protocol: list all its targets in one cell)."""
    out = {k: v for k, v in params.items() if k != "target_models"}
    out["attacks"] = [a.describe() for a in parse_attacks(params["attacks"])]
    if params.get("mode") != "targeted":
        out.pop("target", None)
    return out


def fill_sources(cell: dict, methods: dict) -> dict:
    """The runner's step for ``target_models`` (as it fills ``source`` for ``method``): each target named
    by a grid method gets that method's source, its paths made absolute (kernels run in notebooks/)."""
    entries = cell.get("target_models")
    if not isinstance(entries, list):
        return cell
    filled = []
    for entry in entries:
        entry = {"method": entry} if isinstance(entry, str) else entry
        if isinstance(entry, dict) and entry.get("source") is None and entry.get("method") in methods:
            source = resolve_source(entry["method"], methods)
            if source.get("kind") in ("file", "checkpoint"):
                source["path"] = os.path.abspath(os.path.expanduser(source["path"]))
            entry = {**entry, "source": source}
        filled.append(entry)
    return {**cell, "target_models": filled}


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the blackbox cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


def obtain(cell: Cell) -> DistilledSet | None:
    """The surrogate's set (None for a checkpoint), as the adversarial protocol obtains it."""
    return adversarial.obtain(cell)


def train_models(cell: Cell, distilled: DistilledSet | None) -> list[TrainedModel]:
    """The surrogate's models, one per seed, from the pool (the adversarial protocol's)."""
    return adversarial.train_models(cell, distilled)


def _target_models(cell: Cell, entry: dict) -> list[TrainedModel]:
    """One target's models, one per seed: the adversarial protocol's models of the same parameters with
    the target's method, source, model and IPC, from the pool (trained and stored where it lacks them)."""
    raw = {k: v for k, v in cell.params.items() if k in adversarial.PARAMS}
    raw.update(method=entry["method"], source=entry["source"], model=entry["model"], ipc=entry["ipc"] or 1)
    view = replace(cell, params=adversarial.validate(raw))
    if view.params["source"]["kind"] == "checkpoint":
        return adversarial.train_models(view, None)
    p = view.params
    distilled = obtain_set(p["method"], p["source"], view.dataset, p["ipc"], device=view.device, progress=view.progress)
    if distilled.zca_space:
        distilled = _from_zca_space(view, distilled)
    return adversarial.train_models(view, distilled)


@dataclass(kw_only=True)
class BlackboxResult(Result):
    """per_seed: the white-box and transfer values per seed; ``matrix``: one row per (seed, attack, target)."""

    matrix: pd.DataFrame
    skipped: dict = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Robust accuracy (%) under transfer, mean over seeds: one row per attack, one column per target."""
        if self.matrix.empty:
            return self.matrix
        shown = self.matrix.pivot_table(index="attack", columns="target", values="robust_acc", aggfunc="mean",
                                        sort=False)
        return 100 * shown


def evaluate(cell: Cell, distilled: DistilledSet | None, models: list[TrainedModel] | None = None) -> BlackboxResult:
    """Train, test and score: black-box transfer and query attacks on models trained on the set (the cell's Result)."""
    p, ds = cell.params, cell.dataset
    targeted = p["mode"] == "targeted"
    with cell.guard():
        surrogates = models if models is not None else train_models(cell, distilled)
        entries = {target_label(e, p): e for e in p["target_models"]}
        # the surrogate's own method among the targets is the surrogate's models themselves (the diagonal)
        pools = {label: {m.seed: m for m in (surrogates if label == p["method"] else _target_models(cell, e))}
                 for label, e in entries.items()}
        images, labels = adversarial.attack_subset(cell)
        test_id = f"{ds.name}:{tensor_digest(images, labels)}"  # by content: the same images under another path are the same
        cell.tracker.set_tags(cell.run_id, {adversarial.SPACE_TAG: p["space"]})
        rows, matrix, skipped = [], [], {}
        for surrogate in surrogates:
            net = PixelModel(surrogate.model, ds.mean, ds.std).to(cell.device).eval()
            targets = {label: PixelModel(pool[surrogate.seed].model, ds.mean, ds.std).to(cell.device).eval()
                       for label, pool in pools.items()}
            identity = {"surrogate_run": surrogate.run_id, "targets": {k: pool[surrogate.seed].run_id
                                                                       for k, pool in pools.items()},
                        "test": test_id, "device": device_name(cell.device), "batch_size": p["attack_batch_size"],
                        "space": p["space"], "mode": p["mode"], "attack_seed": p["attack_seed"],
                        "protocol": PROTOCOL, "revision": REVISION, **({"target": p["target"]} if targeted else {})}
            # the surrogate's clean accuracy on the attacked images (its pool accuracy is on the whole test set)
            row = {"seed": surrogate.seed, "clean_acc": clean_pass(net, images, labels, p["attack_batch_size"],
                                                                   cell.device).accuracy}
            for spec in parse_attacks(p["attacks"]):
                if targeted and (reason := targeted_skip_reason(spec)):
                    skipped[spec.name] = reason
                    continue
                result = _transfer(cell, spec, net, targets, images, labels, {**identity, "attack": spec.describe()},
                                   surrogate.seed)
                for key in ("robust_acc", "attack_seconds", "queries"):
                    row[f"{spec.name}.{key}"] = result[key]
                for label in targets:
                    row[f"transfer.{spec.name}.{label}"] = result[f"to.{label}"]
                    row[f"clean.{label}"] = result[f"clean.{label}"]
                    if targeted:
                        row[f"hit.{spec.name}.{label}"] = result[f"hit.{label}"]
                    matrix.append({"seed": surrogate.seed, "attack": spec.name, "surrogate": p["method"],
                                   "target": label, "robust_acc": result[f"to.{label}"],
                                   "clean_acc": result[f"clean.{label}"],
                                   "white_box": label == p["method"],  # the surrogate itself
                                   **({"hit": result[f"hit.{label}"]} if targeted else {})})
            rows.append(row)
        if skipped:
            cell.tracker.set_tags(cell.run_id, {f"ddlib.skipped.{name}": reason for name, reason in skipped.items()})
        per_seed, summary = cell.record_per_seed(rows)
        matrix = pd.DataFrame(matrix)
        _log_matrix(cell, matrix)
    return BlackboxResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                          matrix=matrix, skipped=skipped, run_id=cell.run_id)


def _transfer(cell: Cell, spec, net, targets: dict, images, labels, key: dict, seed: int) -> dict[str, float]:
    """One attack crafted on one surrogate model and scored on every target, cached by everything it depends on."""
    p = cell.params
    targeted = p["mode"] == "targeted"

    def compute():
        out = transfer_attack(spec, net, targets, images, labels, num_classes=cell.dataset.num_classes,
                              targeted=targeted, target_classes=p["target"] if targeted else None,
                              batch_size=p["attack_batch_size"], seed=p["attack_seed"], device=cell.device,
                              space=p["space"], progress=cell.progress)
        white = out.white_box
        return {"robust_acc": white.robust_acc, "attack_seconds": white.attack_seconds, "queries": white.queries,
                **{f"to.{k}": v for k, v in out.robust_acc.items()}, **{f"clean.{k}": v for k, v in out.clean_acc.items()},
                **{f"hit.{k}": v for k, v in out.targeted_success.items()}}

    result, _ = cell.cached_result(f"{spec.describe()} {p['mode']} transfer seed{seed}", key, compute,
                                   params={"attack": spec.describe(), "mode": p["mode"], "space": p["space"],
                                           "surrogate_run": key["surrogate_run"], "device_name": key["device"]})
    return result


def _log_matrix(cell: Cell, matrix: pd.DataFrame) -> None:
    """The long table as ``transfer_matrix.csv`` and ``transfer_matrix.json`` on the cell's run."""
    with tempfile.TemporaryDirectory(prefix="ddlib-blackbox-") as tmp:
        path = Path(tmp) / "transfer_matrix.csv"
        matrix.to_csv(path, index=False)
        cell.tracker.log_artifact(cell.run_id, path)
        (Path(tmp) / "transfer_matrix.json").write_text(json.dumps(matrix.to_dict(orient="records"), indent=1))
        cell.tracker.log_artifact(cell.run_id, Path(tmp) / "transfer_matrix.json")
