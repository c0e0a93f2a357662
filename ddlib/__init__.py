"""ddlib: fair, reproducible scores for distilled datasets, tracked in MLflow."""

__version__ = "0.2.0"
