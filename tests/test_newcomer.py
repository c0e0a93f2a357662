"""A researcher's first hour: ``ddlib score`` and ``ddlib.score()`` on a set of their own, ``--dry-run``,
``ddlib runs``, ``ddlib export``, ``ddlib ui``, and the sanity flag of near-chance cells."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from waiting import assert_gone, kill_leftovers

import ddlib
from ddlib.scores import metrics
from ddlib.store import tracking
from ddlib.cli import main as cli_main
from ddlib.boards.rank import aggregate
from ddlib.boards.table import format_leaderboard
from ddlib.scoring import cell_result, resolve_cell, score_grid
from ddlib.store.tracking import TAG, Tracker

# a cheap cell on digits: the set's and the random subset's models 30 epochs (30 steps: ~50 %), the reference 2
FAST = {"seeds": [0, 1], "recipe": {"epochs": 30, "batch_size": 64}, "real_recipe": {"epochs": 2},
        "lr_policy": "fixed"}
FAST_ARGS = ["--seeds", "0", "1", "--param", "recipe={epochs: 30, batch_size: 64}",
             "--param", "real_recipe={epochs: 2}", "--param", "lr_policy=fixed", "--quiet"]


def use_store(monkeypatch, store: Path) -> Path:
    monkeypatch.setenv("DDLIB_MLRUNS", str(store))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    monkeypatch.setattr(tracking, "_CLIENTS", {})
    return store


@pytest.fixture
def npz_set(tmp_path) -> Path:
    """Two real digits per class saved as a user would: an .npz with images (N x 1 x 8 x 8 in [0, 1]) and labels."""
    from ddlib.data.datasets import load_dataset

    ds = load_dataset("digits")
    labels = ds.train_labels.numpy()
    idx = np.concatenate([np.flatnonzero(labels == c)[:2] for c in range(10)])
    path = tmp_path / "my_set.npz"
    np.savez(path, images=ds.train_images[idx].numpy(), labels=labels[idx])
    return path


@pytest.mark.slow
def test_score_cli_and_python_api_give_the_same_numbers(npz_set, tmp_path, monkeypatch, capsys):
    """`ddlib score my_set.npz` prints a result; ddlib.score() on the same arrays, in another store (so it
    trains everything again, in process), returns the same per-seed accuracies; a rerun reuses the cell.
    Why it takes about 20 s: the set is scored twice for real, once in a kernel and once in process."""
    monkeypatch.setenv("DDLIB_NUM_THREADS", "1")  # CPU results are bit-identical at one thread count
    cli_store = use_store(monkeypatch, tmp_path / "cli")
    assert cli_main(["score", str(npz_set), "--dataset", "digits", *FAST_ARGS]) == 0
    out = capsys.readouterr().out
    assert "scored my_set-ipc2-convnet on digits" in out and "acc_syn_hard" in out
    # one line per score with its unit (ddlib.specs.units), mean ± std, interval and seeds, the headline score first
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["value", "unit"])
    assert lines[header].split()[-4:] == ["seed", "0", "seed", "1"], lines[header]
    assert lines[header + 1].split()[:2] == ["LRS", "0-100"], out
    assert re.search(r"^LRS +0-100 +\d+\.\d\d ± \d+\.\d\d +\[\d+\.\d\d, \d+\.\d\d\] +\d+\.\d\d +\d+\.\d\d$", out,
                     re.M), out
    assert re.search(r"^HLR +points ", out, re.M) and re.search(r"^acc_syn_hard +% ", out, re.M), out
    params_file = next((cli_store / "score").glob("label_robust-my_set-*.yaml"))
    assert yaml.safe_load(params_file.read_text())["methods"]["my_set"]["path"] == str(npz_set)
    protocol, experiment, cell = resolve_cell(score_grid(npz_set, "digits", **FAST))
    from_cli = cell_result(protocol, experiment, cell)
    assert list(from_cli.per_seed["seed"]) == [0, 1]

    assert cli_main(["score", str(npz_set), "--dataset", "digits", *FAST_ARGS]) == 0  # resumable: nothing retrained
    assert "reused the finished cell" in capsys.readouterr().out

    use_store(monkeypatch, tmp_path / "api")
    with np.load(npz_set) as z:
        result = ddlib.score(z["images"], z["labels"], dataset="digits", method="my_set", **FAST)
    columns = ["acc_syn_hard", "acc_rdm_hard", "acc_real_hard", "acc_syn_any", "acc_rdm_any", "hlr", "ior", "lrs"]
    pd.testing.assert_frame_equal(result.per_seed[["seed", *columns]].reset_index(drop=True),
                                  from_cli.per_seed[["seed", *columns]].reset_index(drop=True), check_dtype=False)
    assert result.summary["lrs_mean"] == pytest.approx(from_cli.summary["lrs_mean"])
    # tracked like any cell: a FINISHED cell run of the label_robust experiment, the set stored by content
    run = tracking.client().get_run(result.run_id)
    assert run.info.status == "FINISHED" and run.data.tags[TAG["kind"]] == "cell"
    assert len(list((tmp_path / "api" / "sets").glob("set-*.npz"))) == 1


def test_score_refuses_a_missing_or_bad_set_before_anything_runs(npz_set, tmp_path, monkeypatch, capsys):
    store = use_store(monkeypatch, tmp_path / "store")
    assert cli_main(["score", str(tmp_path / "nope.npz"), "--dataset", "digits"]) == 2
    assert "nope.npz: no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((20, 1, 8, 8), np.float32))  # no labels
    assert cli_main(["score", str(bad), "--dataset", "digits"]) == 2
    err = capsys.readouterr().err
    assert "bad.npz" in err and "labels" in err
    assert not (store / "mlflow.db").exists()  # nothing was tracked
    from ddlib.data.datasets import load_dataset
    from ddlib.data.distilled import load, save

    pt = save(load(npz_set, load_dataset("digits")), tmp_path / "as_pt.pt")  # the same set as a .pt
    assert cli_main(["score", str(pt), "--dataset", "digits", "--seeds", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[run]  as_pt-ipc2-convnet" in out and '"seeds": [0]' in out and "would run 1" in out
    assert not (store / "mlflow.db").exists()  # a dry run writes nothing
    with pytest.raises(ValueError, match="give images and labels, or path"):
        ddlib.score(dataset="digits")


def test_false_file_flags_and_index_0_reach_the_cell(tmp_path, monkeypatch, capsys):
    """A DC file that holds pixels needs ``normalized: false`` (the format's default is normalised):
    ``ddlib.score(normalized=False)``, ``ddlib score --no-normalized``, ``zca_space=False`` (over a file's
    own flag) and ``experiment_index=0`` reach the cell's source; all four were once dropped as falsy.
    ``trusted`` and ``allow_unequal`` left false stay out of the spec (the key a user's grid gives)."""
    from ddlib import scoring
    from ddlib.data.datasets import load_dataset

    use_store(monkeypatch, tmp_path / "store")
    ds = load_dataset("digits")
    idx = torch.cat([torch.nonzero(ds.train_labels == c)[:1, 0] for c in range(10)])
    path = tmp_path / "res_DC_pixels.pt"
    torch.save({"data": [[ds.train_images[idx], ds.train_labels[idx]]] * 2}, path)
    cells = []
    monkeypatch.setattr(scoring, "_run_steps", lambda protocol, experiment, cell, *a: cells.append(cell))
    ddlib.score(path=path, dataset="digits", normalized=False, zca_space=False, experiment_index=0, seeds=[0])
    assert cells[0]["source"] == {"kind": "file", "path": str(path), "normalized": False, "zca_space": False,
                                  "experiment_index": 0}
    assert cli_main(["score", str(path), "--dataset", "digits", "--seeds", "0", "--no-normalized", "--dry-run"]) == 0
    assert '"normalized": false' in capsys.readouterr().out
    assert cli_main(["score", str(path), "--dataset", "digits", "--seeds", "0", "--normalized", "--dry-run"]) == 0
    assert '"normalized": true' in capsys.readouterr().out


# --------------------------------------------------------------------------- --dry-run


def test_dry_run_fails_on_a_missing_file_or_data_root_before_anything_runs(npz_set, tmp_path, monkeypatch, capsys):
    store = use_store(monkeypatch, tmp_path / "store")
    grid = {"protocol": "label_robust", "params": {"dataset": "digits", **FAST},
            "grid": {"method": ["random", "mine", "gone"], "ipc": [2]},
            "methods": {"mine": {"kind": "file", "path": str(npz_set)},
                        "gone": {"kind": "file", "path": str(tmp_path / "gone_ipc{ipc}.npz")}}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    assert cli_main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "cell gone-ipc2-convnet" in err and "gone_ipc2.npz" in err and "before anything ran" in err
    assert not (store / "mlflow.db").exists()  # failed at the check: no store, so no cell trained

    empty = tmp_path / "no_cifar_here"  # a data root that exists but holds no CIFAR-10: found by loading it
    empty.mkdir()
    grid["params"].update(dataset="cifar10", data_root=str(empty))
    grid["grid"]["method"] = ["random"]
    path.write_text(yaml.safe_dump(grid))
    assert cli_main(["run", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "dataset 'cifar10'" in err and "no_cifar_here" in err and "before anything ran" in err


@pytest.mark.filterwarnings("ignore:sanity")  # 5 epochs: its accuracies are near chance, as intended
def test_dry_run_lists_cells_with_params_reuse_and_estimate(npz_set, tmp_path, monkeypatch, capsys):
    """A first dry run on an empty store: every cell to run, params resolved, no estimate; after one
    cell ran in process, the other cell of the same setting reuses its random-subset and reference
    models and is estimated from it."""
    use_store(monkeypatch, tmp_path / "store")
    cheap = {**FAST, "seeds": [0], "recipe": {"epochs": 5, "batch_size": 64}}
    grid = {"protocol": "label_robust", "params": {"dataset": "digits", **cheap},
            "grid": {"method": ["random", "mine"], "ipc": [2]}, "methods": {"mine": {"kind": "file", "path": str(npz_set)}}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    assert cli_main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[run]  random-ipc2-convnet" in out and "[run]  mine-ipc2-convnet" in out
    assert '"recipe": {"batch_size": 64, "epochs": 5}' in out and '"real_recipe": {"epochs": 2}' in out
    assert "no earlier run of this recipe" in out and "would run 2, skip 0" in out

    ddlib.score(path=npz_set, dataset="digits", method="mine", **cheap)
    from ddlib.run.plan import plan_grid

    plan = {c.name: c for c in plan_grid(path).cells}
    assert plan["mine-ipc2-convnet"].action == "skip"
    random_cell = plan["random-ipc2-convnet"]
    assert random_cell.action == "run" and random_cell.minutes is not None and random_cell.minutes > 0
    assert any(r.startswith("real_hard (seeds 0)") for r in random_cell.reuse)
    assert any(r.startswith("rdm_hard (seeds 0)") for r in random_cell.reuse)


# --------------------------------------------------------------------------- runs, export, sanity, ui


def _cell_run(tracker: Tracker, name: str, status: str, error: str | None = None) -> str:
    run_id = tracker.start_run(name, params={"dataset": "digits", "method": name, "ipc": 1},
                               tags={TAG["kind"]: "cell"})
    if error:
        tracker.fail_run(run_id, error)
    elif status == "FINISHED":
        tracker.end_run(run_id)
    return run_id


def test_runs_lists_cells_by_status(tmp_path, monkeypatch, capsys):
    use_store(monkeypatch, tmp_path / "store")
    tracker = Tracker("label_robust")
    _cell_run(tracker, "good", "FINISHED")
    _cell_run(tracker, "broken", "FAILED", error="DistilledSetError: /x.pt: unreadable")
    _cell_run(tracker, "busy", "RUNNING")
    assert cli_main(["runs", "--status", "failed"]) == 0
    out = capsys.readouterr().out
    assert "broken" in out and "DistilledSetError: /x.pt: unreadable" in out and "good" not in out
    assert cli_main(["runs", "--status", "running"]) == 0
    out = capsys.readouterr().out
    assert "busy" in out and "broken" not in out
    assert cli_main(["runs"]) == 0
    assert "3 cell runs: " in capsys.readouterr().out
    from ddlib.report.runs import list_cell_runs

    table = list_cell_runs(now=time.time() + 120).set_index("name")  # two minutes later
    assert table.loc["busy", "minutes"] == pytest.approx(2.0, abs=0.1)  # a running cell's minutes so far, not NaN


def test_runs_command_imports_no_torch_or_scipy(tmp_path):
    """``ddlib runs`` took 18-20 s for three runs: it imported the leaderboard code (torch, SciPy) to
    list runs. It needs the tracking layer and pandas only."""
    store = tmp_path / "store"
    code = ("import contextlib, io, sys, ddlib.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()): ddlib.cli.main(['runs'])\n"
            "print(sorted(m for m in ('torch', 'scipy.stats', 'ddlib.boards.read', 'ddlib.protocols.cell') if m in sys.modules))")
    env = {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "[]", out.stdout


@pytest.mark.slow
def test_export_writes_recipe_columns_and_flags_near_chance_rows(npz_set, tmp_path, monkeypatch, capsys):
    """Two rows that differ only in their recipe are told apart by recipe and epochs columns (not only
    by a hash); a full-data reference that never learned (lr 1e-12) is flagged in the notebook (a warning,
    a tag) and in the exported leaderboard."""
    use_store(monkeypatch, tmp_path / "store")
    base = {**FAST, "seeds": [0]}
    ddlib.score(path=npz_set, dataset="digits", method="mine", **{**base, "recipe": {"epochs": 30, "batch_size": 64}})
    with pytest.warns(UserWarning, match="full-data reference near chance"):
        broken = ddlib.score(path=npz_set, dataset="digits", method="mine",
                             **{**base, "recipe": {"epochs": 40, "batch_size": 64}, "real_recipe": {"epochs": 1, "lr": 1e-12}})
    assert "full-data reference near chance" in tracking.client().get_run(broken.run_id).data.tags["ddlib.sanity"]

    out = tmp_path / "board.md"
    assert cli_main(["export", "--format", "markdown", "--out", str(out), "--board", "lrs"]) == 0
    text = out.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| dataset"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    for column in ("recipe", "epochs", "real_epochs", "data_source", "code", "LRS", "sanity"):
        assert column in columns, column
    rows = [dict(zip(columns, (c.strip() for c in line.strip("|").split("|"))))
            for line in text.splitlines() if line.startswith("| digits")]
    by_epochs = {r["epochs"]: r for r in rows}
    assert set(by_epochs) == {"30", "40"}
    assert by_epochs["30"]["recipe"] == '{"batch_size": 64, "epochs": 30}' and by_epochs["30"]["real_epochs"] == "2"
    assert by_epochs["40"]["real_epochs"] == "1"
    assert by_epochs["40"]["sanity"].startswith("full-data reference near chance (acc_real_hard 10.0 %")
    assert by_epochs["30"]["sanity"] == ""
    assert by_epochs["30"]["data_source"] == "sklearn.datasets.load_digits"
    assert by_epochs["30"]["code"].startswith(ddlib.__version__)

    csv = tmp_path / "board.csv"
    assert cli_main(["export", "--format", "csv", "--out", str(csv)]) == 0
    table = pd.read_csv(csv)
    assert {"board", "recipe", "epochs", "lrs_mean", "lrs_low", "sanity"} <= set(table.columns)
    tex = tmp_path / "board.tex"
    assert cli_main(["export", "--format", "latex", "--out", str(tex), "--board", "lrs"]) == 0
    assert "\\begin{tabular}" in tex.read_text() and "real\\_epochs" in tex.read_text()


def test_near_chance_flags_reference_and_set_not_the_random_subset():
    assert metrics.near_chance({"acc_real_hard": 0.115, "acc_rdm_any": 0.10, "acc_syn_hard": 0.5}, 10) == [
        "full-data reference near chance (acc_real_hard 11.5 %, chance 10.0 %)"]
    assert metrics.near_chance({"acc_real_hard": 0.125, "acc_syn_hard": 0.119}, 10) == [
        "distilled set near chance (acc_syn_hard 11.9 %, chance 10.0 %)"]
    assert metrics.near_chance({"clean_acc": 0.015}, 100) == [
        "distilled set near chance (clean_acc 1.5 %, chance 1.0 %)"]
    assert metrics.near_chance({"clean_acc": 0.025}, 100) == []
    # 1000 classes: within chance of chance (0.1 % + 0.1 %), not 2 points: 1.5 % at IPC 1 is a result
    assert metrics.near_chance({"acc_syn_hard": 0.015}, 1000) == []
    assert len(metrics.near_chance({"acc_syn_hard": 0.0015}, 1000)) == 1
    assert metrics.near_chance({"acc_real_hard": 0.98, "acc_syn_hard": 0.5}, 10) == []


def test_leaderboard_sanity_column():
    rows = [{"group": m, "series": m, "family": "f", "seed": s, "run_id": f"run-{m}", "dataset": "digits", "ipc": 1,
             "method": m, "classes": 10.0, "acc_real_hard": real, "acc_syn_hard": 0.6, "lrs": 30.0}
            for m, real in (("smoke", 0.11), ("real", 0.97)) for s in (0, 1)]
    board = aggregate(pd.DataFrame(rows), ["acc_real_hard", "acc_syn_hard", "lrs"], ("dataset", "ipc", "method"))
    flags = dict(zip(board["method"], board["sanity"]))
    assert flags["smoke"].startswith("full-data reference near chance (acc_real_hard 11.0 %") and flags["real"] == ""
    shown = format_leaderboard(board)
    assert list(shown.columns)[-1] == "sanity"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_prints_its_address_once_it_answers_and_sigterm_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    """`ddlib ui` says where the UI is only once /health answers, and a SIGTERM to the ddlib process
    alone (not its group) stops MLflow's UI with its uvicorn workers: the port is free again. MLflow's
    job workers (Huey consumers) are not started: ddlib turns MLflow's job execution off.
    Why it takes about 20 s: `python -m ddlib ui` creates the new store (MLflow's schema migrations),
    then MLflow's UI process starts (its imports and uvicorn workers) until /health answers, most
    of the time; after the SIGTERM, the whole tree's graceful stop takes several seconds. A real process
    tree is the point: only it shows a worker left listening."""
    import psutil

    use_store(monkeypatch, tmp_path / "store")
    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    assert cli_main(["ui", "--print"]) == 0
    command = capsys.readouterr().out
    assert command.startswith(f"env MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false {sys.executable}")
    assert "--host 127.0.0.1" in command and "mlflow ui" in command
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ddlib", "ui", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    tree = []
    try:
        lines = []
        while not any(line.startswith("MLflow UI on") for line in lines) and len(lines) < 300 and proc.poll() is None:
            lines.append(proc.stdout.readline().strip())
        assert any(line == f"MLflow UI on http://127.0.0.1:{port} (Ctrl-C stops it)" for line in lines), lines
        # the address is printed after the server answers, not before
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert tree  # MLflow's UI and its workers
        assert not [p.cmdline() for p in tree if "huey" in " ".join(p.cmdline())]  # MLflow's job workers off
        proc.send_signal(signal.SIGTERM)  # the ddlib process only, as `kill <pid>` does
        assert proc.wait(timeout=60) == 0
        assert_gone(tree, port)  # MLflow's UI and its workers exit with it, the port is free
    finally:
        kill_leftovers(tree)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_export_formats_on_the_command_line_are_the_exporters():
    """The CLI lists the formats without importing the report stack; both lists must agree."""
    from ddlib.cli.commands import EXPORT_FORMATS
    from ddlib.report.export import FORMATS

    assert EXPORT_FORMATS == FORMATS


def test_the_command_line_and_the_registry_do_not_import_the_heavy_stacks():
    """Every grid cell's kernel and every ``ddlib`` command pays its imports: the CLI parser needs
    neither torch nor the attacks, and the model registry loads timm only for a ResNet or ViT."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys, ddlib.cli\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()): ddlib.cli.main(['run', '--help'])\n"
            "a = {m for m in ('torch', 'torchattacks', 'timm', 'mlflow') if m in sys.modules};"
            "import ddlib.engine.train; b = 'timm' in sys.modules;"
            "from ddlib.models import create_model; create_model('resnet18', 3, 10, 32); c = 'timm' in sys.modules;"
            "print(sorted(a), b, c)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[]", "False", "True"], out.stdout


def test_epochs_is_one_name_on_every_surface(tmp_path):
    """`--epochs` (CLI), `epochs=` (ddlib.score), `-p epochs` (papermill) and `epochs:` (grids) are one
    parameter, folded into the key the protocol trains by: the same cell as the protocol's own spelling."""
    import inspect

    import papermill as pm

    import ddlib
    from ddlib.protocols import augmentation_robust, compression, label_robust
    from ddlib.protocols.placement import cell_tags

    assert "epochs" in inspect.signature(ddlib.score).parameters
    for protocol in ("label_robust", "augmentation_robust", "adversarial", "compression", "nas"):
        assert "epochs" in pm.inspect_notebook(str(Path(__file__).parents[1] / "notebooks" / f"{protocol}.ipynb"))
    same = [(label_robust, {"epochs": 5}, {"recipe": {"epochs": 5}}),
            (label_robust, {"epochs": 5, "preset": "sre2l"}, {"preset_epochs": 5, "preset": "sre2l"}),
            (augmentation_robust, {"epochs": 5}, {"preset_epochs": 5}),
            (compression, {"epochs": 7}, {"recipe": {"epochs": 7}, "aug_epochs": 7})]
    for module, short, canonical in same:
        assert cell_tags(module.SPEC.name, module.validate(short)) == cell_tags(module.SPEC.name, module.validate(canonical))
    with pytest.raises(ValueError, match="epochs: 7 and aug_epochs: 9 disagree"):
        compression.validate({"epochs": 7, "aug_epochs": 9})


def test_a_set_scored_like_a_grid_sits_in_that_grids_setting(npz_set, tmp_path):
    from ddlib.scoring import score_grid

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"protocol": "augmentation_robust", "experiment": "my_ars",
                                    "params": {"dataset": "digits", "seeds": [0, 1], "preset": "dsa",
                                               "preset_epochs": 3}, "grid": {"method": ["random"], "ipc": [2]}}))
    scored = score_grid(npz_set, like=grid)
    assert scored["protocol"] == "augmentation_robust" and scored["experiment"] == "my_ars"
    assert scored["params"]["seeds"] == [0, 1] and scored["params"]["preset_epochs"] == 3
    assert scored["grid"]["method"] == ["my_set"]
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump({"protocol": "label_robust", "params": {"dataset": "digits"},
                                   "grid": {"method": ["random"], "ipc": [2], "preset": ["dsa", "dm"]}}))
    with pytest.raises(ValueError, match="crosses preset"):
        score_grid(npz_set, like=two)
