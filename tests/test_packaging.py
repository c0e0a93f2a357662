"""The install paths: pyproject.toml declares ranges, requirements-lock.txt pins the exact versions
`make setup` and environment.yml install with (as constraints), and a wheel carries what a
`pip install`ed ddlib needs to run its notebooks."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import ddlib

ROOT = Path(__file__).resolve().parents[1]
LOCK = "requirements-lock.txt"


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> list[Requirement]:
    project = _project()["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return reqs + [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / LOCK).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.+]*)", line)
            assert match, f"{LOCK}: not an exact pin: {line!r}"
            name = canonicalize_name(match[1])
            assert name not in pins, f"{LOCK}: {name} pinned twice"
            pins[name] = match[2]
    return pins


def test_pyproject_declares_ranges_that_the_lock_satisfies():
    lock = _lock()
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "ddlib":  # the `all` extra names the others
            assert req.extras == {"notebooks", "cluster", "adversarial", "test"}
            continue
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"pyproject pins {req}: a range belongs there"
        assert any(s.operator == ">=" for s in req.specifier) and any(s.operator == "<" for s in req.specifier), req
        assert name in lock, f"{req.name} has no pin in {LOCK}"
        assert req.specifier.contains(lock[name]), f"{LOCK} pins {name}=={lock[name]}, outside pyproject's {req}"
    # today's versions, the ones the published numbers of this repository were measured with
    assert {k: lock[k] for k in ("torch", "torchvision", "mlflow", "torchattacks", "ray")} == {
        "torch": "2.14.1", "torchvision": "0.29.1", "mlflow": "3.17.2", "torchattacks": "3.5.1", "ray": "2.60.0"}


def test_heavy_parts_are_extras():
    project = _project()["project"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    extras = {k: {canonicalize_name(Requirement(r).name) for r in v} for k, v in project["optional-dependencies"].items()}
    assert {"papermill", "ipykernel", "jupyter"} <= extras["notebooks"]
    assert {"ray", "psycopg"} <= extras["cluster"] and "pytest" in extras["test"]
    assert not core & {"papermill", "ipykernel", "jupyter", "ray", "psycopg", "pytest", "torchattacks"}
    # torchattacks (every release pins requests~=2.25.1) is in no extra: it goes in with --no-deps
    assert "torchattacks" not in set().union(*extras.values())
    assert {"numpy", "scipy", "tqdm"} <= extras["adversarial"]  # what torchattacks imports besides torch


def test_environment_yml_installs_with_the_lock():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert pip_section == [f"-c {LOCK}", "-e .[all]"]
    assert f"pip install -c {LOCK} --no-deps torchattacks" in (ROOT / "environment.yml").read_text()


def test_makefile_installs_with_the_lock_and_checks():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): pyproject.toml requirements-lock.txt$", makefile, re.M)
    assert f'pip install -c {LOCK} -e ".[all]"' in makefile
    assert f"pip install -c {LOCK} --no-deps torchattacks" in makefile
    assert "pip check" in makefile
    assert not (ROOT / "vendor").exists()


def test_makefile_pip_check_tolerates_only_the_torchattacks_pin():
    pattern = re.search(r"^KNOWN_PIP_CHECK := (.*)$", (ROOT / "Makefile").read_text(), re.M)[1].replace("$$", "$")

    def left(output: str) -> list[str]:
        return [line for line in output.splitlines() if not re.search(pattern, line)]

    assert left("torchattacks 3.5.1 has requirement requests~=2.25.1, but you have requests 2.34.2.") == []
    assert left("No broken requirements found.") == []
    other = "mlflow 3.17.2 has requirement requests<3,>=2.17.3, but you have requests 3.0.0."
    assert left(other) == [other]
    assert left("torchattacks 3.5.1 requires scipy, which is not installed.") != []


def test_ci_calls_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_mlruns_is_ignored_except_gitkeep():
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "mlruns/*" in ignore and "!mlruns/.gitkeep" in ignore


def test_listed_packages_are_every_package_of_the_checkout():
    from setuptools import find_packages

    listed = _project()["tool"]["setuptools"]["packages"]
    assert sorted(p for p in listed if not p.startswith("ddlib._files")) == sorted(find_packages(str(ROOT), include=["ddlib*"]))


@pytest.mark.slow
def test_wheel_carries_the_notebooks_presets_and_grids(tmp_path):
    """A non-editable install runs notebooks from the wheel: they, the presets and the shipped grids
    (`ddlib run demo` from any folder) are inside it."""
    src = tmp_path / "src"  # a copy: setuptools writes build/ and ddlib.egg-info/ beside the sources
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "mlruns", "build", "*.egg-info", "__pycache__",
                                                             "tests", "bench", "site", "docs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(src)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("ddlib-*.whl"))
    assert wheel.name == f"ddlib-{ddlib.__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"ddlib/_files/notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb")} <= names
    assert {f"ddlib/_files/presets/{p.name}" for p in (ROOT / "params" / "methods").glob("*.yaml")} <= names
    grids = {name for name in names if name.startswith("ddlib/_files/grids/")}
    assert grids == {f"ddlib/_files/grids/{p.name}" for p in (ROOT / "params").glob("*.yaml")}  # *.yaml only
    metadata = zipfile.ZipFile(wheel).read(f"ddlib-{ddlib.__version__}.dist-info/METADATA").decode()
    assert "Requires-Dist: torch<3,>=2.4" in metadata
    assert "Provides-Extra: adversarial" in metadata


def test_wheel_layout_reads_notebooks_presets_and_grids_from_the_package(monkeypatch, tmp_path):
    from ddlib.run import shipped_grids
    from ddlib.store import paths, tracking
    monkeypatch.setattr(paths, "IN_CHECKOUT", False)
    package = Path(ddlib.__file__).resolve().parent
    assert tracking.project_folder("notebooks") == package / "_files" / "notebooks"
    assert tracking.project_folder("params/methods") == package / "_files" / "presets"
    assert tracking.project_folder("params") == package / "_files" / "grids"
    installed = tmp_path / "site-packages" / "ddlib" / "_files" / "grids"  # as a wheel lays them out
    installed.mkdir(parents=True)
    shutil.copy(ROOT / "params" / "demo.yaml", installed)
    monkeypatch.setattr(shipped_grids, "project_folder", lambda name: installed if name == "params" else None)
    monkeypatch.chdir(tmp_path)
    assert shipped_grids.grid_file("demo") == installed / "demo.yaml"
    assert shipped_grids.grid_file("params/demo.yaml") == installed / "demo.yaml"
    monkeypatch.setattr(paths, "IN_CHECKOUT", True)
    assert tracking.project_folder("notebooks") == ROOT / "notebooks"
    assert tracking.project_folder("params") == ROOT / "params"


def test_version_prints_version_and_commit(capsys):
    from ddlib.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    assert re.fullmatch(rf"ddlib {re.escape(ddlib.__version__)} \(commit [0-9a-f]{{40}}(-dirty)?\)", out), out


def test_a_command_exits_without_a_last_collection_and_its_handlers_still_run(mlflow_store, tmp_path, monkeypatch):
    """Every command registers ``gc.freeze`` at exit once (however often ``main`` runs in a process):
    the interpreter's last collections then skip the imported stack (1.4-2 s of each exit). Handlers
    registered after it still run, before it; the exit status is the command's."""
    import gc
    import types

    from ddlib.cli import entry as cli
    store = tmp_path / "mlruns"
    env = {**os.environ, "DDLIB_MLRUNS": str(store), "MLFLOW_TRACKING_URI": f"sqlite:///{store / 'mlflow.db'}"}
    code = ("import atexit, gc, sys\nfrom ddlib.cli import main\nstatus = main(['runs'])\n"
            "atexit.register(lambda: print('handler ran; collector on:', gc.isenabled(),\n"
            "                              'frozen:', gc.get_freeze_count() == 0))\n"
            "sys.exit(status + 3)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3 and "handler ran; collector on: True frozen: True" in done.stdout, done.stdout + done.stderr
    registered = []  # what main() leaves registered, however often it runs in one process (the tests)
    fake = types.SimpleNamespace(register=registered.append,
                                 unregister=lambda f: registered.remove(f) if f in registered else None)
    monkeypatch.setattr(cli, "atexit", fake)
    for _ in range(2):
        assert cli.main(["runs"]) in (0, 1)
    assert registered == [gc.freeze]


def test_installed_wheel_reports_the_commit_pip_recorded(monkeypatch):
    """Outside a checkout git is not asked (it would answer for the repository around the venv)."""
    from ddlib.store import paths, provenance, tracking
    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return '{"url": "https://example.org/ddlib.git", "vcs_info": {"vcs": "git", "commit_id": "' + "ab" * 20 + '"}}'

    monkeypatch.setattr(paths, "IN_CHECKOUT", False)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    monkeypatch.setattr(provenance.subprocess, "run", lambda *a, **k: pytest.fail("git was asked"))
    assert tracking.git_commit() == "ab" * 20
    assert tracking.code_version() == f"ddlib {ddlib.__version__} (commit {'ab' * 20})"


def test_without_the_notebooks_extra_a_grid_stops_naming_it(monkeypatch, tmp_path):
    """`ddlib run` / `ddlib score` execute notebooks: without papermill and ipykernel they say which extra."""
    import importlib.util

    from ddlib.run import runner
    real = importlib.util.find_spec
    hidden = ("papermill", "ipykernel")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in hidden else real(name, *a))
    wanted = r"needs papermill and ipykernel, not installed: pip install 'ddlib\[notebooks\]'"
    with pytest.raises(runner.ExecutorError, match=wanted):
        runner.check_notebook_runner()


def test_without_torchattacks_ddlib_imports_and_beard_names_the_install():
    """torchattacks is no dependency (its requests pin): everything but BEARD's attacks imports without it,
    and those say how to install it."""
    code = ("import sys; sys.modules['torchattacks'] = None\n"
            "import ddlib.report.report, ddlib.report.export, ddlib.protocols.beard_boards, ddlib.cli\n"
            "try:\n    import ddlib.attacks\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == ("BEARD's attacks need torchattacks, which is not installed: "
                                  "pip install --no-deps 'torchattacks>=3.5.1,<4'")
