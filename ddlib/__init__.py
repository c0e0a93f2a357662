"""ddlib: fair, reproducible scores for distilled datasets, tracked in MLflow."""

__version__ = "0.2.0"


def score(images=None, labels=None, *, dataset: str, protocol: str = "label_robust", **params):
    """Score a distilled set in this process, tracked in MLflow like any grid cell; returns the
    protocol's result (``per_seed``, ``summary``, ``run_id``). See :func:`ddlib.scoring.score`."""
    from ddlib.scoring import score as _score  # torch and mlflow load only when used

    return _score(images, labels, dataset=dataset, protocol=protocol, **params)
