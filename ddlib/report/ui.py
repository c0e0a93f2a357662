"""MLflow's UI on ddlib's store: a saved table view per experiment, and the address of its runs page.

MLflow 3.17 opens an experiment as a GenAI project (traces, token usage) unless its workflow
toggle says "Model training". ddlib's experiments carry ``mlflow.experimentKind =
custom_model_development`` (:data:`ddlib.store.tracking.EXPERIMENT_TAGS`), but the UI's mode is the address's
``workflowType`` (else the browser's last choice, GenAI at first), so every address here, a runs page
and a run's page alike, asks for ``workflowType=machine_learning``. The runs table shows only a few
attribute columns by default; :func:`install_views` saves a *shared view* on each experiment (the
experiment tag ``mlflow.sharedViewState.ddlib``, what the UI's "share view" writes) whose columns are
the datasets a cell logged (the UI's Dataset column), the cells' method, IPC, dataset and model and
their leaderboard scores, so :func:`runs_url` opens the table a user wants; :func:`run_url` opens a
cell's page (``ddlib run``, ``ddlib score`` and ``ddlib runs --links`` print it). Cell runs are named
``<method>-ipc<ipc>-<model>``; their evaluations nest under them.

The UI's search box takes MLflow filters over ddlib's tags and params, e.g.
``tags.protocol = 'label_robust' and params.ipc = '10'`` or ``tags.`ddlib.kind` = 'cell'``.
"""

from __future__ import annotations

import json

from ddlib.store.tags import TAG
from ddlib.store.tracking import client

__all__ = ["VIEW_KEY", "UI_HOST", "UI_PORT", "install_views", "runs_url", "run_url", "ui_base", "cell_link", "ui_urls"]

UI_HOST = "127.0.0.1"  # `ddlib ui`: this machine only; reach it from elsewhere with an SSH tunnel
UI_PORT = 5000
VIEW_KEY = "ddlib"
SHARED_VIEW_TAG = "mlflow.sharedViewState."
PARAM_COLUMNS = ("dataset", "method", "ipc", "model", "preset", "mode")
# the scores first (in this order), then other per-cell means, at most MAX_METRICS columns (NAS logs one
# rho and tau per cell, of the seed-averaged proxy: no _mean)
SCORE_ORDER = ("lrs_mean", "ars_mean", "crei_mean", "rr_mean", "ae_mean", "rcr_mean", "spearman", "kendall",
               "acc_aug_avg_mean", "acc_reference_mean", "acc_transfer_mean", "acc_others_avg_mean", "acc_set_mean",
               "relative_mean",
               "hlr_mean", "ior_mean", "ior_aug_mean", "ior_noaug_mean", "acc_syn_any_mean", "acc_syn_hard_mean",
               "clean_acc_mean")
MAX_METRICS = 6
# The runs table's Dataset column (the datasets a run logged): an attribute column the UI shows only
# where a view selects it by this key (MLflow's default view does; a view that lists its own columns
# must too)
DATASET_COLUMN = "attributes.`Dataset`"


def _view(metrics: list[str], params: list[str]) -> dict:
    """Columns: method and IPC, the scores (the protocol's first), the datasets the cell logged, then
    the other params. The UI sorts selected columns by name unless ``columnOrder`` says otherwise."""
    ordered = [m for m in SCORE_ORDER if m in metrics] + sorted(m for m in metrics if m not in SCORE_ORDER)
    first = [f"params.`{p}`" for p in ("method", "ipc") if p in params]
    rest = [f"params.`{p}`" for p in PARAM_COLUMNS if p in params and p not in ("method", "ipc")]
    columns = [*first, *(f"metrics.`{m}`" for m in ordered[:MAX_METRICS]), DATASET_COLUMN, *rest]
    return {"selectedColumns": columns, "columnOrder": columns, "runsExpanded": {},
            "orderByKey": "attributes.start_time", "orderByAsc": False}


def install_views() -> dict[str, str]:
    """Save ddlib's table view on every experiment that has cell runs; returns name -> experiment id."""
    mlflow_client = client()
    found = {}
    for experiment in mlflow_client.search_experiments():
        cells = mlflow_client.search_runs([experiment.experiment_id], max_results=200,
                                          filter_string=f"tags.`{TAG['kind']}` = 'cell'")
        if not cells:
            continue
        metrics = sorted({k for run in cells for k in run.data.metrics if k.endswith("_mean") or k in SCORE_ORDER})
        params = sorted({k for run in cells for k in run.data.params})
        view = json.dumps(_view(metrics, params))
        if experiment.tags.get(SHARED_VIEW_TAG + VIEW_KEY) != view:
            mlflow_client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG + VIEW_KEY, view)
        found[experiment.name] = experiment.experiment_id
    return found


def runs_url(base: str, experiment_id: str) -> str:
    """The runs page of one experiment, as a training project, with ddlib's columns."""
    return (f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    """One run's page, as a training project (its metrics in ddlib's units: :mod:`ddlib.specs.units`)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def ui_base(port: int = UI_PORT) -> str:
    """Where this store's UI is: a tracking server's own address, else where ``ddlib ui`` serves it."""
    from ddlib.store.paths import is_server_uri, tracking_uri

    return tracking_uri().rstrip("/") if is_server_uri() else f"http://{UI_HOST}:{port}"


def cell_link(experiment_id: str, run_id: str) -> str:
    """A run's page in this store's UI (:func:`ui_base`)."""
    return run_url(ui_base(), experiment_id, run_id)


def ui_urls(base: str = f"http://{UI_HOST}:{UI_PORT}") -> dict[str, str]:
    """Install the views and return experiment name -> runs page address."""
    return {name: runs_url(base, eid) for name, eid in install_views().items()}
