"""Teachers for online relabelling: trained once on the real data and kept in MLflow, or loaded
from the user's checkpoints.

A teacher is identified by the content of the data it was trained on, its architecture, recipe,
augmentation, seed and definition revision (the engine's and its protocol's: :func:`ddlib.specs.keys.definition`;
:func:`teacher_key`), so a revision bump trains teachers again; its weights are the artifact ``teacher.pt`` of a run
in experiment ``teachers``, found again by that key from any process. This is tracking-layer work
built on the engine's training loop, which is why it lives here and not in
:mod:`ddlib.engine.labels` (the losses and the relabelling hook, which know nothing of MLflow).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch
import torch.nn as nn

from ddlib.data.digest import data_identity
from ddlib.protocols import definition
from ddlib.engine.device import resolve_device, run_precision
from ddlib.engine.recipe import Recipe
from ddlib.engine.train import AugmentHook, hook_name, train_and_test
from ddlib.models import create_model
from ddlib.store.hashing import config_hash
from ddlib.store.locks import file_lock
from ddlib.store.provenance import default_tags
from ddlib.store.tags import TAG
from ddlib.store.tracking import Tracker, init_store

if TYPE_CHECKING:
    from ddlib.data.datasets import Dataset

__all__ = ["get_teachers", "load_teacher", "teacher_key", "dataset_identity", "CheckpointError",
           "TEACHER_EXPERIMENT", "TEACHER_KEY_TAG", "TEACHER_ARTIFACT"]

TEACHER_EXPERIMENT = "teachers"
TEACHER_KEY_TAG = "ddlib.teacher_key"
TEACHER_ARTIFACT = "teacher.pt"


class CheckpointError(ValueError):
    """A teacher checkpoint is missing, unreadable or does not fit the architecture; names the file."""


def dataset_identity(dataset: "Dataset") -> dict:
    """What a teacher was trained on: the dataset's name, normalisation, class count and a digest of
    the training images and labels (not ``source``, a path that differs between machines holding the
    same data; a reduced or re-split set differs in content, so it gets its own teachers). Memoised
    per Dataset object (:func:`ddlib.data.digest.data_identity`); the test split, which only scores
    a teacher, is left out."""
    return {k: v for k, v in data_identity(dataset).items() if k != "test"}


def _teacher_group(dataset: "Dataset", arch: str, recipe: Recipe, augment_name: str, model_kwargs: dict | None,
                   protocol: str | None) -> dict:
    return {"kind": "teacher", "dataset": dataset_identity(dataset), "arch": arch, "model_kwargs": model_kwargs or {},
            "recipe": recipe.to_dict(), "augment": augment_name, "definition": definition(protocol)}


def teacher_key(dataset: "Dataset", arch: str, recipe: Recipe, seed: int, augment_name: str = "none",
                model_kwargs: dict | None = None, protocol: str | None = None) -> str:
    """The reuse key of one teacher: dataset content, architecture, recipe, augmentation, seed and the
    definition revision of ``protocol`` (the engine's alone for None)."""
    return config_hash({**_teacher_group(dataset, arch, recipe, augment_name, model_kwargs, protocol),
                        "seed": int(seed)})


def _state_dict_from(obj: Any, path: Path) -> dict:
    """A plain state_dict, also from ``{"state_dict": ...}`` / ``{"model": ...}`` checkpoints and
    DataParallel's ``module.`` prefixes (EDC and SRe2L save theirs that way)."""
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: not a state_dict (a dict of tensors), got {type(obj).__name__}")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return obj


def load_teacher(arch: str, dataset: "Dataset", path: str | os.PathLike, *, device: str | torch.device = "cpu",
                 model_kwargs: dict | None = None) -> nn.Module:
    """Build ``arch`` for ``dataset`` with the registry and load a state_dict file into it (eval mode)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such teacher checkpoint")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {str(exc)[:200]})") from exc
    state = _state_dict_from(obj, path)
    broken = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:  # it would "load" and then give NaN outputs inside the cell, naming nothing
        raise CheckpointError(f"{path}: {len(broken)} weight tensor(s) hold NaN/Inf values ({', '.join(broken[:3])}"
                              f"{', ...' if len(broken) > 3 else ''}): a diverged or damaged checkpoint")
    model = create_model(arch, dataset.channels, dataset.num_classes, dataset.image_size, **(model_kwargs or {}))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())
        raise CheckpointError(f"{path}: does not fit {arch!r} for {dataset.name} "
                              f"({dataset.channels}x{dataset.image_size}, {dataset.num_classes} classes): "
                              f"{detail[:600]}") from exc
    return model.to(resolve_device(device)).eval()


@contextlib.contextmanager
def _quiet_downloads() -> Iterator[None]:
    """No MLflow download progress bar in notebooks (unless the user configured it explicitly)."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    if name in os.environ:
        yield
        return
    os.environ[name] = "false"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def get_teachers(
    dataset: "Dataset",
    arch: str,
    count: int,
    recipe: Recipe,
    *,
    device: str | torch.device = "auto",
    seeds: Sequence[int] | None = None,
    checkpoint: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    progress: bool = False,
    augment: AugmentHook | None = None,
    model_kwargs: dict | None = None,
    protocol: str | None = None,
) -> list[nn.Module]:
    """``count`` teachers of architecture ``arch`` for ``dataset``, in eval mode on ``device``.

    With ``checkpoint`` (a state_dict file, or a list of them) the teachers are loaded from there.
    Otherwise each is trained on the full real training set (``train_and_test``, seeds
    ``0..count-1`` unless given) ONCE per (dataset content, arch, recipe, augmentation, seed,
    definition revision of ``protocol``, the protocol whose cells use them): the state_dict is
    logged as artifact ``teacher.pt`` of a run in MLflow experiment ``teachers`` (tags
    ``ddlib.kind=teacher``, ``ddlib.teacher_key``), and any later call, in any process, downloads
    it instead of training. A file lock keeps parallel workers from training the same teachers
    twice. ``augment`` (a hook carrying its name) trains them with an augmentation hook (the name is
    part of the key, so give a distinct one per hook configuration)."""
    dev = resolve_device(device)
    # "auto" precision differs by device: the key holds what it resolves to here
    recipe = replace(recipe, precision=run_precision(recipe, dev))
    if checkpoint is not None:
        paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
        if len(paths) != count:
            raise ValueError(f"{count} teacher(s) asked for but {len(paths)} checkpoint(s) given: {[str(p) for p in paths]}")
        return [load_teacher(arch, dataset, p, device=dev, model_kwargs=model_kwargs) for p in paths]
    seeds = list(range(count)) if seeds is None else [int(s) for s in seeds]
    if len(seeds) != count or len(set(seeds)) != len(seeds):
        raise ValueError(f"need {count} distinct seeds, got {seeds}")
    init_store()
    tracker = Tracker(TEACHER_EXPERIMENT)
    augment_name = hook_name(augment, "none")
    keys = {s: teacher_key(dataset, arch, recipe, s, augment_name, model_kwargs, protocol) for s in seeds}
    # One lock per (data, arch, recipe, augment): overlapping seed lists never train a teacher twice.
    group = config_hash(_teacher_group(dataset, arch, recipe, augment_name, model_kwargs, protocol))
    found: dict[int, nn.Module] = {}
    with file_lock(f"teacher-{group}"), tempfile.TemporaryDirectory(prefix="ddlib-teacher-") as tmp:
        for seed, key in keys.items():
            runs = tracker.find_finished({TAG["kind"]: "teacher", TEACHER_KEY_TAG: key})
            if runs:
                target = Path(tmp) / key
                target.mkdir(parents=True, exist_ok=True)
                with _quiet_downloads():
                    local = tracker.client.download_artifacts(runs[0].info.run_id, TEACHER_ARTIFACT, str(target))
                found[seed] = load_teacher(arch, dataset, local, device=dev, model_kwargs=model_kwargs)
        missing = [s for s in seeds if s not in found]
        if missing:
            results = train_and_test(
                arch, dataset.train_images, dataset.train_labels, dataset.test_images, dataset.test_labels,
                num_classes=dataset.num_classes, mean=dataset.mean, std=dataset.std, recipe=recipe, seeds=missing,
                augment=augment, device=dev, model_kwargs=model_kwargs, keep_models=True, progress=progress,
                desc=f"teacher {arch}",
            )
            for r in results:
                run_id = tracker.start_run(
                    f"teacher-{dataset.name}-{arch}-seed{r.seed}",
                    params={"arch": arch, "seed": r.seed, "recipe": recipe.to_dict(), "dataset": dataset.name,
                            "dataset_source": dataset.source, "dataset_digest": dataset_identity(dataset)["train"],
                            "augment": augment_name, "model_kwargs": model_kwargs or {},
                            "train_size": len(dataset.train_labels)},
                    tags={**default_tags(TEACHER_EXPERIMENT, str(dev)), TAG["kind"]: "teacher",
                          TEACHER_KEY_TAG: keys[r.seed]},
                )
                try:
                    file = Path(tmp) / f"seed{r.seed}" / TEACHER_ARTIFACT
                    file.parent.mkdir(parents=True, exist_ok=True)
                    torch.save({k: v.detach().cpu() for k, v in r.model.state_dict().items()}, file)
                    tracker.log_artifact(run_id, file)
                    tracker.log_metrics(run_id, {"test_accuracy": r.test_accuracy, "train_seconds": r.train_seconds,
                                                 "eval_seconds": r.eval_seconds})
                    tracker.log_series(run_id, "train_loss", r.epoch_losses)
                    tracker.end_run(run_id)
                except BaseException as error:
                    tracker.fail_run(run_id, error)
                    raise
                found[r.seed] = r.model.eval()
    return [found[s] for s in seeds]
