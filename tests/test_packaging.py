"""The two install paths (pip via pyproject, conda via environment.yml) pin the same versions."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = project["dependencies"] + project["optional-dependencies"]["test"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section
    assert sorted(p for p in pip_section if p != "-e .") == sorted(pinned)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", p) for p in pinned), "pin exact versions"
    assert "torch==2.14.1" in pinned and "torchvision==0.29.1" in pinned and "mlflow==3.17.2" in pinned


def test_ci_calls_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_mlruns_is_ignored_except_gitkeep():
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "mlruns/*" in ignore and "!mlruns/.gitkeep" in ignore
