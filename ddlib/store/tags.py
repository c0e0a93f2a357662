"""The names ddlib writes on MLflow runs (:data:`TAG`; its UI can filter on them) and what the units tag
says. Imports nothing of ddlib: every other store module, and everything above, reads them from here."""

# Tag names written by the suite (MLflow's UI can filter on them).
TAG = {
    "protocol": "protocol",
    "version": "ddlib.version",
    "commit": "ddlib.git_commit",
    "mode_pair": "ddlib.mode_pair",  # BEARD: the same row in the other mode
    "device": "ddlib.device",
    "kind": "ddlib.kind",  # "cell" (one grid cell / notebook run), "eval" (one trained model), "summary"
    "revision": "ddlib.protocol_revision",  # the protocol module's REVISION: what its cells compute
    "engine_revision": "ddlib.engine_revision",  # ddlib.specs.keys.ENGINE_REVISION: what the training engine computes
    "config": "ddlib.config_hash",  # a cell's full resolved params
    "group": "ddlib.group_key",  # a cell's params without seeds: rows of a leaderboard
    "series": "ddlib.series_key",  # ... and without ipc: one method's cells across IPCs (unified scores, curves)
    "family": "ddlib.family_key",  # ... and without method and source: the cells compared with each other
    "data": "ddlib.data",  # how results on a cell's data must be labelled, e.g. "CIFAR-10 (JPEG)"
    "device_name": "ddlib.device_name",  # e.g. "cuda: NVIDIA H100 80GB HBM3" or "cpu x2 threads": what timings ran on
    "eval_key": "ddlib.eval_key",  # what was trained on what, with which seed: reuse key
    "role": "ddlib.role",  # syn / rdm / real ...
    "data_source": "ddlib.data_source",  # where a cell's real data was read from (a path, "sklearn.datasets.load_digits")
    "error": "ddlib.error",
    "owner": "ddlib.owner",  # "host:pid:start time" of the process executing a cell (liveness)
    "heartbeat": "ddlib.heartbeat",  # Unix time, renewed while the cell executes (liveness across hosts)
    "runner": "ddlib.run.runner",  # id of the `ddlib run` invocation that executes a cell
    "estimate": "ddlib.estimate_minutes",  # the runner's estimate of a cell's minutes when it started (ddlib.run.plan)
    "boards_from": "ddlib.boards_from",  # the experiment a summary's or card's boards read (not the protocols' own)
    "units": "ddlib.specs.units",  # "shown": the run's metrics are in ddlib.specs.units' units, per-seed values under per_seed/
    "quick": "ddlib.quick",  # a quick cell (ddlib score --quick): a first look, not a result
}
# What TAG["units"] says on every run whose metrics the Tracker wrote: each metric in the unit ddlib.specs.units
# gives its name (accuracies in %, ...), and a cell's per-seed values as histories ``per_seed/<name>`` (step =
# seed) beside their ``<name>_mean`` and ``<name>_std``. Runs without it (written before) hold computed units
# (fractions) and per-seed histories under the value's own name; the readers below take both.
SHOWN_UNITS = "shown"
# The tags a cell writes that every board reads (the cells write them: ddlib.protocols.cell, .common, .leakage)
CLASSES_TAG = "ddlib.num_classes"  # the cell's class count: what "near chance" means (the sanity column)
PRECISION_TAG = "ddlib.precision"  # the precisions the cell's trainings ran in (fp32, bf16): Recipe.precision resolved
SET_DIGEST_TAG = "ddlib.set_digest"  # the obtained set's content (ddlib.protocols.common.obtain): in every row key
# What the set cost to make (ddlib.protocols.common.log_construction): "measured" (a built-in method's seconds and
# FLOPs, metrics construction_seconds / construction_flops) or "declared" (construction_gpu_hours); the device
CONSTRUCTION_TAG = "ddlib.construction"
LEAKAGE_TAG = "ddlib.leakage"  # one line where test or validation images leaked into the set (the sanity column)
