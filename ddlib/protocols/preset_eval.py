"""How the DD-Ranking protocols train a set: the *settings* (hard labels, or the method's own
evaluation from its preset), the random subsets, the teachers' labels and the learning-rate policy.

Shared by the Label-Robust and Augmentation-Robust protocols. The distilled set and the random
subset of a comparison go through the same :class:`~ddlib.protocols.side_plan.SideSetting` (model, recipe, augmentation, ZCA,
labels and loss), so the only differences between the two sides are the images and, where the
policy says so, the learning rate.

Settings (resolved once when the cell opens: :func:`ddlib.protocols.side_plan.resolve_sides`):

* **hard** (HLR and the hard-label IOR): hard labels with cross-entropy. With a preset, the preset's
  recipe, augmentation, ZCA and student model (DD-Ranking measures a hard-label method under its
  own augmentation, e.g. DSA for DSA/DM/MTT/DataDAM/DATM, DATM also with ZCA), less its
  batch-level ops (CutMix, Mixup) where the preset says ``use_aug_for_hard: false`` (DD-Ranking's
  configs of the teacher-relabelling methods); without one, the grid's ``recipe`` and ``model``, no
  augmentation.
* **own** (the "any" side, ARS): the preset as published. Label types: ``hard``; ``stored`` (soft
  labels shipped with the set; a set without them, e.g. the random subset, is labelled once by the
  preset's teacher: its logits over the images, kept as an artifact of the cell run and trained on
  with the same loss and temperature, as DD-Ranking's ``soft_label_mode: S`` labels its random
  data); ``teacher`` (every augmented batch relabelled online, ensembles averaged in logit space).

Learning-rate policy (``lr_policy``; the real-data reference is never searched):

* ``paper`` (default), DD-Ranking's code: hard-label accuracies are searched over ``lr_grid``
  ("When computing the accuracy under hard labels, we perform the hyperparameter search for the
  learning rate and report the best one"); under the method's own evaluation the distilled set
  trains at the method's lr (the preset's, or the learned lr the set ships where the preset says
  ``learned_lr: true``: DD-Ranking's ``syn_lr``) and the random subset is searched. One exception
  to the paper's sentence, the code's: a hard-label preset's own evaluation is its hard-label side,
  so MTT's acc_syn_hard trains at the learned lr it ships, unsearched, as
  ``LabelRobustScoreHard.compute_metrics(syn_lr=...)`` does (docs/deviations.md).
* ``symmetric``: every side searched (DD-Ranking's code when no ``syn_lr`` is passed).
* ``fixed``: nothing searched: the preset's lr (or the set's learned lr), else the grid's recipe.

A search trains each candidate lr per evaluation seed (a seed's choice may differ) and scores it on
``lr_select``: ``validation`` (default) a class-stratified split held out of the real training set;
``test`` the test set, as DD-Ranking's code does (labelled so in MLflow). The chosen lr of every
side and seed and where it came from are logged: metric ``lr_<role>`` (step = seed) and tag
``ddlib.lr.<role>`` on the cell run, and :meth:`SideTrainer.sides` as a table.

Less work for the same numbers:

* A seed's candidates train in lockstep (``Cell.train_eval(lrs=...)``): one batch draw, one
  augmentation and one teacher forward per step for all of them; each model's numbers are those of
  training it alone.
* A search's outcome depends only on what it trains (images, labels, setting, model, recipe less
  the lr, grid, where it is scored, seed), not on the method: the random subset of a (dataset, IPC,
  preset, seed, pool) is searched once and every other cell, whichever method it scores, reuses the
  chosen lr (a cached result, ``Cell.cached_result``). Each cell counts its searches run and reused:
  metrics ``lr_searches_run`` / ``lr_searches_reused`` and tag ``ddlib.lr_search`` on the cell run,
  column ``lr search`` in :meth:`SideTrainer.sides`.
* The side's evaluation at the chosen lr tests the search's own model of that lr (held in memory)
  instead of training it again: the same seed, data order and recipe give the same model, so the
  numbers are those of a second training (``tests/test_protocols_presets.py``), for one training fewer
  per searched side and seed (a search reused from another cell has no model here: the side trains).
* ``lr_search: halving`` (off by default: ``full``): successive halving. Every candidate trains a
  quarter of the epochs (at least one; its own schedule over those epochs), the better half (rounded
  up) trains the full epochs from scratch (the engine has no mid-run checkpoints, so these are the
  full search's own runs and reuse them), and the best of those is chosen: 4.25 instead of 5 full
  trainings for the 5-lr grid. It may choose another lr than the full search (``bench/lr_halving.py``
  measures how often); cells that use it are tagged ``ddlib.lr_search: halving`` and form their own
  leaderboard rows.

Random subsets: one per evaluation seed (DD-Ranking draws a new subset per evaluation run), so
every method gets the same subset at a given seed; ``baseline_seed`` fixes one subset for every seed
instead. They come from a stream of their own (:func:`ddlib.methods.select.baseline_subset`), never
from the torch generator the methods draw with: drawn there at the evaluation seed, the built-in
``random`` method (seed 0) *was* seed 0's baseline, and its seed-0 IOR was 0 by construction.

Teachers (stored and online soft labels) train on the real-data pool with the preset's
``labels.teacher.recipe`` where it gives one, the grid's ``teacher_recipe`` overriding it key by key
(the grid wins where it names a key; :func:`teacher_recipe`; tag ``ddlib.teacher_recipe`` says where
each value came from). Teachers are keyed by the recipe they trained with, and every evaluation by the
teachers' weights.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from ddlib.data.digest import tensor_digest
from ddlib.data.distilled import DistilledSet
from ddlib.engine.recipe import Recipe
from ddlib.engine.train import hook_name
from ddlib.methods.select import baseline_subset
from ddlib.protocols.cell import Cell, TrainedModel
from ddlib.protocols.presets import Preset
from ddlib.protocols.side_plan import (SideSetting, SidesPlan, preset_augment, resolve_preset,  # noqa: F401 (re-exported)
                                       teacher_recipe)

__all__ = ["LR_GRID", "LR_SELECT", "LR_POLICIES", "LR_SEARCHES", "DEFAULT_MODEL", "halving_rungs", "pick_lr",
           "LrPlan", "lr_plan", "SideTrainer"]

LR_GRID = [0.001, 0.005, 0.01, 0.05, 0.1]  # DD-Ranking's grid (soft_label.py, hard_label.py, aug_robust.py)
LR_SELECT = ("validation", "test")
LR_POLICIES = ("paper", "symmetric", "fixed")
LR_SEARCHES = ("full", "halving")
DEFAULT_MODEL = "convnet"  # the student when neither the grid nor the preset names one


@dataclass(frozen=True)
class LrPlan:
    """How one side gets its learning rate: searched over the grid, or fixed (and where the value comes from)."""

    search: bool
    lr: float  # when not searching
    source: str  # where ``lr`` comes from, or why the search runs


def lr_plan(policy: str, setting: SideSetting, side: str, learned_lr: float | None, grid: Sequence[float],
            split: str = "val") -> LrPlan:
    """Which lr a side trains at (``side``: ``syn`` the distilled set, ``rdm`` the random subset;
    ``learned_lr``: the lr the set ships, if any) under ``policy`` (see the module docstring)."""
    if policy not in LR_POLICIES:
        raise ValueError(f"lr_policy must be one of {LR_POLICIES}, got {policy!r}")
    preset = setting.preset
    own_lr = f"preset {preset.name}" if preset is not None else "the grid's recipe"
    learned = (side == "syn" and setting.own and preset is not None and preset.learned_lr and learned_lr is not None)
    where = "validation split" if split == "val" else "TEST set (as the peer does)"
    searched = LrPlan(True, setting.recipe.lr, f"searched on the {where} over {', '.join(f'{v:g}' for v in grid)}")
    if policy == "symmetric":
        return searched
    if learned:
        return LrPlan(False, float(learned_lr), "learned lr shipped with the set (syn_lr)")
    if policy == "fixed":
        return LrPlan(False, setting.recipe.lr, own_lr)
    if side == "rdm" or setting.hard:  # paper: hard-label accuracies and the random subset are searched
        return searched
    return LrPlan(False, setting.recipe.lr, f"{own_lr} (the method's own)")


def pick_lr(scores: dict[float, float]) -> float:
    """The best-scoring lr; ties go to the smaller lr."""
    return max(scores, key=lambda c: (scores[c], -c))


def halving_rungs(grid: Sequence[float], epochs: int) -> tuple[int, int]:
    """(epochs of the first rung, how many candidates continue) of ``lr_search: halving``."""
    return max(1, epochs // 4), max(1, (len(grid) + 1) // 2)


class SideTrainer:
    """The DD-Ranking sides of one cell: builds settings and random subsets, trains sides under the
    learning-rate policy, labels sets with teachers, and logs what each side used."""

    def __init__(self, cell: Cell):
        plan = cell.resolved
        if not isinstance(plan, SidesPlan):
            raise ValueError("this cell's sides are not resolved: open it with its protocol's open_cell")
        self.cell = cell
        self.plan = plan
        self.preset = plan.preset
        self.policy = plan.policy
        self.split = plan.split
        self.grid = list(plan.grid)
        self.search_mode = plan.search_mode
        self.searches = {"run": 0, "reused": 0}  # lr searches of this cell: run here, reused from another cell
        self.rows: list[dict] = []  # one per trained side: what it used (the notebook's table)

    # ------------------------------------------------------------------ sets

    def random_subsets(self, ipc: int, seeds: Sequence[int]) -> dict[int, DistilledSet]:
        """The random subset of each evaluation seed (``baseline_seed``: one subset for all), logged once
        each; drawn from the baselines' own stream (:func:`ddlib.methods.select.baseline_subset`)."""
        fixed = self.plan.baseline_seed
        cache = self.cell.cache.setdefault("random_subsets", {})
        out = {}
        for seed in seeds:
            draw = seed if fixed is None else fixed
            if (ipc, draw) not in cache:
                cache[(ipc, draw)] = baseline_subset(self.cell.dataset, ipc, draw)
                self.cell.log_set(cache[(ipc, draw)], f"random_baseline_seed{draw}")
            out[seed] = cache[(ipc, draw)]
        return out

    def _teacher_hook(self, preset: Preset):
        from ddlib.engine.labels import TeacherRelabel
        from ddlib.protocols.teachers import get_teachers

        archs, teacher = preset.teacher_archs(), self.plan.teacher  # checked against the checkpoints: resolve_sides
        checkpoints = teacher.checkpoints
        key = ("teachers", tuple(archs), teacher.recipe, tuple(checkpoints or ()), repr(preset.loss))
        cell = self.cell
        if key not in cell.cache:
            if checkpoints is None:
                cell.tracker.set_tags(cell.run_id, {"ddlib.teacher_recipe": teacher.note[:4900]})
            teachers = []
            for seed, arch in enumerate(archs):  # one seed (or checkpoint) per ensemble member
                teachers += get_teachers(cell.dataset, arch, 1, teacher.recipe, seeds=[seed], device=cell.device,
                                         progress=cell.progress, protocol=cell.protocol,
                                         checkpoint=checkpoints[seed] if checkpoints is not None else None)
            cell.cache[key] = TeacherRelabel(teachers, loss=preset.loss)
        return cell.cache[key]

    def teacher_logits(self, subset: DistilledSet, preset: Preset, name: str) -> torch.Tensor:
        """The preset's teachers' mean logits over ``subset``'s normalised images (no augmentation),
        computed once per subset and kept as artifact ``teacher_labels/<name>.pt`` of the cell run."""
        from ddlib.engine.test_pass import Normalize, as_pixels

        hook = self._teacher_hook(preset)
        cache = self.cell.cache.setdefault("teacher_logits", {})
        key = (hook.name, tensor_digest(subset.images, subset.labels))
        if key not in cache:
            ds, dev = self.cell.dataset, self.cell.device
            normalize = Normalize(ds.mean, ds.std).to(dev)
            with torch.no_grad():
                logits = torch.cat([hook.teacher_logits(normalize(as_pixels(chunk.to(dev)))).cpu()
                                    for chunk in subset.images.split(512)])
            cache[key] = logits
            with tempfile.TemporaryDirectory() as tmp:
                file = Path(tmp) / f"{name}.pt"
                torch.save({"logits": logits, "labels": subset.labels, "teacher": hook.name}, file)
                self.cell.tracker.log_artifact(self.cell.run_id, file, "teacher_labels")
        return cache[key]

    def _labels(self, setting: SideSetting, subset: DistilledSet, name: str):
        """(targets, loss hook, what the labels are) for ``subset`` under ``setting`` (its resolved labels)."""
        from ddlib.engine.labels import stored_targets

        labels = setting.labels
        if setting.hard:
            return subset.labels, None, "hard labels"
        if labels.kind == "teacher":
            hook = self._teacher_hook(setting.preset)
            return subset.labels, hook, f"relabelled online by {len(hook.teachers)} teacher(s)"
        if subset.soft_labels is not None:
            return stored_targets(subset, temperature=labels.temperature), labels.loss, "soft labels shipped with the set"
        labelled = replace(subset, soft_labels=self.teacher_logits(subset, setting.preset, name))
        note = f"teacher logits ({'+'.join(labels.teacher_archs)}), computed once (artifact teacher_labels/{name}.pt)"
        return stored_targets(labelled, temperature=labels.temperature), labels.loss, note

    # ------------------------------------------------------------------ learning rates

    def lr_plan(self, setting: SideSetting, side: str, subset: DistilledSet) -> LrPlan:
        return lr_plan(self.policy, setting, side, subset.learned_lr, self.grid, self.split)

    # ------------------------------------------------------------------ training a side

    def run(self, role: str, side: str, subsets: dict[int, DistilledSet], setting: SideSetting,
            seeds: Sequence[int], set_name: str) -> list[TrainedModel]:
        """Train every seed's subset under ``setting`` at the lr the policy gives; one evaluation per seed."""
        cell = self.cell
        common = dict(model=setting.model, augment=setting.augment, preprocess=setting.preprocess)
        results, lrs, sources, label_notes, loss_names = [], {}, {}, set(), set()
        searches = {False: 0, True: 0}
        for seed in seeds:
            subset = subsets[seed]
            name = ("distilled" if side == "syn" else
                    f"random_seed{seed if cell.params['baseline_seed'] is None else cell.params['baseline_seed']}")
            targets, loss, note = self._labels(setting, subset, name)
            label_notes.add(note)
            loss_names.add(hook_name(loss, "ce"))
            plan = self.lr_plan(setting, side, subset)
            lr, chosen = plan.lr, None
            if plan.search:
                lr, reused, chosen = self.search(role, subset, targets, setting, seed, loss, common)
                searches[reused] += 1
                self.searches["reused" if reused else "run"] += 1
            # the search's own model of the chosen lr is tested, not trained again (the same model)
            (evaluation,) = cell.train_eval(role, subset.images, targets, replace(setting.recipe, lr=float(lr)), [seed],
                                            loss=loss, adopt={seed: chosen} if chosen is not None else None, **common)
            results.append(evaluation)
            lrs[seed], sources[seed] = float(lr), plan.source
        self.log_lrs(role, lrs, sources)
        if searches[False] or searches[True]:
            self.log_searches()
        recipe = setting.recipe
        self.rows.append({
            "role": role, "set": set_name, "setting": setting.name, "labels": "; ".join(sorted(label_notes)),
            "loss": ", ".join(sorted(loss_names)), "augment": setting.augment_name, "preprocess": setting.preprocess_name,
            "model": setting.model, "recipe": f"{recipe.optimizer}, {recipe.scheduler}, {recipe.epochs} epochs, "
                                              f"batch {recipe.batch_size}",
            "lr": ", ".join(f"{lrs[s]:g}" for s in seeds), "lr from": "; ".join(sorted(set(sources.values()))),
            "lr search": (f"{self.search_mode}: {searches[False]} run, {searches[True]} reused"
                          if searches[False] or searches[True] else "none"),
        })
        return results

    def search(self, role: str, subset: DistilledSet, targets: torch.Tensor, setting: SideSetting, seed: int,
               loss, common: dict) -> tuple[float, bool, object]:
        """The lr of one seed's search, whether another cell had already searched it, and, when the
        search trained here, its model of that lr (the engine's ``SeedResult``, else None). The search
        is a cached result keyed by everything it trains (not by the method or the cell) and the split's
        content it is scored on (with the cell's definition revision: :meth:`Cell.cached_result`), so the
        random subset of one (dataset, IPC, preset, seed, pool) is searched once per store."""
        from ddlib.protocols.evaluation_runs import fit_digest

        cell = self.cell
        recipe = setting.recipe  # its precision resolved for the cell's device (resolve_sides)
        identity = {
            "kind": "lr_search", "mode": self.search_mode, "grid": self.grid, "seed": seed,
            "train": tensor_digest(subset.images, targets), "scored_on": self.plan.scored_on,
            "model": setting.model, "recipe": {k: v for k, v in recipe.to_dict().items() if k != "lr"},
            "augment": setting.augment_name, "loss": hook_name(loss, "ce"), "preprocess": setting.preprocess_name,
            **({"preprocess_fit": fit_digest(setting.preprocess)} if fit_digest(setting.preprocess) else {}),
        }

        # the full-epoch candidates trained here, in memory; scored on the test set a candidate's evaluation
        # already is the side's (one key), so there is nothing to hold
        hold = self.split != "test"
        held: dict[float, object] = {}

        def trials(lrs: Sequence[float], epochs: int | None = None) -> dict[float, float]:
            r = recipe if epochs is None else replace(recipe, epochs=epochs)
            suffix = "" if epochs is None else f"-e{epochs}"
            done = cell.train_eval(lambda c: f"{role}-lr{c:g}-{self.split}{suffix}", subset.images, targets, r,
                                   [seed] * len(lrs), lrs=list(lrs), eval_split=self.split, loss=loss,
                                   hold_models=hold and epochs is None, **common)
            held.update({float(c): e.trained for c, e in zip(lrs, done) if epochs is None and e.trained is not None})
            return {float(c): e.accuracy for c, e in zip(lrs, done)}

        def compute() -> dict[str, float]:
            if self.search_mode == "halving":
                short, keep = halving_rungs(self.grid, recipe.epochs)
                first = trials(self.grid, short)
                survivors = sorted(first, key=lambda c: (first[c], -c), reverse=True)[:keep]
                scores = trials(survivors)
            else:
                scores = trials(self.grid)
            return {"lr": pick_lr(scores), **{f"score_lr{c:g}": v for c, v in scores.items()}}

        metrics, reused = cell.cached_result(f"{role}-lr_search-s{seed}", identity, compute,
                                             params={"mode": self.search_mode, "seed": seed})
        return float(metrics["lr"]), reused, held.get(float(metrics["lr"]))

    def log_searches(self) -> None:
        """Searches run here and reused from other cells (so far in this cell), on the cell run."""
        tracker, run_id = self.cell.tracker, self.cell.run_id
        tracker.log_metrics(run_id, {"lr_searches_run": self.searches["run"],
                                     "lr_searches_reused": self.searches["reused"]})
        tracker.set_tags(run_id, {"ddlib.lr_search": f"{self.search_mode}: {self.searches['run']} run, "
                                                     f"{self.searches['reused']} reused from other cells"})

    def run_real(self, role: str, recipe: Recipe, seeds: Sequence[int], unless_busy: bool = False) -> list[TrainedModel] | None:
        """The full-data reference: the whole training set (the validation split included, as
        DD-Ranking trains on its ``dst_train``: nothing of this side is chosen on that split, its lr is
        never searched), hard labels, ``recipe``, ZCA-whitened under a ZCA preset (DD-Ranking trains and
        tests its real side on ``get_dataset(use_zca)``'s whitened ``dst_train``: DATM, MTT), augmented
        only as the plan says (:func:`ddlib.protocols.side_plan._real_augment`). Scored on the test set
        like every side.
        ``unless_busy``: None, at once, while another cell trains it (:meth:`Cell.train_eval`)."""
        cell = self.cell
        ds = cell.unsplit if cell.unsplit is not None else cell.dataset
        preprocess, augment = self.plan.real_preprocess, self.plan.real_augment
        results = cell.train_eval(role, ds.train_images, ds.train_labels, recipe, seeds, unless_busy=unless_busy,
                                  preprocess=preprocess, augment=augment)
        if results is None:
            return None
        self.log_lrs(role, {s: recipe.lr for s in seeds}, {s: "real_recipe (never searched)" for s in seeds})
        self.rows.append({"role": role, "set": f"the whole real training set ({len(ds.train_labels)} images, "
                                               "the validation split included)",
                          "setting": "real", "labels": "hard labels", "loss": "ce", "augment": hook_name(augment, "none"),
                          "preprocess": hook_name(preprocess, "none"), "model": self.cell.params["model"],
                          "recipe": f"{recipe.optimizer}, {recipe.scheduler}, {recipe.epochs} epochs, batch {recipe.batch_size}",
                          "lr": f"{recipe.lr:g}", "lr from": "real_recipe (never searched)"})
        return results

    def log_lrs(self, role: str, lrs: dict[int, float], sources: dict[int, str]) -> None:
        tracker, run_id = self.cell.tracker, self.cell.run_id
        tracker.log_per_seed(run_id, [{"seed": s, f"lr_{role}": lr} for s, lr in lrs.items()])
        text = "; ".join(f"seed {s}: {lr:g} ({sources[s]})" for s, lr in lrs.items())
        tracker.set_tags(run_id, {f"ddlib.lr.{role}": text[:4900]})

    # The sides table's rows, in this order whatever order they trained in (LRS trains the shared
    # full-data reference second, or last when another cell trains it); other roles follow as trained.
    SIDE_ORDER = ("syn_hard", "rdm_hard", "real_hard", "syn_any", "rdm_any", "rdm_matched")

    def sides(self) -> pd.DataFrame:
        """What every trained side used: set, labels, loss, augmentation, ZCA, model, recipe, lr and its source."""
        rank = {role: i for i, role in enumerate(self.SIDE_ORDER)}
        rows = sorted(copy.deepcopy(self.rows), key=lambda row: rank.get(row["role"], len(rank)))
        return pd.DataFrame(rows).set_index("role") if rows else pd.DataFrame()
