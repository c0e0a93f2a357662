"""What a cell trains and runs, before it runs: the model of the work that the dry run counts and
times, and the runner's progress line measures a cell's pace against.

:func:`cell_work` lists, for one cell's validated params and data, every model the cell trains
(:class:`Training`: role, how many, images x epochs, batch, architecture, augmentation, what it is
scored on) and every pass that is not a training (:class:`Passes`: attacks, teachers' labels,
membership outputs), from an empty store: the set's selection networks (K-Center, herding,
forgetting, EL2N; DM's iterations), each lr search's candidates, teachers, the full-data reference,
shadow models, the target models of a black-box cell. It follows the protocols' code
(:mod:`ddlib.protocols`); ``tests/test_estimate.py`` checks each protocol's list against what a cell
trains.

:func:`ddlib.run.timing.seconds` turns the work into seconds with this machine's rates. Attack costs
are gradient and forward passes per image (:data:`ATTACK_COST`), measured on digits models (where half
the images survive the first attacks, so AutoAttack's and Square's later queries are many).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace

from ddlib.run.calibrate import Probe, forward_flops

__all__ = ["Data", "Training", "Passes", "cell_work", "data_of", "ATTACK_COST", "shown_stem"]

# What an attack costs per attacked image, as (gradient passes, forward passes, step overheads): each
# pass at the attack's batch, a step overhead what an optimisation step costs beyond its images.
# Measured with torchattacks' defaults as ddlib.attacks registers them on ConvNets trained on digits sets
# (bench/estimate_accuracy.py), where half the images survive the first attacks at 8/255: AutoAttack's
# and Square's later queries go to the survivors (5,000 each), DeepFool works image by image. A model
# that is fooled at once (a CIFAR-10 ConvNet without adversarial training) costs less there.
ATTACK_COST = {"fgsm": (1.5, 1, 0), "pgd": (10, 1, 0), "pgd_l2": (10, 1, 0), "cw": (150, 1, 0),
               "deepfool": (120, 1, 70), "autoattack": (190, 2700, 0), "square": (0, 2700, 0),
               "difgsm": (10, 1, 0), "mifgsm": (10, 1, 0), "tifgsm": (10, 1, 0), "eotpgd": (20, 1, 0),
               "upgd": (10, 1, 0)}
STEPPED = {"pgd", "pgd_l2", "cw", "difgsm", "mifgsm", "tifgsm", "eotpgd", "upgd"}  # cost scales with their steps


@dataclass(frozen=True)
class Data:
    """The sizes a cell's work depends on (its dataset, reduced and split as the cell does)."""

    shape: tuple[int, int, int]
    classes: int
    train: int  # training images after the validation split
    whole: int  # before it (DD-Ranking's full-data reference)
    val: int
    test: int


@dataclass(frozen=True)
class Training:
    """``models`` models of one role, each trained ``epochs`` on ``images`` and scored on ``scored_on``."""

    stem: str  # the role as a cell's trainings tag counts it (ddlib.protocols.cell.role_stem)
    models: int
    images: int
    epochs: int  # epochs the loop runs (dc_step: one more)
    batch_size: int
    probe: Probe
    scored_on: int
    trained: bool = True  # False: tested only (an lr search's model of the chosen lr)
    gradient_passes: float = 1.0  # per image and step: 1, or 1 + steps under adversarial training
    teachers: tuple[Probe, ...] = ()  # relabelling every batch online: one forward per image each
    kept: str = "store"  # where a rerun finds it: store (an evaluation), cache (this machine's), teachers
    recorded: bool = True  # an evaluation run is written for each model
    scale: float = 1.0  # its per-image costs against the probe's (a sampled architecture's FLOPs / the probe's)

    @property
    def image_epochs(self) -> int:
        return self.images * self.epochs if self.trained else 0


@dataclass(frozen=True)
class Passes:
    """Passes through a model that train nothing: ``images`` x (``gradients`` forward + backward, ``forwards`` forward)."""

    what: str
    probe: Probe
    images: int
    gradients: float = 0.0
    forwards: float = 0.0
    steps: int = 0  # optimisation or attack steps (each costs what a training step costs beyond its images)
    recorded: int = 0  # cached results written


def shown_stem(stem: str) -> str:
    """A stem as the dry run lists it: numbered architectures starred (``nas-arch007`` -> ``nas-arch*``)."""
    return re.sub(r"arch\d+", "arch*", stem)


# --------------------------------------------------------------------------- the data


def data_of(params: dict) -> Data:
    """The cell's sizes: its dataset (loaded once per process), reduced and split as :meth:`Cell.open` does."""
    import numpy as np

    from ddlib.data.datasets import load_dataset, reduce_dataset

    ds = reduce_dataset(load_dataset(params["dataset"], params.get("data_root")), params.get("train_per_class"),
                        params.get("test_size"))
    whole, val = len(ds.train_labels), 0
    fraction = params.get("val_fraction")
    if fraction:
        counts = np.bincount(ds.train_labels.numpy(), minlength=ds.num_classes)
        val = sum(int(round(c * fraction)) for c in counts if c)
    return Data(tuple(ds.image_shape), ds.num_classes, whole - val, whole, val, len(ds.test_labels))


# --------------------------------------------------------------------------- shared pieces


class _Builder:
    """One cell's list of work, with what every entry shares (data, device)."""

    def __init__(self, params: dict, data: Data, device):
        self.p, self.data, self.device, self.work = params, data, device, []

    def probe(self, model: str, recipe, augment=None, objective: bool = False, model_kwargs: dict | None = None) -> Probe:
        from ddlib.engine.augment import create_augment
        from ddlib.engine.device import run_precision

        hook = create_augment(augment, mean=(0.5,), std=(0.5,), num_classes=self.data.classes)
        return Probe(model, self.data.shape, self.data.classes, run_precision(recipe, self.device, objective),
                     hook.name if hook is not None else "none", json.dumps(model_kwargs or {}, sort_keys=True),
                     json.dumps(augment, sort_keys=True) if hook is not None else None)

    def train(self, stem: str, models: int, images: int, recipe, probe: Probe, scored_on: int | None = None,
              **more) -> None:
        from ddlib.engine.recipe import epochs_trained

        if models <= 0:
            return
        self.work.append(Training(stem, models, images, epochs_trained(recipe), recipe.batch_size, probe,
                                  self.data.test if scored_on is None else scored_on, **more))

    def set_images(self, p: dict | None = None) -> int:
        """The set's images: ``ipc`` per class, or (method ``full``) the cell's training split."""
        p = p or self.p
        return self.data.train if not p.get("ipc") else int(p["ipc"]) * self.data.classes

    def obtain(self, method: str, source: dict, ipc: int) -> None:
        """The networks a built-in method trains to make its set (cached per machine)."""
        from ddlib.engine.recipe import Recipe

        kind, spec = source.get("kind"), {k: v for k, v in source.items() if k != "kind"}
        fp32 = Recipe(batch_size=256, scheduler="none", precision="fp32")
        feature = "convnet_d4" if min(self.data.shape[1:]) >= 64 else "convnet"
        if kind in ("kcenter", "kcenter_greedy", "herding", "herding_dc") or (kind == "dm" and spec.get("init") == "kcenter"):
            epochs = spec.get("init_epochs" if kind == "dm" else "epochs", 50 if kind == "herding_dc" else 1)
            recipe = replace(fp32, epochs=epochs)
            self.train("selection: feature network", 1, self.data.train, recipe,
                       self.probe(spec.get("model") or feature, recipe), kept="cache", recorded=False)
        elif kind in ("forgetting", "el2n", "aum", "ccs"):
            score = spec.get("score", "aum") if kind == "ccs" else kind  # CCS trains its difficulty score's networks
            recipe = replace(fp32, epochs=spec.get("epochs", 20))
            count = spec.get("num_models", 10) if score == "el2n" else 1
            probe = self.probe(spec.get("model") or feature, recipe)
            self.train(f"selection: {score}", count, self.data.train, recipe, probe, kept="cache", recorded=False)
            if score == "el2n":
                self.work.append(Passes("selection: el2n scores", probe, self.data.train * count, forwards=1))
        if kind == "dm":
            iterations, batch_real = spec.get("iterations", 200), spec.get("batch_real", 64)
            probe = self.probe(spec.get("model", "convnet"), Recipe(precision="fp32"))
            syn = ipc * self.data.classes
            self.work.append(Passes(f"selection: dm ({iterations} iterations)", probe, iterations * syn, gradients=1,
                                    forwards=batch_real * self.data.classes / syn, steps=iterations))


# --------------------------------------------------------------------------- DD-Ranking (label_robust, augmentation_robust)


def _side(b: _Builder, role: str, side: str, setting, images: int, seeds: int, teachers: tuple = ()) -> None:
    """One DD-Ranking side: per seed, the lr search's candidates (scored on the validation split or the
    test set) and the side's model (tested only where the search trained it), as SideTrainer.run does."""
    from ddlib.protocols.preset_eval import halving_rungs, lr_plan

    p = b.p
    plan = lr_plan(p["lr_policy"], setting, side, 1.0 if side == "syn" else None, p["lr_grid"],
                   "val" if p["lr_select"] == "validation" else "test")
    probe = b.probe(setting.model, setting.recipe, setting.augment)
    more = {"teachers": teachers}
    if not plan.search:
        b.train(role, seeds, images, setting.recipe, probe, **more)
        return
    split = "val" if p["lr_select"] == "validation" else "test"
    scored = b.data.val if split == "val" else b.data.test
    grid = len(p["lr_grid"])
    if p.get("lr_search") == "halving":
        short, keep = halving_rungs(p["lr_grid"], setting.recipe.epochs)
        b.train(f"{role}-lr*-{split}-e{short}", seeds * grid, images, replace(setting.recipe, epochs=short), probe,
                scored, **more)
        b.train(f"{role}-lr*-{split}", seeds * keep, images, setting.recipe, probe, scored, **more)
    else:
        b.train(f"{role}-lr*-{split}", seeds * grid, images, setting.recipe, probe, scored, **more)
    if split == "val":  # the chosen lr's model, held by the search, is tested on the test set
        b.train(role, seeds, images, setting.recipe, probe, trained=False, **more)


class _Setting:
    def __init__(self, name, recipe, model, preset, hard, augment, own=False):
        self.name, self.recipe, self.model, self.preset, self.hard, self.augment, self.own = \
            name, recipe, model, preset, hard, augment, own


def _preset_settings(b: _Builder):
    """(preset, hard setting, own setting factory) as :class:`ddlib.protocols.preset_eval.SideTrainer` builds them."""
    from ddlib.engine.recipe import Recipe
    from ddlib.protocols.preset_eval import resolve_preset

    p = b.p
    preset = resolve_preset(p["preset"])

    def from_preset(name, pre, with_augment, own):
        recipe = pre.recipe if p["preset_epochs"] is None else replace(pre.recipe, epochs=p["preset_epochs"])
        return _Setting(name, recipe, p["model"], pre, pre.label_type == "hard", pre.augment if with_augment else None, own)

    if preset is None:
        hard = _Setting("hard", Recipe.from_dict(p.get("recipe") or {}), p["model"], None, True, None)
    else:
        hard = from_preset("hard", preset.hard_label_variant(), True, preset.label_type == "hard")
    return preset, hard, (lambda with_augment=True: from_preset("own" if with_augment else "own, no augmentation",
                                                                 preset, with_augment, True))


def _teachers(b: _Builder, preset) -> tuple:
    """Teachers a soft-label preset needs (trained once per store: experiment ``teachers``), and the
    probes of those that relabel every batch online."""
    from ddlib.protocols.preset_eval import teacher_recipe

    if preset is None or preset.label_type == "hard":
        return ()
    recipe, _ = teacher_recipe(preset, b.p["teacher_recipe"])
    probes = tuple(b.probe(arch, recipe) for arch in preset.teacher_archs())
    if b.p.get("teacher_checkpoints") is None:
        for seed, probe in enumerate(probes):
            b.train(f"teacher {probe.model} (seed {seed})", 1, b.data.train, recipe, probe, kept="teachers")
    if preset.label_type == "stored":  # the random subsets' labels: the teachers' logits, once per subset
        for probe in probes:
            b.work.append(Passes(f"teacher labels ({probe.model})", probe, b.set_images() * len(b.p["seeds"]), forwards=1))
        return ()
    return probes


def _label_robust(b: _Builder) -> None:
    from ddlib.engine.recipe import Recipe

    p, seeds = b.p, len(b.p["seeds"])
    preset, hard, own = _preset_settings(b)
    images = b.set_images()
    online = _teachers(b, preset)
    _side(b, "syn_hard", "syn", hard, images, seeds)
    real = Recipe.from_dict(p["real_recipe"], base=Recipe.from_dict(p["recipe"]))
    b.train("real_hard", seeds, b.data.whole, real, b.probe(p["model"], real))
    if preset is None or preset.label_type == "hard":
        _side(b, "rdm_hard", "rdm", hard, b.data.classes * int(p["ipc"] or 1), seeds)
    else:
        setting = own()
        _side(b, "syn_any", "syn", setting, images, seeds, online)
        _side(b, "rdm_any", "rdm", setting, b.data.classes * int(p["ipc"] or 1), seeds, online)


def _augmentation_robust(b: _Builder) -> None:
    p, seeds = b.p, len(b.p["seeds"])
    preset, _, own = _preset_settings(b)
    online = _teachers(b, preset)
    for variant, with_augment in (("aug", True), ("noaug", False)):
        setting = own(with_augment)
        _side(b, f"syn_{variant}", "syn", setting, b.set_images(), seeds, online)
        _side(b, f"rdm_{variant}", "rdm", setting, b.data.classes * int(p["ipc"] or 1), seeds, online)


def _label_regimes(b: _Builder) -> None:
    """As :func:`ddlib.protocols.label_regimes.evaluate` trains: the teachers once (where a regime needs them),
    their labels of every set once under ``sl``, and per applicable regime both sets at every seed, one recipe."""
    from ddlib.engine.recipe import Recipe

    p, seeds = b.p, len(b.p["seeds"])
    archs = [] if p["teacher"] is None else [p["teacher"]] if isinstance(p["teacher"], str) else list(p["teacher"])
    regimes = [r for r in p["regimes"] if r == "hl" or archs]  # the others do not apply: nothing trains
    teacher_recipe = Recipe.from_dict(p["teacher_recipe"])
    teachers = tuple(b.probe(arch, teacher_recipe) for arch in archs) if set(regimes) - {"hl"} else ()
    if p.get("teacher_checkpoints") is None:
        for seed, probe in enumerate(teachers):
            b.train(f"teacher {probe.model} (seed {seed})", 1, b.data.train, teacher_recipe, probe, kept="teachers")
    recipe, images = Recipe.from_dict(p["recipe"]), b.set_images()
    student = b.probe(p["model"], recipe, p["augment"])
    for regime in regimes:
        if regime == "sl":  # the set's and every random subset's labels, once each
            for probe in teachers:
                b.work.append(Passes(f"teacher labels ({probe.model})", probe, images * (1 + seeds), forwards=1))
        for side in ("syn", "rdm"):
            b.train(f"{side}_{regime}", seeds, images, recipe, student, teachers=teachers if regime == "sl_kd" else ())


# --------------------------------------------------------------------------- BEARD (adversarial, blackbox)


def _attack(what: str, spec, probe: Probe, images: int, batch: int, seeds: int) -> Passes:
    """One attack on ``images`` test images of each seed's model (:data:`ATTACK_COST`, scaled by its
    ``steps`` where it gives them)."""
    gradients, forwards, per_image = ATTACK_COST.get(spec.name, (10, 1, 0))
    default, steps = spec.entry.defaults.get("steps"), spec.params.get("steps")
    if spec.name in STEPPED and default and steps:
        gradients *= steps / default
    step_overheads = images * per_image + math.ceil(images / batch) * gradients
    return Passes(what, probe, images * seeds, gradients=gradients, forwards=forwards,
                  steps=round(step_overheads) * seeds, recorded=seeds)


def _beard_models(b: _Builder, p: dict, data_images: int | None = None) -> Probe | None:
    """The adversarial protocol's models of ``p`` (one per seed), as train_models trains them; None for a checkpoint."""
    from ddlib.engine.adversarial_training import create_objective
    from ddlib.protocols.adversarial import BEARD_RECIPE
    from ddlib.protocols.common import check_recipe

    if p["source"]["kind"] == "checkpoint":
        return b.probe(p["model"], BEARD_RECIPE)
    recipe = check_recipe(p, "recipe", base=BEARD_RECIPE)
    named = dict(p["recipe"] or {})
    full = p["source"].get("kind") == "full"
    if full:
        recipe = check_recipe(p, "real_recipe", base=recipe)
        named.update(p["real_recipe"] or {})
    if "precision" not in named:
        recipe = replace(recipe, precision="fp32")
    _, name = create_objective(p["training"], mean=(0.5,), std=(0.5,), num_classes=b.data.classes)
    found = re.search(r"steps=(\d+)", name)
    steps = int(found.group(1)) if found else 0  # each training step crafts its batch in this many gradient passes
    images = data_images if data_images is not None else b.set_images(p)
    if p["number_sign"] and not full:
        images *= 4
    b.obtain(p["method"], p["source"], int(p["ipc"] or 1))
    probe = b.probe(p["model"], recipe, p["augment"], objective=steps > 0)
    b.train("model", len(p["seeds"]), images, recipe, probe, gradient_passes=1 + steps)
    return probe


def _attacked(p: dict, data: Data) -> int:
    return data.test if p["attack_size"] is None else min(p["attack_size"], data.test)


def _adversarial(b: _Builder) -> None:
    from ddlib.attacks import parse_attacks, targeted_skip_reason
    from ddlib.attacks.curves import parse_curve

    p, seeds = b.p, len(b.p["seeds"])
    probe = _beard_models(b, p)
    n = _attacked(p, b.data)
    targeted = p["mode"] == "targeted"
    attacks = [a for a in parse_attacks(p["attacks"]) if not (targeted and targeted_skip_reason(a))]
    points = [pt.spec for pt in parse_curve(p["eps_curve"], targeted) if pt.spec is not None]
    for spec in [*attacks, *points]:
        b.work.append(_attack(f"attack {spec.name}", spec, probe, n, p["attack_batch_size"], seeds))
    b.work.append(Passes("clean passes", probe, n * seeds, forwards=1))


def _blackbox(b: _Builder) -> None:
    from ddlib.attacks import parse_attacks, targeted_skip_reason
    from ddlib.protocols import adversarial
    from ddlib.protocols.blackbox import target_label

    p, seeds = b.p, len(b.p["seeds"])
    shared = {k: v for k, v in p.items() if k in adversarial.PARAMS}
    probe = _beard_models(b, adversarial.validate(shared))
    targets = []
    for entry in p["target_models"]:
        if target_label(entry, p) == p["method"]:
            targets.append(probe)
            continue
        raw = {**shared, "method": entry["method"], "source": entry["source"], "model": entry["model"],
               "ipc": entry["ipc"] or 1}
        targets.append(_beard_models(b, adversarial.validate(raw)))
    n = _attacked(p, b.data)
    targeted = p["mode"] == "targeted"
    for spec in parse_attacks(p["attacks"]):
        if targeted and targeted_skip_reason(spec):
            continue
        b.work.append(_attack(f"attack {spec.name} (crafted)", spec, probe, n, p["attack_batch_size"], seeds))
        for target in targets:
            b.work.append(Passes(f"attack {spec.name} on a target", target, n * seeds, forwards=2))


# --------------------------------------------------------------------------- DC-Bench and privacy


def _augmentation(b: _Builder) -> None:
    from ddlib.protocols.dcbench import augment_label, setting_recipe

    p = b.p
    for spec in (None if a == "none" else a for a in p["augmentations"]):
        recipe = setting_recipe(p, spec)
        b.train(f"syn-{augment_label(spec)}", len(p["seeds"]), b.set_images(), recipe, b.probe(p["model"], recipe, spec))


def _transfer(b: _Builder) -> None:
    from ddlib.engine.recipe import Recipe
    from ddlib.protocols.dcbench import setting_recipe

    p = b.p
    base = setting_recipe(p, p["augment"])
    for model in p["models"]:
        recipe = Recipe.from_dict(p["model_recipes"].get(model, {}), base=base)
        b.train(f"syn-{model}", len(p["seeds"]), b.set_images(), recipe, b.probe(model, recipe, p["augment"]))


def _compression(b: _Builder) -> None:
    from ddlib.protocols.dcbench import setting_recipe

    p = b.p
    recipe = setting_recipe(p, p["augment"])
    b.train("syn-set", len(p["seeds"]), b.set_images(), recipe, b.probe(p["model"], recipe, p["augment"]))
    if p["full_data"]:
        real = setting_recipe(p, p["augment"], full=True)
        b.train("real-full", len(p["seeds"]), b.data.whole, real, b.probe(p["model"], real, p["augment"]))


def _privacy(b: _Builder) -> None:
    from ddlib.protocols.common import FULL_IPC
    from ddlib.protocols.dcbench import setting_recipe

    p, seeds, d = b.p, len(b.p["seeds"]), b.data
    recipe, real = setting_recipe(p, p["augment"], full=False), setting_recipe(p, p["augment"], full=True)
    small, large = b.probe(p["model"], recipe, p["augment"]), b.probe(p["model"], real, p["augment"])
    whole = p["ipc"] == FULL_IPC
    members = min(p["members"], d.whole // 2, d.test // 2)
    b.train("real" if whole else "syn", seeds, b.set_images(), real if whole else recipe, large if whole else small)
    if not whole:
        b.train("rdm", seeds, d.classes * p["ipc"], recipe, small)
        b.train("shadow_ipc", seeds, d.classes * p["ipc"], recipe, small)
    if p["full_data"] or whole:
        if not whole:
            b.train("real", seeds, d.whole, real, large)
        b.train("shadow_full", seeds, d.whole - members, real, large)
    outputs = seeds * ((3 if not whole else 1) * 2 * members + (2 if not whole else 0) * (d.test - members) * 2)
    b.work.append(Passes("membership outputs", small, outputs, forwards=1))


def _nas(b: _Builder) -> None:
    from ddlib.models.nasbench201 import OP_NAMES
    from ddlib.protocols import nas_space
    from ddlib.protocols.nas import CELL_AFFINE, MODEL, PROXY_RECIPE
    from ddlib.protocols.dcbench import setting_recipe

    p = b.p
    recipe = setting_recipe(p, p["augment"], base=PROXY_RECIPE)
    archs = nas_space.sample_ground_truth(p["ground_truth"], p["num_archs"], p["arch_seed"], column=p["gt_column"],
                                          dataset=None if p["gt_column"] else p["dataset"], sampling=p["sampling"])
    # one probe for every architecture (a hundred would take minutes to time): the densest cell, each
    # architecture's per-image costs scaled by its FLOPs. Every cell of a network repeats the one cell
    # string and every edge of a cell maps the same shape, so a network's FLOPs are a base plus one
    # term per edge's operation: counted on the five one-operation cells, not per architecture.
    common = {"C": p["C"], "N": p["N"], "cell_affine": CELL_AFFINE}
    probe = b.probe(MODEL, recipe, p["augment"], model_kwargs={"arch": _uniform("nor_conv_3x3"), **common})
    uniform = {op: forward_flops(replace(probe, model_kwargs=json.dumps({"arch": _uniform(op), **common}, sort_keys=True)))
               for op in OP_NAMES}
    base = uniform.get("none", float("nan"))
    per_edge = {op: (f - base) / 6 for op, f in uniform.items()}
    dense = uniform.get("nor_conv_3x3", float("nan"))
    for i, arch in enumerate(archs["arch"]):
        flops = base + sum(per_edge.get(op, float("nan")) for op in re.findall(r"([a-z_0-9x]+)~\d", arch))
        b.train(f"nas-arch{i:03d}", len(p["seeds"]), b.set_images(), recipe, probe, b.data.val,
                scale=flops / dense if dense > 0 and flops == flops else 1.0)


def _uniform(op: str) -> str:
    """The NAS-Bench-201 cell string with ``op`` on all six edges."""
    return f"|{op}~0|+|{op}~0|{op}~1|+|{op}~0|{op}~1|{op}~2|"


PROTOCOL_WORK = {"label_robust": _label_robust, "augmentation_robust": _augmentation_robust,
                 "label_regimes": _label_regimes,
                 "adversarial": _adversarial, "blackbox": _blackbox, "augmentation": _augmentation,
                 "transfer": _transfer, "compression": _compression, "privacy": _privacy, "nas": _nas}


def cell_work(protocol: str, params: dict, data: Data | None = None, device=None) -> list[Training | Passes]:
    """Everything a cell of ``protocol`` with these (validated) ``params`` trains and runs on an empty
    store: its set's selection networks first, then the protocol's models and passes."""
    from ddlib.engine.device import resolve_device

    device = device if device is not None else resolve_device(params.get("device", "auto"))
    b = _Builder(params, data or data_of(params), device)
    if protocol not in ("adversarial", "blackbox") and "source" in params:  # those obtain with their models
        b.obtain(params.get("method", ""), params["source"], int(params.get("ipc") or 1))
    if protocol not in PROTOCOL_WORK:
        raise ValueError(f"no model of the work of protocol {protocol!r}; known: {sorted(PROTOCOL_WORK)}")
    PROTOCOL_WORK[protocol](b)
    return b.work
