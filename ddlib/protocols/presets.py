"""Method presets: the evaluation setting each dataset-distillation method published.

One YAML file per method in ``params/methods/`` (``dc``, ``dsa``, ``dm``, ``mtt``, ``datadam``,
``datm``, ``sre2l``, ``rded``, ``cda``, ``dwa``, ``d4m``, ``edc``, ``gvbsm``). The fields that
DD-Ranking's configuration table covers (Li et al., arXiv 2505.13300: epochs, batch size,
optimizer, scheduler, label type, loss, single/ensemble teacher, DSA, ZCA, RandomResizedCrop range,
PatchShuffle, CutMix) follow that table; every other value (lr, weight decay, KL temperature,
teacher architecture, ...) is the method's own published setting, cited in a YAML comment.

Schema (every level is strict: an unknown key is a ``ValueError`` naming the file and the key)::

    method: SRe2L                       # display name
    citation: "Yin, Xing & Shen, NeurIPS 2023, ..."
    recipe: {epochs: 300, batch_size: 1024, optimizer: adamw, lr: 0.001, momentum: 0.9,
             weight_decay: 0.01, scheduler: cosine}      # ddlib.engine.train.Recipe keys only
    labels:
      type: teacher                     # hard | stored | teacher
      loss: {name: kl, temperature: 20.0, t_squared: false}
      teacher: {arch: resnet18_bn, count: 1}             # only (and always) for type teacher
    augment:                            # ops applied in order; [] / none / null = no augmentation
      - random_resized_crop: {scale: [0.08, 1.0]}
      - flip: {p: 0.5}
      - cutmix: {alpha: 1.0, p: 1.0}
    zca: false                          # ZCA whitening (kornia's, eps 0.1) in place of normalisation (see below)
    model: resnet18_bn                  # the student the method evaluates with (optional; grid's model wins)
    learned_lr: false                   # train the distilled set at the lr it ships (MTT, DATM)
    use_aug_for_hard: false             # hard-label side without the batch-level ops (DSA, CutMix, Mixup)

``recipe`` must give the seven training keys (``epochs``, ``batch_size``, ``optimizer``, ``lr``,
``momentum``, ``weight_decay``, ``scheduler``); ``eval_batch_size`` is optional. ``momentum`` is
only used by SGD (AdamW keeps PyTorch's betas 0.9 / 0.999).

``labels.type``:

* ``hard``: the set's int labels, loss ``ce`` (no parameters).
* ``stored``: soft labels shipped with the set (DATM's learned labels), any loss. ``labels.teacher``
  is required: it labels every set that ships none (the random subset: DD-Ranking's
  ``soft_label_mode: S`` runs its teacher once over the random images and keeps the logits).
* ``teacher``: every augmented batch is relabelled online by pretrained teachers.

``labels.loss``: ``{name: ce}``; ``{name: kl, temperature, t_squared}``; ``{name: sce,
temperature}``; ``{name: mse_ce, mse_weight, ce_weight}`` (the names and parameters of
:func:`ddlib.engine.labels.create_loss`; presets give every parameter explicitly, ``t_squared`` included).

``labels.teacher``: ``arch`` is a registry name (``ddlib.models.list_models()``) or a list of them,
one per ensemble member; ``count`` is the number of teachers (with a list it must equal the list's
length and may be left out; with a string, ``count > 1`` means that many teachers of that
architecture trained with different seeds). Ensembles are averaged in logit space. An optional
``recipe`` (Recipe keys) overrides how the teachers are trained. :meth:`Preset.teacher_archs`
gives the member architectures as a list either way.

``augment`` ops: any op of the one augmentation registry (:func:`ddlib.engine.augment.list_ops`: ``dsa``,
``mixup``, ``cutmix``, ``random_resized_crop``, ``flip``, ``patch_shuffle``, ``autoaugment``,
``randaugment``, ``imagenet_aug``, ``torchvision`` and ``none``), with its parameters. ZCA is not an
augmentation op: use the top-level ``zca`` flag, which whitens as MTT, DATM and DD-Ranking do
(kornia's ``ZCAWhitening(eps=0.1)`` fitted on the whole real training set's [0, 1] pixels, applied
to training and test images in place of the mean/std normalisation, so the ops run on whitened
batches; the ops that work on normalised pixels are refused with it). When :func:`ddlib.engine.augment.create_augment` is
importable, every preset's ``augment`` is also built with it at load time.

``model``: the student architecture the method reports its accuracy with (DD-Ranking evaluates
"with the model architecture reported in the paper", e.g. ResNet-18-BN for SRe2L); a protocol uses
it unless the grid names a ``model``.

``use_aug_for_hard`` (default ``true``; DD-Ranking's config key of that name): whether the hard-label
side trains with the preset's batch-level augmentation (DD-Ranking's ``data_aug_func``: ``dsa``,
``cutmix``, ``mixup``). Its configs say ``true`` for DATM, ``false`` for SRe2L, RDED, DWA, D4M and
G-VBSM, whose hard side keeps only the per-image transforms (``custom_train_trans``: crops, flips,
PatchShuffle). Its hard-label evaluator (DC, DSA, DM, MTT) has no such key: it applies the config's
``data_aug_func`` to the distilled and random sides (never to the full-data reference), which is
``dsa`` for DSA, DM and MTT and ``null`` for DC (its DC/CIFAR10/IPC{1,10,50} configs): DC's preset
has no augmentation, on either side.

``learned_lr``: ``true`` where the method learns the evaluation lr with the images and ships it
(MTT's ``lr_best.pt``, DATM's ``lr.pt``): the distilled set's own evaluation then trains at that lr,
unsearched (DD-Ranking's ``compute_metrics(syn_lr=...)``). Whether other learning rates are searched
is not a preset's choice but the protocol's ``lr_policy`` (:mod:`ddlib.protocols.preset_eval`); the
key ``lr_search`` of earlier presets is refused with a message saying so.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ddlib.engine.augment import list_ops, op_params
from ddlib.engine.labels import LOSSES
from ddlib.engine.recipe import Recipe
from ddlib.specs.registry import parse_number
from ddlib.store.paths import project_folder
from ddlib.specs.yamlfile import load_yaml

__all__ = [
    "PRESETS_DIR",
    "preset_file",
    "Preset",
    "list_presets",
    "load_preset",
    "parse_preset",
    "LABEL_TYPES",
    "LOSS_PARAMS",
    "AUGMENT_OPS",
    "BATCH_AUGMENT_OPS",
]

PRESETS_DIR = project_folder("params/methods")  # in a wheel: ddlib/_files/presets

LABEL_TYPES = ("hard", "stored", "teacher")

# loss name -> its parameters, all required in a preset (the registry of ddlib.engine.labels.create_loss)
LOSS_PARAMS: dict[str, tuple[str, ...]] = {name: tuple(LOSSES.params(name)) for name in LOSSES}

# augmentation op -> its parameters (all optional here; ddlib.engine.augment gives the defaults)
AUGMENT_OPS: dict[str, tuple[str, ...]] = {name: op_params(name) for name in list_ops()}

_TOP_REQUIRED = ("method", "citation", "recipe", "labels")
_TOP_OPTIONAL = ("augment", "zca", "model", "learned_lr", "use_aug_for_hard")
# DD-Ranking's data_aug_func: batch-level ops, which use_aug_for_hard: false leaves out of the hard side
BATCH_AUGMENT_OPS = ("dsa", "cutmix", "mixup")
_RECIPE_REQUIRED = ("epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "scheduler")
_LABEL_KEYS = ("type", "loss", "teacher")
_TEACHER_KEYS = ("arch", "count", "recipe")


def list_presets() -> list[str]:
    """Names of the presets in :data:`PRESETS_DIR` (file stems, sorted)."""
    if not PRESETS_DIR.is_dir():
        return []
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class Preset:
    """A validated method preset (see the module docstring for the schema).

    ``labels`` and ``augment`` are normalised plain data (``augment`` is always a list, ``labels``
    always holds ``type`` and ``loss``, plus ``teacher`` with ``arch`` and ``count`` for type
    ``teacher``); treat them as read-only: :meth:`to_dict` and the variants return copies.
    """

    name: str
    method: str
    citation: str
    recipe: Recipe
    labels: dict = field(hash=False)
    augment: list = field(hash=False)
    zca: bool = False
    model: str | None = None  # the student the method evaluates with (None: the protocol's default)
    learned_lr: bool = False  # the distilled set trains at the lr it ships (MTT, DATM)
    use_aug_for_hard: bool = True  # the hard-label side keeps the batch-level augmentation (DD-Ranking's key)
    source: Path | None = None

    # ------------------------------------------------------------------ accessors

    @property
    def label_type(self) -> str:
        return self.labels["type"]

    @property
    def loss(self) -> dict:
        """The loss spec (``{"name": ..., params}``), a copy: ready for ``ddlib.engine.labels.create_loss``."""
        return copy.deepcopy(self.labels["loss"])

    @property
    def teacher(self) -> dict | None:
        """The teacher spec (a copy), or ``None`` unless the labels come from teachers."""
        teacher = self.labels.get("teacher")
        return copy.deepcopy(teacher) if teacher is not None else None

    def teacher_archs(self) -> list[str]:
        """One architecture name per teacher (``[]`` without teachers)."""
        teacher = self.labels.get("teacher")
        if teacher is None:
            return []
        arch = teacher["arch"]
        return list(arch) if isinstance(arch, list) else [arch] * teacher["count"]

    def teacher_recipe(self, base: Recipe | None = None) -> Recipe | None:
        """The teacher's recipe overrides applied to ``base`` (``None`` if the preset gives none)."""
        teacher = self.labels.get("teacher") or {}
        overrides = teacher.get("recipe")
        if overrides is None:
            return None
        return Recipe.from_dict(overrides, base=base)

    # ------------------------------------------------------------------ serialisation and variants

    def to_dict(self) -> dict:
        """Plain data for logging (MLflow params / a YAML dump): every field, the recipe expanded."""
        return {
            "name": self.name,
            "method": self.method,
            "citation": self.citation,
            "recipe": self.recipe.to_dict(),
            "labels": copy.deepcopy(self.labels),
            "augment": copy.deepcopy(self.augment),
            "zca": self.zca,
            "model": self.model,
            "learned_lr": self.learned_lr,
            "use_aug_for_hard": self.use_aug_for_hard,
            "source": str(self.source) if self.source is not None else None,
        }

    def hard_label_variant(self) -> "Preset":
        """The same preset trained on the set's hard labels with cross-entropy (the hard-label side
        of the Label-Robust Score); recipe, ZCA, model and learned lr are unchanged, and so is the
        augmentation, except the batch-level ops (:data:`BATCH_AUGMENT_OPS`) where
        ``use_aug_for_hard`` is false."""
        augment = [op for op in self.augment if self.use_aug_for_hard or _op_name(op) not in BATCH_AUGMENT_OPS]
        return replace(self, labels={"type": "hard", "loss": {"name": "ce"}}, augment=copy.deepcopy(augment))

    def without_augment(self) -> "Preset":
        """The same preset with no augmentation (the Augmentation-Robust Score's other side). ZCA is
        preprocessing, not augmentation, and stays as it is."""
        return replace(self, labels=copy.deepcopy(self.labels), augment=[])


def _op_name(op) -> str:
    return op if isinstance(op, str) else next(iter(op))


# ---------------------------------------------------------------------- loading and validation


class _Checker:
    """Builds ``ValueError`` messages that name the file and the key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, message: str):
        raise ValueError(f"{self.source}: {key}: {message}")

    def mapping(self, value: Any, key: str) -> Mapping:
        if not isinstance(value, Mapping):
            self.fail(key, f"must be a mapping, got {value!r}")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            self.fail(key, f"keys must be strings, got {bad!r}")
        return value

    def keys(self, value: Mapping, key: str, required: tuple[str, ...], optional: tuple[str, ...] = ()):
        known = set(required) | set(optional)
        unknown = sorted(set(value) - known)
        if unknown:
            where = f"{key}." if key else ""
            self.fail(f"{where}{unknown[0]}", f"unknown key(s) {[where + k for k in unknown]}; known: {sorted(known)}")
        missing = [k for k in required if k not in value]
        if missing:
            where = f"{key}." if key else ""
            self.fail(f"{where}{missing[0]}", f"missing required key(s) {[where + k for k in missing]}")

    def text(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(key, f"must be a non-empty string, got {value!r}")
        return value.strip()

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {value!r}")
        return value

    def number(self, value: Any, key: str, *, positive: bool = False) -> float:
        try:
            number = parse_number(value)  # YAML reads 1e-3 as a string
        except ValueError:
            self.fail(key, f"must be a number, got {value!r}")
        if number < 0 or (positive and number == 0):
            self.fail(key, f"must be a {'positive' if positive else 'non-negative'} number, got {value!r}")
        return number

    def recipe(self, value: Any, key: str, *, required: tuple[str, ...]) -> Recipe:
        value = self.mapping(value, key)
        known = {f for f in Recipe.__dataclass_fields__}
        self.keys(value, key, required, tuple(sorted(known - set(required))))
        try:
            return Recipe.from_dict(dict(value))
        except (ValueError, TypeError) as error:
            self.fail(key, str(error))


def _check_labels(chk: _Checker, value: Any) -> dict:
    labels = chk.mapping(value, "labels")
    chk.keys(labels, "labels", ("type", "loss"), ("teacher",))
    kind = labels["type"]
    if kind not in LABEL_TYPES:
        chk.fail("labels.type", f"must be one of {list(LABEL_TYPES)}, got {kind!r}")

    loss = chk.mapping(labels["loss"], "labels.loss")
    if "name" not in loss:
        chk.fail("labels.loss.name", f"missing; one of {sorted(LOSS_PARAMS)}")
    name = loss["name"]
    if name not in LOSS_PARAMS:
        chk.fail("labels.loss.name", f"must be one of {sorted(LOSS_PARAMS)}, got {name!r}")
    chk.keys(loss, "labels.loss", ("name",) + LOSS_PARAMS[name])
    loss_out: dict[str, Any] = {"name": name}
    for param in LOSS_PARAMS[name]:
        key = f"labels.loss.{param}"
        if param == "t_squared":
            loss_out[param] = chk.boolean(loss[param], key)
        else:
            loss_out[param] = chk.number(loss[param], key, positive=(param == "temperature"))
    if kind == "hard" and name != "ce":
        chk.fail("labels.loss.name", f"hard labels train with 'ce', got {name!r}")

    out: dict[str, Any] = {"type": kind, "loss": loss_out}
    if kind in ("teacher", "stored"):
        if "teacher" not in labels:
            why = "" if kind == "teacher" else " (it labels the sets that ship no soft labels: the random subset)"
            chk.fail("labels.teacher", f"required for labels of type {kind!r}{why}")
        out["teacher"] = _check_teacher(chk, labels["teacher"])
    elif "teacher" in labels:
        chk.fail("labels.teacher", f"hard labels take no teacher (type is {kind!r})")
    return out


def _check_teacher(chk: _Checker, value: Any) -> dict:
    from ddlib.models import list_models

    teacher = chk.mapping(value, "labels.teacher")
    chk.keys(teacher, "labels.teacher", ("arch",), ("count", "recipe"))
    known = list_models()
    arch = teacher["arch"]
    if isinstance(arch, str):
        archs = [arch]
    elif isinstance(arch, list) and arch:
        archs = list(arch)
    else:
        chk.fail("labels.teacher.arch", f"must be a model name or a non-empty list of them, got {arch!r}")
    for a in archs:
        if not isinstance(a, str) or a not in known:
            chk.fail("labels.teacher.arch", f"unknown model {a!r}; known: {known}")
    count = teacher.get("count", len(archs) if isinstance(arch, list) else 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        chk.fail("labels.teacher.count", f"must be a positive integer, got {count!r}")
    if isinstance(arch, list) and count != len(archs):
        chk.fail("labels.teacher.count", f"is {count} but arch lists {len(archs)} member(s)")
    out: dict[str, Any] = {"arch": archs if isinstance(arch, list) else arch, "count": count}
    if "recipe" in teacher:
        overrides = chk.mapping(teacher["recipe"], "labels.teacher.recipe")
        chk.recipe(overrides, "labels.teacher.recipe", required=())  # validates keys and values
        out["recipe"] = dict(overrides)
    return out


def _check_model(chk: _Checker, value: Any) -> str | None:
    from ddlib.models import list_models

    if value is None:
        return None
    if not isinstance(value, str) or value not in list_models():
        chk.fail("model", f"unknown model {value!r}; known: {list_models()}")
    return value


def _check_augment(chk: _Checker, value: Any) -> list:
    if value is None or value == "none" or value == []:
        return []
    items = [value] if isinstance(value, (str, Mapping)) else value
    if not isinstance(items, list):
        chk.fail("augment", f"must be a list of ops, an op, 'none' or empty, got {value!r}")
    out = []
    for i, item in enumerate(items):
        where = f"augment[{i}]"
        if isinstance(item, str):
            name, params = item, None
        elif isinstance(item, Mapping) and len(item) == 1:
            ((name, params),) = item.items()
        else:
            chk.fail(where, f"must be an op name or a single-key mapping {{op: {{params}}}}, got {item!r}")
        if name == "zca":
            chk.fail(f"{where}.zca", "ZCA is not an augmentation op: set the top-level 'zca: true'")
        if name not in AUGMENT_OPS:
            chk.fail(f"{where}.{name}", f"unknown augmentation op {name!r}; known: {sorted(AUGMENT_OPS)}")
        if name == "none":
            if params not in (None, {}):
                chk.fail(f"{where}.none", f"takes no parameters, got {params!r}")
            continue
        if params is None:
            out.append(name)
            continue
        if name == "torchvision" and isinstance(params, list):
            out.append({name: copy.deepcopy(params)})
            continue
        params = chk.mapping(params, f"{where}.{name}")
        chk.keys(params, f"{where}.{name}", (), AUGMENT_OPS[name])
        out.append({name: copy.deepcopy(dict(params))})
    _cross_check_augment(chk, out)
    return out


def _cross_check_augment(chk: _Checker, spec: list) -> None:
    """Build the spec with ddlib.engine.augment.create_augment where that module is ready (it may not be)."""
    if not spec:
        return
    try:
        from ddlib.engine.augment import create_augment
    except Exception:  # not written yet, or mid-edit: the checks above are enough
        return
    try:
        create_augment(spec, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), num_classes=10)
    except ValueError as error:
        chk.fail("augment", str(error))


# Ops that de-normalise the batch with the dataset mean/std (ddlib.engine.augment._pixels): under ZCA
# the batch is whitened pixels, which they would misread.
_PIXEL_SPACE_OPS = ("torchvision", "autoaugment", "randaugment", "imagenet_aug")


def _check_zca(chk: _Checker, value: Any, augment: Any) -> bool:
    zca = chk.boolean(value, "zca")
    if zca:
        items = [augment] if isinstance(augment, (str, Mapping)) else (augment or [])
        names = [i if isinstance(i, str) else next(iter(i)) for i in items if isinstance(i, (str, Mapping)) and i]
        bad = [n for n in names if n in _PIXEL_SPACE_OPS]
        if bad:
            chk.fail("zca", f"zca: true feeds whitened batches to the augmentation, but {bad} work on "
                            "mean/std-normalised pixels; drop zca or those ops")
    return zca


def parse_preset(data: Any, *, source: str | Path | None = None, name: str | None = None) -> Preset:
    """Validate a preset mapping (e.g. a parsed YAML file) and build a :class:`Preset`."""
    label = str(source) if source is not None else (name or "<preset>")
    chk = _Checker(label)
    data = chk.mapping(data, "preset")
    if "lr_search" in data:
        chk.fail("lr_search", "removed in ddlib 0.2.0: whether a learning rate is searched is the protocol's "
                              "lr_policy (paper | symmetric | fixed); a preset only says 'learned_lr: true' when "
                              "the set ships the lr it was distilled for")
    chk.keys(data, "", _TOP_REQUIRED, _TOP_OPTIONAL)
    if name is None:
        name = Path(source).stem if source is not None else chk.text(data["method"], "method").lower()
    return Preset(
        name=name,
        method=chk.text(data["method"], "method"),
        citation=chk.text(data["citation"], "citation"),
        recipe=chk.recipe(data["recipe"], "recipe", required=_RECIPE_REQUIRED),
        labels=_check_labels(chk, data["labels"]),
        augment=_check_augment(chk, data.get("augment")),
        zca=_check_zca(chk, data.get("zca", False), data.get("augment")),
        model=_check_model(chk, data.get("model")),
        learned_lr=chk.boolean(data.get("learned_lr", False), "learned_lr"),
        use_aug_for_hard=chk.boolean(data.get("use_aug_for_hard", True), "use_aug_for_hard"),
        source=Path(source).resolve() if source is not None else None,
    )


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or "/" in text or "\\" in text
    if looks_like_path:
        if not path.is_file():
            raise ValueError(f"{path}: no such preset file")
        return path
    candidate = PRESETS_DIR / f"{text.lower()}.yaml"
    if not candidate.is_file():
        raise ValueError(f"unknown method preset {text!r}; known: {list_presets()} (or give a path to a YAML file)")
    return candidate


def preset_file(name_or_path: str | Path) -> Path:
    """The YAML file a preset name (``params/methods/<name>.yaml``) or path refers to."""
    return _resolve(name_or_path)


def load_preset(name_or_path: str | Path) -> Preset:
    """Load and validate a preset by name (``"sre2l"``, case-insensitive, from :data:`PRESETS_DIR`)
    or from a YAML file path. Raises ``ValueError`` naming the file and the offending key."""
    path = _resolve(name_or_path)
    return parse_preset(load_yaml(path), source=path)
