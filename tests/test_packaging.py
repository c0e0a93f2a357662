"""The two install paths (pip via pyproject, conda via environment.yml) pin the same versions."""

import base64
import hashlib
import importlib.metadata
import importlib.util
import re
import tomllib
import zipfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TORCHATTACKS_WHEEL = "vendor/torchattacks-3.5.1+ddlib1-py3-none-any.whl"


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = project["dependencies"] + [p for extra in project["optional-dependencies"].values() for p in extra]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e ." in pip_section
    # the repacked torchattacks wheel is installed from vendor/, before the package itself
    assert TORCHATTACKS_WHEEL in pip_section
    assert pip_section.index(TORCHATTACKS_WHEEL) < pip_section.index("-e .")
    assert sorted(p for p in pip_section if p not in ("-e .", TORCHATTACKS_WHEEL)) == sorted(pinned)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+(\[[a-z,]+\])?==[0-9][0-9A-Za-z.]*", p) for p in pinned), "pin exact versions"
    assert "ray==2.60.0" in pinned and "psycopg[binary]==3.3.9" in pinned  # scale-out: Ray, PostgreSQL
    assert "torch==2.14.1" in pinned and "torchvision==0.29.1" in pinned and "mlflow==3.17.2" in pinned


def test_ci_calls_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_mlruns_is_ignored_except_gitkeep():
    ignore = (ROOT / ".gitignore").read_text().split()
    assert "mlruns/*" in ignore and "!mlruns/.gitkeep" in ignore


def _repack_script():
    spec = importlib.util.spec_from_file_location("repack_torchattacks", ROOT / "vendor" / "repack_torchattacks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_makefile_installs_the_vendored_wheel():
    makefile = (ROOT / "Makefile").read_text()
    assert f"pip install {TORCHATTACKS_WHEEL} -e" in makefile
    assert '-e ".[test,cluster]"' in makefile  # the tests need Ray and psycopg
    assert re.search(r"^\$\(STAMP\):.*" + re.escape(TORCHATTACKS_WHEEL), makefile, re.M)
    assert "pip check" in makefile
    assert "torchattacks==3.5.1" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_vendored_torchattacks_wheel_is_upstream_without_requests_and_robustbench():
    repack = _repack_script()
    assert repack.OUTPUT_WHEEL == Path(TORCHATTACKS_WHEEL).name
    wheel = ROOT / TORCHATTACKS_WHEEL
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        members = {n: zf.read(n) for n in names}
    info = "torchattacks-3.5.1+ddlib1.dist-info"
    # torchattacks/ files byte-identical to upstream 3.5.1 (hashes from its RECORD, pinned in the script)
    package = {n for n in names if n.startswith("torchattacks/")}
    assert package == set(repack.UPSTREAM_FILES)
    for path, (digest, size) in repack.UPSTREAM_FILES.items():
        data = members[path]
        assert len(data) == size, path
        assert base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() == digest, path
    # nothing else but the .dist-info: no robustbench
    assert not any(n.startswith("robustbench") for n in names)
    assert set(names) - package == {f"{info}/{f}" for f in ("LICENSE", "METADATA", "WHEEL", "top_level.txt", "RECORD")}
    assert members[f"{info}/top_level.txt"].decode().split() == ["torchattacks"]
    metadata = members[f"{info}/METADATA"].decode()
    assert "Version: 3.5.1+ddlib1\n" in metadata
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not any(r.lower().startswith("requests") for r in requires)
    # RECORD lists every other file with its hash and size
    record = {}
    for line in members[f"{info}/RECORD"].decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        record[path] = (digest, size)
    assert set(record) == set(names)
    for path in names:
        if path != f"{info}/RECORD":
            data = members[path]
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert record[path] == (want, str(len(data))), path
    # deterministic: fixed timestamps, sorted package entries, RECORD last
    with zipfile.ZipFile(wheel) as zf:
        assert {zi.date_time for zi in zf.infolist()} == {repack.ZIP_DATE}
    assert [n for n in names if n.startswith("torchattacks/")] == sorted(package)
    assert names[-1] == f"{info}/RECORD"


def test_installed_torchattacks_is_the_vendored_wheel():
    assert importlib.metadata.version("torchattacks") == "3.5.1+ddlib1"
    files = importlib.metadata.files("torchattacks") or []
    assert not any(str(f).startswith("robustbench") for f in files)
    requires = importlib.metadata.requires("torchattacks") or []
    assert not any(r.lower().startswith("requests") for r in requires)
