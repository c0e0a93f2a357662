"""Membership inference: does a model trained on the set tell the real images the set was made from
from images it never saw? (The privacy lens of Chen et al., "A comprehensive study on dataset
distillation: performance, privacy, robustness and fairness", arXiv 2305.03355.)

**Members** are real training images (the data the distillation saw; a selection method may have
picked some of them); **non-members** are test images (no model here, nor the distillation, saw
them). ``members`` of each are drawn with ``attack_seed`` (balanced counts; the rest of each split is
the shadow data). Three targets are attacked, one model per seed each, with the same members and
non-members: the set's models, a random subset of the same IPC (DD-Ranking's baseline draw,
:func:`ddlib.methods.select.baseline_subset`) and the full-data model (``full_data``). Every model
is trained through :meth:`ddlib.protocols.cell.Cell.train_eval` with ``keep_models=True``: found in
the model pool when an earlier cell trained it, never trained twice. Method ``full`` (ipc 0): the set
is the training split, attacked once with the full-data shadows (no random subset).

Two attacks, both black-box on the softmax:

* **loss threshold** (Yeom et al., CSF 2018): score = - cross-entropy of the true label; no training.
* **shadow models** (Shokri et al., S&P 2017), in its simple form: per seed a shadow model trained the
  way the target was, on shadow data of known membership (shadow *in*: real training images outside
  the members; shadow *out*: test images outside the non-members): for the set and the random subset
  (both ``ipc`` images per class under ``recipe``) a random ``ipc``-per-class draw of the shadow pool,
  one shadow model per seed shared by the two; for the full-data model the whole shadow pool under
  ``real_recipe``. One attack classifier per kind of target (logistic regression, standardised
  features, balanced class weights; scikit-learn) is fitted on every shadow model's outputs pooled:
  features = the softmax vector sorted in decreasing order and the true label's loss (one classifier
  for all classes, not Shokri's one per class). A shadow of the distilled set would need the method
  rerun on shadow data: it is trained as the random subset's is (named deviation, tag
  ``ddlib.privacy_shadow``).

Per model: ``*_auc`` (ROC AUC, 0.5: no membership signal) and ``*_tpr`` (TPR at 1 % FPR, read off
``sklearn.metrics.roc_curve`` as LiRA's code reads it, Carlini et al. 2022: the highest TPR at an
operating point with FPR strictly below 1 %; no interpolation).
Out of scope: LiRA and other per-example calibrated attacks (many shadow models per example),
white-box attacks, label-only attacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ddlib.data.distilled import DistilledSet
from ddlib.engine.augment import create_augment
from ddlib.methods.select import baseline_subset
from ddlib.methods.sources import full_set
from ddlib.protocols.cell import Cell, TrainedModel
from ddlib.protocols.common import FULL_IPC, SET_PARAMS, obtain, positive_int, validate_set_params  # noqa: F401 (obtain: a step)
from ddlib.protocols.dcbench import RECIPE_PARAMS, check_augment, check_recipe_params, setting_recipe
from ddlib.protocols.spec import LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.shown import shown

__all__ = ["SPEC", "PARAMS", "validate", "open_cell", "obtain", "evaluate", "leaderboard", "PrivacyResult",
           "model_outputs", "attack_features", "membership_auc", "tpr_at_fpr", "fit_shadow_attack", "split_members"]

FPR = 0.01  # the false-positive rate TPR is read at
SHADOW_TAG = "ddlib.privacy_shadow"
SIDES = ("set", "random", "full")

SPEC = ProtocolSpec(
    name="privacy", revision=2, order=80, title="Privacy: membership inference on models trained on the set",
    summary="loss-threshold and shadow-model membership inference (AUC, TPR at 1 % FPR) on the set's, a random "
            "subset's and the full data's models",
    params={
        **SET_PARAMS,
        **RECIPE_PARAMS,
        "augment": Param(None, "one augmentation spec (ddlib.engine.augment) or null, for every training", "str"),
        "members": Param(500, "members attacked and as many non-members (at most half of each split; the default is "
                              "lowered to that, another value past it refused)"),
        "attack_seed": Param(0, "draws the members, the non-members and the shadow data"),
        "full_data": Param(True, "also attack the full-data model (trained once per seed, reused)"),
    },
    boards=(Board("privacy", "Privacy: membership inference (AUC; 0.5: no leak)", "ddlib.protocols.privacy:leaderboard",
                  "loss_auc_set", "MIA AUC (loss)",
                  columns=(("loss_auc_set", "loss attack AUC, the set"), ("shadow_auc_set", "shadow attack AUC, the set"),
                           ("loss_tpr_set", "loss attack TPR at 1 % FPR, the set"),
                           ("loss_auc_random", "loss attack AUC, random subset"),
                           ("loss_auc_full", "loss attack AUC, full data")),
                  more_columns=True, variant=("model",), higher_is_better=False),),
    headline="privacy",
    history=(f"2: {LAYOUT_REVISION}",),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def validate(params: dict) -> dict:
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
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


# --------------------------------------------------------------------------- the attacks


@torch.no_grad()
def model_outputs(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, mean, std,
                  device: torch.device | str = "cpu", batch: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(softmax probabilities [N, C], cross-entropy of the true label [N]) of a model in eval mode, in fp32."""
    from ddlib.engine.test_pass import Normalize, as_pixels

    normalize = Normalize(mean, std).to(device)
    model.eval()
    probs, losses = [], []
    for start in range(0, len(images), batch):
        x = normalize(as_pixels(images[start:start + batch].to(device)))
        y = labels[start:start + batch].to(device)
        logits = model(x).float()
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


@dataclass(frozen=True)
class Split:
    """Which images are attacked (members, non-members) and which the attacker's shadows use (indices)."""

    members: torch.Tensor  # into the training split
    nonmembers: torch.Tensor  # into the test split
    shadow_pool: torch.Tensor  # the training split without the members: shadow models train on it
    shadow_out: torch.Tensor  # the test split without the non-members: what shadow models never saw


def split_members(n_train: int, n_test: int, members: int, seed: int) -> Split:
    """``members`` training and as many test indices (at most half of either split), drawn with ``seed``;
    the rest of each split is the shadow data."""
    n = min(members, n_train // 2, n_test // 2)
    if n < 1:
        raise ValueError(f"members: {n_train} training and {n_test} test images leave none to attack")
    g = torch.Generator().manual_seed(seed)
    train, test = torch.randperm(n_train, generator=g), torch.randperm(n_test, generator=g)
    return Split(train[:n].sort().values, test[:n].sort().values, train[n:].sort().values, test[n:].sort().values)


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
    """per_seed: per side (set, random, full) its accuracy ``acc_<side>`` and ``{loss,shadow}_{auc,tpr}_<side>``."""

    members: int  # members attacked, and as many non-members

    def table(self) -> pd.DataFrame:
        rows = {}
        for side in SIDES:
            if f"acc_{side}_mean" in self.summary:
                rows[side] = {k: self.summary.get(f"{k}_{side}_mean", float("nan"))
                              for k in ("acc", "loss_auc", "loss_tpr", "shadow_auc", "shadow_tpr")}
        return pd.DataFrame(rows).T


def evaluate(cell: Cell, distilled: DistilledSet) -> PrivacyResult:
    """Train (or find in the pool) every target and shadow model, fit the shadow attacks, attack each target."""
    p, ds = cell.params, cell.dataset
    recipe = setting_recipe(p, p["augment"], full=False)
    real_recipe = setting_recipe(p, p["augment"], full=True)
    hook = create_augment(p["augment"], mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
    seeds = [int(s) for s in p["seeds"]]
    whole = p["ipc"] == FULL_IPC  # method full: the set is the training split
    split = split_members(len(ds.train_labels), len(ds.test_labels), p["members"], p["attack_seed"])

    def models(subset: DistilledSet, role: str, how, seed_list: Sequence[int]) -> list[TrainedModel]:
        return cell.train_eval(role, subset.images, subset.labels, how, seed_list, augment=hook, keep_models=True)

    with cell.guard():
        cell.tracker.set_tags(cell.run_id, {SHADOW_TAG: "the set's shadow models train as the random subset's (a random "
                                                        "ipc-per-class draw of real shadow data)"})
        targets = {"set": models(distilled, "real" if whole else "syn", real_recipe if whole else recipe, seeds)}
        shadows: dict[str, list[tuple[TrainedModel, torch.Tensor]]] = {}
        if not whole:
            targets["random"] = [models(baseline_subset(ds, p["ipc"], s), "rdm", recipe, [s])[0] for s in seeds]
            draws = [_shadow_draw(cell, split.shadow_pool, p["ipc"], s) for s in seeds]
            shadows["ipc"] = [(models(_images(ds, d, "shadow draw"), "shadow_ipc", recipe, [s])[0], d)
                              for s, d in zip(seeds, draws)]
        if p["full_data"] or whole:
            if not whole:
                targets["full"] = models(full_set(ds), "real", real_recipe, seeds)
            pool = models(_images(ds, split.shadow_pool, "shadow pool"), "shadow_full", real_recipe, seeds)
            shadows["full"] = [(m, split.shadow_pool) for m in pool]
        attacks = {kind: _fit_attack(cell, split, trained) for kind, trained in shadows.items()}
        rows = []
        for i, seed in enumerate(seeds):
            row = {"seed": seed}
            for side, trained in targets.items():
                kind = "full" if side == "full" or whole else "ipc"
                row.update(_attack_row(cell, split, trained[i], attacks[kind], side))
            rows.append(row)
        cell.tracker.log_metrics(cell.run_id, {"members": len(split.members)})
        per_seed, summary = cell.record_per_seed(rows)
    return PrivacyResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                         members=len(split.members), run_id=cell.run_id)


def _outputs(cell: Cell, model: TrainedModel, images, labels):
    ds = cell.dataset
    return model_outputs(model.model, images, labels, ds.mean, ds.std, cell.device)


def _fit_attack(cell: Cell, split: Split, shadows: list[tuple[TrainedModel, torch.Tensor]]):
    """The attack classifier of one kind of target, on every shadow model's outputs on images it trained on
    (in; at most as many as the shadow out images, drawn per seed) and on the shadow out images."""
    ds = cell.dataset
    features_in, features_out = [], []
    out_images, out_labels = ds.test_images[split.shadow_out], ds.test_labels[split.shadow_out]
    for model, trained_on in shadows:
        if len(trained_on) > len(out_labels):  # balanced in and out (the full pool is larger)
            g = torch.Generator().manual_seed(model.seed)
            trained_on = trained_on[torch.randperm(len(trained_on), generator=g)[:len(out_labels)]]
        features_in.append(attack_features(*_outputs(cell, model, ds.train_images[trained_on], ds.train_labels[trained_on])))
        features_out.append(attack_features(*_outputs(cell, model, out_images, out_labels)))
    return fit_shadow_attack(np.concatenate(features_in), np.concatenate(features_out))


def _attack_row(cell: Cell, split: Split, model: TrainedModel, attack, side: str) -> dict:
    ds = cell.dataset
    probs_in, loss_in = _outputs(cell, model, ds.train_images[split.members], ds.train_labels[split.members])
    probs_out, loss_out = _outputs(cell, model, ds.test_images[split.nonmembers], ds.test_labels[split.nonmembers])
    shadow_in = attack.predict_proba(attack_features(probs_in, loss_in))[:, 1]
    shadow_out = attack.predict_proba(attack_features(probs_out, loss_out))[:, 1]
    return {f"acc_{side}": model.accuracy,
            f"loss_auc_{side}": membership_auc(-loss_in, -loss_out), f"loss_tpr_{side}": tpr_at_fpr(-loss_in, -loss_out),
            f"shadow_auc_{side}": membership_auc(shadow_in, shadow_out),
            f"shadow_tpr_{side}": tpr_at_fpr(shadow_in, shadow_out)}


def leaderboard(experiment: str = "privacy") -> pd.DataFrame:
    """Per dataset x model x method x IPC: both attacks' AUC and TPR at 1 % FPR on each side, mean over
    seeds; not ranked (a lower AUC is less leakage, the leaderboards rank higher first)."""
    from ddlib.report.core import aggregate, per_seed_values

    rows = ("dataset", "model", "method", "ipc")
    df = per_seed_values(experiment, ("loss_auc_set",), rows,
                         match=lambda k: k.startswith(("acc_", "loss_", "shadow_")))
    if df.empty:
        return df
    first = [c for c, _ in SPEC.board().columns if c in df]
    cols = first + sorted(c for c in df.columns if c.startswith(("acc_", "loss_", "shadow_")) and c not in first)
    return aggregate(df, cols, rows, sort=("dataset", "model", "ipc", "method"))
