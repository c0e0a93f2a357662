"""BEARD's adversarial-robustness protocol: models trained on one set, attacked (one grid cell).

Per cell: one set (``method``, ``ipc``), one architecture (``model``), one attack ``mode``. The
set trains one model per seed with BEARD's recipe (ConvNet, SGD 0.01, momentum 0.9, weight decay
5e-4, batch 256, DSA, 1000 epochs in DC's loop: 1001 epochs, lr x 0.1 with a fresh optimizer after
epoch 501, ``scheduler: dc_step``), or with an adversarial-training objective
(``training``: pgd_at, trades, mart, beard_at). The trained models are stored in MLflow (the model pool), so
the other mode, another attack list or a rerun attacks them without retraining. A released model
joins the pool instead with ``source: {kind: checkpoint, path, model}`` (BEARD's own model pool is
ConvNet state_dicts): loaded with ``weights_only=True``, checked to fit the architecture and data,
scored on the test set and attacked like a trained one (``recipe``, ``augment`` do not apply).
Models train in fp32 unless the recipe names a ``precision``: the default ``auto`` (bf16 where
native) was checked to keep clean accuracy, never robustness, so BEARD's numbers stay fp32's.

Each model is attacked on a seeded class-stratified subset of ``attack_size`` test images
(default: the whole test set) by every attack of ``attacks``, in pixel space (``space: pixel``,
the default: ε bounds the change of pixels in [0, 1]), or as BEARD's code does it (``space:
beard_compat``: normalised tensors fed to torchattacks, ε in normalised units and torchattacks'
[0, 1] clamp on normalised values; see :func:`ddlib.attacks.run_attack`), which
reproduces BEARD's published accuracies and is never a pixel-space robustness: ``space`` is part
of the leaderboard row, and the run is tagged ``ddlib.attack_space``.

Per attack: robust accuracy, ASR as the BEARD paper defines it and as its code computes it
(clean - robust), the synchronised wall time of the attack pass and per sample. An attack that
cannot target is recorded as skipped in targeted mode (never as a clean accuracy). Targets:
``next`` ((y + 1) mod C), ``random`` (a seeded other class) or ``next_mod10`` (BEARD's (y + 1) mod
10 whatever C); ``space: beard_compat`` with ``target: next`` on other than 10 classes is refused
(BEARD never ran those targets: ``next_mod10`` is its).

Timing provenance: each attack is preceded by a clean pass timed in the same process, on the same
device (its name is part of every cached result's key and logged with it), and AE compares the
attack times with those clean times (their mean is the seed's ``clean_seconds``), never with a
clean time taken in another process or the other mode: BEARD's published tables use each mode's
own clean time (its metric toolkit's minimum of the two modes is the report's
``clean_time="min_of_modes"``). Each result also records the process that timed it
(``timing_process``, a random id drawn once per Python process). Attack results are cached, so a
seed's attacks can come from several processes (a rerun of an interrupted cell, or a second grid
whose attack list overlaps the first's) whose loads differ: their times are not comparable (AE
47.06 from two processes that alone give 66.67 each). Such a seed keeps its accuracies and RR,
but its ``clean_seconds``, AE and CREI are NaN, and the cell is flagged (``ddlib.sanity``, and
``ddlib.timing_mixed.seed<n>`` names the attacks of each process): we chose this over re-timing,
which would rerun every cached attack (the point of caching). To get AE, delete the older result
runs (tag ``ddlib.result_key``) and rerun the cell in one process.

Per seed, from the attacks that ran: BEARD's RR, its toolkit's ``rome`` and ``rome+`` variants
(``rr_rome``, ``rr_rome_plus``: BEARD's Table 15 reports ``rome``), AE and CREI, and the monotone
robust-to-clean ratio RCR; ROME's I-CREI (``crei_rome``: CREI on ``rr_rome``, ROME's I-RR); optional
robust-accuracy-versus-epsilon curves of several attacks (``eps_curve``: :mod:`ddlib.attacks.curves`,
AutoAttack's components among them) with each curve's area ``curve_auc.<attack>``. RR, AE and CREI
compare the attacks with each other, so with fewer than two that ran (a targeted cell of
``[fgsm, deepfool]``, say) they would be 0, 100 and 50 whatever the model: they are NaN there and
the cell is flagged. The paper's AST (time to fool a sample, conditional on success) is computed by
neither BEARD's code nor ddlib: every time here is the whole attack pass over all N images. Each
attack result is cached in MLflow by (model, attack, mode, space, test subset, seed, device), so a
rerun recomputes nothing. References (a random subset, the full data) are other rows of the grid:
``method: [dc, random, full]``.

BEARD's training differs from this recipe in two ways (``Code/train_model.py`` with its released
``train_config.json``, ``eva_utils.epoch``): it applies ``number_sign_augment`` to the set before
training (each image's four quadrants, bilinearly upsampled to full size: 4x the images, labels
repeated), which ``number_sign: true`` applies here too; and its "+AT" is untargeted
``torchattacks.PGD`` (ε 8/255, step 2/225, 10 steps, no random start) on the *normalised*,
DSA-augmented batch, clamped to [0, 1] in normalised units, training on the adversarial batch
only: ``training: beard_at`` (:mod:`ddlib.engine.adversarial_training`), never a pixel-space PGD-AT.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
import torch.nn.functional as F

from ddlib.scores import metrics

from ddlib.specs import units
from ddlib.engine.adversarial_training import create_objective
from ddlib.attacks import (SPACES, TARGET_KINDS, AttackSpec, PixelModel, clean_pass, parse_attacks, run_attack,
                           targeted_skip_reason)
from ddlib.attacks.curves import AUC_PREFIX, curve_aucs, parse_curve, point_key
from ddlib.engine.augment import create_augment
from ddlib.data.datasets import stratified_subset
from ddlib.data.distilled import DistilledSet
from ddlib.data.digest import tensor_digest
from ddlib.engine.test_pass import as_pixels
from ddlib.engine.recipe import Recipe
from ddlib.models import list_models
from ddlib.protocols.cell import Cell, TrainedModel, device_name, group_params
from ddlib.protocols.spec import IDENTITY_REVISION, LAYOUT_REVISION, Board, Param, ProtocolSpec, Result
from ddlib.protocols.common import SET_PARAMS, positive_int, check_recipe, check_weight, validate_set_params
from ddlib.protocols.common import obtain as obtain_set
from ddlib.protocols.dcbench import check_augment
from ddlib.protocols.inputs import checkpoint_path
from ddlib.protocols.released import check_checkpoint_accuracy, check_expected_accuracy, pool_checkpoints
from ddlib.store.hashing import config_hash
from ddlib.store.tags import TAG

__all__ = ["PROTOCOL", "PARAMS", "MODES", "validate", "group_identity", "open_cell", "obtain", "train_models", "attack_subset",
           "evaluate", "AdversarialResult", "BEARD_ATTACKS", "curve_key", "check_targets", "TIMING_PROCESS",
           "number_sign"]

# BEARD's training (Code/eva_utils.py evaluate_synset with its train_config.json): SGD lr 0.01, momentum
# 0.9, weight decay 5e-4, batch 256, 1000 epochs run as DC's loop runs them. A grid's ``recipe`` applies on top.
BEARD_RECIPE = Recipe(epochs=1000, scheduler="dc_step")
# The process that times attacks here: a random 52-bit id (exact as an MLflow metric, a float).
TIMING_PROCESS = float(uuid.uuid4().int & ((1 << 52) - 1))
TIMING_MIXED_TAG = "ddlib.timing_mixed"
MODES = ("untargeted", "targeted")
BEARD_ATTACKS = ["fgsm", "pgd", "pgd_l2", "cw", "deepfool", "autoattack"]

SPEC = ProtocolSpec(
    name="adversarial", revision=6, order=30, title="BEARD: adversarial robustness (targeted and untargeted)",
    summary="models trained on the set (or released) attacked: robust accuracy, ASR, time per attack, RR, AE, CREI",
    params={
        **SET_PARAMS,
        "seeds": Param([0], "models per set (BEARD attacks one)", "list[int]"),
        "recipe": Param({}, "Recipe keys over BEARD_RECIPE (SGD 0.01, momentum 0.9, wd 5e-4, batch 256, 1000 epochs "
                            "in DC's loop: dc_step)"),
        "real_recipe": Param({}, "overrides for method full (the full-size reference), e.g. {epochs: 200}"),
        "augment": Param("dsa", "one augmentation spec (ddlib.engine.augment) or null; BEARD trains with DSA", "str"),
        "number_sign": Param(False, "BEARD's released training config: the set's quadrants upsampled (4x images) "
                                    "before training"),
        "training": Param("standard", "or an objective (ddlib.engine.adversarial_training): pgd_at, trades, mart, "
                                      "beard_at (a name or {name: {params}})", "str"),
        "attacks": Param(list(BEARD_ATTACKS), "attack specs (ddlib.attacks): names or {name: {params}}", "list"),
        "mode": Param("untargeted", "untargeted | targeted"),
        "target": Param("next", "targeted mode: next ((y + 1) mod C) | random (a seeded other class) | next_mod10 "
                                "(BEARD's)"),
        "attack_size": Param(None, "a seeded, class-stratified test subset of this many images (null: all)", "int"),
        "attack_seed": Param(0, "the subset, random targets and random starts"),
        "attack_batch_size": Param(256, "BEARD's test batch size (timings depend on it)"),
        "alpha": Param(0.5, "CREI is alpha RR + (1 - alpha) AE"),
        "eps_curve": Param(None, "e.g. {attacks: [pgd, aa_apgd_ce], eps: [0, 2/255, 8/255]}: accuracy against eps, "
                                 "area curve_auc", "dict"),
        "space": Param("pixel", "pixel (eps bounds pixels) | beard_compat (BEARD's normalised-tensor pipeline, to "
                                "check its numbers)"),
    },
    boards=(Board("beard", "BEARD: adversarial robustness (targeted and untargeted)",
                  "ddlib.protocols.beard_boards:robustness_leaderboard", "crei", "CREI",
                  columns=(("clean_acc", "clean accuracy"), ("rr", "RR (0-100)"), ("ae", "AE (0-100)"),
                           ("crei", "CREI (0-100)"), ("rcr", "RCR = robust / clean accuracy (0-100)"),
                           ("rr_rome", "I-RR (ROME's; BEARD's rome)"), ("crei_rome", "I-CREI (CREI on I-RR)")),
                  more_columns=True, variant=("mode", "space", "training", "model", "attacks"), weight="alpha",
                  heading="BEARD: RR, AE, CREI{weight} and RCR, 0-100; accuracies in %, times in s",
                  section="ddlib.protocols.beard_boards:section", pages=("eps_curves",),
                  derived=(("eps_curves", "ddlib.protocols.beard_boards:eps_curves_of"),)),
            Board("beard_unified", "BEARD: unified over IPCs (RRM, AEM, CREI)",
                  "ddlib.protocols.beard_boards:unified_leaderboard", "creim", "CREI over IPCs", weight="alpha",
                  own_section=False)),
    headline="beard",
    history=("2: the space parameter; each attack paired with a clean pass timed in its own process",
             "3: each result records its timing process (AE/CREI NaN for a seed timed in several); RR, AE and CREI "
             "NaN with fewer than two attacks; RR variants rome and rome+; target kind next_mod10",
             "4: BEARD's schedule (its eva_utils.evaluate_synset, as DC's): Epoch + 1 epochs, lr x 0.1 with a new "
             "optimizer after Epoch // 2 + 1 (scheduler: dc_step), the base of every recipe (BEARD_RECIPE)",
             f"5: {LAYOUT_REVISION}",
             f"6: {IDENTITY_REVISION}"
              "; in space beard_compat the eps_curve's 0 point runs the attack (BEARD's [0, 1] clamp on normalised "
              "tensors acts with no budget), no longer the clean accuracy; a checkpoint's expected_accuracy in % and "
              "required where its file name carries none (or `unknown`)"),
)
PROTOCOL, REVISION, PARAMS = SPEC.name, SPEC.revision, SPEC.defaults()
SPACE_TAG = "ddlib.attack_space"
MODE_PAIR_TAG = TAG["mode_pair"]  # the same row in the other mode (the report's clean_time="min_of_modes")


def validate(params: dict) -> dict:
    """Check a adversarial cell's params before anything runs (one-line errors naming the key)."""
    p = validate_set_params(PROTOCOL, PARAMS, params, trained_models=True)
    if p["source"]["kind"] == "checkpoint":
        _check_checkpoint(p, params)
    if p["space"] not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {p['space']!r}")
    check_recipe(p, "real_recipe", base=check_recipe(p, "recipe", base=BEARD_RECIPE))
    check_augment(p["augment"], "augment")
    if not isinstance(p["number_sign"], bool):
        raise ValueError(f"number_sign must be true or false, got {p['number_sign']!r}")
    check_weight(p, "alpha")
    try:
        create_objective(p["training"], mean=(0.5,), std=(0.5,), num_classes=10)
    except ValueError as e:
        raise ValueError(f"training: {e}") from None
    try:
        attacks = parse_attacks(p["attacks"])
    except ValueError as e:
        raise ValueError(f"attacks: {e}") from None
    if not attacks:
        raise ValueError("attacks must list at least one attack")
    names = [a.name for a in attacks]
    if len(set(names)) != len(names):
        raise ValueError(f"attacks: each attack may appear once (its metrics are named after it), got {names}; "
                         "for one attack at several epsilons use eps_curve")
    if p["mode"] not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {p['mode']!r}")
    if p["target"] not in TARGET_KINDS:
        raise ValueError(f"target must be one of {TARGET_KINDS}, got {p['target']!r}")
    if p["mode"] == "targeted" and all(targeted_skip_reason(a) for a in attacks):
        raise ValueError(f"mode targeted: none of {[a.name for a in attacks]} can target")
    if p["attack_size"] is not None and not positive_int(p["attack_size"]):
        raise ValueError(f"attack_size must be null or a positive integer, got {p['attack_size']!r}")
    if not isinstance(p["attack_seed"], int) or p["attack_seed"] < 0:
        raise ValueError(f"attack_seed must be a non-negative integer, got {p['attack_seed']!r}")
    if not positive_int(p["attack_batch_size"]):
        raise ValueError(f"attack_batch_size must be a positive integer, got {p['attack_batch_size']!r}")
    try:
        parse_curve(p["eps_curve"], targeted=p["mode"] == "targeted")
    except ValueError as e:
        raise ValueError(f"eps_curve: {e}" if not str(e).startswith("eps_curve") else str(e)) from None
    return p


def _check_checkpoint(p: dict, raw: dict) -> None:
    """A checkpoint source: its ``model`` is the cell's; its path names one file per seed."""
    source = p["source"]
    if "model" in source:
        if "model" in raw and raw["model"] != source["model"]:
            raise ValueError(f"method {p['method']!r}: the checkpoint is a {source['model']!r} but model is "
                             f"{raw['model']!r}")
        if source["model"] not in list_models():
            raise ValueError(f"method {p['method']!r}: unknown model {source['model']!r}; known: {list_models()}")
        p["model"] = source["model"]
    if "{seed}" not in source["path"] and len(p["seeds"]) > 1:
        raise ValueError(f"method {p['method']!r}: path {source['path']!r} has no {{seed}}, so the {len(p['seeds'])} "
                         "seeds would attack one file; put {seed} in the path or list one seed")
    check_checkpoint_accuracy(p["method"], source)


def group_identity(params: dict) -> dict:
    """The leaderboard row of a cell: attacks by their resolved description (``fgsm`` and
    ``{fgsm: {eps: 8/255}}`` are one attack), without what the summary recomputes or only adds
    (``alpha``; ``eps_curve`` only where a cell has one: its points, each attack's settings and ε,
    since its areas are row values), without ``target`` in untargeted mode, and without the training
    recipe (``recipe``, ``augment``, ``number_sign``) of a checkpoint (nothing is trained), nor
    ``number_sign`` for ``full`` (never applied to the whole training set, as in BEARD, whose
    ``src_dataset`` training reads the data loader). ``space`` stays: a ``beard_compat`` row is
    never pooled with a pixel-space one."""
    out = {k: v for k, v in params.items() if k not in ("alpha", "eps_curve")}
    out["attacks"] = [a.describe() for a in parse_attacks(params["attacks"])]
    if params.get("eps_curve") is not None:  # its areas are row values: one curve (attacks, settings, ε) per row
        out["eps_curve"] = sorted({(p.attack, p.spec.describe() if p.spec else "clean", f"{p.eps:.6f}")
                                   for p in parse_curve(params["eps_curve"], params.get("mode") == "targeted")})
    if params.get("mode") != "targeted":
        out.pop("target", None)
    if (params.get("source") or {}).get("kind") == "checkpoint":
        for key in ("recipe", "real_recipe", "augment", "number_sign"):
            out.pop(key, None)
    if (params.get("source") or {}).get("kind") == "full":
        out.pop("number_sign", None)
    return out


def curve_key(spec: AttackSpec) -> str:
    """Metric name of one point of the epsilon curve (the summary parses it back)."""
    return point_key(spec.name, spec.eps)


@dataclass(kw_only=True)
class AdversarialResult(Result):
    """per_seed: clean and per-attack measurements, RR (3 variants), AE, CREI, I-CREI, RCR, curve points and
    their areas (``curve_auc.<attack>``) per seed."""

    attacks: pd.DataFrame  # one row per (seed, attack): measurements, or skipped with the reason
    cell: dict = field(default_factory=dict)  # dataset, method, ipc, training, mode: what the curve is of

    def curve(self) -> pd.DataFrame:
        """Robust accuracy against epsilon (``eps_curve``), mean and std over seeds, in the layout of
        :func:`ddlib.report.eps_curves` (so :func:`ddlib.report.plot_eps_curves` draws it)."""
        rows = []
        for column in (c for c in self.per_seed.columns if c.startswith("curve.")):
            _, attack, eps = column.split(".", 2)
            mean, std = metrics.mean_std(units.computed(column, v) for v in self.per_seed[column])  # as the boards
            rows.append({**self.cell, "group": "cell", "attack": attack, "eps": float(eps), "robust_acc_mean": mean,
                         "robust_acc_std": std, "seeds": len(self.per_seed)})
        return pd.DataFrame(rows)

    def table(self) -> pd.DataFrame:
        """Per attack, mean over seeds: robust accuracy and ASR in %, times in seconds, queries (model
        evaluations per image; absent from results cached before they were counted), skipped shown."""
        attacks = self.attacks if "queries" in self.attacks else self.attacks.assign(queries=float("nan"))
        shown = attacks.groupby("attack", sort=False).agg(
            robust_acc=("robust_acc", "mean"), asr=("asr", "mean"), asr_beard=("asr_beard", "mean"),
            attack_seconds=("attack_seconds", "mean"), queries=("queries", "mean"), status=("status", "first"))
        for col in ("robust_acc", "asr", "asr_beard"):
            shown[col] = units.shown(col, 1.0) * shown[col]
        return shown.rename(columns={"robust_acc": "robust acc %", "asr": "ASR %", "asr_beard": "ASR (BEARD) %",
                                     "attack_seconds": "attack s", "queries": "queries / image"})

    def scores(self) -> pd.DataFrame:
        keys = ["clean_acc", "rr", "rr_rome", "rr_rome_plus", "ae", "crei", "crei_rome", "rcr",
                *[c for c in self.per_seed.columns if c.startswith(AUC_PREFIX)]]
        return pd.DataFrame({"mean": [self.summary[f"{k}_mean"] for k in keys],
                             "std": [self.summary[f"{k}_std"] for k in keys]}, index=keys)


def open_cell(run_id: str | None = None, experiment: str | None = None, **params) -> Cell:
    """Open the adversarial cell's MLflow run, its configuration resolved and checked before the set is obtained."""
    return Cell.open(PROTOCOL, validate(params), run_id=run_id, experiment=experiment)


def obtain(cell: Cell) -> DistilledSet | None:
    """The cell's set (made or loaded, logged as an image grid), or None for a checkpoint source."""
    with cell.guard():
        _check_cell_targets(cell)
    if cell.params["source"]["kind"] == "checkpoint":
        return None
    return obtain_set(cell)


def number_sign(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BEARD's ``number_sign_augment`` (``eva_utils.py``, applied by ``train_model.py`` when its
    config says ``aug: true``, as the released ``train_config.json`` does): each image's four
    quadrants (top-left, bottom-left, top-right, bottom-right, in that order of blocks), each
    upsampled bilinearly (``align_corners=False``) to the full size; labels repeated. BEARD does it
    on normalised tensors, here on pixels: bilinear weights sum to 1, so it commutes with the
    per-channel normalisation. Float pixels out (uint8 in is read as pixels / 255)."""
    if images.dim() != 4 or images.shape[2] != images.shape[3] or images.shape[2] % 2:
        raise ValueError(f"number_sign needs square images of even size, got shape {tuple(images.shape)}")
    x = as_pixels(images)
    h = x.shape[2] // 2
    quadrants = [x[:, :, :h, :h], x[:, :, h:, :h], x[:, :, :h, h:], x[:, :, h:, h:]]
    up = [F.interpolate(q, scale_factor=2, mode="bilinear", align_corners=False) for q in quadrants]
    return torch.cat(up), labels.repeat(4, *[1] * (labels.dim() - 1))


def train_models(cell: Cell, distilled: DistilledSet | None) -> list[TrainedModel]:
    """One model per seed trained on the set (or found in the model pool), with its weights; for a
    checkpoint source, the seeds' released models, put into the pool (``distilled`` is None)."""
    p, ds = cell.params, cell.dataset
    with cell.guard():
        _check_cell_targets(cell)
    if p["source"]["kind"] == "checkpoint":
        with cell.guard():
            paths = {seed: checkpoint_path(p, ds.name, seed) for seed in p["seeds"]}
            models = pool_checkpoints(cell, "model", paths, p["model"])
            check_expected_accuracy(cell, models, paths)
            return models
    if distilled is None:
        raise ValueError(f"method {p['method']!r}: no set to train on")
    with cell.guard():
        hook = create_augment(p["augment"], mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
        # plain training (objective None) has the key of any other protocol's identical training
        # (DC-Bench's DSA augmentation, say), so its models are shared
        objective, _ = create_objective(p["training"], mean=ds.mean, std=ds.std, num_classes=ds.num_classes)
        recipe = check_recipe(p, "recipe", base=BEARD_RECIPE)
        named = dict(p["recipe"] or {})
        if p["source"].get("kind") == "full":
            recipe = check_recipe(p, "real_recipe", base=recipe)
            named.update(p["real_recipe"] or {})
        if "precision" not in named:  # bf16 kept clean accuracy; robustness was never measured in it
            recipe = replace(recipe, precision="fp32")
        images, labels = distilled.images, distilled.labels
        if p["number_sign"] and p["source"].get("kind") != "full":
            images, labels = number_sign(images, labels)
        return cell.train_eval("model", images, labels, recipe, p["seeds"], augment=hook, objective=objective,
                               keep_models=True)


def attack_subset(cell: Cell) -> tuple[torch.Tensor, torch.Tensor]:
    """The test images the attacks see: all, or a class-stratified subset of ``attack_size`` (``attack_seed``)."""
    p, ds = cell.params, cell.dataset
    if p["attack_size"] is None or p["attack_size"] >= len(ds.test_labels):
        return ds.test_images, ds.test_labels
    try:
        keep = torch.from_numpy(stratified_subset(ds.test_labels.numpy(), p["attack_size"], p["attack_seed"]))
    except ValueError as e:
        raise ValueError(f"attack_size: {e}") from None
    return ds.test_images[keep], ds.test_labels[keep]


def evaluate(cell: Cell, distilled: DistilledSet | None, models: list[TrainedModel] | None = None) -> AdversarialResult:
    """Train, test and score: BEARD's scores (RR, AE, CREI) of models trained on the set (the cell's Result)."""
    p, ds = cell.params, cell.dataset
    targeted = p["mode"] == "targeted"
    with cell.guard():
        _check_cell_targets(cell)
        models = models if models is not None else train_models(cell, distilled)
        images, labels = attack_subset(cell)
        test_id = f"{ds.name}:{tensor_digest(images, labels)}"  # by content: the same images under another path are the same
        attacks = parse_attacks(p["attacks"])
        curve = parse_curve(p["eps_curve"], targeted, p["space"])
        run = dict(num_classes=ds.num_classes, batch_size=p["attack_batch_size"], seed=p["attack_seed"],
                   device=cell.device, space=p["space"])
        pair = {k: v for k, v in group_params(p, PROTOCOL).items() if k not in ("mode", "target")}
        cell.tracker.set_tags(cell.run_id, {SPACE_TAG: p["space"],
                                            MODE_PAIR_TAG: config_hash({"revision": REVISION, **pair})})
        rows, attack_rows, skipped, few, mixed = [], [], {}, {}, {}
        for evaluation in models:
            net = PixelModel(evaluation.model, ds.mean, ds.std).to(cell.device).eval()
            # timings are results too: they are cached per device (GPU model, CPU thread count)
            identity = {"model_run": evaluation.run_id, "test": test_id, "device": device_name(cell.device),
                        "batch_size": p["attack_batch_size"], "space": p["space"], "revision": REVISION}
            # the clean accuracy (deterministic); its time is not used: every attack carries the
            # time of a clean pass run right before it, in the process that timed the attack
            clean = clean_pass(net, images, labels, p["attack_batch_size"], cell.device)
            row = {"seed": evaluation.seed, "clean_acc": clean.accuracy}
            accs, times, clean_times, processes = [], [], [], {}
            for spec in attacks:
                if targeted and (reason := targeted_skip_reason(spec)):
                    skipped[spec.name] = reason
                    attack_rows.append({"seed": evaluation.seed, "attack": spec.name, "status": "skipped",
                                        "reason": reason})
                    continue
                result = _attack(cell, net, spec, images, labels, identity, evaluation.seed, targeted, run)
                for k, v in result.items():
                    row[f"{spec.name}.{k}"] = v
                accs.append(100 * result["robust_acc"])
                times.append(result["attack_seconds"])
                clean_times.append(result["clean_seconds"])
                processes.setdefault(result["timing_process"], []).append(spec.name)
                attack_rows.append({"seed": evaluation.seed, "attack": spec.name, "status": "ran", **result})
            # AE compares times of one process only (see the module docstring)
            row["clean_seconds"] = metrics.mean_std(clean_times)[0] if len(processes) == 1 else float("nan")
            if len(processes) > 1:
                mixed[evaluation.seed] = processes
            if len(accs) < metrics.MIN_ATTACKS:
                few[evaluation.seed] = [a.name for a in attacks if a.name not in skipped]
            row.update(metrics.beard_scores(100 * row["clean_acc"], accs, row["clean_seconds"], times, p["alpha"]))
            for point in curve:  # robustness curves (ddlib.attacks.curves): at eps 0 in pixel space the clean accuracy
                row[point.key] = row["clean_acc"] if point.spec is None else _attack(
                    cell, net, point.spec, images, labels, identity, evaluation.seed, targeted, run)["robust_acc"]
            row.update(curve_aucs(row))
            rows.append(row)
        if skipped:
            cell.tracker.set_tags(cell.run_id, {f"ddlib.skipped.{name}": reason for name, reason in skipped.items()})
        _flag_scores(cell, few, mixed, skipped)
        per_seed, summary = cell.record_per_seed(rows)
    label = {"dataset": p["dataset"], "method": p["method"], "ipc": p["ipc"], "mode": p["mode"], "space": p["space"],
             "training": p["training"] if isinstance(p["training"], str) else str(p["training"])}
    return AdversarialResult(per_seed=per_seed, summary=summary, protocol=cell.protocol,
                             attacks=pd.DataFrame(attack_rows), cell=label,
                             run_id=cell.run_id)


def _check_cell_targets(cell: Cell) -> None:
    """:func:`check_targets` for a targeted cell, once its data (the class count) is known: before
    the set is made and the models are trained, so a refused cell costs nothing."""
    if cell.params["mode"] == "targeted":
        check_targets(cell.params["space"], cell.params["target"], cell.dataset.num_classes)


def check_targets(space: str, target: str, num_classes: int) -> None:
    """Targets the data can take, and in ``beard_compat`` space the ones BEARD ran: its
    ``(y + 1) % 10`` is ``next`` on 10 classes only, ``next_mod10`` on any."""
    if target == "next_mod10" and num_classes < 10:
        raise ValueError(f"target 'next_mod10' ((y + 1) mod 10, BEARD's) needs at least 10 classes, got {num_classes}")
    if space == "beard_compat" and target == "next" and num_classes != 10:
        raise ValueError(f"space 'beard_compat', target 'next': on {num_classes} classes that is (y + 1) mod "
                         f"{num_classes}, but BEARD targets (y + 1) mod 10 whatever the classes; use target "
                         "next_mod10 (BEARD's) or space pixel")


def _flag_scores(cell: Cell, few: dict[int, list[str]], mixed: dict[int, dict[float, list[str]]],
                 skipped: dict[str, str]) -> None:
    """Flag the seeds whose RR, AE and CREI are NaN: fewer than two attacks ran, or their times come
    from several processes (cached results of another run)."""
    if few:
        ran = next(iter(few.values()))
        cell.flag(f"only {len(ran)} attack{'s' if len(ran) != 1 else ''} ran ({', '.join(ran) or 'none'}"
                  + (f"; skipped: {', '.join(sorted(skipped))}" if skipped else "") + "): RR, AE and CREI compare "
                  f"attacks with each other (one gives RR 0, AE 100, CREI 50 whatever the model), so they are NaN; "
                  f"list at least {metrics.MIN_ATTACKS} attacks that run in this mode")
    for seed, processes in mixed.items():
        parts = [f"process {int(pid):x}: {', '.join(names)}" for pid, names in processes.items()]
        cell.tracker.set_tags(cell.run_id, {f"{TIMING_MIXED_TAG}.seed{seed}": "; ".join(parts)})
        cell.flag(f"seed {seed}: the attack times come from {len(processes)} processes ({'; '.join(parts)}; cached "
                  "results of an earlier run), whose loads differ: AE, CREI and clean_seconds are NaN for it "
                  "(accuracies and RR stand); delete the older result runs and rerun the cell to time them together")


def _attack(cell: Cell, net, spec: AttackSpec, images, labels, identity: dict, seed: int, targeted: bool,
            run: dict) -> dict[str, float]:
    """One attack on one pooled model, with a clean pass timed right before it in this process,
    cached by everything its result depends on (the device's name included: times are results)."""
    p = cell.params
    key = {**identity, "attack": spec.describe(), "mode": p["mode"], "attack_seed": p["attack_seed"],
           **({"target": p["target"]} if targeted else {})}

    def compute():
        outcome = run_attack(spec, net, images, labels, targeted=targeted, targets=p["target"] if targeted else None,
                             progress=cell.progress, **run)
        return {**{k: v for k, v in outcome.metrics().items() if k != "clean_acc"}, "timing_process": TIMING_PROCESS}

    result, _ = cell.cached_result(f"{spec.describe()} {p['mode']} seed{seed}", key, compute,
                                   params={"attack": spec.describe(), "mode": p["mode"], "space": p["space"],
                                           "model_run": identity["model_run"], "device_name": identity["device"]})
    return result
