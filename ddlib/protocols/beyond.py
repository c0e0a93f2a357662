"""What a cell logs beyond accuracy (issue 27), beside each evaluation's accuracy: the scores of
:mod:`ddlib.scores.beyond_accuracy`, the reliability table, the datasets (``mlflow.data``) and MLflow's system metrics.

Per evaluation (child run): metrics ``ece``, ``nll``, ``worst_class_acc``, ``class_acc_std``,
``class_acc_range`` (from the test pass that gives the accuracy, and its confusion matrix), the cost
``train_flops``, ``test_flops``, ``train_images``, ``test_images``, ``train_steps`` and
``flops_per_image`` (wall times: ``train_seconds``, ``eval_seconds``; device: tag ``ddlib.device_name``),
artifact ``reliability.json`` (the 15 bins), and its inputs: the training set (context ``distilled``,
``random`` or ``train``) and the test set (``test``; ``validation`` for a validation split), each
a digest-only ``mlflow.data`` dataset whose digest is ddlib's content digest
(:func:`ddlib.data.digest.tensor_digest`).

Per cell (at :meth:`Cell.close`): per-seed histories ``<score>.<role>`` (step = seed) and their mean
and std over seeds, the cell's cost per seed ``cost.<column>`` (the sums over every model whose test
accuracy the cell used, trained here or reused; lr-search trials scored on the validation split are
not counted), the datasets of every evaluation it used, and artifact ``reliability.png``.

A stored evaluation from before these scores is reused as it is: its calibration and fairness are
NaN (recomputing them would need its model, which is kept only with ``keep_models``); its cost is
computed again (it depends on the model and the recipe only).

System metrics: MLflow's own switch, ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` (off by default:
a sampling thread per cell), logs ``system/*`` (CPU, memory, disk, network; GPU where pynvml is
installed) on the cell's run.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from pathlib import Path

from ddlib.scores import beyond_accuracy as beyond
from ddlib.data.digest import tensor_digest

__all__ = ["evaluation_scores", "model_cost", "log_evaluation", "note", "close", "start_system_metrics", "stop_system_metrics",
           "is_beyond", "board_columns", "RELIABILITY_ARTIFACT", "CONTEXTS", "context_of"]

RELIABILITY_ARTIFACT = "reliability.json"
CONTEXTS = ("distilled", "random", "train", "shadow", "test", "validation")
SCORES = (*beyond.CALIBRATION, *beyond.FAIRNESS)
CELL_COST = ("train_flops", "test_flops", "train_images", "test_images", "train_seconds", "eval_seconds")
_NAN = float("nan")


def evaluation_scores(confusion, sums) -> dict[str, float]:
    """Calibration and class-wise fairness of one tested model (NaN where the pass gave no sums)."""
    scores = beyond.calibration(sums) if sums is not None else {k: _NAN for k in beyond.CALIBRATION}
    fair = beyond.class_fairness(confusion) if confusion is not None else {k: _NAN for k in beyond.FAIRNESS}
    return {**scores, **fair}


def model_cost(cell, model: str, model_kwargs: dict | None, images, targets, eval_labels, recipe) -> dict[str, float]:
    """The cost columns of one model (:func:`ddlib.scores.beyond_accuracy.training_cost`), its FLOPs per image
    counted once per architecture and input shape in a cell."""
    from ddlib.engine.recipe import epochs_trained
    from ddlib.models import create_model

    shape = tuple(images.shape[1:])
    key = ("flops", model, json.dumps(model_kwargs or {}, sort_keys=True, default=str), shape, cell.dataset.num_classes)
    if key not in cell.cache:
        cell.cache[key] = beyond.flops_per_image(
            lambda: create_model(model, shape[0], cell.dataset.num_classes, tuple(shape[1:]), **(model_kwargs or {})),
            shape)
    flops = cell.cache[key]
    return {"flops_per_image": flops, **beyond.training_cost(flops, len(targets), epochs_trained(recipe), recipe.batch_size,
                                                             len(eval_labels))}


def context_of(cell, role: str, targets) -> str:
    """What a training set is, for its ``mlflow.data`` context: the random subset (roles ``rdm*``), a
    membership-inference shadow model's real draw (roles ``shadow*``), the real training data (roles
    ``real*``, or a set as large as the cell's training data), else the distilled set."""
    if role.startswith("rdm"):
        return "random"
    if role.startswith("shadow"):
        return "shadow"
    full = {len(d.train_labels) for d in (cell.dataset, cell.unsplit) if d is not None}
    return "train" if role.startswith("real") or len(targets) in full else "distilled"


def _dataset_input(name: str, digest: str, context: str, images, source: dict):
    import numpy as np
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.types import Schema, TensorSpec
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    dtype = np.dtype(str(getattr(images, "dtype", "uint8")).replace("torch.", ""))
    schema = Schema([TensorSpec(dtype, (-1, *map(int, images.shape[1:])), "images")])
    dataset = MetaDataset(CodeDatasetSource({k: str(v) for k, v in source.items()}), name=name, digest=digest,
                          schema=schema)
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


def datasets(cell, role: str, images, targets, train_digest: str, eval_images, eval_labels, split: str) -> list:
    """The two inputs of one evaluation: its training set and its test (or validation) set."""
    ds = cell.dataset
    key = ("test_digest", id(eval_images), split)
    if key not in cell.cache:
        cell.cache[key] = tensor_digest(eval_images, eval_labels)
    context = context_of(cell, role, targets)
    method = cell.params.get("method") or ""
    train_name = f"{ds.name} {method} ipc{cell.params.get('ipc')}" if context == "distilled" and method else \
        f"{ds.name} {role}" if context == "shadow" else f"{ds.name} {context}"
    source = {"dataset": ds.name, "data": ds.label, "images": len(targets), "role": role}
    test_context = "test" if split == "test" else "validation"
    return [_dataset_input(train_name, train_digest, context, images, source),
            _dataset_input(f"{ds.name} {test_context}", cell.cache[key], test_context, eval_images,
                           {"dataset": ds.name, "data": ds.label, "images": len(eval_labels), "split": split})]


def log_evaluation(cell, run_id: str, sums, inputs: list) -> None:
    """An evaluation run's reliability table (artifact) and its datasets."""
    if sums is not None:
        table = {"bins": beyond.reliability_table(sums), **beyond.calibration(sums)}
        cell.tracker.log_dict(run_id, table, RELIABILITY_ARTIFACT)
    cell.tracker.log_inputs(run_id, inputs)


def note(cell, role: str, seed: int, values: dict, sums, inputs: list) -> None:
    """Remember one tested model the cell used (test split), for :func:`close`."""
    cell.cache.setdefault("beyond", []).append({"role": role, "seed": int(seed), "values": values, "sums": sums})
    seen = cell.cache.setdefault("beyond_inputs", {})
    for item in inputs:
        seen.setdefault((item.dataset.name, item.dataset.digest, item.tags[0].value), item)


def close(cell) -> None:
    """The cell's per-seed scores and cost (histories, step = seed), their mean and std, its datasets,
    the reliability diagram of each role (summed over seeds); stops the system-metrics monitor."""
    from ddlib.scores.metrics import mean_std

    stop_system_metrics(cell)
    rows = cell.cache.pop("beyond", None)  # logged once, however often the cell is closed
    if not rows:
        return
    per: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        for score in SCORES:
            per.setdefault(f"{score}.{row['role']}", {}).setdefault(row["seed"], []).append(row["values"][score])
        for column in CELL_COST:  # the cell's whole cost, and each role's (what a board's score cost)
            value = row["values"].get(column, _NAN)
            per.setdefault(f"cost.{column}", {}).setdefault(row["seed"], []).append(value)
            per.setdefault(f"cost.{column}.{row['role']}", {}).setdefault(row["seed"], []).append(value)
    by_seed: dict[int, dict] = {}
    summary = {}
    for name, seeds in per.items():
        total = name.startswith("cost.")
        values = {s: (sum(v) if total else sum(v) / len(v)) for s, v in seeds.items()}
        for s, v in values.items():
            by_seed.setdefault(s, {"seed": s})[name] = float(v)
        summary[f"{name}_mean"], summary[f"{name}_std"] = mean_std([v for v in values.values() if not math.isnan(v)])
    cell.tracker.log_per_seed(cell.run_id, by_seed.values())
    cell.tracker.log_metrics(cell.run_id, summary)
    inputs = list(cell.cache.get("beyond_inputs", {}).values())
    if inputs:
        cell.tracker.log_inputs(cell.run_id, inputs)
    _reliability_png(cell, rows)


def _reliability_png(cell, rows: list[dict]) -> None:
    """Artifact ``reliability.png``: accuracy against confidence per bin, one line per role (its
    seeds' bins summed), the diagonal being perfect calibration."""
    summed: dict[str, list[float]] = {}
    for row in rows:
        if row["sums"] is not None:
            old = summed.get(row["role"])
            summed[row["role"]] = list(row["sums"]) if old is None else [a + b for a, b in zip(old, row["sums"])]
    if not summed:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for role, sums in summed.items():
        table = [b for b in beyond.reliability_table(sums) if b["images"]]
        ece = beyond.calibration(sums)["ece"]
        ax.plot([b["confidence"] for b in table], [b["accuracy"] for b in table], marker="o",
                label=f"{role} (ECE {100 * ece:.1f} %)")
    ax.set(xlabel="confidence (mean in bin)", ylabel="accuracy in bin", xlim=(0, 1), ylim=(0, 1),
           title="Reliability (15 bins, seeds pooled)")
    ax.legend(fontsize=7)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reliability.png"
        fig.savefig(path, dpi=100, bbox_inches="tight")
        cell.tracker.log_artifact(cell.run_id, path)
    plt.close(fig)


def start_system_metrics(cell) -> None:
    """MLflow's system metrics on the cell's run where ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is true
    (psutil is a dependency; GPU metrics need pynvml); stopped by :func:`close`."""
    if os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() not in ("true", "1"):
        return
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        from ddlib.store.paths import tracking_uri

        monitor = SystemMetricsMonitor(cell.run_id, tracking_uri=tracking_uri())
        monitor.start()
        cell.cache["system_metrics"] = monitor
    except Exception as error:  # never a cell's failure: the numbers do not depend on it
        warnings.warn(f"system metrics not logged: {error}", UserWarning, stacklevel=2)


def stop_system_metrics(cell) -> None:
    """Stop the cell's system-metrics monitor (MLflow's CPU/GPU sampling), if one was started."""
    monitor = cell.cache.pop("system_metrics", None)
    if monitor is not None:
        monitor.finish()


# --------------------------------------------------------------------------- leaderboards

BOARD_SCORES = SCORES
BOARD_COST = ("train_flops", "test_flops", "train_images", "train_seconds", "eval_seconds")


def is_beyond(metric: str) -> bool:
    """A cell's per-seed history this module logs (what a board's ``per_seed_values`` reads)."""
    return metric.startswith(tuple(f"{s}." for s in SCORES)) or metric.startswith("cost.")


def board_columns(df, roles: tuple[str, ...]) -> list[str]:
    """Add a board's extra columns to its per-seed frame (in place) and return their names: the
    scores of the first of ``roles`` each row has (the models its headline accuracy comes from: a
    hard-label cell logs ``syn_hard`` only, a soft-label one ``syn_any`` too) and the cell's cost per
    seed. Cells logged before these columns show NaN."""
    added = []
    for score in BOARD_SCORES:
        column = None
        for role in roles:  # row by row: the first role that row logged
            if f"{score}.{role}" in df:
                values = df[f"{score}.{role}"]
                column = values if column is None else column.fillna(values)
        df[score] = column if column is not None else _NAN
        added.append(score)
    for column in BOARD_COST:  # what the row's headline models cost, not the cell's references and teachers
        values = None
        for role in roles:
            if f"cost.{column}.{role}" in df:
                own = df[f"cost.{column}.{role}"]
                values = own if values is None else values.fillna(own)
        df[column] = values if values is not None else _NAN
        added.append(column)
    return added
