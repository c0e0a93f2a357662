"""Membership inference: does a model trained on the set tell the real images the set was made from
from images it never saw? (The privacy lens of Chen et al., "A comprehensive study on dataset
distillation: performance, privacy, robustness and fairness", arXiv 2305.03355.)

**Members** are, per target, the real images it was made from (:mod:`ddlib.protocols.membership`):
the set's own source images where they are known (a built-in selection's picks, DM's real starting
images, ``member_indices``), or, with ``member_half``, the seeded half of the training split the set
was made from (Dong et al., ICML 2022); a random subset's own images; for the full-data model
``members`` training images drawn with ``attack_seed``. A set whose source images are unknown gets no
attack value (flagged). **Non-members** are ``members`` test images (at most half the test split),
the same for every target; the rest of each split is the shadow data. Three targets are attacked, one
model per seed each: the set's models, a random subset of the same IPC (DD-Ranking's baseline draw,
:func:`ddlib.methods.select.baseline_subset`; in ``member_half`` mode drawn from the member half) and
the full-data model (``full_data``). Every model is trained through
:meth:`ddlib.protocols.cell.Cell.train_eval` with ``keep_models=True``: found in the model pool when an
earlier cell trained it, never trained twice. Method ``full`` (ipc 0): the set is the training split,
attacked once with the full-data shadows (no random subset).

Two attacks, both black-box on the softmax (logits as the model's test pass computes them, bf16 autocast for a
bf16 model; softmax and loss in fp32):

* **loss threshold** (Yeom et al., CSF 2018): score = - cross-entropy of the true label; no training.
* **shadow models** (Shokri et al., S&P 2017), in its simple form: per seed a shadow model trained the
  way the target was, on shadow data of known membership, asked the target's question (shadow *in*: its
  own training images, or in ``member_half`` mode a sample of the other half it was drawn from; shadow
  *out*: test images outside the non-members): for the set and the random subset (both ``ipc`` images
  per class under ``recipe``) a random ``ipc``-per-class draw of the shadow pool, one shadow model per
  seed shared by the two; for the full-data model the whole shadow pool under ``real_recipe``. One
  attack classifier per kind of target (logistic regression, standardised features, balanced class
  weights; scikit-learn) is fitted on every shadow model's outputs pooled: features = the softmax
  vector sorted in decreasing order and the true label's loss (so not label-agnostic; one classifier
  for all classes, not Shokri's one per class). A shadow of the distilled set would need the method
  rerun on shadow data: it is trained as the random subset's is (named deviation, tag
  ``ddlib.privacy_shadow``).

Per model: ``*_auc`` (ROC AUC, 0.5: no membership signal) and ``*_tpr`` (TPR at 1 % FPR, read off
``sklearn.metrics.roc_curve`` as LiRA's code reads it, Carlini et al. 2022: the highest TPR at an
operating point with FPR strictly below 1 %; no interpolation; with at most 100 non-members that
is the TPR at FPR 0).
Out of scope: LiRA and other per-example calibrated attacks (many shadow models per example),
white-box attacks, label-only attacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ddlib.data.distilled import DistilledSet
from ddlib.engine.augment import create_augment
from ddlib.engine.device import run_precision
from ddlib.methods.select import baseline_subset
from ddlib.methods.sources import full_set
from ddlib.protocols.cell import Cell, TrainedModel
from ddlib.protocols import common
from ddlib.protocols.common import FULL_IPC, SET_PARAMS, positive_int, validate_set_params
from ddlib.protocols.dcbench import RECIPE_PARAMS, check_augment, check_recipe_params, setting_recipe
from ddlib.protocols.membership import (Split, at_most, check_member_params, half_dataset, member_half, set_members,
                                        split_members)
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.specs.shown import shown

__all__ = ["SPEC", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "leaderboard", "PrivacyResult",
           "model_outputs", "attack_features", "membership_auc", "tpr_at_fpr", "fit_shadow_attack", "split_members",
           "Split"]

FPR = 0.01  # the false-positive rate TPR is read at
SHADOW_TAG = "ddlib.privacy_shadow"
MEMBERS_TAG = "ddlib.privacy_members"  # what the set's models are asked about
SIDES = ("set", "random", "full")

SPEC = ProtocolSpec(
    name="privacy", revision=3, order=80, title="Privacy: membership inference on models trained on the set",
    summary="loss-threshold and shadow-model membership inference (AUC, TPR at 1 % FPR) on the set's, a random "
            "subset's and the full data's models",
    params={
        **SET_PARAMS,
        **RECIPE_PARAMS,
        "augment": Param(None, "one augmentation spec (ddlib.engine.augment) or null, for every training", "str"),
        "members": Param(500, "non-members attacked (test images) and the most members per target (more are "
                              "subsampled); at most half of each split: the default is lowered to that, another value "
                              "past it refused"),
        "member_indices": Param(None, "training-split indices of the real images the set was made from (a file's set); "
                                      "null: the built-in method's own record", "list[int]"),
        "member_half": Param(False, "make the set with its built-in source from a seeded half of each class of the "
                                    "training split, the members (Dong et al. 2022)"),
        "attack_seed": Param(0, "draws the members, the non-members, the member half and the shadow data"),
        "full_data": Param(True, "also attack the full-data model (trained once per seed, reused)"),
    },
    boards=(Board("privacy", "Privacy: membership inference (AUC; 0.5: no leak)", "ddlib.protocols.privacy:leaderboard",
                  "loss_auc_set", "MIA AUC (loss)",
                  columns=(("loss_auc_set", "loss attack AUC, the set"), ("shadow_auc_set", "shadow attack AUC, the set"),
                           ("loss_tpr_set", "loss attack TPR at 1 % FPR, the set"),
                           ("loss_auc_random", "loss attack AUC, random subset"),
                           ("loss_auc_full", "loss attack AUC, full data")),
                  more_columns=True, variant=("model",), higher_is_better=False,
                  heading="Privacy: membership inference (AUC 0-1, 0.5: no leak; lower is better, not ranked; TPR and "
                          "accuracies in %)"),),
    headline="privacy",
    history=(f"2: {LAYOUT_REVISION}",
             f"3: {IDENTITY_REVISION}"
              "; members are the images each target was made from (a selection's picks, DM's starting images, "
              "member_indices, or member_half's half: Dong et al. 2022), not uniform draws of the training split "
              "(which capped the set's AUC at 0.5 + IPC·C/2N); the shadow attack asks its target's question; a set "
              "whose source images are unknown gets no AUC (flagged); logits in the model's training precision"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
    """Check a privacy cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params)
    check_recipe_params(p)
    check_augment(p["augment"], "augment")
    if not positive_int(p["members"]) or p["members"] < 2:
        raise ValueError(f"members must be an integer >= 2, got {shown(p['members'])}")
    if not isinstance(p["attack_seed"], int) or isinstance(p["attack_seed"], bool) or p["attack_seed"] < 0:
        raise ValueError(f"attack_seed must be a non-negative integer, got {shown(p['attack_seed'])}")
    if not isinstance(p["full_data"], bool):
        raise ValueError(f"full_data must be true or false, got {shown(p['full_data'])}")
    most = _most_members(p)
    check_member_params(p, most[1] if most is not None else None)
    if most is not None and p["members"] > most[0] and p["members"] != PARAMS["members"]:  # the default: lowered
        raise ValueError(f"members must be at most {most[0]} here (half of the smaller split: {most[1]} training and "
                         f"{most[2]} test images of {p['dataset']}), got {p['members']}")
    return p


def _most_members(p: dict) -> tuple[int, int, int] | None:
    """(the most members the cell's data allows, its training images, its test images), counted as
    :func:`split_members` draws them from the data :meth:`Cell.open` prepares; None where the data does
    not load (the runner's data check says why)."""
    from ddlib.data.datasets import load_dataset

    try:
        ds = load_dataset(p["dataset"], p["data_root"])
    except (ValueError, OSError):
        return None
    n_train, n_test = len(ds.train_labels), len(ds.test_labels)
    if p["train_per_class"] is not None:
        n_train = int(torch.bincount(ds.train_labels.long()).clamp(max=p["train_per_class"]).sum())
    if p["test_size"] is not None:
        n_test = min(n_test, p["test_size"])
    return min(n_train, n_test) // 2, n_train, n_test


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the privacy cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


def obtain(cell: Cell) -> DistilledSet:
    """The cell's set (:func:`ddlib.protocols.common.obtain`); with ``member_half``, made by its built-in
    source from the member half of the training split only (:func:`ddlib.protocols.membership.member_half`)."""
    p = cell.params
    if not p["member_half"]:
        return common.obtain(cell)
    half, _ = member_half(cell.dataset.train_labels, cell.dataset.num_classes, p["attack_seed"])
    whole = cell.dataset
    cell.dataset = half_dataset(whole, half)
    try:
        distilled = common.obtain(cell)
    finally:
        cell.dataset = whole
    distilled.provenance["member_half"] = (f"made from {len(half)} of the {len(whole.train_labels)} training images "
                                           f"(half of each class, attack_seed {p['attack_seed']})")
    return distilled


# --------------------------------------------------------------------------- the attacks


@torch.no_grad()
def model_outputs(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, mean, std,
                  device: torch.device | str = "cpu", batch: int = 512,
                  precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """(softmax probabilities [N, C], cross-entropy of the true label [N]) of a model in eval mode: its logits
    as its test pass computes them (bf16 autocast for a model trained in bf16), softmax and loss in fp32."""
    from ddlib.engine.device import autocast
    from ddlib.engine.test_pass import Normalize, as_pixels

    device = torch.device(device)
    normalize = Normalize(mean, std).to(device)
    model.eval()
    probs, losses = [], []
    for start in range(0, len(images), batch):
        x = normalize(as_pixels(images[start:start + batch].to(device)))
        y = labels[start:start + batch].to(device)
        with autocast(precision, device):
            logits = model(x)
        logits = logits.float()
        probs.append(torch.softmax(logits, 1).cpu())
        losses.append(torch.nn.functional.cross_entropy(logits, y, reduction="none").cpu())
    return torch.cat(probs).numpy().astype(np.float64), torch.cat(losses).numpy().astype(np.float64)


def attack_features(probs: np.ndarray, losses: np.ndarray) -> np.ndarray:
    """The shadow attack's input: the softmax sorted in decreasing order, and the true label's loss."""
    return np.concatenate([-np.sort(-probs, axis=1), losses[:, None]], axis=1)


def _labelled(member_scores, nonmember_scores) -> tuple[np.ndarray, np.ndarray]:
    members, nonmembers = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    if not len(members) or not len(nonmembers):
        raise ValueError(f"an attack needs members and non-members, got {len(members)} and {len(nonmembers)}")
    return np.r_[np.ones(len(members)), np.zeros(len(nonmembers))], np.r_[members, nonmembers]


def membership_auc(member_scores, nonmember_scores) -> float:
    """ROC AUC of membership scores (higher: more likely a member); 0.5 is chance."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(*_labelled(member_scores, nonmember_scores)))


def tpr_at_fpr(member_scores, nonmember_scores, fpr: float = FPR) -> float:
    """TPR at the ROC's operating points with FPR strictly below ``fpr``, the highest (as LiRA's code
    reads it, ``tpr[np.where(fpr < .01)[0][-1]]``): no interpolation between operating points."""
    from sklearn.metrics import roc_curve

    fprs, tprs, _ = roc_curve(*_labelled(member_scores, nonmember_scores), drop_intermediate=False)
    return float(tprs[fprs < fpr].max())


def fit_shadow_attack(features_in: np.ndarray, features_out: np.ndarray):
    """Shokri et al.'s attack model: fitted on shadow models' outputs on their own training images (in)
    and on images they never saw (out); ``predict_proba(features)[:, 1]`` scores membership."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.concatenate([features_in, features_out])
    y = np.r_[np.ones(len(features_in)), np.zeros(len(features_out))]
    return make_pipeline(StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000)).fit(x, y)


# --------------------------------------------------------------------------- the cell's data


def _shadow_draw(cell: Cell, pool: torch.Tensor, ipc: int, seed: int) -> torch.Tensor:
    """``ipc`` images per class of the shadow pool (training indices): an ``ipc``-sized target's shadow, per seed."""
    ds = cell.dataset
    g = torch.Generator().manual_seed(int(cell.params["attack_seed"]) * 1_000_003 + seed)
    labels = ds.train_labels[pool]
    chosen = []
    for c in range(ds.num_classes):
        idx = pool[labels == c]
        if len(idx) < ipc:
            raise ValueError(f"ipc {ipc}: the shadow pool has {len(idx)} images of class {c}; lower members or ipc")
        chosen.append(idx[torch.randperm(len(idx), generator=g)[:ipc]])
    return torch.cat(chosen).sort().values


def _images(ds, indices: torch.Tensor, what: str) -> DistilledSet:
    """Training images by index, as stored (uint8 stays uint8: the training loop converts per batch)."""
    return DistilledSet(images=ds.train_images[indices], labels=ds.train_labels[indices], num_classes=ds.num_classes,
                        method="shadow", source=f"{what} of {ds.name}", provenance={"images": len(indices)})


# --------------------------------------------------------------------------- evaluate


@dataclass(kw_only=True)
class PrivacyResult(Result):
    """per_seed: per side (set, random, full) its accuracy ``acc_<side>`` and ``{loss,shadow}_{auc,tpr}_<side>``
    (absent for the set where its members are unknown)."""

    members: int  # non-members attacked (test images), and the most members per target
    member_counts: dict = field(default_factory=dict)  # side -> members attacked (the set's: 0 where unknown)

    def table(self) -> pd.DataFrame:
        rows = {}
        for side in SIDES:
            if f"acc_{side}_mean" in self.summary:
                rows[side] = {k: self.summary.get(f"{k}_{side}_mean", float("nan"))
                              for k in ("acc", "loss_auc", "loss_tpr", "shadow_auc", "shadow_tpr")}
                rows[side]["members"] = self.member_counts.get(side, 0)
        return pd.DataFrame(rows).T


@dataclass
class Target:
    """One attacked model, the training indices it is asked about (None: unknown, not attacked) and the
    precision it trained in (its logits are computed in it)."""

    model: TrainedModel
    members: torch.Tensor | None
    precision: str = "fp32"


def evaluate(cell: Cell, distilled: DistilledSet) -> PrivacyResult:
    """Train (or find in the pool) every target and shadow model, fit the shadow attacks, attack each target."""
    p, ds = cell.params, cell.dataset
    recipe = setting_recipe(p, p["augment"], full=False)
    real_recipe = setting_recipe(p, p["augment"], full=True)
    hook = create_augment(p["augment"], mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
    seeds = [int(s) for s in p["seeds"]]
    whole = p["ipc"] == FULL_IPC  # method full: the set is the training split
    split = split_members(len(ds.train_labels), len(ds.test_labels), p["members"], p["attack_seed"])
    cap, seed0 = len(split.nonmembers), int(p["attack_seed"])
    half, other_half = (member_half(ds.train_labels, ds.num_classes, seed0) if p["member_half"] else (None, None))
    if whole:
        asked, how = split.members, "drawn from the training split (the set is all of it)"
    else:
        asked, how = set_members(p, distilled, half)
    asked = at_most(asked, cap, seed0) if asked is not None else None
    small, large = (run_precision(r, cell.device) for r in (recipe, real_recipe))  # what each kind trains in

    def models(subset: DistilledSet, role: str, recipe_of, seed_list: Sequence[int]) -> list[TrainedModel]:
        return cell.train_eval(role, subset.images, subset.labels, recipe_of, seed_list, augment=hook, keep_models=True)

    with cell.guard():
        cell.tracker.set_tags(cell.run_id, {SHADOW_TAG: "the set's shadow models train as the random subset's (a random "
                                                        "ipc-per-class draw of real shadow data)",
                                            MEMBERS_TAG: how[:500]})
        if asked is None:
            cell.flag(how)
        set_models = models(distilled, "real" if whole else "syn", real_recipe if whole else recipe, seeds)
        targets = {"set": [Target(m, asked, large if whole else small) for m in set_models]}
        shadows: dict[str, list[tuple[TrainedModel, torch.Tensor]]] = {}
        if not whole:
            targets["random"] = [replace(_random_target(cell, models, recipe, s, half, cap), precision=small)
                                 for s in seeds]
            pool = split.shadow_pool if half is None else other_half
            shadows["ipc"] = []
            for s in seeds:
                draw = _shadow_draw(cell, pool, p["ipc"], s)
                trained = models(_images(ds, draw, "shadow draw"), "shadow_ipc", recipe, [s])[0]
                # asked as its target is: its own images, or (member half) a sample of the half it was drawn from
                shadows["ipc"].append((trained, draw if half is None else at_most(other_half, cap, seed0 + s + 1)))
        if p["full_data"] or whole:
            if not whole:
                targets["full"] = [Target(m, split.members, large)
                                   for m in models(full_set(ds), "real", real_recipe, seeds)]
            pool_models = models(_images(ds, split.shadow_pool, "shadow pool"), "shadow_full", real_recipe, seeds)
            shadows["full"] = [(m, split.shadow_pool) for m in pool_models]
        attacks = {kind: _fit_attack(cell, split, trained, small if kind == "ipc" else large)
                   for kind, trained in shadows.items()}
        rows = []
        for i, seed in enumerate(seeds):
            row = {"seed": seed}
            for side, side_targets in targets.items():
                kind = "full" if side == "full" or whole else "ipc"
                row.update(_attack_row(cell, split, side_targets[i], attacks[kind], side))
            rows.append(row)
        counts = {side: len(t[0].members) if t[0].members is not None else 0 for side, t in targets.items()}
        cell.tracker.log_metrics(cell.run_id, {"members": len(split.nonmembers),
                                               **{f"members_{side}": n for side, n in counts.items()}})
        per_seed, summary = cell.record_per_seed(rows)
    return PrivacyResult(per_seed=per_seed, summary=summary, protocol=cell.protocol, members=len(split.nonmembers),
                         member_counts=counts, run_id=cell.run_id)


def _random_target(cell: Cell, models, recipe, seed: int, half: torch.Tensor | None, cap: int) -> Target:
    """The random subset of evaluation seed ``seed`` and its own images; in member-half mode drawn from the
    member half and asked about the half (the set's question)."""
    ds = cell.dataset
    if half is None:
        subset = baseline_subset(ds, cell.params["ipc"], seed)
        own = torch.tensor(subset.provenance["indices"]).sort().values
        return Target(models(subset, "rdm", recipe, [seed])[0], at_most(own, cap, int(cell.params["attack_seed"])))
    subset = baseline_subset(half_dataset(ds, half), cell.params["ipc"], seed)
    return Target(models(subset, "rdm", recipe, [seed])[0], at_most(half, cap, int(cell.params["attack_seed"])))


def _outputs(cell: Cell, model: TrainedModel, images, labels, precision: str):
    ds = cell.dataset
    return model_outputs(model.model, images, labels, ds.mean, ds.std, cell.device, precision=precision)


def _fit_attack(cell: Cell, split: Split, shadows: list[tuple[TrainedModel, torch.Tensor]], precision: str):
    """The attack classifier of one kind of target, on every shadow model's outputs on the images it is asked
    about as members (in; at most as many as the shadow out images, drawn per seed) and on the shadow out images."""
    ds = cell.dataset
    features_in, features_out = [], []
    out_images, out_labels = ds.test_images[split.shadow_out], ds.test_labels[split.shadow_out]
    for model, asked in shadows:
        if len(asked) > len(out_labels):  # balanced in and out (the full pool is larger)
            g = torch.Generator().manual_seed(model.seed)
            asked = asked[torch.randperm(len(asked), generator=g)[:len(out_labels)]]
        features_in.append(attack_features(*_outputs(cell, model, ds.train_images[asked], ds.train_labels[asked],
                                                     precision)))
        features_out.append(attack_features(*_outputs(cell, model, out_images, out_labels, precision)))
    return fit_shadow_attack(np.concatenate(features_in), np.concatenate(features_out))


def _attack_row(cell: Cell, split: Split, target: Target, attack, side: str) -> dict:
    ds, model = cell.dataset, target.model
    if target.members is None:
        return {f"acc_{side}": model.accuracy}
    members = target.members
    probs_in, loss_in = _outputs(cell, model, ds.train_images[members], ds.train_labels[members], target.precision)
    probs_out, loss_out = _outputs(cell, model, ds.test_images[split.nonmembers], ds.test_labels[split.nonmembers],
                                   target.precision)
    shadow_in = attack.predict_proba(attack_features(probs_in, loss_in))[:, 1]
    shadow_out = attack.predict_proba(attack_features(probs_out, loss_out))[:, 1]
    return {f"acc_{side}": model.accuracy,
            f"loss_auc_{side}": membership_auc(-loss_in, -loss_out), f"loss_tpr_{side}": tpr_at_fpr(-loss_in, -loss_out),
            f"shadow_auc_{side}": membership_auc(shadow_in, shadow_out),
            f"shadow_tpr_{side}": tpr_at_fpr(shadow_in, shadow_out)}


def leaderboard(experiment: str = "privacy") -> pd.DataFrame:
    """Per dataset x model x method x IPC: both attacks' AUC and TPR at 1 % FPR on each side, mean over
    seeds; not ranked (a lower AUC is less leakage, the leaderboards rank higher first)."""
    from ddlib.boards.rank import aggregate
    from ddlib.boards.read import per_seed_values

    rows = ("dataset", "model", "method", "ipc")
    df = per_seed_values(experiment, ("acc_set",), rows,  # a cell whose members are unknown is listed, without AUC
                         match=lambda k: k.startswith(("acc_", "loss_", "shadow_")))
    if df.empty:
        return df
    first = [c for c, _ in SPEC.board().columns if c in df]
    cols = first + sorted(c for c in df.columns if c.startswith(("acc_", "loss_", "shadow_")) and c not in first)
    board = aggregate(df, cols, rows, sort=("dataset", "model", "ipc", "method"))
    unknown = board["loss_auc_set_mean"].isna() if "loss_auc_set_mean" in board else pd.Series(True, board.index)
    if unknown.any():
        notes = board["sanity"].fillna("") if "sanity" in board else pd.Series("", board.index)
        board["sanity"] = [("; ".join(n for n in (note, "membership not measured (source images unknown)") if n)
                            if missing else note) for note, missing in zip(notes, unknown)]
    return board
