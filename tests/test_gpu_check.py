"""bench/gpu_check.py, the one command that checks every CUDA path (issue 25): skipped with one line
where no CUDA device exists, a tiny cell for every protocol, stops at the first failure, and its
CPU self-test runs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlib.protocols import PROTOCOLS, protocol_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **extra}


def test_without_cuda_it_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env=_env(CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no CUDA device: gpu_check skipped\n"
    assert not out.exists()


def test_a_valid_tiny_cell_for_every_protocol(gpu_check, tmp_path):
    assert set(gpu_check.CELLS) == set(PROTOCOLS)  # a new protocol needs its cell here
    for protocol in gpu_check.CELLS:
        for quick in (False, True):  # the CUDA cells and the self-test's
            params = protocol_module(protocol).validate(gpu_check.cell_params(protocol, "cuda", tmp_path, quick))
            assert params["device"] == "cuda" and params["dataset"] == "digits" and params["seeds"] == [0], protocol


def test_the_first_failure_stops_the_run_with_its_traceback(gpu_check, tmp_path, capsys):
    ran = []

    def ok(ctx):
        ran.append("ok")
        return {"images_per_s": 12.5}

    def broken(ctx):
        ran.append("broken")
        raise gpu_check.CheckFailed("batched 3.10x sequential (target 10.0x)")

    def later(ctx):
        ran.append("later")

    def context():
        import torch

        return gpu_check.Context(torch.device("cpu"), True, tmp_path, 10.0, 500)

    out = tmp_path / "gpu_check.json"
    checks = [("first", ok), ("second", broken), ("third", later)]
    assert gpu_check.run_checks(context(), checks, out) == 1
    assert ran == ["ok", "broken"]
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert lines[0].startswith("PASS first") and "images_per_s=12.5" in lines[0]
    assert lines[1].startswith("FAIL second") and lines[2].startswith("gpu_check: 1/3 checks passed")
    assert "Traceback" in printed.err and "target 10.0x" in printed.err
    record = json.loads(out.read_text())
    assert [c["status"] for c in record["checks"]] == ["PASS", "FAIL"] and record["passed"] is False
    ran.clear()
    assert gpu_check.run_checks(context(), checks, None, keep_going=True) == 1
    assert ran == ["ok", "broken", "later"]


@pytest.mark.slow
def test_the_cpu_self_test_passes(tmp_path):
    """Part of ``--device cpu --quick`` (the whole self-test takes about 5 minutes on 2 cores): the
    environment record, one cell through the runner, the batched mode and the OOM halving. Why it takes
    about 36 s: the script's own interpreter (torch's import), then its cell check, a `ddlib run` process
    with its worker, a papermill kernel and a new store for the augmentation cell's 3 models (about half),
    the batched check's 5 seeds of 30 epochs trained twice as tests/test_batched.py does (about a
    quarter), and the OOM check's ConvNet test passes (about a tenth); this is the script users run."""
    out = tmp_path / "gpu_check.json"
    only = ["environment", "cell:augmentation", "batched", "oom_halving"]
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out), "--only", *only],
                          cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert [c["name"] for c in record["checks"]] == only and record["passed"] is True
    assert {"matmul_allow_tf32", "cudnn_allow_tf32", "bf16_supported", "precision_auto"} <= set(record["settings"])
    assert record["machine"]["cpu_model"] and record["cells"]["augmentation"]["device_name"].startswith("cpu")
    assert record["oom_halving"]["simulated"]["tried"][:3] == [1000, 500, 250]
