"""The prepared GPU session (bench/gpu_session.py) and its kit (bench/device_kit.py), checked on the CPU:
every step's script takes the options the session passes, the two calls fit their time, the device
command fits the tool's 2,000 characters, and the kit carries what the image lacks and nothing it has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import device_kit  # noqa: E402
import gpu_session  # noqa: E402


def test_the_kit_carries_what_the_image_lacks_and_not_what_it_has():
    need = device_kit.closure(["mlflow", "ddranking==0.2.0"])
    assert {"mlflow", "mlflow-skinny", "sqlalchemy", "alembic"} <= set(need)
    assert need["ddranking"] == "0.2.0"  # pinned, not installed here: carried without its requirements
    assert not set(need) & device_kit.IMAGE_PACKAGES  # numpy, pandas, torch ... are the image's
    assert not set(need) & device_kit.SKIP
    assert "numpy" not in need and "torch" not in need


def test_a_root_that_is_neither_installed_nor_pinned_is_refused():
    with pytest.raises(SystemExit, match="not installed in this venv and has no == pin"):
        device_kit.closure(["no-such-distribution-here"])


@pytest.mark.parametrize("call", [1, 2])
def test_each_call_fits_its_time_and_its_scripts_take_the_options_passed(call, tmp_path):
    plan = gpu_session.steps(call, "cuda", tmp_path)
    assert sum(s["seconds"] for s in plan) <= gpu_session.CALL_SECONDS
    done = subprocess.run([sys.executable, "bench/gpu_session.py", "--call", str(call), "--device", "cuda",
                           "--out", str(tmp_path), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_device_command_fits_the_tool():
    for call in (1, 2):
        command = gpu_session.device_command(call)
        assert len(command) <= 2000
        assert command.startswith(device_kit.INSTALL) and f"--call {call}" in command
        assert "DDLIB_BENCH_COMMIT=" in command
