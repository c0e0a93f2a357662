"""The conformance harness: run a peer benchmark's released code in its own environment on saved
tensors, and get tensors back.

DD-Ranking (``ddranking==0.2.0``) is installed the way ``bench/vs_ddranking.py`` installs it, by its
own :func:`bench.vs_ddranking.ensure_peer_venv`: its own venv, ``pip install --no-deps`` plus the
exact pins of what its source imports, once per machine under ``${DDLIB_CACHE:-~/.cache/ddlib}/
venv-ddranking`` (``$DDLIB_PEER_VENV`` to put it elsewhere; about 1.5 min and 6 GB the first time).
Where it cannot be had (no network to PyPI, ``DDLIB_NO_PEER=1``) the tests that need it skip,
saying why.

:func:`run_cases` saves ``{case: inputs}`` with ``torch.save`` to a temporary folder, runs a
peer-side script (``tests/peer_ddranking.py``, which never imports ddlib) with the peer's Python
once for all the cases, and returns ``{case: outputs}``; a test module asks for all its cases in one
call (one subprocess per module).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DDRANKING_CASES = Path(__file__).resolve().parent / "peer_ddranking.py"


class PeerUnavailable(RuntimeError):
    """The peer's environment cannot be had here (the message says why)."""


class PeerSkipped(UserWarning):
    """Warned when the conformance tests skip for want of the peer: shown in pytest's warnings summary."""


@functools.lru_cache(maxsize=None)
def ddranking_python() -> Path:
    """The Python of DD-Ranking's venv, created on first use; :class:`PeerUnavailable` if it cannot be."""
    if os.environ.get("DDLIB_NO_PEER"):
        raise PeerUnavailable("DDLIB_NO_PEER is set")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.vs_ddranking import PEER_PACKAGE, ensure_peer_venv, peer_python

    try:
        ensure_peer_venv()
    except subprocess.CalledProcessError as error:
        tail = (error.stderr or error.stdout or "").strip().splitlines()[-1:] or [str(error)]
        raise PeerUnavailable(f"could not install {PEER_PACKAGE} into its own venv "
                              f"(no network to PyPI?): {tail[0]}") from error
    except (OSError, RuntimeError) as error:
        raise PeerUnavailable(f"could not set up {PEER_PACKAGE}'s venv: {error}") from error
    return peer_python()


def run_cases(cases: dict, script: Path = DDRANKING_CASES, timeout: float = 1200) -> dict:
    """Run ``script``'s cases in the peer's environment: ``{case: inputs}`` in, ``{case: outputs}`` out.
    A case that raised comes back as ``{"error": traceback}``."""
    import torch

    python = ddranking_python()
    with tempfile.TemporaryDirectory(prefix="ddlib-peer-") as tmp:
        inp, out = Path(tmp) / "in.pt", Path(tmp) / "out.pt"
        torch.save(cases, inp)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}  # never ddlib
        env.update(OMP_NUM_THREADS="2", TQDM_DISABLE="1", CUDA_VISIBLE_DEVICES="")
        proc = subprocess.run([str(python), str(script), str(inp), str(out)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=tmp)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{script.name} failed in the peer's venv (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return torch.load(out, weights_only=False)


def result(outputs: dict, case: str):
    """One case's outputs; a case that raised in the peer fails the test with its traceback."""
    value = outputs[case]
    if isinstance(value, dict) and set(value) == {"error"}:
        raise AssertionError(f"peer case {case!r} raised:\n{value['error']}")
    return value
