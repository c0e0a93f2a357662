"""ddlib: fair, reproducible scores for distilled datasets, tracked in MLflow."""

from ddlib.specs.version import VERSION as __version__

__all__ = ["score", "__version__"]


def __getattr__(name: str):
    """``ddlib.score`` is :func:`ddlib.scoring.score` itself (its typed signature and documentation:
    ``help(ddlib.score)``), imported on first use so that ``import ddlib`` stays light."""
    if name == "score":
        from ddlib.scoring import score

        return score
    raise AttributeError(f"module 'ddlib' has no attribute {name!r}")
