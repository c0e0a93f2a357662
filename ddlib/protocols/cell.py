"""What every protocol notebook shares: a grid cell's MLflow run, and cached trained evaluations.

A *cell* is one notebook execution (one point of a params grid): one parent run in the
protocol's experiment. Every model it trains is a child run (an *evaluation*) tagged with a
key that hashes what was trained (the exact training tensors), how (model, recipe, hooks, a
fitted preprocessing's content), on which test set (its images' and labels' content), with which
seed and under which definition (the engine's revision and the protocol's, with those of the
protocols sharing its models: :func:`ddlib.specs.keys.definition`; a revision bump therefore trains
again). Before training, the cell looks for a FINISHED run with that key in any experiment and
reuses its accuracy: the full-data reference, or the
random baseline shared by every method at one IPC, is trained once, not once per cell.
A file lock keeps parallel workers from training the same key twice.

With ``keep_models=True`` the trained weights are logged too (artifact ``model.pt`` of the
evaluation run, tag ``ddlib.model_stored``): those runs are the *model pool*. A later cell that
needs the model itself (an attack, say) downloads it instead of retraining; released weights join
the pool the same way (:func:`ddlib.protocols.released.pool_checkpoints`). Results that are not
trained models (an attack's robust accuracy on a pooled model, say) are cached the same way by
:meth:`Cell.cached_result`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pandas as pd
import torch

from ddlib.specs import units
from ddlib.specs.units import shown_frame
from ddlib.data.datasets import Dataset, load_dataset, reduce_dataset, stratified_split
from ddlib.data.digest import data_identity, tensor_digest
from ddlib.specs.keys import definition
from ddlib.engine.device import configure_threads, forget_compiled, resolve_device, run_precision
from ddlib.scores.metrics import mean_std, near_chance
from ddlib.data.distilled import DistilledSet, grid_layout, image_grid
from ddlib.protocols import beyond
from ddlib.protocols.leakage import strict_from_env
from ddlib.protocols.placement import NON_GROUP_PARAMS, cell_tags, group_params, run_name  # noqa: F401 (re-exported)
from ddlib.store.tracking import (TAG, Tracker, as_stored, config_hash, default_tags, file_lock, init_store, owner_tag,
                            release_store_locks, run_metrics)
from ddlib.engine.recipe import Recipe, epochs_trained
from ddlib.engine.train import AugmentHook, EpochProgress, LossHook, Objective, hook_name, train_and_test
from ddlib.engine.test_pass import forget_test_batches, test_trained
from ddlib.store.progress import ProgressWriter, writer_from_env
from ddlib.run.calibrate import epoch_unit

__all__ = ["Cell", "TrainedModel", "group_params", "cell_tags", "device_name"]

MODEL_ARTIFACT = "model.pt"
CONFUSION_ARTIFACT = "confusion.json"  # an evaluation's test counts, [true class][predicted class]
MODEL_STORED_TAG = "ddlib.model_stored"
TRAIN_MODE_TAG = "ddlib.train_mode"  # sequential / batched: how the loop ran (not part of the key)
RESULT_KEY_TAG = "ddlib.result_key"
CLASSES_TAG = "ddlib.num_classes"  # the cell's class count: what "near chance" means (leaderboards' sanity column)
SANITY_TAG = "ddlib.sanity"  # set where an accuracy that must be well above chance is not (metrics.near_chance)
TRAININGS_TAG = "ddlib.trainings"  # what the cell trained and reused, per role (JSON): the dry run's calibration
PRECISION_TAG = "ddlib.precision"  # the precisions the cell's trainings ran in (fp32, bf16): Recipe.precision resolved
# Every cell of a dataset that holds out a validation split holds out the same one (VALIDATION_SEED,
# whatever the preset or method): one real-data pool per (dataset, val_fraction), identified by this tag.
POOL_TAG = "ddlib.pool"
SET_DIGEST_TAG = "ddlib.set_digest"  # the obtained set's content (ddlib.protocols.common.obtain): in every row key
# The seed of every cell's validation split: the real-data pool depends on the dataset and the
# fraction only, never on the preset or method of a cell.
VALIDATION_SEED = 0


def role_stem(role: str) -> str:
    """A role with its lr candidate starred: ``rdm_hard-lr0.01-val`` -> ``rdm_hard-lr*-val``."""
    return re.sub(r"-lr[0-9.e+-]*?(?=-[a-z_]|$)", "-lr*", role)


def device_name(device: torch.device) -> str:
    """What a timing ran on: the GPU's name, or the CPU's architecture and intra-op thread count."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    import platform

    return f"cpu ({platform.machine()}) x{torch.get_num_threads()} threads"


@dataclass
class TrainedModel:
    """One trained model's test result (fresh or reused from an earlier run)."""

    role: str
    seed: int
    accuracy: float
    train_seconds: float
    eval_seconds: float
    run_id: str
    reused: bool
    model: torch.nn.Module | None = field(default=None, repr=False)  # with keep_models=True, in eval mode
    trained: Any = field(default=None, repr=False)  # hold_models=True: the engine's SeedResult, model kept in memory


@dataclass
class Cell:
    protocol: str
    params: dict
    tracker: Tracker
    run_id: str
    owns_run: bool
    device: torch.device
    dataset: Dataset
    progress: bool = True
    validation: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)  # held out of train
    unsplit: Dataset | None = field(default=None, repr=False)  # the data before the validation split
    closed: bool = field(default=False, repr=False)
    cache: dict = field(default_factory=dict, repr=False)  # per-cell reuse (teachers, ZCA)
    flags: list = field(default_factory=list, repr=False)  # what the numbers must be read with (flag())
    strict: bool = field(default=False, repr=False)  # refuse a set holding test images (protocols.leakage)
    progress_writer: ProgressWriter | None = field(default=None, repr=False)  # for the runner's console (ddlib.store.progress)

    # ------------------------------------------------------------------ opening and closing

    @classmethod
    def open(cls, protocol: str, params: dict, run_id: str | None = None, experiment: str | None = None,
             progress: bool = True) -> "Cell":
        """Attach to the batch runner's parent run (``run_id``), or start one when run by hand.

        A protocol with a ``val_fraction`` parameter works on a real-data pool: the training set
        without a class-stratified validation split (drawn with :data:`VALIDATION_SEED`, the same in
        every cell of the dataset whatever its preset or method), on which lr searches and proxies are
        scored; the random subsets and teachers come from the pool. :attr:`unsplit` keeps the whole
        set (DD-Ranking's full-data reference trains on it, the ZCA is fitted on it). The pool's
        identity is tagged (:data:`POOL_TAG`)."""
        configure_threads()
        forget_compiled()  # a cell compiles as in a fresh process (recompile_limit counts per process)
        forget_test_batches()  # and tests in the batches a fresh process would (CUDA's halvings)
        init_store()
        tracker = Tracker(experiment or protocol)
        device = resolve_device(params.get("device", "auto"))
        owns = run_id is None
        if owns:  # run by hand: this process owns the run (a later grid run marks it KILLED once it is gone)
            run_id = tracker.start_run(run_name(protocol, params), params=params,
                                       tags={**default_tags(protocol), **cell_tags(protocol, params),
                                             TAG["owner"]: owner_tag()})
        tracker.set_tags(run_id, {TAG["device"]: str(device), TAG["device_name"]: device_name(device)})
        cell = cls(protocol, dict(params), tracker, run_id, owns, device, None, progress)  # type: ignore[arg-type]
        cell.strict = strict_from_env()
        cell.progress_writer = writer_from_env(run_name(protocol, params))
        beyond.start_system_metrics(cell)
        with cell.guard():
            tracker.log_dict(run_id, params, "config.json")
            cell.dataset = reduce_dataset(load_dataset(params["dataset"], params.get("data_root")),
                                          params.get("train_per_class"), params.get("test_size"))
            tracker.set_tags(run_id, {TAG["data_source"]: cell.dataset.source, TAG["data"]: cell.dataset.label,
                                      CLASSES_TAG: str(cell.dataset.num_classes)})
            if cell.dataset.extra.get("reduced"):
                tracker.set_tags(run_id, {"ddlib.reduced_data": cell.dataset.source})
            cell.unsplit = cell.dataset
            if "val_fraction" in params:
                cell._hold_out(params["val_fraction"])
            if cell.progress_writer is not None:  # the cell's own remaining time on the runner's line
                from ddlib.run.work import running_plan

                cell.progress_writer.plan(running_plan(protocol, cell.params, device))
        return cell

    def _hold_out(self, fraction: float | None) -> None:
        from ddlib.protocols.teachers import dataset_identity

        if fraction:
            self.dataset, self.validation = hold_out_validation(self.dataset, fraction)
        held = len(self.validation[1]) if self.validation is not None else 0
        split = (f"{held} held out for validation (val_fraction {fraction:g}, seed {VALIDATION_SEED})"
                 if held else "no validation split")
        self.tracker.set_tags(self.run_id, {POOL_TAG: f"{self.dataset.name}: {len(self.dataset.train_labels)} training "
                                                      f"images, {split}; content "
                                                      f"{dataset_identity(self.dataset)['train'][:16]}"})

    def zca(self):
        """The dataset's one ZCA whitening (:func:`ddlib.engine.augment.fit_zca`) on the whole training
        set before the validation split, as MTT, DATM and DD-Ranking fit theirs: it inverts sets stored
        ZCA-whitened and whitens every training, validation and test tensor of a preset with ``zca:
        true``. Fitted once per machine: the fit (13-14 s for CIFAR-10 on 2 cores, an SVD of the
        3072 x 3072 covariance) is cached under ``$DDLIB_CACHE/features`` by the training images'
        content, the fit's code revision and chunk size and the machine
        (:func:`ddlib.methods.select.kernel_identity`), so the
        cells of a grid load the very tensors a fit gives instead of fitting again."""
        from ddlib.engine.augment import ZCA, ZCA_NAME, fit_zca
        from ddlib.engine.augment.zca import FIT_BATCH, FIT_REVISION
        from ddlib.methods.select import cache_path, cache_store, kernel_identity

        if "zca" not in self.cache:
            ds = self.unsplit if self.unsplit is not None else self.dataset
            identity = {"zca": ZCA_NAME, "revision": FIT_REVISION, "data": tensor_digest(ds.train_images), "batch": FIT_BATCH,
                        **kernel_identity(self.device)}
            path = cache_path(ds, "zca", identity)
            zca = None
            if path.is_file():
                try:
                    zca = ZCA.from_state(torch.load(path, map_location="cpu", weights_only=True), self.device)
                except Exception:  # noqa: BLE001 - a damaged cache entry: fit again
                    zca = None
            if zca is None:
                zca = fit_zca(ds.train_images, device=self.device)
                cache_store(path, {**zca.state(), "identity": identity})
            # the fit depends on the training images: the keys of what it whitens hold its content
            zca.fit_digest = tensor_digest(*(v for v in zca.state().values() if isinstance(v, torch.Tensor)))
            self.cache["zca"] = zca
        return self.cache["zca"]

    def definition(self) -> dict:
        """The definition revision every reuse key of this cell holds (:func:`ddlib.specs.keys.definition`)."""
        return definition(self.protocol)

    def scored_on(self, split: str) -> dict:
        """What a model tested on ``split`` (``test`` or ``val``) is scored against, by content: the
        dataset's identity (name, normalisation, classes) and the digest of the split's images and labels."""
        if split == "val":
            if self.validation is None:
                raise ValueError("this cell has no validation split (val_fraction is not set)")
            images, labels = self.validation
        elif split == "test":
            images, labels = self.dataset.test_images, self.dataset.test_labels
        else:
            raise ValueError(f"eval_split must be 'test' or 'val', got {split!r}")
        data = {k: v for k, v in data_identity(self.dataset).items() if k not in ("train", "test")}
        return {"split": split, "data": data, "content": tensor_digest(images, labels)}

    def _note_precision(self, precision: str) -> None:
        """Tag ``ddlib.precision`` on the cell run: the precisions its trainings ran in (``auto``, the
        default, is bf16 where the device computes it natively: a deviation from the papers' fp32)."""
        used = self.cache.setdefault("precisions", set())
        if precision not in used:
            used.add(precision)
            self.tracker.set_tags(self.run_id, {PRECISION_TAG: ", ".join(sorted(used))})

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Mark the run FAILED (never a result) if the body raises, then re-raise."""
        try:
            yield
        except BaseException as error:
            release_store_locks(error)  # an interrupt inside a store read would lock the store for the writes below
            beyond.stop_system_metrics(self)
            if self.owns_run and not self.closed:
                self.tracker.fail_run(self.run_id, error)
                self.closed = True
            raise

    def close(self, metrics: dict[str, float] | None = None) -> None:
        """Log the cell's summary metrics and what it trained (:data:`TRAININGS_TAG`, metrics
        ``models_trained``, ``models_reused``, ``image_epochs_trained``); end the run if this cell
        started it."""
        beyond.close(self)
        trainings = self.cache.get("trainings")
        if trainings:
            self.tracker.set_tags(self.run_id, {TRAININGS_TAG: json.dumps(trainings, sort_keys=True)})
            metrics = {**(metrics or {}),
                       "models_trained": sum(t["trained"] for t in trainings.values()),
                       "models_reused": sum(t["models"] - t["trained"] for t in trainings.values()),
                       "image_epochs_trained": sum(t["trained_image_epochs"] for t in trainings.values())}
        if metrics:
            self.tracker.log_metrics(self.run_id, metrics)
        if self.owns_run and not self.closed:
            self.tracker.end_run(self.run_id)
        self.closed = True

    # ------------------------------------------------------------------ logging helpers

    def log_set(self, distilled: DistilledSet, name: str) -> Path:
        """Log a PNG grid of a set's images (and its provenance) to the cell's run."""
        with tempfile.TemporaryDirectory() as tmp:
            path = image_grid(distilled, Path(tmp) / f"{name}.png")
            self.tracker.log_artifact(self.run_id, path, "images")
            provenance = {k: v for k, v in distilled.provenance.items() if k != "indices"}
            self.tracker.log_dict(self.run_id, {"method": distilled.method, "source": distilled.source,
                                                "ipc": distilled.ipc, "n": len(distilled), **provenance,
                                                "grid": grid_layout(distilled),  # a report labels its rows
                                                "classes": list(self.dataset.class_names)[:distilled.num_classes]},
                                  f"sets/{name}.json")
        return path

    def record_per_seed(self, rows: Sequence[dict]) -> tuple[pd.DataFrame, dict[str, float]]:
        """Log per-seed values as metric histories ``per_seed/<value>`` (step = seed, so summaries can
        pool seeds over runs) and their mean and std over seeds as run metrics ``<value>_mean`` and
        ``<value>_std``, the figures MLflow's run page shows; return both in their shown units
        (:mod:`ddlib.specs.units`: accuracies in %, ...), as every other surface shows them. ``rows`` hold
        computed values (fractions)."""
        self.tracker.log_per_seed(self.run_id, rows)
        computed = pd.DataFrame(list(rows))
        summary = {}
        for col in computed.columns.drop("seed"):
            summary[f"{col}_mean"], summary[f"{col}_std"] = mean_std(computed[col])
        self.tracker.log_metrics(self.run_id, summary)
        self.check_sanity(summary)
        return shown_frame(computed), {k: units.shown(k, v) for k, v in summary.items()}

    def check_sanity(self, summary: dict[str, float]) -> list[str]:
        """Flag (a warning in the notebook, tag ``ddlib.sanity`` on the run) a full-data reference or
        distilled-set accuracy near chance: a smoke run whose scores must not be read as results."""
        means = {k[: -len("_mean")]: v for k, v in summary.items() if k.endswith("_mean")}
        notes = near_chance(means, self.dataset.num_classes)
        if notes:
            self.flag(f"{'; '.join(notes)}: the scores of this cell are not a result (too few epochs or images?)")
        return notes

    def flag(self, note: str) -> None:
        """Something the cell's numbers must be read with: a warning in the notebook, and a line of
        the run's ``ddlib.sanity`` tag, which the runner and ``ddlib score`` print on the console."""
        warnings.warn(f"sanity: {note}", UserWarning, stacklevel=3)
        self.flags.append(note)
        self.tracker.set_tags(self.run_id, {SANITY_TAG: " | ".join(self.flags)[:5000]})

    # ------------------------------------------------------------------ trained evaluations

    def train_eval(
        self,
        role: str | Callable[[float], str],
        images: torch.Tensor,
        targets: torch.Tensor,
        recipe: Recipe,
        seeds: Sequence[int],
        *,
        lrs: Sequence[float] | None = None,
        model: str | None = None,
        augment: AugmentHook | None = None,
        loss: LossHook | None = None,
        objective: Objective | None = None,
        preprocess: torch.nn.Module | None = None,
        model_kwargs: dict | None = None,
        eval_split: str = "test",
        keep_models: bool = False,
        hold_models: bool = False,
        adopt: dict | None = None,
        unless_busy: bool = False,
    ) -> list[TrainedModel] | None:
        """Train and test one model per seed, reusing any identical evaluation already FINISHED.

        ``eval_split="val"`` scores on the cell's held-out validation split (learning-rate search).
        ``objective`` (adversarial training) replaces the loss. Every hook carries its canonical name
        (``.name``: :func:`ddlib.engine.train.hook_name`), which is part of the reuse key: the key is
        derived from the hook itself, never from a name passed beside it.
        ``keep_models=True`` returns each seed's model (eval mode, on the cell's device) and stores
        its weights in MLflow, where later cells find them instead of retraining. ``hold_models=True``
        keeps each model trained here in memory only (``TrainedModel.trained``: an lr search's
        candidates). ``adopt`` ({seed: such a held ``SeedResult``}): a seed whose evaluation is not stored
        yet tests that model on ``eval_split`` instead of training one again (an lr search's model of the
        chosen lr is the model a training at that lr gives: same seed, data order and recipe; its run
        says the search's train mode).

        ``lrs`` (one per seed; a seed may repeat) trains run i at ``lrs[i]``, keyed as a call with
        that lr in the recipe; ``role`` may then be a function of the lr. The runs of one seed train
        in lockstep (one batch draw and one teacher forward per step for all: an lr search).

        ``unless_busy=True`` returns None at once, doing nothing, while another cell trains the same
        models (the caller does its own work first and asks again, then waiting for them)."""
        model = model or self.params["model"]
        ds = self.dataset
        # "auto" precision means bf16 on some devices and fp32 on others: key what it resolves to here
        recipe = replace(recipe, precision=run_precision(recipe, self.device, objective is not None))
        self._note_precision(recipe.precision)
        if eval_split == "val":
            if self.validation is None:
                raise ValueError("this cell has no validation split (val_fraction is not set)")
            eval_images, eval_labels = self.validation
        elif eval_split == "test":
            eval_images, eval_labels = ds.test_images, ds.test_labels
        else:
            raise ValueError(f"eval_split must be 'test' or 'val', got {eval_split!r}")
        seeds = [int(s) for s in seeds]
        lrs = [float(recipe.lr)] * len(seeds) if lrs is None else [float(v) for v in lrs]
        if len(lrs) != len(seeds):
            raise ValueError(f"{len(seeds)} seeds but {len(lrs)} learning rates (give one per seed)")
        role_of = role if callable(role) else (lambda lr: role)
        recipes = {lr: recipe if lr == recipe.lr else replace(recipe, lr=lr) for lr in lrs}
        identity = {
            "train": tensor_digest(images, targets), "test": self.scored_on(eval_split),
            "model": model, "model_kwargs": model_kwargs or {}, "recipe": recipe.to_dict(),
            "augment": hook_name(augment, "none"), "loss": hook_name(loss, "ce"),
            "preprocess": hook_name(preprocess, "none"), "definition": self.definition(),
        }
        if fit_digest(preprocess) is not None:  # a fitted preprocessing (ZCA) is keyed by its content
            identity["preprocess_fit"] = fit_digest(preprocess)
        if objective is not None:  # only when used, so earlier keys (and their runs) stay valid
            identity["objective"] = hook_name(objective, "none")
        identities = {lr: {**identity, "recipe": r.to_dict()} for lr, r in recipes.items()}
        group = config_hash([identities[lr] for lr in dict.fromkeys(lrs)])
        runs = list(zip(seeds, lrs))
        keys = [config_hash({**identities[lr], "seed": seed}) for seed, lr in runs]
        cost = beyond.model_cost(self, model, model_kwargs, images, targets, eval_labels, recipe)
        unit = None if self.progress_writer is None else epoch_unit(  # one model-epoch's predicted time (ddlib.store.progress)
            model, images.shape[1:], ds.num_classes, len(targets), recipe, hook_name(augment, "none"), model_kwargs,
            hook_name(objective, "standard"), self.device)

        def inputs(i: int) -> list:
            return beyond.datasets(self, role_of(runs[i][1]), images, targets, identity["train"], eval_images, eval_labels,
                                   eval_split)

        def waiting() -> None:
            if self.progress_writer is not None:
                self.progress_writer.waiting(role_of(lrs[0]), "waiting: another cell trains the same models (then reused)")

        with self.guard(), file_lock(f"eval-{group}", on_wait=waiting, wait=not unless_busy) as held:
            if not held:
                return None
            found: dict[int, TrainedModel] = {}
            scores: dict[int, tuple[dict, list | None]] = {}  # calibration and fairness, reliability sums
            for i, ((seed, lr), key) in enumerate(zip(runs, keys)):
                wanted = {TAG["eval_key"]: key, **({MODEL_STORED_TAG: "true"} if keep_models else {})}
                stored = self.tracker.find_finished(wanted)
                if stored:
                    m = run_metrics(stored[0])
                    net = self._load_model(stored[0].info.run_id, model, model_kwargs) if keep_models else None
                    found[i] = TrainedModel(role_of(lr), seed, m["test_accuracy"], m.get("train_seconds", float("nan")),
                                          m.get("eval_seconds", float("nan")), stored[0].info.run_id, True, net)
                    scores[i] = ({k: m.get(k, float("nan")) for k in beyond.SCORES}, None)
            missing = [i for i in range(len(runs)) if i not in found]
            held = {i: adopt[runs[i][0]] for i in missing if runs[i][0] in (adopt or {})}  # trained elsewhere here
            for i, (_seed, lr) in enumerate(runs):
                self._count_training(role_of(lr), len(targets) * epochs_trained(recipes[lr]), i in missing and i not in held)
            if unit is not None:  # found in the store: work the cell's estimate counted and it will not do
                self.progress_writer.skipped(unit * epochs_trained(recipe) * (len(runs) - len(missing)))
            if missing:
                train = [i for i in missing if i not in held]
                results = dict(zip(train, train_and_test(
                    model, images, targets, eval_images, eval_labels, num_classes=ds.num_classes,
                    mean=ds.mean, std=ds.std, recipe=recipe, seeds=[runs[i][0] for i in train],
                    lrs=[runs[i][1] for i in train], augment=augment, loss=loss,
                    objective=objective, preprocess=preprocess, device=self.device, model_kwargs=model_kwargs,
                    progress=self.progress, desc=role_of(runs[missing[0]][1]), keep_models=keep_models or hold_models,
                    on_epoch=self._on_epoch(role_of, unit),
                ) if train else []))
                results.update({i: test_trained(t, model, eval_images, eval_labels, num_classes=ds.num_classes, mean=ds.mean,
                                                std=ds.std, recipe=recipes[runs[i][1]], preprocess=preprocess,
                                                device=self.device, model_kwargs=model_kwargs) for i, t in held.items()})
                results = [results[i] for i in missing]
                for i, r in zip(missing, results):
                    lr = runs[i][1]
                    run_id, scores[i] = self._record_eval(role_of(lr), keys[i], r, recipes[lr], identity, len(targets),
                                                          model, model_kwargs, objective, eval_split, cost, inputs(i))
                    if keep_models:
                        self._store_model(run_id, r.model)
                    net = r.model.eval() if keep_models else None
                    accuracy = as_stored({"test_accuracy": r.test_accuracy})["test_accuracy"]  # as a reuse reads it
                    found[i] = TrainedModel(role_of(lr), r.seed, accuracy, r.train_seconds, r.eval_seconds,
                                          run_id, False, net, r if hold_models else None)
            for i, t in found.items():
                if eval_split == "test":
                    times = {"train_seconds": t.train_seconds, "eval_seconds": t.eval_seconds}
                    beyond.note(self, t.role, t.seed, {**scores[i][0], **cost, **times}, scores[i][1], inputs(i))
        return [found[i] for i in range(len(runs))]

    def _record_eval(self, role: str, key: str, r, recipe: Recipe, identity: dict, train_size: int, model: str,
                     model_kwargs, objective, eval_split: str, cost: dict, inputs: list) -> tuple[str, tuple]:
        """One trained model's evaluation run (a ``SeedResult`` ``r``): params, tags, metrics, its loss
        series and confusion matrix. Returns its run id and its (scores, calibration sums)."""
        ds = self.dataset
        run_id = self.tracker.start_run(
            f"{role}-s{r.seed}",  # nested under the cell's run in the MLflow UI
            params={"role": role, "seed": r.seed, "model": model, "model_kwargs": model_kwargs or {},
                    "recipe": recipe.to_dict(), "augment": identity["augment"], "loss": identity["loss"],
                    "objective": hook_name(objective, "none"), "preprocess": identity["preprocess"],
                    "eval_split": eval_split, "dataset": ds.name, "train_size": train_size,
                    "train_digest": identity["train"]},
            tags={**default_tags(self.protocol, str(self.device)), TAG["kind"]: "eval", TAG["role"]: role,
                  TAG["eval_key"]: key, TRAIN_MODE_TAG: r.mode},
            parent_run_id=self.run_id,
        )
        scores = (as_stored(beyond.evaluation_scores(r.confusion, r.calibration)), r.calibration)  # as a reuse reads them
        self.tracker.log_metrics(run_id, {"test_accuracy": r.test_accuracy, "train_seconds": r.train_seconds,
                                          "eval_seconds": r.eval_seconds, **scores[0], **cost})
        beyond.log_evaluation(self, run_id, r.calibration, inputs)
        self.tracker.log_series(run_id, "train_loss", r.epoch_losses)
        if r.confusion is not None:  # for the report card's confusion matrix
            self.tracker.log_dict(run_id, {"classes": list(ds.class_names), "matrix": r.confusion}, CONFUSION_ARTIFACT)
        self.tracker.end_run(run_id)
        return run_id, scores

    def _count_training(self, role: str, image_epochs: int, trained: bool) -> None:
        """One model of ``role`` (lr candidates counted under one stem, ``-lr*``): trained or reused."""
        stem = role_stem(role)
        entry = self.cache.setdefault("trainings", {}).setdefault(
            stem, {"models": 0, "trained": 0, "image_epochs": 0, "trained_image_epochs": 0})
        entry["models"] += 1
        entry["image_epochs"] += image_epochs
        if trained:
            entry["trained"] += 1
            entry["trained_image_epochs"] += image_epochs

    def _on_epoch(self, role_of: Callable[[float], str], unit: float | None = None) -> Callable[[EpochProgress], None] | None:
        """The training loop's progress to the runner (the role of the models training now: one name,
        or an lr search's common stem), where a runner listens; ``unit``: one model-epoch's predicted time."""
        writer = self.progress_writer
        if writer is None:
            return None

        def report(progress: EpochProgress) -> None:
            names = sorted({role_of(lr) for _, lr in progress.runs})
            name = names[0] if len(names) == 1 else os.path.commonprefix(names).rstrip("0123456789.-e") + " search"
            writer(name, progress, unit)

        return report

    def _store_model(self, run_id: str, model: torch.nn.Module) -> None:
        """Log a trained model's weights (a plain state_dict: loadable with ``weights_only=True``)."""
        with tempfile.TemporaryDirectory(prefix="ddlib-model-") as tmp:
            file = Path(tmp) / MODEL_ARTIFACT
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, file)
            self.tracker.log_artifact(run_id, file)
        self.tracker.set_tags(run_id, {MODEL_STORED_TAG: "true"})

    def _load_model(self, run_id: str, model: str, model_kwargs: dict | None) -> torch.nn.Module:
        """A pooled model: the registry's ``model`` for this cell's data with the run's weights (eval mode)."""
        from ddlib.protocols.teachers import _quiet_downloads, load_teacher

        with tempfile.TemporaryDirectory(prefix="ddlib-model-") as tmp, _quiet_downloads():
            local = self.tracker.client.download_artifacts(run_id, MODEL_ARTIFACT, tmp)
            return load_teacher(model, self.dataset, local, device=self.device, model_kwargs=model_kwargs)

    def cached_result(self, role: str, identity: dict, compute: Callable[[], dict[str, float]],
                      params: dict | None = None) -> tuple[dict[str, float], bool]:
        """Metrics of a deterministic computation (an attack on a pooled model, say), computed once.

        ``identity`` must say everything the result depends on (the model's run id, the attack and
        its parameters, the test images, the seed); the cell's definition revision is added to it.
        The first call runs ``compute()`` and logs its metrics as a child run tagged with the
        identity's hash; later calls, in any cell or process, return those metrics. Returns (metrics, reused)."""
        key = config_hash({**identity, "definition": self.definition()})
        with self.guard(), file_lock(f"result-{key}"):
            runs = self.tracker.find_finished({RESULT_KEY_TAG: key})
            if runs:
                return run_metrics(runs[0]), True
            metrics = compute()
            if not metrics:
                raise ValueError(f"{role}: the computation returned no result; nothing is cached")
            run_id = self.tracker.start_run(
                role, params={"role": role, **(params or {})},
                tags={**default_tags(self.protocol, str(self.device)), TAG["kind"]: "result", TAG["role"]: role,
                      RESULT_KEY_TAG: key},
                parent_run_id=self.run_id)
            self.tracker.log_metrics(run_id, metrics)
            self.tracker.end_run(run_id)
        return as_stored(metrics), False  # the values a later call reads back


def fit_digest(hook) -> str | None:
    """The content digest of a hook fitted on data (a ZCA's ``fit_digest``, set by :meth:`Cell.zca`), or None."""
    return getattr(hook, "fit_digest", None)


def hold_out_validation(dataset: Dataset, fraction: float, seed: int = VALIDATION_SEED) -> tuple[Dataset, tuple]:
    """Split a class-stratified validation set off the training set, so that choices such as the
    learning rate are never made on the test set; everything else in the cell that is chosen or
    drawn (random baseline, teachers) then uses only the remaining training images. ``Cell.unsplit``
    keeps the whole set: DD-Ranking's full-data reference trains on it, and the ZCA whitening is
    fitted on it, as the peers fit theirs (:meth:`Cell.zca`)."""
    train_idx, val_idx = stratified_split(dataset.train_labels.numpy(), fraction, seed)
    train_idx, val_idx = torch.from_numpy(train_idx), torch.from_numpy(val_idx)
    kept = replace(dataset, train_images=dataset.train_images[train_idx], train_labels=dataset.train_labels[train_idx],
                   source=f"{dataset.source} [validation {len(val_idx)} held out, seed {seed}]")
    return kept, (dataset.train_images[val_idx], dataset.train_labels[val_idx])
