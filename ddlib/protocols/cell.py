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
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pandas as pd
import torch

from ddlib.specs import units
from ddlib.specs.units import shown_frame
from ddlib.data.datasets import Dataset, load_dataset, reduce_dataset, stratified_split
from ddlib.data.digest import data_identity, tensor_digest
from ddlib.protocols import definition
from ddlib.engine.device import configure_threads, forget_compiled, resolve_device, run_precision
from ddlib.scores.metrics import mean_std, near_chance
from ddlib.data.distilled import DistilledSet, grid_layout, image_grid
from ddlib.protocols import beyond
from ddlib.protocols.leakage import strict_from_env
from ddlib.protocols.placement import NON_GROUP_PARAMS, cell_tags, group_params, run_name  # noqa: F401 (re-exported)
from ddlib.store.hashing import config_hash
from ddlib.store.liveness import owner_tag
from ddlib.store.locks import file_lock, release_store_locks
from ddlib.store.provenance import default_tags
from ddlib.store.tags import CLASSES_TAG, PRECISION_TAG, SET_DIGEST_TAG, TAG  # noqa: F401  (SET_DIGEST_TAG: tests)
from ddlib.store.tracking import Tracker, as_stored, init_store, run_metrics
from ddlib.engine.recipe import Recipe, epochs_trained
from ddlib.engine.train import hook_name, train_and_test
from ddlib.engine.test_pass import forget_test_batches, test_trained
from ddlib.store.progress import ProgressWriter, writer_from_env
from ddlib.protocols.evaluation_runs import (CONFUSION_ARTIFACT, MODEL_ARTIFACT, MODEL_STORED_TAG,  # noqa: F401 (re-exported)
                                             RESULT_KEY_TAG, TRAIN_MODE_TAG, Training, TrainedModel, cached_result,
                                             count_training, epoch_reporter, fit_digest, load_model, record_eval,
                                             role_stem, store_model)
from ddlib.protocols.pace import epoch_unit, planned_seconds

__all__ = ["Cell", "Training", "TrainedModel", "group_params", "cell_tags", "device_name"]

SANITY_TAG = "ddlib.sanity"  # set where an accuracy that must be well above chance is not (metrics.near_chance)
TRAININGS_TAG = "ddlib.trainings"  # what the cell trained and reused, per role (JSON): the dry run's calibration
# Every cell of a dataset that holds out a validation split holds out the same one (VALIDATION_SEED,
# whatever the preset or method): one real-data pool per (dataset, val_fraction), identified by this tag.
POOL_TAG = "ddlib.pool"
# The seed of every cell's validation split: the real-data pool depends on the dataset and the
# fraction only, never on the preset or method of a cell.
VALIDATION_SEED = 0


def device_name(device: torch.device) -> str:
    """What a timing ran on: the GPU's name, or the CPU's architecture and intra-op thread count."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    import platform

    return f"cpu ({platform.machine()}) x{torch.get_num_threads()} threads"


@dataclass
class Cell:
    """One grid cell: its MLflow run, its resolved configuration, its data, and the models it trains or reuses."""

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
    # the protocol's configuration, resolved and checked once by its open_cell before evaluate runs (a frozen
    # object: ddlib.protocols.side_plan.SidesPlan for the DD-Ranking protocols); None where there is none
    resolved: object = field(default=None, repr=False)

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
                cell.progress_writer.plan(planned_seconds())  # the runner's plan of its work (ddlib.protocols.pace)
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

    def split_tensors(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The images and labels a model is tested on: ``test`` or ``val`` (the held-out validation split)."""
        if split == "val":
            if self.validation is None:
                raise ValueError("this cell has no validation split (val_fraction is not set)")
            return self.validation
        if split == "test":
            return self.dataset.test_images, self.dataset.test_labels
        raise ValueError(f"eval_split must be 'test' or 'val', got {split!r}")

    def scored_on(self, split: str) -> dict:
        """What a model tested on ``split`` (``test`` or ``val``) is scored against, by content: the
        dataset's identity (name, normalisation, classes) and the digest of the split's images and labels."""
        images, labels = self.split_tensors(split)
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

    def train_eval(self, role: str | Callable[[float], str], images: torch.Tensor, targets: torch.Tensor,
                   recipe: Recipe, seeds: Sequence[int], **options) -> list[TrainedModel] | None:
        """:meth:`train` of a :class:`~ddlib.protocols.evaluation_runs.Training` (``options``: its other
        fields: ``lrs``, ``model``, ``augment``, ``loss``, ``objective``, ``preprocess``, ``eval_split``, ...)."""
        return self.train(Training(role, images, targets, recipe, seeds, **options))

    def train(self, t: Training) -> list[TrainedModel] | None:
        """Train and test one model per seed of ``t``, reusing any identical evaluation already FINISHED.

        ``eval_split="val"`` scores on the cell's held-out validation split (learning-rate search).
        ``objective`` (adversarial training) replaces the loss. Every hook carries its canonical name
        (``.name``: :func:`ddlib.engine.train.hook_name`), which is part of the reuse key: the key is
        derived from the hook itself, never from a name passed beside it. ``keep_models=True`` returns
        each seed's model (eval mode, on the cell's device) and stores its weights in MLflow, where later
        cells find them instead of retraining. An adopted model (an lr search's model of the chosen lr is
        the model a training at that lr gives: same seed, data order and recipe) is tested, not trained
        again; its run says the search's train mode. The runs of one seed train in lockstep (one batch
        draw and one teacher forward per step for all: an lr search). ``unless_busy=True`` returns None
        at once, doing nothing, while another cell trains the same models (the caller does its own work
        first and asks again, then waiting for them)."""
        model, ds, images, targets = t.model or self.params["model"], self.dataset, t.images, t.targets
        # "auto" precision means bf16 on some devices and fp32 on others: key what it resolves to here
        recipe = replace(t.recipe, precision=run_precision(t.recipe, self.device, t.objective is not None))
        self._note_precision(recipe.precision)
        eval_images, eval_labels = self.split_tensors(t.eval_split)
        seeds = [int(s) for s in t.seeds]
        lrs = [float(recipe.lr)] * len(seeds) if t.lrs is None else [float(v) for v in t.lrs]
        if len(lrs) != len(seeds):
            raise ValueError(f"{len(seeds)} seeds but {len(lrs)} learning rates (give one per seed)")
        role_of = t.role_of
        recipes = {lr: recipe if lr == recipe.lr else replace(recipe, lr=lr) for lr in lrs}
        identity = {
            "train": tensor_digest(images, targets), "test": self.scored_on(t.eval_split),
            "model": model, "model_kwargs": t.model_kwargs or {}, "recipe": recipe.to_dict(),
            "augment": hook_name(t.augment, "none"), "loss": hook_name(t.loss, "ce"),
            "preprocess": hook_name(t.preprocess, "none"), "definition": self.definition(),
        }
        if fit_digest(t.preprocess) is not None:  # a fitted preprocessing (ZCA) is keyed by its content
            identity["preprocess_fit"] = fit_digest(t.preprocess)
        if t.objective is not None:  # only when used, so earlier keys (and their runs) stay valid
            identity["objective"] = hook_name(t.objective, "none")
        identities = {lr: {**identity, "recipe": r.to_dict()} for lr, r in recipes.items()}
        group = config_hash([identities[lr] for lr in dict.fromkeys(lrs)])
        runs = list(zip(seeds, lrs))
        keys = [config_hash({**identities[lr], "seed": seed}) for seed, lr in runs]
        cost = beyond.model_cost(self, model, t.model_kwargs, images, targets, eval_labels, recipe)
        unit = None if self.progress_writer is None else epoch_unit(  # one model-epoch's predicted time (ddlib.store.progress)
            model, images.shape[1:], ds.num_classes, len(targets), recipe, hook_name(t.augment, "none"), t.model_kwargs,
            hook_name(t.objective, "standard"))

        def inputs(i: int) -> list:
            return beyond.datasets(self, role_of(runs[i][1]), images, targets, identity["train"], eval_images, eval_labels,
                                   t.eval_split)

        def waiting() -> None:
            if self.progress_writer is not None:
                self.progress_writer.waiting(role_of(lrs[0]), "waiting: another cell trains the same models (then reused)")

        with self.guard(), file_lock(f"eval-{group}", on_wait=waiting, wait=not t.unless_busy) as held:
            if not held:
                return None
            found: dict[int, TrainedModel] = {}
            scores: dict[int, tuple[dict, list | None]] = {}  # calibration and fairness, reliability sums
            for i, ((seed, lr), key) in enumerate(zip(runs, keys)):
                wanted = {TAG["eval_key"]: key, **({MODEL_STORED_TAG: "true"} if t.keep_models else {})}
                stored = self.tracker.find_finished(wanted)
                if stored:
                    m = run_metrics(stored[0])
                    net = self._load_model(stored[0].info.run_id, model, t.model_kwargs) if t.keep_models else None
                    found[i] = TrainedModel(role_of(lr), seed, m["test_accuracy"], m.get("train_seconds", float("nan")),
                                            m.get("eval_seconds", float("nan")), stored[0].info.run_id, True, net)
                    scores[i] = ({k: m.get(k, float("nan")) for k in beyond.SCORES}, None)
            missing = [i for i in range(len(runs)) if i not in found]
            held = {i: t.adopt[runs[i][0]] for i in missing if runs[i][0] in (t.adopt or {})}  # trained elsewhere here
            for i, (_seed, lr) in enumerate(runs):
                count_training(self.cache, role_of(lr), len(targets) * epochs_trained(recipes[lr]),
                               i in missing and i not in held)
            if unit is not None:  # found in the store: work the cell's estimate counted and it will not do
                self.progress_writer.skipped(unit * epochs_trained(recipe) * (len(runs) - len(missing)))
            if missing:
                train = [i for i in missing if i not in held]
                results = dict(zip(train, train_and_test(
                    model, images, targets, eval_images, eval_labels, num_classes=ds.num_classes,
                    mean=ds.mean, std=ds.std, recipe=recipe, seeds=[runs[i][0] for i in train],
                    lrs=[runs[i][1] for i in train], augment=t.augment, loss=t.loss,
                    objective=t.objective, preprocess=t.preprocess, device=self.device, model_kwargs=t.model_kwargs,
                    progress=self.progress, desc=role_of(runs[missing[0]][1]),
                    keep_models=t.keep_models or t.hold_models, on_epoch=epoch_reporter(self.progress_writer, role_of, unit),
                ) if train else []))
                results.update({i: test_trained(r, model, eval_images, eval_labels, num_classes=ds.num_classes, mean=ds.mean,
                                                std=ds.std, recipe=recipes[runs[i][1]], preprocess=t.preprocess,
                                                device=self.device, model_kwargs=t.model_kwargs) for i, r in held.items()})
                results = [results[i] for i in missing]
                for i, r in zip(missing, results):
                    lr = runs[i][1]
                    run_id, scores[i] = record_eval(self, t, role_of(lr), keys[i], r, recipes[lr], identity, cost, inputs(i))
                    if t.keep_models:
                        self._store_model(run_id, r.model)
                    net = r.model.eval() if t.keep_models else None
                    accuracy = as_stored({"test_accuracy": r.test_accuracy})["test_accuracy"]  # as a reuse reads it
                    found[i] = TrainedModel(role_of(lr), r.seed, accuracy, r.train_seconds, r.eval_seconds,
                                            run_id, False, net, r if t.hold_models else None)
            for i, m in found.items():
                if t.eval_split == "test":
                    times = {"train_seconds": m.train_seconds, "eval_seconds": m.eval_seconds}
                    beyond.note(self, m.role, m.seed, {**scores[i][0], **cost, **times}, scores[i][1], inputs(i))
        return [found[i] for i in range(len(runs))]

    def _store_model(self, run_id: str, model: torch.nn.Module) -> None:
        store_model(self.tracker, run_id, model)

    def _load_model(self, run_id: str, model: str, model_kwargs: dict | None) -> torch.nn.Module:
        return load_model(self, run_id, model, model_kwargs)

    def cached_result(self, role: str, identity: dict, compute: Callable[[], dict[str, float]],
                      params: dict | None = None) -> tuple[dict[str, float], bool]:
        """:func:`ddlib.protocols.evaluation_runs.cached_result` in this cell: metrics computed once per store."""
        return cached_result(self, role, identity, compute, params)


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
