#!/usr/bin/env python
"""What a GPU session carries to the device machine: the wheels its image lacks and the data files.

The device machine (an H200 lent now and then, bench/README.md) is bare each call and reaches
nothing: its ``python3`` holds torch, numpy, pandas, scipy, timm and the rest of
:data:`IMAGE_PACKAGES`, but not MLflow, papermill, kornia, torchattacks or the peer ``ddranking``.
This script, run here where the package registries answer, puts into the checkout's ignored folders

* ``.whl/common/``, ``.whl/<kit>/``: every distribution a kit needs that the image lacks, as py3.12
  manylinux wheels at this venv's versions (the lock file's): the kit's roots and their declared
  requirements, recursively, less the image's packages (``pip download --no-deps``); what every kit
  needs once in ``common``;
* ``.devdata/data/``: the files of ``../shared/data`` a kit reads (``../shared`` does not travel);
  scripts find them with ``DDLIB_SHARED=$PWD/.devdata``;

adds both to ``.git/info/exclude`` and prints, per kit, what a call carrying it sends against the
64 MiB a call may carry (:func:`carry`). There the command begins with :data:`INSTALL` (pip installs
whatever wheels came into ``/tmp/site``). One kit per call: both together are over the limit.

    .venv/bin/python bench/device_kit.py          # every kit (a minute; run before the first call)
    .venv/bin/python bench/device_kit.py --list   # what each kit needs, nothing written
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
DEVDATA = ROOT / ".devdata"
SHARED = ROOT.parent / "shared" / "data"
LIMIT_MIB = 64  # what one device call may carry: the working tree and the carried paths together

# The device image's Python packages (/work/.library/device/KINDS.md, read 2026-11-17); normalised names.
IMAGE_PACKAGES = frozenset(re.sub(r"[-_.]+", "-", n.strip().lower()) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split())

# What each kit's scripts import beyond the image (roots; their requirements follow) and the data they read.
KITS = {
    # bench/batched_compile.py, engine_throughput.py, fixed_cost.py, gpu_check.py: ddlib's cells through
    # `ddlib run` (papermill and a notebook kernel), MLflow's store, kornia's augmentations, the attacks
    "engine": {"roots": ["mlflow", "papermill", "ipykernel", "kornia", "torchattacks"], "data": []},
    # bench/vs_ddranking.py --device cuda: ddlib's cells in-process (no papermill), the peer package, CIFAR-10 (JPEG)
    "peer": {"roots": ["mlflow", "kornia", "ddranking==0.2.0"],
             "data": ["cifar10-jpeg.tar.gz", "distilled/dc_cifar10_convnet_ipc10.pt"]},
}
# Declared but not imported on the paths measured (MLflow's server and its auth, IPython's completion, the
# kernel's debugger), left behind for size: checked here by running a cell with them blocked (bench/README.md).
# Not skippable: databricks-sdk (``import mlflow`` probes ``databricks.agents``), cryptography (MLflow's SQL
# store imports the model registry's tables), kornia-rs (``import kornia``).
SKIP = frozenset({"docker", "gunicorn", "graphene", "graphql-core", "graphql-relay", "huey", "google-auth", "pyasn1",
                  "pyasn1-modules", "rsa", "jedi", "parso", "debugpy"})
# Installed there by the call's command; PYTHONPATH puts them and the checkout (ddlib) first.
INSTALL = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
           ".whl/*/*.whl && export PYTHONPATH=/tmp/site:$PWD DDLIB_SHARED=$PWD/.devdata || exit;")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64"]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.lower())


def closure(roots: list[str]) -> dict[str, str]:
    """name -> version of every distribution the roots need (declared requirements, markers evaluated for
    Python 3.12 on Linux, no extras) that the image lacks; versions from this venv, else the root's pin."""
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    need: dict[str, str] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = normalise(req.name)
        if name in need or name in IMAGE_PACKAGES or name in SKIP:
            continue
        pinned = [s.version for s in req.specifier if s.operator == "=="]
        try:
            dist = md.distribution(req.name)
            version = pinned[0] if pinned else dist.version
        except md.PackageNotFoundError:
            if not pinned:
                raise SystemExit(f"device_kit: {req.name} is not installed in this venv and has no == pin") from None
            need[name] = pinned[0]
            continue  # the peer: --no-deps, its imports are the image's or named as roots
        need[name] = version
        if pinned and pinned[0] != dist.version:
            continue  # another version than this venv's: its requirements are not read here
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or sub.marker.evaluate(env):
                todo.append(sub)
    return dict(sorted(need.items()))


def fetch(packages: dict[str, str], folder: Path) -> None:
    folder.mkdir(parents=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version in packages.items():
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", *platforms, "-d", str(folder), f"{name}=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"device_kit: pip download {name}=={version} failed: {done.stderr.strip()[-400:]}")


def carry(kit: str) -> list[str]:
    """The paths a device call running ``kit``'s scripts names in ``carry``."""
    return [f"{WHEELS.name}/common", f"{WHEELS.name}/{kit}"] + ([DEVDATA.name] if KITS[kit]["data"] else [])


def copy_data(files: list[str]) -> None:
    for rel in files:
        src, dst = SHARED / rel, DEVDATA / "data" / rel
        if not src.exists():
            raise SystemExit(f"device_kit: {src} is missing (the kit's data comes from ../shared/data)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def exclude(*names: str) -> None:
    path = ROOT / ".git" / "info" / "exclude"
    path.parent.mkdir(parents=True, exist_ok=True)
    have = path.read_text().splitlines() if path.exists() else []
    path.write_text("\n".join(have + [f"/{n}/" for n in names if f"/{n}/" not in have]) + "\n")


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return sum(p.stat().st_size for p in files) / 2**20


def travelling_mib() -> float:
    """The working tree as a device call sends it: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in out if f and (ROOT / f.decode()).is_file()) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print what each kit needs; fetch and copy nothing")
    args = ap.parse_args(argv)
    needs = {kit: closure(spec["roots"]) for kit, spec in KITS.items()}
    common = dict(set.intersection(*(set(n.items()) for n in needs.values())))
    for kit, need in needs.items():
        print(f"{kit}: {len(need)} distributions the image lacks ({len(need) - len(common)} its own): "
              + ", ".join(f"{n}=={v}" for n, v in need.items()))
    if args.list:
        return 0
    exclude(WHEELS.name, DEVDATA.name)
    for folder in (WHEELS, DEVDATA):
        shutil.rmtree(folder, ignore_errors=True)
    fetch(common, WHEELS / "common")
    for kit, need in needs.items():
        fetch({n: v for n, v in need.items() if n not in common}, WHEELS / kit)
    copy_data(sorted({f for spec in KITS.values() for f in spec["data"]}))
    tree, over = travelling_mib(), []
    for kit in KITS:
        paths = carry(kit)
        total = tree + sum(mib(ROOT / p) for p in paths)
        print(f"{kit}: carry {paths}: tree {tree:.1f} MiB + " + " + ".join(f"{p} {mib(ROOT / p):.1f}" for p in paths)
              + f" = {total:.1f} MiB of {LIMIT_MIB}")
        if total > LIMIT_MIB:
            over.append(kit)
    print(f"the command begins with:\n  {INSTALL}")
    if over:
        print(f"device_kit: {over} over the {LIMIT_MIB} MiB a call carries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
