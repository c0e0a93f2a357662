"""Hostile input beside the params-file table of test_hostile_inputs.py (issue 53.7): command-line
options (``--param`` values get a params file's checks), files that are no params file (/dev/zero, a
file too large), broken modules on ``DDLIB_PROTOCOL_PATH``, and two places where the run said
something else than its params or the dry run (a relative path written into ``ddlib score``'s params
file, ``--strict`` on a reduced test split). Each is one line (exit 2) or handled right."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ddlib.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_thread")

g = torch.Generator().manual_seed(0)
IMAGES, LABELS = torch.rand((10, 1, 8, 8), generator=g), torch.arange(10)
GRID = {"protocol": "label_robust", "params": {"dataset": "digits", "seeds": [0]},
        "grid": {"method": ["random"], "ipc": [1]}}


def a_set(folder: Path) -> Path:
    path = folder / "set.npz"
    np.savez(path, images=IMAGES.numpy(), labels=LABELS.numpy())
    return path


def error_lines(err: str) -> list[str]:
    """stderr without its warning lines; no traceback anywhere."""
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if not line.startswith("warning: ")]


@contextlib.contextmanager
def memory_bound(extra: int = 2**30):
    """At most ``extra`` more bytes of address space while the block runs: code that reads /dev/zero
    without bound raises MemoryError instead of filling the machine (Linux; no bound elsewhere)."""
    try:
        import resource

        used = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (used + extra if hard == resource.RLIM_INFINITY else min(hard, used + extra),
                                            hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# --------------------------------------------------------------------------- ddlib score's options

PARAM_BOMB = ("lr_grid=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], "
              "&c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c], "
              "[*d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d, *d]]")


@pytest.mark.parametrize("args,message", [
    (["--param", "lr_policy=[unclosed"], r"^error: --param lr_policy: not valid YAML \(.*\)$"),
    (["--param", "lr_policy=\udcff"], r"^error: --param lr_policy: the value holds bytes that are not UTF-8$"),
    (["--param", "=3"], r"^error: --param takes key=value, got '=3'$"),
    (["--param", "recipe=&a [*a]"], r"^error: --param recipe: not valid YAML \(an alias refers to a node that "
                                     r"contains it \(a recursive document\)\)$"),
    (["--param", PARAM_BOMB], r"^error: --param lr_grid: the document expands to [\d,]+ values through its "
                              r"aliases .*an alias bomb\?$"),
    (["--param", "lr_policy=fi\x07xed"], r"^error: --param lr_policy: control character 0x07 on line 1, column 3; "),
    (["--param", "real_recipe={epochs: 1, epochs: 2}"], r"^error: --param real_recipe: not valid YAML \(duplicate "
                                                        r"key 'epochs' \(first given on line 1\)"),
    (["--param", "\udcff=1"], r"^error: --param: the key holds bytes that are not UTF-8$"),
    (["--method", "\udcff"], r"^error: --method: the value holds bytes that are not UTF-8$"),
    (["--method", "a/b"], r"^error: --method: a name for the leaderboards \(it also names the params file\), "
                          r"without /, got 'a/b'$"),
], ids=["unclosed-yaml", "not-utf8", "no-key", "recursive-alias", "alias-bomb", "control-byte", "duplicate-key",
        "key-not-utf8", "method-not-utf8", "method-a-path"])
def test_score_options_get_the_checks_of_a_params_file_and_write_nothing(args, message, tmp_path, mlflow_store,
                                                                          capsys):
    assert cli_main(["score", str(a_set(tmp_path)), "--dataset", "digits", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and re.match(message, err.strip()), err
    assert not mlflow_store.exists() or not any(mlflow_store.iterdir())  # no params file written, no store


def test_a_relative_teacher_checkpoint_is_written_absolute_so_the_rerun_works_from_anywhere(
        tmp_path, mlflow_store, monkeypatch, capsys):
    from ddlib.models import create_model

    (tmp_path / "teachers").mkdir()
    torch.save(create_model("resnet18_bn", 1, 10, (8, 8)).state_dict(), tmp_path / "teachers" / "t0.pt")
    a_set(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli_main(["score", "set.npz", "--dataset", "digits", "--dry-run",
                     "--param", "preset=sre2l", "--param", "teacher_checkpoints=[teachers/t0.pt]"]) == 0
    written = Path(re.search(r"^params file: (.*)$", capsys.readouterr().out, re.M).group(1))
    grid = yaml.safe_load(written.read_text())
    assert grid["params"]["teacher_checkpoints"] == [str(tmp_path / "teachers" / "t0.pt")]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli_main(["run", str(written), "--dry-run"]) == 0, capsys.readouterr().err  # "rerun with" works


# --------------------------------------------------------------------------- files that are no params file


def test_a_device_or_a_huge_file_is_refused_without_reading_it(tmp_path, mlflow_store, capsys):
    with memory_bound():
        assert cli_main(["run", "/dev/zero"]) == 2
        assert error_lines(capsys.readouterr().err) == ["error: /dev/zero: not a regular file (a character device)"]
        assert cli_main(["score", str(a_set(tmp_path)), "--dataset", "digits", "--like", "/dev/zero", "--dry-run"]) == 2
        assert error_lines(capsys.readouterr().err) == ["error: /dev/zero: not a regular file (a character device)"]
    from ddlib.specs.yamlfile import MAX_BYTES

    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump(GRID) + "#" * MAX_BYTES)
    assert cli_main(["run", str(huge)]) == 2
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"error: {huge}: larger than 4 MiB, more than a params file holds"), line
    assert not mlflow_store.exists() or not any(mlflow_store.iterdir())


# --------------------------------------------------------------------------- DDLIB_PROTOCOL_PATH

HEADER = "from ddlib.protocols.spec import ProtocolSpec\n"


def _spec(name: str) -> str:
    return f'SPEC = ProtocolSpec(name="{name}", revision=1, title="t", summary="s", params={{}}, boards=(), headline="x")\n'


@pytest.fixture
def broken_protocols(tmp_path, monkeypatch) -> Path:
    """A DDLIB_PROTOCOL_PATH folder of broken files: one raising at import, one that is not Python, one
    of NUL bytes whose protocol has no name to read, and a Latin-1 helper that declares no protocol (not
    discovery's business: ignored)."""
    from ddlib.protocols.spec import PATH_ENV

    folder = tmp_path / "protocols"
    folder.mkdir()
    (folder / "hostile_raiser.py").write_text(HEADER + _spec("hostile_raiser") + "raise RuntimeError('boom')\n")
    (folder / "hostile_syntax.py").write_text(HEADER + _spec("hostile_syntax") + "def (:\n")
    (folder / "hostile_nul.py").write_bytes(b"SPEC = ProtocolSpec(\x00)\n")
    (folder / "helper.py").write_bytes(b"# caf\xe9\nX = 1\n")
    monkeypatch.setenv(PATH_ENV, str(folder))
    return folder


def test_broken_protocol_files_are_named_once_and_skipped_and_the_rest_runs(broken_protocols, mlflow_store,
                                                                            monkeypatch, capsys):
    from ddlib.protocols.spec import PATH_ENV, PROTOCOLS, all_specs

    specs = {spec.name for spec in all_specs()}
    err = capsys.readouterr().err
    monkeypatch.delenv(PATH_ENV)
    assert specs == set(PROTOCOLS)  # every built-in protocol, none of the broken ones
    lines = err.splitlines()
    assert "Traceback" not in err and all(line.startswith("warning: ") for line in lines), err
    for name, problem in (("hostile_raiser", r"importing it raised RuntimeError: boom \(line 3\)"),
                          ("hostile_syntax", r"not valid Python: invalid syntax \(line 3\)"),
                          ("hostile_nul", r"not valid Python: .*null bytes")):
        found = [line for line in lines if f"{broken_protocols / name}.py: " in line]
        assert len(found) == 1 and re.search(problem, found[0]) and found[0].endswith(f"skipped ({PATH_ENV})"), lines
    assert "helper.py" not in err

    monkeypatch.setenv(PATH_ENV, str(broken_protocols))
    assert cli_main(["summary", "--no-log"]) == 1  # nothing to summarise in an empty store: no traceback
    assert error_lines(capsys.readouterr().err) == []


@pytest.mark.parametrize("name,problem", [("hostile_raiser", "importing it raised RuntimeError: boom (line 3)"),
                                          ("hostile_syntax", "not valid Python: invalid syntax (line 3)")])
def test_a_grid_of_a_broken_protocol_is_one_line_naming_its_file(name, problem, broken_protocols, tmp_path,
                                                                 mlflow_store, capsys):
    params = tmp_path / "grid.yaml"
    params.write_text(yaml.safe_dump({"protocol": name, "params": {}}))
    for dry_run in ([], ["--dry-run"]):
        assert cli_main(["run", str(params), *dry_run]) == 2
        assert error_lines(capsys.readouterr().err)[:1] == [f"error: {broken_protocols / name}.py: {problem}"]
    assert not mlflow_store.exists() or not any(mlflow_store.iterdir())


# --------------------------------------------------------------------------- --strict on a reduced test split


@pytest.mark.filterwarnings("ignore:sanity.*near chance")
def test_strict_refuses_test_images_outside_a_reduced_test_split_as_the_dry_run_says(tmp_path, mlflow_store, capsys):
    """``test_size: 50`` scores on 50 test images; a set holding three others is still a set of test
    images: the dry run says --strict refuses it, and the run refuses it."""
    import ddlib
    from ddlib.data.datasets import load_dataset, reduce_dataset
    from ddlib.protocols.leakage import LeakageRefused

    digits = load_dataset("digits")
    kept = reduce_dataset(digits, None, 50).test_images.flatten(1)
    outside = [j for j in range(len(digits.test_labels))
               if not (kept == digits.test_images[j].flatten()).all(1).any()]
    train_labels = digits.train_labels.numpy()
    images = digits.train_images[[int(np.flatnonzero(train_labels == c)[0]) for c in range(10)]].clone()
    for j in [next(j for j in outside if int(digits.test_labels[j]) == c) for c in (2, 5, 8)]:
        images[int(digits.test_labels[j])] = digits.test_images[j]
    path = tmp_path / "picked.npz"
    np.savez(path, images=images.numpy(), labels=np.arange(10))
    assert cli_main(["score", str(path), "--dataset", "digits", "--param", "test_size=50", "--dry-run"]) == 0
    assert "warning: test images in a set: " in capsys.readouterr().out
    with pytest.raises(LeakageRefused, match=r"^strict: the set holds test images of digits: 3 of 10 images"):
        ddlib.score(images, torch.arange(10), dataset="digits", method="picked", strict=True, test_size=50, seeds=[0],
                    recipe={"epochs": 1}, real_recipe={"epochs": 1}, lr_policy="fixed")
