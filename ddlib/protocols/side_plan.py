"""A DD-Ranking cell's evaluation, resolved and checked once when the cell opens: the preset, each
side's setting (recipe, student, augmentation, ZCA, labels and loss), the teachers, the lr policy.

:func:`resolve_sides` builds a :class:`SidesPlan` in the protocols' ``open_cell``; their ``evaluate``
(through :class:`ddlib.protocols.preset_eval.SideTrainer`) only trains, tests and scores what it says.
Imports the presets, the engine's hooks and the cell (for its data and its ZCA fit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ddlib.engine.device import run_precision
from ddlib.engine.recipe import Recipe
from ddlib.engine.train import hook_name
from ddlib.protocols.cell import Cell
from ddlib.protocols.presets import BATCH_AUGMENT_OPS, Preset, load_preset

__all__ = ["SideLabels", "SideSetting", "TeacherPlan", "SidesPlan", "resolve_preset", "teacher_recipe",
           "preset_augment", "resolve_sides"]


def resolve_preset(spec) -> Preset | None:
    """``None`` (hard labels only), a preset name (``params/methods/<name>.yaml``) or a path."""
    if spec is None:
        return None
    return load_preset(spec)


def teacher_recipe(preset: Preset | None, grid: dict) -> tuple[Recipe, str]:
    """How the teachers train: the preset's ``labels.teacher.recipe`` overrides, then the grid's
    ``teacher_recipe`` overrides over those (the grid wins for every key it names), on the Recipe
    defaults (DC's recipe). Returns the recipe and a note saying where each overridden key came from."""
    own = dict((preset.teacher or {}).get("recipe") or {}) if preset is not None else {}
    recipe = Recipe.from_dict({**own, **grid})
    where = [f"{k}={v} (grid teacher_recipe{', over the preset' if k in own else ''})" for k, v in grid.items()]
    where += [f"{k}={v} (preset {preset.name} labels.teacher.recipe)" for k, v in own.items() if k not in grid]
    return recipe, "; ".join(where) + ("; " if where else "") + "every other key: the Recipe defaults (DC's recipe)"


def preset_augment(preset: Preset, with_augment: bool, mean, std, num_classes: int):
    """The augmentation hook a preset trains with (None without). Under online relabelling the
    label-mixing ops leave the targets alone (:func:`ddlib.engine.labels.teacher_augment`): the
    teachers label the mixed images, and ``mse_ce``'s CE term sees the images' own labels, as in
    DD-Ranking's ``train_one_epoch``."""
    from ddlib.engine.augment import create_augment
    from ddlib.engine.labels import teacher_augment

    augment = create_augment(preset.augment if with_augment else [], mean=mean, std=std, num_classes=num_classes)
    return teacher_augment(augment) if preset.label_type == "teacher" else augment


@dataclass(frozen=True)
class SideLabels:
    """What a side's images are labelled with: ``hard`` labels with cross-entropy; ``stored`` soft
    labels (shipped with the set, else its teachers' logits, computed once) trained with ``loss`` at
    ``temperature``; or ``teacher`` labels (every augmented batch relabelled online)."""

    kind: str  # hard | stored | teacher
    loss_spec: dict | None = field(default=None, compare=False)  # the preset's loss (the teachers' relabelling)
    loss: object = field(default=None, repr=False)  # stored: the loss hook on stored targets
    temperature: float = 1.0
    teacher_archs: tuple[str, ...] = ()


@dataclass(frozen=True)
class SideSetting:
    """How a DD-Ranking side is trained and tested: everything but the images and the lr."""

    name: str  # "hard", "own", "own, no augmentation"
    recipe: Recipe
    model: str
    preset: Preset | None  # its labels, unless ``hard``
    hard: bool  # hard labels with cross-entropy
    augment: object = field(default=None, repr=False)  # hooks carry their canonical names (hook_name)
    preprocess: torch.nn.Module | None = field(default=None, repr=False)
    own: bool = False  # the method's own evaluation (where a learned lr applies)
    labels: SideLabels = SideLabels("hard")

    @property
    def augment_name(self) -> str:
        return hook_name(self.augment, "none")

    @property
    def preprocess_name(self) -> str:
        return hook_name(self.preprocess, "none")


@dataclass(frozen=True)
class TeacherPlan:
    """How the preset's teachers train (:func:`teacher_recipe`; ``note``: where each key came from), or
    the user's own ``checkpoints`` (one per ensemble member)."""

    recipe: Recipe
    note: str
    checkpoints: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SidesPlan:
    """A DD-Ranking cell's evaluation: the preset, the settings of its sides, the teachers and the
    learning-rate policy (:mod:`ddlib.protocols.preset_eval`)."""

    preset: Preset | None
    model: str
    policy: str  # lr_policy
    split: str  # where an lr search is scored: val | test
    grid: tuple[float, ...]
    search_mode: str  # lr_search: full | halving
    baseline_seed: int | None
    teacher: TeacherPlan
    hard: SideSetting | None  # hard labels (HLR, the hard-label IOR); None: neither a preset nor a recipe
    own: SideSetting | None  # the preset as the method evaluates (None without a preset)
    own_without_augment: SideSetting | None  # ... less its augmentation (ARS)
    real_preprocess: object = field(default=None, repr=False)  # the full-data reference's (ZCA under a ZCA preset)
    real_augment: object = field(default=None, repr=False)  # ... and its augmentation
    real_recipe: Recipe | None = None  # the full-data reference's recipe (LRS)
    scored_on: dict | None = None  # what an lr search is scored against (Cell.scored_on); None: nothing is searched

    @property
    def hard_only(self) -> bool:
        """No preset, or a hard-label one: the method's own evaluation *is* the hard-label side."""
        return self.preset is None or self.preset.label_type == "hard"


def side_labels(preset: Preset | None) -> SideLabels:
    """A preset's labels, resolved: the loss hook built and checked once."""
    if preset is None or preset.label_type == "hard":
        return SideLabels("hard")
    if preset.label_type == "teacher":
        return SideLabels("teacher", preset.loss, teacher_archs=tuple(preset.teacher_archs()))
    from ddlib.engine.labels import create_loss

    return SideLabels("stored", preset.loss, create_loss(preset.loss)[0].stored(),
                      preset.loss.get("temperature", 1.0), tuple(preset.teacher_archs()))


def _real_augment(preset: Preset | None, ds):
    """The full-data reference's augmentation: none, but under a soft-label preset that says
    ``use_aug_for_hard: true`` (DATM) its batch-level ops, as DD-Ranking's soft-label evaluator
    trains every hard-label model, the real one included, with its ``data_aug_func`` there (its
    hard-label evaluator never augments the real side)."""
    if preset is None or preset.label_type == "hard" or not preset.use_aug_for_hard:
        return None
    ops = [op for op in preset.augment if (op if isinstance(op, str) else next(iter(op))) in BATCH_AUGMENT_OPS]
    return preset_augment(replace(preset.hard_label_variant(), augment=ops), True, ds.mean, ds.std, ds.num_classes)


def resolve_sides(cell: Cell, recipe: Recipe | None = None, real_recipe: Recipe | None = None) -> SidesPlan:
    """The cell's :class:`SidesPlan` from its (validated) params: the preset loaded and checked, every
    side's hooks built, the ZCA fitted where the preset whitens, every recipe's precision resolved for
    the cell's device, the teachers' recipe settled; the lr policy tagged on the cell run. ``recipe``:
    the hard-label recipe without a preset (LRS's grid recipe); ``real_recipe``: the full-data reference's."""
    p, ds = cell.params, cell.dataset
    preset = resolve_preset(p["preset"])
    zca = cell.zca() if preset is not None and preset.zca else None  # the dataset's one whitening

    def on_device(r: Recipe | None) -> Recipe | None:  # "auto" precision is bf16 on some devices, fp32 on others
        return replace(r, precision=run_precision(r, cell.device)) if r is not None else None

    def from_preset(name: str, pre: Preset, with_augment: bool, own: bool) -> SideSetting:
        r = pre.recipe if p["preset_epochs"] is None else replace(pre.recipe, epochs=p["preset_epochs"])
        return SideSetting(name, on_device(r), p["model"], pre, pre.label_type == "hard",
                           preset_augment(pre, with_augment, ds.mean, ds.std, ds.num_classes),
                           zca if pre.zca else None, own, side_labels(pre))

    if preset is None:
        hard = SideSetting("hard", on_device(recipe), p["model"], None, True) if recipe is not None else None
        own = own_without_augment = None
    else:
        hard = from_preset("hard", preset.hard_label_variant(), True, own=preset.label_type == "hard")
        own = from_preset("own", preset, True, own=True)
        own_without_augment = from_preset("own, no augmentation", preset, False, own=True)
    checkpoints = p["teacher_checkpoints"]
    archs = preset.teacher_archs() if preset is not None and preset.label_type != "hard" else None
    if checkpoints is not None and archs is not None and len(checkpoints) != len(archs):
        raise ValueError(f"teacher_checkpoints: the preset has {len(archs)} teacher(s) {archs}, "
                         f"but {len(checkpoints)} checkpoint(s) were given")
    teacher = TeacherPlan(*teacher_recipe(preset, p["teacher_recipe"]),
                          tuple(checkpoints) if checkpoints is not None else None)
    split = "val" if p["lr_select"] == "validation" else "test"
    plan = SidesPlan(preset, p["model"], p["lr_policy"], split, tuple(float(v) for v in p["lr_grid"]),
                     p.get("lr_search", "full"), p["baseline_seed"], teacher, hard, own, own_without_augment,
                     real_preprocess=zca, real_augment=_real_augment(preset, ds), real_recipe=on_device(real_recipe),
                     scored_on=cell.scored_on(split) if p["lr_policy"] != "fixed" else None)
    cell.tracker.set_tags(cell.run_id, {"ddlib.lr_policy": plan.policy + (
        f"; searches scored on the {'validation split' if split == 'val' else 'TEST set, as the peer does'}"
        if plan.policy != "fixed" else "")})
    if plan.policy != "fixed":
        cell.tracker.set_tags(cell.run_id, {"ddlib.lr_search": plan.search_mode})
    return plan
