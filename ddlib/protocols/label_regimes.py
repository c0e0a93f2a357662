"""Label regimes at matched compute (Dey et al., "Rethinking Dataset Distillation: Hard Truths about Soft
Labels", CVPR 2026, arXiv 2604.18811): a set and its random subset under hard labels, fixed soft labels
and an online teacher, every model of a cell trained for one images-seen budget; and the board that
says in which regimes the set beats random. Imports the cell, the teachers and the boards below it.

Per evaluation seed, the distilled set and that seed's random subset of the same size (the baselines'
own stream, :func:`ddlib.methods.select.baseline_subset`, as ``label_robust`` draws it) are trained under
each regime of ``regimes``:

* ``hl``: hard labels, cross-entropy.
* ``sl``: fixed soft labels, no teacher in the loop: the set's stored soft labels; a set without them
  (the random subset, a coreset) is labelled once per image by the ``teacher`` (its logits on the
  un-augmented images), and those targets are then fixed for every augmented view. Trained with
  ``soft_loss`` at ``temperature`` (targets at that temperature: :func:`ddlib.engine.labels.stored_targets`).
* ``sl_kd``: the ``teacher`` relabels every augmented batch (:class:`ddlib.engine.labels.TeacherRelabel`,
  knowledge distillation) with ``soft_loss`` at ``temperature``.

Matched compute: every model of the cell (each regime, both sets) trains ``recipe`` with ``augment``:
``epochs x set size`` images seen, one budget per row. A set with unequal classes holds fewer images than
its random subset (whose IPC is the set's); that subset then trains the whole number of epochs that
brings its images seen nearest the set's (``label_robust``'s ``ior_matched`` rule). No lr is searched:
the recipe's lr for every model (a search would spend compute the matched budget does not count).

Where a regime cannot apply (``sl`` without a teacher for a side without soft labels; ``sl_kd`` without a
teacher) nothing of it is trained: tag ``ddlib.label_regimes.<regime>`` says "not applicable: <why>" and
the board shows that reason instead of numbers. Per seed: ``acc_syn_<r>``, ``acc_rdm_<r>`` (fractions,
shown in %) and ``gap_<r> = acc_syn_<r> - acc_rdm_<r>`` (points). The board's verdict per regime: the set
beats random where the paired bootstrap interval of the gap over shared seeds
(:func:`ddlib.scores.stats.paired_difference`) lies above 0."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import torch

from ddlib.data.distilled import DistilledSet
from ddlib.engine.recipe import Recipe, epochs_trained
from ddlib.protocols.cell import Cell
from ddlib.protocols.common import SET_PARAMS, PRESET_PARAMS, check_recipe, obtain, validate_set_params
from ddlib.protocols.spec import Board, Param, ProtocolSpec, Result

__all__ = ["PROTOCOL", "PARAMS", "REGIMES", "validate", "open_cell", "obtain", "evaluate", "LabelRegimesResult",
           "regime_tag", "matched_epochs", "verdicts", "regimes_leaderboard"]

REGIMES = ("hl", "sl", "sl_kd")
REGIME_NAMES = {"hl": "hard labels", "sl": "fixed soft labels (no teacher in the loop)",
                "sl_kd": "soft labels from an online teacher (every augmented batch relabelled)"}
DEFAULT_AUGMENT = ["random_resized_crop", "flip"]  # SRe2L's / RDED's student augmentation (the ops' defaults)

SPEC = ProtocolSpec(
    name="label_regimes", revision=1, order=25, title="Label regimes at matched compute",
    summary="a set and its random subset under hard labels, fixed soft labels and an online teacher, one "
            "images-seen budget; in which regimes the set beats random",
    params={
        **{k: v for k, v in SET_PARAMS.items() if k != "epochs"},
        "epochs": Param(None, "training epochs of every model (recipe's epochs)", "int"),
        "recipe": Param({}, "the one recipe of every regime and both sets: the matched budget (Recipe keys)"),
        "augment": Param(list(DEFAULT_AUGMENT), "augmentation of every model (ddlib.engine.augment ops)", "list"),
        "regimes": Param(list(REGIMES), "which regimes: hl (hard labels), sl (fixed soft labels), sl_kd (online teacher)",
                         "list[str]"),
        "teacher": Param(None, "teacher architecture(s) for sl and sl_kd (null: neither applies; see the docs)", "str"),
        "soft_loss": Param("kl", "the soft-label loss of sl and sl_kd (ddlib.engine.labels: kl, sce, mse_ce, ce)"),
        "temperature": Param(4.0, "the soft labels' and the loss's temperature (RDED's CIFAR setting)"),
        "baseline_seed": PRESET_PARAMS["baseline_seed"],
        "teacher_recipe": Param({}, "Recipe keys of the teachers' training (the Recipe defaults otherwise)"),
        "teacher_checkpoints": PRESET_PARAMS["teacher_checkpoints"],
    },
    boards=(Board("label_regimes", "Label regimes at matched compute", "ddlib.protocols.label_regimes:regimes_leaderboard",
                  "gap_hl", "gap, hard labels",
                  columns=(("beats_random_in", "regimes where the set beats random (paired bootstrap over seeds)"),
                           *((c, f"{what}, {REGIME_NAMES[r]}") for r in REGIMES for c, what in (
                               (f"acc_syn_{r}", "accuracy of the set"), (f"acc_rdm_{r}", "random subset"),
                               (f"gap_{r}", "gap in points"), (f"verdict_{r}", "verdict")))),
                  variant=("model", "teacher", "temperature"),
                  heading="Label regimes at matched compute; accuracies in %, gaps in points"),),
    headline="label_regimes",
    history=("1: hl, sl and sl_kd of a set and its random subset at one images-seen budget per row",),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()


def _teachers_of(value) -> tuple[str, ...]:
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)


def validate(params: dict) -> dict:
    """Fill defaults and check every value; errors name the key."""
    from ddlib.engine.augment import create_augment
    from ddlib.engine.labels import create_loss
    from ddlib.models import list_models

    p = validate_set_params(PROTOCOL, PARAMS, params)
    check_recipe(p, "recipe")
    check_recipe(p, "teacher_recipe")
    regimes = p["regimes"]
    if not isinstance(regimes, list) or not regimes or any(r not in REGIMES for r in regimes) \
            or len(set(regimes)) != len(regimes):
        raise ValueError(f"regimes must be a non-empty list of distinct regimes from {list(REGIMES)}, got {regimes!r}")
    teacher = p["teacher"]
    if not (teacher is None or isinstance(teacher, str) or (
            isinstance(teacher, list) and teacher and all(isinstance(t, str) for t in teacher))):
        raise ValueError(f"teacher must be null, an architecture or a list of them, got {teacher!r}")
    unknown = [t for t in _teachers_of(teacher) if t not in list_models()]
    if unknown:
        raise ValueError(f"teacher: unknown architecture(s) {unknown}; known: {list_models()}")
    checkpoints = p["teacher_checkpoints"]
    if checkpoints is not None and (not isinstance(checkpoints, list) or len(checkpoints) != len(_teachers_of(teacher))
                                    or not all(isinstance(c, str) for c in checkpoints)):
        raise ValueError(f"teacher_checkpoints must be null or one path per teacher architecture, got {checkpoints!r}")
    t = p["temperature"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"temperature must be a positive number, got {t!r}")
    try:
        create_loss(_loss_spec(p))
        create_augment(p["augment"], mean=(0.5,), std=(0.5,), num_classes=2)
    except ValueError as e:
        raise ValueError(f"soft_loss / augment: {e}") from None
    return p


def _loss_spec(p: dict) -> dict:
    """``soft_loss`` with ``temperature`` where the loss takes one (mse_ce and ce take none)."""
    from ddlib.engine.labels import LOSSES

    name, given = (p["soft_loss"], {}) if isinstance(p["soft_loss"], str) else (
        dict(p["soft_loss"]).pop("name", None), {k: v for k, v in dict(p["soft_loss"]).items() if k != "name"})
    takes = name in LOSSES and "temperature" in LOSSES.params(name)
    return {"name": name, **given, **({"temperature": float(p["temperature"])} if takes else {})}


def regime_tag(regime: str) -> str:
    return f"ddlib.label_regimes.{regime}"


def not_applicable(regime: str, distilled: DistilledSet, teachers: tuple[str, ...]) -> str:
    """Why ``regime`` cannot compare ``distilled`` with its random subset ("" where it can)."""
    if regime == "sl" and not teachers:
        if distilled.soft_labels is None:
            return "not applicable: the set ships no soft labels and no teacher is given to label it once"
        return "not applicable: the random subset has no soft labels and no teacher is given to label it once"
    if regime == "sl_kd" and not teachers:
        return "not applicable: no teacher is given to relabel every augmented batch"
    return ""


def matched_epochs(recipe: Recipe, n_set: int, n_random: int) -> int:
    """The random subset's epochs for as many images seen as the set's (``recipe``'s epochs where sizes agree)."""
    if n_set == n_random:
        return recipe.epochs
    trained = epochs_trained(recipe)  # epochs + 1 under DC-Bench's dc_step schedule
    return max(1, round(trained * n_set / n_random - (trained - recipe.epochs)))


@dataclass(kw_only=True)
class LabelRegimesResult(Result):
    """per_seed: accuracies and gaps of the applicable regimes; regimes: one row per regime and side."""

    regimes: pd.DataFrame  # regime, side, labels, loss, images seen per model, or why it does not apply


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    cell = Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)
    with cell.guard():
        p = cell.params
        cell.resolved = {"recipe": Recipe.from_dict(p["recipe"]), "teachers": _teachers_of(p["teacher"]),
                         "loss": _loss_spec(p)}
    return cell


class _Regimes:
    """Targets and loss hooks of one cell's regimes: the teachers trained (or loaded) once, their logits
    over a set computed once per set."""

    def __init__(self, cell: Cell):
        self.cell, self.p = cell, cell.params
        self.archs, self.loss_spec = cell.resolved["teachers"], cell.resolved["loss"]
        self._relabel = None

    def relabel(self):
        from ddlib.engine.labels import TeacherRelabel
        from ddlib.protocols.teachers import get_teachers

        if self._relabel is None:
            cell, checkpoints = self.cell, self.p["teacher_checkpoints"]
            recipe = Recipe.from_dict(self.p["teacher_recipe"])
            teachers = []
            for seed, arch in enumerate(self.archs):  # one seed (or checkpoint) per ensemble member
                teachers += get_teachers(cell.dataset, arch, 1, recipe, seeds=[seed], device=cell.device,
                                         progress=cell.progress, protocol=cell.protocol,
                                         checkpoint=checkpoints[seed] if checkpoints is not None else None)
            self._relabel = TeacherRelabel(teachers, loss=self.loss_spec)
        return self._relabel

    def targets(self, regime: str, subset: DistilledSet):
        """(targets, loss hook, what the labels are) of ``subset`` under ``regime``."""
        from ddlib.engine.labels import create_loss, stored_targets
        from ddlib.engine.test_pass import Normalize, as_pixels

        if regime == "hl":
            return subset.labels, None, "hard labels"
        if regime == "sl_kd":
            hook = self.relabel()
            return subset.labels, hook, f"relabelled online by {'+'.join(self.archs)}"
        temperature = self.loss_spec.get("temperature", 1.0)
        loss = create_loss(self.loss_spec)[0].stored()
        if subset.soft_labels is not None:
            return stored_targets(subset, temperature=temperature), loss, "soft labels shipped with the set"
        ds, dev, hook = self.cell.dataset, self.cell.device, self.relabel()
        normalize = Normalize(ds.mean, ds.std).to(dev)
        with torch.no_grad():  # once per image, un-augmented: fixed for every augmented view
            logits = torch.cat([hook.teacher_logits(normalize(as_pixels(chunk.to(dev)))).cpu()
                                for chunk in subset.images.split(512)])
        labelled = replace(subset, soft_labels=logits)
        return stored_targets(labelled, temperature=temperature), loss, f"{'+'.join(self.archs)} logits, computed once"


def evaluate(cell: Cell, distilled: DistilledSet) -> LabelRegimesResult:
    """Each applicable regime: the set and the random subsets trained for one images-seen budget; gaps per seed."""
    from ddlib.engine.augment import create_augment
    from ddlib.engine.labels import teacher_augment
    from ddlib.engine.train import hook_name
    from ddlib.methods.select import baseline_subset

    p, seeds = cell.params, cell.params["seeds"]
    with cell.guard():
        ds, recipe, labels = cell.dataset, cell.resolved["recipe"], _Regimes(cell)
        augment = create_augment(p["augment"], mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
        draws = {s: s if p["baseline_seed"] is None else p["baseline_seed"] for s in seeds}
        subsets = {}
        for draw in dict.fromkeys(draws.values()):
            subsets[draw] = baseline_subset(ds, distilled.ipc, draw)
            cell.log_set(subsets[draw], f"random_baseline_seed{draw}")
        n_set, n_random = len(distilled.images), len(subsets[draws[seeds[0]]].images)
        rdm_recipe = replace(recipe, epochs=matched_epochs(recipe, n_set, n_random))
        acc, table, tags = {s: {"seed": s} for s in seeds}, [], {}
        for regime in p["regimes"]:
            why = not_applicable(regime, distilled, labels.archs)
            tags[regime_tag(regime)] = why or f"applies: {REGIME_NAMES[regime]}"
            if why:
                table.append({"regime": regime, "side": "both", "labels": why})
                continue
            hook = teacher_augment(augment) if regime == "sl_kd" else augment
            for side, r in (("syn", recipe), ("rdm", rdm_recipe)):
                # the set's seeds train together (one set, one labelling); each random subset on its own
                groups = [(distilled, seeds)] if side == "syn" else [
                    (subsets[d], [s for s in seeds if draws[s] == d]) for d in dict.fromkeys(draws.values())]
                for subset, group in groups:
                    targets, loss, note = labels.targets(regime, subset)
                    trained = cell.train_eval(f"{side}_{regime}", subset.images, targets, r, group, loss=loss,
                                              augment=hook)
                    for seed, model in zip(group, trained):
                        acc[seed][f"acc_{side}_{regime}"] = model.accuracy
                table.append({"regime": regime, "side": side, "labels": note, "loss": hook_name(loss, "ce"),
                              "augment": hook_name(hook, "none"), "images": len(subset.images), "epochs": r.epochs,
                              "images_seen": len(subset.images) * epochs_trained(r)})
            for seed in seeds:
                acc[seed][f"gap_{regime}"] = acc[seed][f"acc_syn_{regime}"] - acc[seed][f"acc_rdm_{regime}"]
        cell.tracker.set_tags(cell.run_id, tags)
        rows = [row for row in acc.values() if len(row) > 1]
        per_seed, summary = cell.record_per_seed(rows) if rows else (pd.DataFrame({"seed": seeds}), {})
    return LabelRegimesResult(per_seed=per_seed, summary=summary, protocol=cell.protocol, run_id=cell.run_id,
                              regimes=pd.DataFrame(table).set_index("regime"))


# --------------------------------------------------------------------------- the board

ROW_PARAMS = ("dataset", "ipc", "method", "model", "teacher", "soft_loss", "temperature")


def verdicts(per_seed: pd.DataFrame, why: dict[str, str] | None = None) -> dict[str, str]:
    """One row's verdict per regime from its per-seed accuracies (fractions; column ``seed``): "beats random"
    where the paired bootstrap interval of acc_syn - acc_rdm over shared seeds lies above 0, "below random"
    where below, "no significant gap" otherwise; ``why[regime]``, "not applicable: ...", where it has no
    numbers. ``beats_random_in``: the regimes it beats random in ("hl only", "all", "none")."""
    from ddlib.scores.stats import paired_difference

    out, wins = {}, []
    for regime in REGIMES:
        syn, rdm = f"acc_syn_{regime}", f"acc_rdm_{regime}"
        rows = per_seed.dropna(subset=[c for c in (syn, rdm) if c in per_seed]) if syn in per_seed else per_seed.iloc[:0]
        if syn not in per_seed or rdm not in per_seed or rows.empty:
            out[f"verdict_{regime}"] = (why or {}).get(regime) or "not run"
            continue
        seeds = [int(s) for s in rows["seed"]]
        c = paired_difference(rows[syn].to_numpy(float), rows[rdm].to_numpy(float), seeds_a=seeds, seeds_b=seeds)
        if c.significant and c.low > 0:
            verdict = "beats random"
            wins.append(regime)
        elif c.significant:
            verdict = "below random"
        else:
            verdict = "no significant gap" + (" (one seed)" if len(rows) < 2 else "")
        out[f"verdict_{regime}"] = f"{verdict}: {100 * c.difference:+.2f} points, 95% [{100 * c.low:+.2f}, " \
                                   f"{100 * c.high:+.2f}]" if c.low == c.low else f"{verdict}: {100 * c.difference:+.2f} points"
    out["beats_random_in"] = ("none" if not wins else "all" if len(wins) == len(REGIMES)
                              else ", ".join(wins) + (" only" if len(wins) == 1 else ""))
    return out


def regimes_leaderboard(experiment: str = "label_regimes") -> pd.DataFrame:
    """One row per method x IPC (x dataset, model, teacher, loss): per regime the accuracies of the set and the
    random subset, the gap (mean and std over seeds) and the verdict; ``beats_random_in`` lists the regimes won."""
    from ddlib.boards.rank import aggregate
    from ddlib.boards.read import per_seed_values
    from ddlib.store.tags import TAG

    why_tags = {f"why_{r}": regime_tag(r) for r in REGIMES}
    df = per_seed_values(experiment, (), ROW_PARAMS, match=lambda k: k.startswith(("acc_syn_", "acc_rdm_", "gap_")),
                         row_tags={"revision": TAG["revision"], **why_tags})
    if df.empty:
        return df
    verdict_cols = [f"verdict_{r}" for r in REGIMES] + ["beats_random_in"]
    for _, sub in df.groupby("group", sort=False):
        why = {r: sub[f"why_{r}"].iloc[0] for r in REGIMES
               if isinstance(sub[f"why_{r}"].iloc[0], str) and sub[f"why_{r}"].iloc[0].startswith("not applicable")}
        for col, value in verdicts(sub, why).items():
            df.loc[sub.index, col] = value
    values = [f"{kind}_{r}" for r in REGIMES for kind in ("acc_syn", "acc_rdm", "gap")]
    return aggregate(df, values, (*ROW_PARAMS, "revision", *verdict_cols), sort=("dataset", "ipc"), descending="gap_hl")
