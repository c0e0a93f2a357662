"""The store: the MLflow tracking layer (``tracking``: store paths, runs, locks, hashes), a shared
tracking server (``server``), the per-machine cache folder (``cache``) and running cells' progress
records (``progress``). Imports ``specs`` only: never the engine, protocols, report or the runner."""
