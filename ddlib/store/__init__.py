"""The store: where it lives (``paths``), the MLflow tracking layer (``tracking``, with ``tags``, ``errors``, ``locks``,
``hashing``, ``provenance``, ``liveness``), a shared tracking server (``server``), the per-machine cache folder (``cache``)
and running cells' progress records (``progress``). Imports ``specs`` only: never the engine, protocols, report or the runner."""
