"""A cell's evaluation runs in MLflow: what one training call asks for (:class:`Training`), a trained
model's result (:class:`TrainedModel`), its evaluation run, the model pool's weights and cached results.

The MLflow side of :meth:`ddlib.protocols.cell.Cell.train`, which keys, trains and tests. Imports the
store, the engine's hook names and the beyond-accuracy scores; never the cell module: the functions'
``cell`` is a :class:`ddlib.protocols.cell.Cell`, passed in.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ddlib.engine.recipe import Recipe
from ddlib.engine.train import AugmentHook, EpochProgress, LossHook, Objective, hook_name
from ddlib.protocols import beyond
from ddlib.store.hashing import config_hash
from ddlib.store.locks import file_lock
from ddlib.store.provenance import default_tags
from ddlib.store.tags import TAG
from ddlib.store.tracking import as_stored, run_metrics

__all__ = ["Training", "TrainedModel", "role_stem", "fit_digest", "record_eval", "count_training", "epoch_reporter",
           "store_model", "load_model", "cached_result", "MODEL_ARTIFACT", "CONFUSION_ARTIFACT", "MODEL_STORED_TAG",
           "TRAIN_MODE_TAG", "RESULT_KEY_TAG"]

MODEL_ARTIFACT = "model.pt"
CONFUSION_ARTIFACT = "confusion.json"  # an evaluation's test counts, [true class][predicted class]
MODEL_STORED_TAG = "ddlib.model_stored"
TRAIN_MODE_TAG = "ddlib.train_mode"  # sequential / batched: how the loop ran (not part of the key)
RESULT_KEY_TAG = "ddlib.result_key"


@dataclass(frozen=True)
class Training:
    """One training call of a cell (:meth:`ddlib.protocols.cell.Cell.train`): one model per seed on
    ``images``/``targets`` with ``recipe``, tested on ``eval_split``.

    ``lrs`` (one per seed; a seed may repeat) trains run i at ``lrs[i]``, keyed as a call with that lr
    in the recipe; ``role`` may then be a function of the lr. ``model``: None is the cell's. Every hook
    (``augment``, ``loss``, ``objective``, ``preprocess``) carries its canonical name, part of the reuse
    key. ``keep_models``: return and store each model; ``hold_models``: keep each model trained here in
    memory only (an lr search's candidates); ``adopt`` ({seed: such a held ``SeedResult``}): test that
    model instead of training one again; ``unless_busy``: None at once while another cell trains the
    same models."""

    role: str | Callable[[float], str]
    images: torch.Tensor = field(repr=False)
    targets: torch.Tensor = field(repr=False)
    recipe: Recipe
    seeds: Sequence[int]
    lrs: Sequence[float] | None = None
    model: str | None = None
    augment: AugmentHook | None = None
    loss: LossHook | None = None
    objective: Objective | None = None
    preprocess: torch.nn.Module | None = None
    model_kwargs: dict | None = None
    eval_split: str = "test"
    keep_models: bool = False
    hold_models: bool = False
    adopt: dict | None = None
    unless_busy: bool = False

    def role_of(self, lr: float) -> str:
        return self.role(lr) if callable(self.role) else self.role


def role_stem(role: str) -> str:
    """A role with its lr candidate starred: ``rdm_hard-lr0.01-val`` -> ``rdm_hard-lr*-val``."""
    return re.sub(r"-lr[0-9.e+-]*?(?=-[a-z_]|$)", "-lr*", role)


def fit_digest(hook) -> str | None:
    """The content digest of a hook fitted on data (a ZCA's ``fit_digest``, set by :meth:`Cell.zca`), or None."""
    return getattr(hook, "fit_digest", None)


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


def record_eval(cell, t: Training, role: str, key: str, r, recipe: Recipe, identity: dict, cost: dict,
                inputs: list) -> tuple[str, tuple]:
    """One trained model's evaluation run (a ``SeedResult`` ``r``): params, tags, metrics, its loss
    series and confusion matrix. Returns its run id and its (scores, calibration sums)."""
    ds, tracker = cell.dataset, cell.tracker
    run_id = tracker.start_run(
        f"{role}-s{r.seed}",  # nested under the cell's run in the MLflow UI
        params={"role": role, "seed": r.seed, "model": identity["model"], "model_kwargs": t.model_kwargs or {},
                "recipe": recipe.to_dict(), "augment": identity["augment"], "loss": identity["loss"],
                "objective": hook_name(t.objective, "none"), "preprocess": identity["preprocess"],
                "eval_split": t.eval_split, "dataset": ds.name, "train_size": len(t.targets),
                "train_digest": identity["train"]},
        tags={**default_tags(cell.protocol, str(cell.device)), TAG["kind"]: "eval", TAG["role"]: role,
              TAG["eval_key"]: key, TRAIN_MODE_TAG: r.mode},
        parent_run_id=cell.run_id,
    )
    scores = (as_stored(beyond.evaluation_scores(r.confusion, r.calibration)), r.calibration)  # as a reuse reads them
    tracker.log_metrics(run_id, {"test_accuracy": r.test_accuracy, "train_seconds": r.train_seconds,
                                 "eval_seconds": r.eval_seconds, **scores[0], **cost})
    beyond.log_evaluation(cell, run_id, r.calibration, inputs)
    tracker.log_series(run_id, "train_loss", r.epoch_losses)
    if r.confusion is not None:  # for the report card's confusion matrix
        tracker.log_dict(run_id, {"classes": list(ds.class_names), "matrix": r.confusion}, CONFUSION_ARTIFACT)
    tracker.end_run(run_id)
    return run_id, scores


def count_training(cache: dict, role: str, image_epochs: int, trained: bool) -> None:
    """One model of ``role`` (lr candidates counted under one stem, ``-lr*``) in the cell's ``cache``:
    trained or reused."""
    entry = cache.setdefault("trainings", {}).setdefault(
        role_stem(role), {"models": 0, "trained": 0, "image_epochs": 0, "trained_image_epochs": 0})
    entry["models"] += 1
    entry["image_epochs"] += image_epochs
    if trained:
        entry["trained"] += 1
        entry["trained_image_epochs"] += image_epochs


def epoch_reporter(writer, role_of: Callable[[float], str],
                   unit: float | None = None) -> Callable[[EpochProgress], None] | None:
    """The training loop's progress to the runner's ``writer`` (the role of the models training now: one
    name, or an lr search's common stem), where a runner listens; ``unit``: one model-epoch's predicted time."""
    if writer is None:
        return None

    def report(progress: EpochProgress) -> None:
        names = sorted({role_of(lr) for _, lr in progress.runs})
        name = names[0] if len(names) == 1 else os.path.commonprefix(names).rstrip("0123456789.-e") + " search"
        writer(name, progress, unit)

    return report


def store_model(tracker, run_id: str, model: torch.nn.Module) -> None:
    """Log a trained model's weights (a plain state_dict: loadable with ``weights_only=True``)."""
    with tempfile.TemporaryDirectory(prefix="ddlib-model-") as tmp:
        file = Path(tmp) / MODEL_ARTIFACT
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, file)
        tracker.log_artifact(run_id, file)
    tracker.set_tags(run_id, {MODEL_STORED_TAG: "true"})


def load_model(cell, run_id: str, model: str, model_kwargs: dict | None) -> torch.nn.Module:
    """A pooled model: the registry's ``model`` for the cell's data with the run's weights (eval mode)."""
    from ddlib.protocols.teachers import _quiet_downloads, load_teacher

    with tempfile.TemporaryDirectory(prefix="ddlib-model-") as tmp, _quiet_downloads():
        local = cell.tracker.client.download_artifacts(run_id, MODEL_ARTIFACT, tmp)
        return load_teacher(model, cell.dataset, local, device=cell.device, model_kwargs=model_kwargs)


def cached_result(cell, role: str, identity: dict, compute: Callable[[], dict[str, float]],
                  params: dict | None = None) -> tuple[dict[str, float], bool]:
    """Metrics of a deterministic computation (an attack on a pooled model, say), computed once.

    ``identity`` must say everything the result depends on (the model's run id, the attack and
    its parameters, the test images, the seed); the cell's definition revision is added to it.
    The first call runs ``compute()`` and logs its metrics as a child run tagged with the
    identity's hash; later calls, in any cell or process, return those metrics. Returns (metrics, reused)."""
    tracker = cell.tracker
    key = config_hash({**identity, "definition": cell.definition()})
    with cell.guard(), file_lock(f"result-{key}"):
        runs = tracker.find_finished({RESULT_KEY_TAG: key})
        if runs:
            return run_metrics(runs[0]), True
        metrics = compute()
        if not metrics:
            raise ValueError(f"{role}: the computation returned no result; nothing is cached")
        run_id = tracker.start_run(
            role, params={"role": role, **(params or {})},
            tags={**default_tags(cell.protocol, str(cell.device)), TAG["kind"]: "result", TAG["role"]: role,
                  RESULT_KEY_TAG: key},
            parent_run_id=cell.run_id)
        tracker.log_metrics(run_id, metrics)
        tracker.end_run(run_id)
    return as_stored(metrics), False  # the values a later call reads back
