"""The code passes ruff under the configuration in pyproject.toml ([tool.ruff]), as the linter itself reads it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["ddlib", "tests", "bench"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                                reason="ruff is not installed (pip install -e '.[test]' installs ruff==0.17.6)")


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    # --no-cache: nothing written into the checkout
    return subprocess.run([sys.executable, "-m", "ruff", *args, "--no-cache"], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    done = _ruff("check", *PATHS, "--output-format", "concise")
    assert done.returncode == 0, f"ruff check {' '.join(PATHS)} found:\n{done.stdout}{done.stderr}"


def test_the_configuration_applies_to_the_checked_paths():
    # a 131-character line in a ddlib module is an error (E501 at line-length 130), a 130-character one is not;
    # ruff's defaults (line-length 88, no E501) would pass both
    for length, fails in ((131, True), (130, False)):
        line = "x = " + repr("a" * (length - 6)) + "\n"
        assert len(line) == length + 1
        done = _ruff("check", "--stdin-filename", "ddlib/_lint_probe.py", "--output-format", "concise", "-", stdin=line)
        assert (done.returncode != 0) == fails, done.stdout + done.stderr
        assert ("E501" in done.stdout) == fails, done.stdout
    # pyflakes and pycodestyle warnings are selected: an unused import, trailing whitespace
    done = _ruff("check", "--stdin-filename", "tests/_lint_probe.py", "--output-format", "concise", "-",
                 stdin="import os \n")
    assert "F401" in done.stdout and "W291" in done.stdout, done.stdout
    # the vendored wheel's repack script is not ours to lint
    shown = {Path(line.strip()) for line in _ruff("check", "--show-files", ".").stdout.splitlines() if line.strip()}
    assert ROOT / "ddlib" / "engine" / "train.py" in shown
    assert not any(ROOT / "vendor" in path.parents for path in shown), sorted(shown)
