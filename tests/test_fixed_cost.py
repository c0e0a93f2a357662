"""The fixed cost per cell (issue 55): device copies of datasets kept across a warm kernel's cells,
the kept kernel's one client, and bench/fixed_cost.py's accounting of the parts of a cell."""

import os

import pytest
import torch

from ddlib.data import device_copies
from ddlib.data.device_copies import KEPT_COPIES, forget_device_copies, on_device
from ddlib.data.digest import MEMO_MIN_BYTES

META = torch.device("meta")  # another device than the CPU, on every machine (no values: the cache's bookkeeping)


def _large(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (MEMO_MIN_BYTES // (3 * 8 * 8) + 1, 3, 8, 8), dtype=torch.uint8, generator=g)


@pytest.fixture(autouse=True)
def _no_copies():
    forget_device_copies()
    yield
    forget_device_copies()


def test_on_the_cpu_nothing_is_copied_or_kept():
    images = _large()
    assert on_device(images, "cpu") is images and on_device(images, torch.device("cpu")) is images
    assert not device_copies._COPIES


def test_a_dataset_goes_to_the_device_once_per_content():
    images = _large()
    first = on_device(images, META)
    assert first.device.type == "meta" and first.shape == images.shape and first.dtype == images.dtype
    assert on_device(images, META) is first
    assert on_device(images.clone(), META) is first  # the next cell's rebuilt (reduced, split) twin: same content
    other = _large(seed=1)
    assert on_device(other, META) is not first
    assert on_device(images.float(), META) is not first  # another dtype, another copy


def test_a_copy_written_into_is_made_again():
    images = _large()
    first = on_device(images, META)
    first.add_(1)  # nothing in ddlib does this; were it done, the next cell must not see it
    assert on_device(images, META) is not first


def test_small_tensors_and_tensors_with_grad_are_not_kept():
    small = torch.zeros(10, 1, 8, 8)
    assert on_device(small, META) is not on_device(small, META)
    weights = torch.zeros(MEMO_MIN_BYTES // 4 + 1, requires_grad=True)
    on_device(weights, META)
    assert not device_copies._COPIES


def test_only_the_last_few_copies_are_kept():
    tensors = [_large(seed) for seed in range(KEPT_COPIES + 1)]
    copies = [on_device(t, META) for t in tensors]
    assert len(device_copies._COPIES) == KEPT_COPIES
    assert on_device(tensors[-1], META) is copies[-1] and on_device(tensors[0], META) is not copies[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_kept_device_copy_trains_bit_for_bit_as_a_fresh_one():
    """On CUDA: a later cell trains on the copy an earlier one made; its model is a fresh copy's, bit for bit."""
    from ddlib.engine.recipe import Recipe
    from ddlib.engine.train import train_and_test

    g = torch.Generator().manual_seed(0)
    images = torch.rand(MEMO_MIN_BYTES // (3 * 16 * 16 * 4) + 64, 3, 16, 16, generator=g)
    labels = torch.randint(0, 10, (len(images),), generator=g)

    def train():
        [result] = train_and_test("convnet", images, labels, images[:256], labels[:256], num_classes=10,
                                  mean=(0.5,) * 3, std=(0.25,) * 3, recipe=Recipe(epochs=1, batch_size=256),
                                  seeds=[0], device="cuda", keep_models=True)
        return result

    fresh = train()
    assert device_copies._COPIES  # the training set was kept
    kept = train()
    forget_device_copies()
    again = train()
    for a, b, c in zip(fresh.model.state_dict().values(), kept.model.state_dict().values(),
                       again.model.state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert fresh.test_accuracy == kept.test_accuracy == again.test_accuracy


def test_a_kept_kernel_keeps_one_client_and_passes_over_other_clients_messages(monkeypatch):
    """The kept kernel's preludes go through one client connected once (a new one waits 0.2 s for IOPub to
    go quiet); output another client (papermill's) made meanwhile does not confuse it."""
    from ddlib.run import executors, kernels

    monkeypatch.setattr(kernels, "_state", {"km": None, "key": None, "cells": 0, "atexit": True})
    try:
        km = kernels.kernel_for(os.getcwd(), {}, {}, executors.KERNEL_ARGUMENTS)
        kc = kernels._state["kc"]
        other = km.blocking_client()  # papermill's, in a real cell
        other.start_channels()
        try:
            other.wait_for_ready(timeout=30)
            reply = other.execute_interactive("print('x' * 10)\nfor i in range(50): print(i)\nanswer = 42", timeout=30,
                                              output_hook=lambda msg: None)
            assert reply["content"]["status"] == "ok"
        finally:
            other.stop_channels()
        assert kernels.kernel_for(os.getcwd(), {}, {"DDLIB_X": "1"}, executors.KERNEL_ARGUMENTS,
                                  setup="import os\nassert os.environ['DDLIB_X'] == '1'") is km
        assert kernels._state["kc"] is kc and kernels.cells_in_kernel() == 2
        kernels._run(km, "assert 'answer' not in globals()")  # the prelude reset the namespace
    finally:
        kernels.release_kernel()
    assert kernels._state["kc"] is None


def test_the_bench_adds_up_a_cells_parts():
    """bench/fixed_cost.py: each part from the probe's exclusive seconds, nothing counted twice."""
    from bench.fixed_cost import analyse, summarise

    def call(role, part, name, start, total, exclusive=None, depth=0, **extra):
        return {"pid": {"runner": 1, "worker": 2, "kernel": 3}[role], "role": role, "event": "call", "part": part,
                "name": name, "start": start, "total": total, "exclusive": total if exclusive is None else exclusive,
                "depth": depth, **extra}

    events = [{"role": "worker", "event": "process", "created": 102.0, "t": 102.5, "pid": 2},
              call("runner", "imports", "import ddlib", 100.1, 1.5),
              call("worker", "cell", "execute_cell", 110.0, 20.0, 1.0, cell="a"),
              call("worker", "mlflow", "MlflowClient.create_run", 110.1, 0.5, depth=1),
              call("worker", "kernel", "kernel_for", 111.0, 6.0, depth=1, cells_in_kernel=1),
              call("kernel", "imports", "import torch", 112.0, 3.0),  # the kernel's start: counted there
              call("worker", "notebook", "papermill.execute_notebook", 117.0, 12.5, depth=1),
              call("kernel", "imports", "import ddlib.protocols", 117.5, 2.0),
              call("kernel", "dataset_load", "load_dataset", 120.0, 0.2),
              call("kernel", "mlflow", "MlflowClient.log_batch", 120.5, 0.3),
              call("kernel", "own_work", "train_and_test", 121.0, 5.0, 4.9),
              call("kernel", "device_move", "on_device", 121.1, 0.1, depth=1),
              call("worker", "cell", "execute_cell", 130.5, 5.0, 0.1, cell="b"),
              call("worker", "kernel", "kernel_for", 130.6, 0.3, depth=1, cells_in_kernel=2),
              call("worker", "notebook", "papermill.execute_notebook", 131.0, 4.2, depth=1),
              call("kernel", "own_work", "train_and_test", 132.0, 2.0),
              call("kernel", "mlflow", "MlflowClient.log_batch", 134.5, 0.4),
              call("worker", "mlflow", "MlflowClient.set_terminated", 135.3, 0.1, depth=1)]
    first, later = analyse(events, launched=100.0, wall=36.0)
    assert first["process_start_imports"] == 10.0 and first["detail"]["runner"] == 2.0
    assert first["kernel_start"] == 6.0 and first["notebook_imports"] == 2.0 and first["mlflow"] == 0.8
    assert first["dataset_load_and_move"] == pytest.approx(0.3) and first["own_work"] == 4.9
    assert first["notebook_other"] == pytest.approx(12.5 - 2.0 - 0.3 - 0.3 - 4.9)
    assert first["worker_other"] == pytest.approx(20.0 - 6.0 - 12.5 - 0.5)
    assert first["fixed"] == pytest.approx(10.0 + 20.0 - 4.9)
    assert later["kernel"] == "warm" and later["kernel_reuse_prelude"] == 0.3 and later["between_cells"] == 0.5
    assert later["mlflow"] == pytest.approx(0.5) and later["fixed"] == pytest.approx(0.5 + 5.0 - 2.0)
    summary = summarise([first, later], 36.0, "cpu")
    assert summary["target"]["met"] and not summary["target"]["applies"]
    assert summary["largest_later_part"]["part"] == "notebook_other"
