from dataclasses import replace

import os
import warnings

import pytest
import torch

from ddlib.data.datasets import load_dataset
from ddlib.engine.device import resolve_device
from ddlib.methods.select import random_subset
from ddlib.engine.train import Normalize, Recipe, model_accuracy, train_and_test


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _train(ds, subset, seeds, **kw):
    recipe = kw.pop("recipe", Recipe(epochs=15, batch_size=32))
    return train_and_test("convnet", subset.images, kw.pop("targets", subset.labels),
                              kw.pop("test_images", ds.test_images), ds.test_labels, num_classes=10, mean=ds.mean,
                              std=ds.std, recipe=recipe, seeds=seeds, device="cpu", **kw)


def test_same_seed_same_result_and_different_seeds_differ(digits):
    subset = random_subset(digits, 5, seed=0)
    a = _train(digits, subset, [0, 1])
    b = _train(digits, subset, [0])
    assert a[0].test_accuracy == b[0].test_accuracy
    assert a[0].epoch_losses == b[0].epoch_losses
    assert a[0].epoch_losses != a[1].epoch_losses
    assert [r.seed for r in a] == [0, 1]


def test_training_learns_and_reports_timings(digits):
    subset = random_subset(digits, 10, seed=0)
    (r,) = _train(digits, subset, [0], recipe=Recipe(epochs=40, batch_size=50))
    assert r.test_accuracy > 0.6  # chance is 0.1
    assert len(r.epoch_losses) == 40 and r.epoch_losses[-1] < r.epoch_losses[0]
    assert r.train_seconds > 0 and r.eval_seconds > 0
    assert r.model is None
    # the test counts per (true, predicted) class: every test image once, the accuracy on the diagonal
    counts = torch.tensor(r.confusion)
    assert counts.shape == (10, 10) and counts.sum() == len(digits.test_labels)
    assert counts.sum(1).tolist() == torch.bincount(digits.test_labels, minlength=10).tolist()
    assert counts.trace().item() / counts.sum().item() == r.test_accuracy


def test_global_rng_state_does_not_change_results(digits):
    subset = random_subset(digits, 3, seed=0)
    torch.manual_seed(123)
    a = _train(digits, subset, [7])[0].epoch_losses
    torch.manual_seed(999)
    torch.rand(10)
    b = _train(digits, subset, [7])[0].epoch_losses
    assert a == b


def test_soft_targets_and_hooks_are_used(digits):
    subset = random_subset(digits, 2, seed=0)
    soft = torch.nn.functional.one_hot(subset.labels, 10).float() * 0.9 + 0.01
    calls = {"augment": 0, "loss": 0}

    def augment(x, targets, generator):
        calls["augment"] += 1
        assert isinstance(generator, torch.Generator) and len(targets) == len(x)
        return x + 0.01 * torch.randn(x.shape, generator=generator), targets

    def loss(logits, targets, inputs):
        calls["loss"] += 1
        assert targets.shape == (len(inputs), 10)
        return torch.nn.functional.cross_entropy(logits, targets)

    (r,) = _train(digits, subset, [0], targets=soft, augment=augment, loss=loss, keep_models=True,
                  recipe=Recipe(epochs=3, batch_size=8))
    assert calls == {"augment": 9, "loss": 9}  # 20 images / 8 -> 3 steps x 3 epochs
    assert isinstance(r.model, torch.nn.Module)


def test_step_scheduler_drops_lr_at_half(digits, monkeypatch):
    seen = []
    original = torch.optim.SGD.step

    def spy(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return original(self, *a, **k)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    subset = random_subset(digits, 1, seed=0)
    _train(digits, subset, [0], recipe=Recipe(epochs=4, batch_size=256, lr=0.1))
    assert seen == pytest.approx([0.1, 0.1, 0.01, 0.01])


# DC's evaluation loop, VICO-UoE/DatasetCondensation utils.py ``evaluate_synset`` (DC-Bench's
# evaluator/evaluator_utils.py ``evaluate_synset_dataset`` is the same loop):
#     lr_schedule = [Epoch//2+1]; optimizer = SGD(lr, momentum=0.9, weight_decay=0.0005)
#     for ep in range(Epoch+1):
#         epoch('train', ...)
#         if ep in lr_schedule: lr *= 0.1; optimizer = SGD(net.parameters(), lr=lr, ...)
# Hand-derived per-step lrs for one step per epoch (batch >= set): Epoch = 4 trains 5 epochs, the
# drop after ep 3 (= 4 // 2 + 1) leaves one step at lr / 10; Epoch = 5 trains 6, drops after ep 3
# too (5 // 2 + 1); Epoch = 7 trains 8, drops after ep 4. The new optimizer has no momentum buffer
# at its first step (torch's SGD starts the buffer from that step's gradient).
DC_STEP_LRS = {4: [0.1] * 4 + [0.01], 5: [0.1] * 4 + [0.01] * 2, 7: [0.1] * 5 + [0.01] * 3}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("epochs", sorted(DC_STEP_LRS))
def test_dc_step_is_dcs_schedule_one_more_epoch_and_momentum_reset_at_the_drop(digits, monkeypatch, epochs, batched):
    seen = []  # per SGD step: (lr, whether any parameter carried a momentum buffer into the step)
    original = torch.optim.SGD.step

    def spy(self, *a, **k):
        carried = any(self.state[p].get("momentum_buffer") is not None for g in self.param_groups for p in g["params"])
        seen.append((self.param_groups[0]["lr"], carried))
        return original(self, *a, **k)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    subset = random_subset(digits, 1, seed=0)
    (r,) = _train(digits, subset, [0], recipe=Recipe(epochs=epochs, batch_size=256, lr=0.1, scheduler="dc_step"),
                  batched=batched)
    assert r.mode == ("batched" if batched else "sequential")
    want = DC_STEP_LRS[epochs]
    assert len(r.epoch_losses) == len(want) == epochs + 1
    assert [lr for lr, _ in seen] == pytest.approx(want)
    first_low = want.index(0.01)
    # no buffer at the very first step nor at the first step of the new optimizer; one everywhere else
    assert [carried for _, carried in seen] == [i not in (0, first_low) for i in range(len(want))]


def test_dc_step_is_keyed_as_its_own_recipe():
    assert Recipe(scheduler="dc_step").to_dict()["scheduler"] == "dc_step"
    assert Recipe().to_dict()["scheduler"] == "step"  # the default (and every key made with it) is unchanged


@pytest.mark.parametrize("opt,sched", [("adam", "cosine"), ("adamw", "none"), ("sgd", "cosine")])
def test_other_optimizers_and_schedulers_run(digits, opt, sched):
    subset = random_subset(digits, 2, seed=0)
    (r,) = _train(digits, subset, [0], recipe=Recipe(epochs=2, optimizer=opt, scheduler=sched, lr=0.001))
    assert 0.0 <= r.test_accuracy <= 1.0


def test_recipe_validation_names_the_key():
    with pytest.raises(ValueError, match="unknown recipe key.*'epoch'"):
        Recipe.from_dict({"epoch": 10})
    with pytest.raises(ValueError, match="optimizer"):
        Recipe(optimizer="rmsprop")
    with pytest.raises(ValueError, match="epochs"):
        Recipe(epochs=0)
    assert Recipe.from_dict({"lr": "1e-3"}).lr == 0.001
    assert Recipe.from_dict({"epochs": 5}, base=Recipe(lr=0.5)).lr == 0.5


def test_mismatched_inputs_are_refused(digits):
    subset = random_subset(digits, 2, seed=0)
    with pytest.raises(ValueError, match="targets"):
        _train(digits, subset, [0], targets=subset.labels[:3])


def test_device_auto_picks_cuda_only_when_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto").type == "cuda"


def test_preprocess_runs_on_training_and_test_batches(digits):
    seen, ranges = [], []

    class Spy(torch.nn.Module):
        def forward(self, x):
            seen.append(len(x))
            ranges.append((x.min().item(), x.max().item()))
            return x

    subset = random_subset(digits, 2, seed=0)
    _train(digits, subset, [0], preprocess=Spy(), recipe=Recipe(epochs=2, batch_size=20, eval_batch_size=500))
    assert seen == [20, 20, 450]  # two training steps, then the 450 test images in one batch
    # it gets [0, 1] pixels in place of the normalisation (ZCA as MTT/DATM/DD-Ranking fit and apply it)
    assert all(0.0 <= lo and hi <= 1.0 for lo, hi in ranges) and max(hi for _, hi in ranges) > 0.9


# --------------------------------------------------------------------------- faster steps and test passes


def test_fp32_results_are_those_of_the_loop_before_the_speed_switches(digits, one_thread):
    """Pinned from the loop as it was before precision/channels_last/compile and the batched mode
    (commit 683405f), run on row-major copies of the same images (the layout every tensor has since
    ddlib.data.layout; on the digits' own stride-1 layout that loop gave other losses from epoch 3):
    the default path must still compute exactly that."""
    subset = random_subset(digits, 2, seed=0)
    # oneDNN rounds its AVX-512 and AVX2 convolutions otherwise on row-major inputs (the old loop too):
    # the pins of each (the AVX2 ones: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 on the same Zen 4)
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    expected = {
        "convnet": [(0.10666666666666667, ["0x1.3192800000000p+1", "0x1.2f23f40000000p+1", "0x1.2a96940000000p+1",
                                           "0x1.29a9d80000000p+1"] if avx512 else
                     ["0x1.31927c0000000p+1", "0x1.2f23f60000000p+1", "0x1.2a96900000000p+1", "0x1.29a7b60000000p+1"]),
                    (0.09777777777777778, ["0x1.366f600000000p+1", "0x1.2f022c0000000p+1", "0x1.262bd40000000p+1",
                                           "0x1.258e9a0000000p+1"] if avx512 else
                     ["0x1.366f600000000p+1", "0x1.2f022c0000000p+1", "0x1.262bb00000000p+1", "0x1.258dcc0000000p+1"])],
        "convnet_bn": [(0.52, ["0x1.28a0ec0000000p+1", "0x1.d0f5400000000p+0", "0x1.8e7fee0000000p+0",
                               "0x1.8ddc3c0000000p+0"] if avx512 else
                        ["0x1.28a0ec0000000p+1", "0x1.d0f53c0000000p+0", "0x1.8e7fea0000000p+0", "0x1.8ddc380000000p+0"]),
                       (0.4622222222222222, ["0x1.2abfc40000000p+1", "0x1.d193b40000000p+0", "0x1.74cb0c0000000p+0",
                                             "0x1.6efa080000000p+0"] if avx512 else
                        ["0x1.2abfc60000000p+1", "0x1.d193b40000000p+0", "0x1.74cb0c0000000p+0", "0x1.6efa0a0000000p+0"])],
    }
    for model, want in expected.items():
        got = train_and_test(model, subset.images, subset.labels, digits.test_images, digits.test_labels,
                                 num_classes=10, mean=digits.mean, std=digits.std,
                                 recipe=Recipe(epochs=4, batch_size=8, lr=0.05, precision="fp32"), seeds=[0, 1],
                                 device="cpu")
        for r, (acc, losses) in zip(got, want):
            assert r.precision == "fp32" and r.mode == "sequential"
            assert r.epoch_losses == pytest.approx([float.fromhex(v) for v in losses], rel=1e-5)
            assert r.test_accuracy == pytest.approx(acc, abs=2 / 450)


def test_recipe_keys_show_the_speed_switches_only_where_they_change_the_arithmetic():
    old_keys = {"epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "scheduler", "eval_batch_size"}
    # the default is "auto" (bf16 where native; kept accuracy in bench/step_speed.py --accuracy), which
    # is resolved before keying; fp32 keys as every recipe did before the switches existed
    assert Recipe().precision == "auto"
    assert set(Recipe(precision="fp32").to_dict()) == old_keys  # every key made before the switches stays valid
    assert Recipe(precision="auto").to_dict()["precision"] == "auto"  # resolve before keying (run_precision)
    d = Recipe(precision="bf16", compile=True).to_dict()
    assert d["precision"] == "bf16" and d["compile"] is True and "channels_last" not in d
    assert Recipe.from_dict({"precision": "auto", "channels_last": True}).channels_last is True
    with pytest.raises(ValueError, match="precision"):
        Recipe(precision="fp16")
    with pytest.raises(ValueError, match="compile"):
        Recipe(compile="yes")


def test_auto_precision_follows_native_bf16_support(monkeypatch):
    from ddlib.engine import device as device_mod

    cpu = torch.device("cpu")
    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: True)
    assert device_mod.resolve_precision("auto", cpu) == "bf16"
    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: False)
    assert device_mod.resolve_precision("auto", cpu) == "fp32"
    # bf16 asked for by name still runs on a CPU without it, but the user is told it is emulated (26x slower)
    with pytest.warns(device_mod.EmulatedBf16Warning, match="emulated.*auto picks fp32"):
        assert device_mod.resolve_precision("bf16", cpu) == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say for fp32, auto, or bf16 where it is native
        device_mod.resolve_precision("fp32", cpu), device_mod.resolve_precision("auto", cpu)
        monkeypatch.setattr(device_mod, "bf16_supported", lambda d: True)
        assert device_mod.resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="precision"):
        device_mod.resolve_precision("half", cpu)
    # adversarial training keeps "auto" at fp32 (bf16 was measured for plain training only)
    from ddlib.engine.train import run_precision

    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: True)
    auto = Recipe(precision="auto")
    assert run_precision(auto, cpu) == "bf16" and run_precision(auto, cpu, objective=True) == "fp32"
    assert run_precision(Recipe(precision="bf16"), cpu, objective=True) == "bf16"
    assert run_precision(Recipe(), cpu) == "bf16"  # the default is auto
    assert run_precision(Recipe(precision="fp32"), cpu) == "fp32"  # fp32 stays fp32 on a bf16 machine
    # what the cells and teachers key (auto resolved first): on a CPU without native bf16 an "auto"
    # recipe has the very key of an fp32 one, so every run stored before the switch is reused
    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: False)
    keyed = replace(auto, precision=run_precision(auto, cpu))
    assert keyed.to_dict() == Recipe(precision="fp32").to_dict()
    monkeypatch.setattr(device_mod, "bf16_supported", lambda d: True)
    assert replace(auto, precision=run_precision(auto, cpu)).to_dict()["precision"] == "bf16"


def test_kernels_capped_at_avx2_mean_no_native_bf16(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 / ONEDNN_MAX_CPU_ISA=AVX2 make an AVX-512 machine take an AVX2 CPU's
    kernel paths; "auto" must then be fp32 there too, as on the AVX2 CPU it stands in for."""
    from ddlib.engine import device as device_mod

    cpu = torch.device("cpu")
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "avx512_core"), ("ATEN_CPU_CAPABILITY", "avx2")):
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        monkeypatch.setenv(name, value)
        assert not device_mod.bf16_supported(cpu), (name, value)
        assert device_mod.resolve_precision("auto", cpu) == "fp32"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert device_mod._isa_allows_bf16()


def test_bf16_runs_the_model_in_bf16_and_learns(digits, one_thread):
    """bf16 autocast runs the layers in bf16 with fp32 master weights and learns as well as fp32. Why
    20 full-batch steps at lr 0.1 (81.6 % in bf16, 81.8 % in fp32 on a 2-core Zen 3 EPYC): fewer leave
    both near chance, where "learns as well" says nothing. Where the CPU has no native bf16 (AVX2),
    torch runs bf16 convolutions on its slow reference path (``_slow_conv2d``, 26x fp32's time), so
    each step counts: 34 s alone there on one thread (80 steps of 50 images took 70 s)."""
    seen = []
    subset = random_subset(digits, 10, seed=0)
    recipe = Recipe(epochs=20, batch_size=100, lr=0.1, precision="bf16")
    (r,) = _train(digits, subset, [0], recipe=recipe, keep_models=True)
    assert r.precision == "bf16"
    r.model.features[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    model_accuracy(r.model, digits.test_images, digits.test_labels, Normalize(digits.mean, digits.std), precision="bf16")
    assert seen and all(d == torch.bfloat16 for d in seen)
    assert r.model.features[0].weight.dtype == torch.float32  # master weights stay fp32
    (f,) = _train(digits, subset, [0], recipe=replace(recipe, precision="fp32"))
    assert r.test_accuracy > 0.6 and abs(r.test_accuracy - f.test_accuracy) < 0.1


def test_channels_last_trains_the_same_model_up_to_rounding(digits, one_thread):
    subset = random_subset(digits, 5, seed=0)
    fp32 = dict(epochs=2, batch_size=25, precision="fp32")
    (a,) = _train(digits, subset, [0], recipe=Recipe(**fp32), keep_models=True)
    (b,) = _train(digits, subset, [0], recipe=Recipe(**fp32, channels_last=True), keep_models=True)
    assert b.model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    for k, v in a.model.state_dict().items():
        assert torch.allclose(v, b.model.state_dict()[k], atol=1e-5), k


@pytest.mark.slow
def test_compile_trains_the_same_model_up_to_rounding(digits, one_thread):
    subset = random_subset(digits, 5, seed=0)
    fp32 = dict(epochs=2, batch_size=25, precision="fp32")
    (a,) = _train(digits, subset, [0], recipe=Recipe(**fp32), keep_models=True)
    (b,) = _train(digits, subset, [0], recipe=Recipe(**fp32, compile=True), keep_models=True)
    for k, v in a.model.state_dict().items():
        assert torch.allclose(v, b.model.state_dict()[k], atol=1e-4), k
    assert b.test_accuracy == pytest.approx(a.test_accuracy, abs=2 / 450)


def test_compiled_kernels_are_cached_per_instruction_set(monkeypatch, tmp_path):
    """Inductor's cache key leaves out the kernel path: kernels cached under AVX-512 and reused with
    ATEN_CPU_CAPABILITY=avx2 trained this test's model to NaN (and the reverse crashed). ddlib keys
    the folder by what picks the kernels; a folder the user set is kept."""
    from ddlib.engine import device as device_mod

    monkeypatch.setenv("DDLIB_CACHE", str(tmp_path))
    folders = {}
    for capability in ("", "avx2"):
        monkeypatch.setattr(device_mod, "_COMPILE_CACHE", [])
        monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        folders[capability] = device_mod.compile_cache_dir()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folders[capability]
        assert device_mod.compile_cache_dir() == folders[capability]  # once per process
    assert folders[""] != folders["avx2"] and all(f.startswith(str(tmp_path / "inductor")) for f in folders.values())
    monkeypatch.setattr(device_mod, "_COMPILE_CACHE", [])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert device_mod.compile_cache_dir() == str(tmp_path / "mine")


def test_a_cell_compiles_as_in_a_fresh_process(mlflow_store, monkeypatch):
    """Dynamo compiles a frame once per input shape, up to ``recompile_limit`` shapes per process, and
    then runs it eagerly: in a warm kernel a cell after others would train eagerly what a fresh process
    compiles (numbers 1e-7 apart, not the same bits). Opening a cell forgets what was compiled before."""
    from torch._dynamo import config
    from torch._dynamo.utils import counters

    from ddlib.engine.device import forget_compiled
    from ddlib.protocols import cell as cell_module, label_robust

    limit = config.recompile_limit
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    counters.clear()
    for n in range(1, limit + 3):
        compiled(torch.ones(n))
    assert counters["frames"]["ok"] == limit  # the shapes past the limit ran eagerly
    calls = []
    monkeypatch.setattr(cell_module, "forget_compiled", lambda: (calls.append(1), forget_compiled()))
    cell = label_robust.open_cell(dataset="digits", method="random", ipc=1, seeds=[0], lr_policy="fixed")
    cell.close()
    assert calls == [1]
    counters.clear()
    compiled(torch.ones(limit + 3))
    assert counters["frames"]["ok"] == 1  # compiled again, as in a fresh process


def test_the_test_set_is_prepared_once_for_many_trainings(digits):
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x):
            seen.append(len(x))
            return x

    spy = Spy()
    subset = random_subset(digits, 2, seed=0)
    test_images = digits.test_images.clone()
    recipe = Recipe(epochs=1, batch_size=20, eval_batch_size=500)
    _train(digits, subset, [0, 1], preprocess=spy, recipe=recipe, test_images=test_images)
    _train(digits, subset, [2], preprocess=spy, recipe=recipe, test_images=test_images)
    assert seen == [20, 450, 20, 20]  # the 450 test images once, for three models in two calls
    test_images[0] = 0  # an in-place change is seen
    seen.clear()
    _train(digits, subset, [2], preprocess=spy, recipe=recipe, test_images=test_images)
    assert seen == [20, 450]


def test_cuda_test_batches_halve_on_out_of_memory():
    from ddlib.engine import test_pass

    tried = []

    def chunk(i, j):
        tried.append(j - i)
        if j - i > 300:
            raise torch.cuda.OutOfMemoryError("fake")
        return torch.ones(j - i, dtype=torch.bool)

    key = ("fake-model", 1)
    test_pass._EVAL_BATCH.pop(key, None)
    out = torch.cat(test_pass._largest_fitting(chunk, 1000, 64, torch.device("cuda"), key))
    assert out.shape == (1000,) and tried[:3] == [1000, 500, 250]  # whole set first, then halves
    assert test_pass._EVAL_BATCH[key] == 250
    tried.clear()
    test_pass._largest_fitting(chunk, 1000, 64, torch.device("cuda"), key)
    assert tried[0] == 250  # remembered
    tried.clear()
    test_pass._largest_fitting(chunk, 100, 64, torch.device("cpu"), key)
    assert tried == [64, 36]  # the CPU keeps the recipe's batch


def test_a_cell_tests_in_the_batches_a_fresh_process_would(mlflow_store):
    """A CUDA test batch halved on out-of-memory is remembered for the rest of the cell, not carried
    into the next cell of a warm kernel (which a fresh process would start at the whole set)."""
    from ddlib.engine import test_pass
    from ddlib.protocols import label_robust

    test_pass._EVAL_BATCH[("fake-model", 1)] = 250  # a halving in an earlier cell
    cell = label_robust.open_cell(dataset="digits", method="random", ipc=1, seeds=[0], lr_policy="fixed")
    cell.close()
    assert test_pass._EVAL_BATCH == {}


ALLOCATOR_PROBE = """
import json, resource, sys
import torch
from ddlib.engine.device import resolve_device, tune_cpu_allocator
resolve_device("cpu")
faults = []
for _ in range(12):  # two 64 MB tensors, touched, freed: above glibc's 32 MB mmap ceiling
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x, y = torch.ones(16 * 2**20), torch.ones(16 * 2**20 + 7)
    del x, y
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"state": tune_cpu_allocator(), "faults": faults}))
"""


def _allocator_probe(setting: str | None) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if setting is not None:
        env["DDLIB_CPU_ALLOCATOR"] = setting
    else:
        env.pop("DDLIB_CPU_ALLOCATOR", None)
    out = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt")
def test_cpu_work_keeps_freed_memory_instead_of_faulting_it_in_again():
    """A CPU device tunes glibc's allocator: a freed 64 MB tensor's pages are reused, not unmapped and
    faulted in again on the next batch (the sys time that was half of a CPU cell); opt-out restores it."""
    tuned = _allocator_probe(None)
    if tuned["state"] == "unavailable":
        pytest.skip("not glibc")
    system = _allocator_probe("system")
    assert tuned["state"] == "tuned" and system["state"] == "system"
    pages = 2 * 64 * 2**20 // 4096
    assert all(f > 0.9 * pages for f in system["faults"]), system  # every allocation mapped afresh
    # the heap settles, then is reused: the last 3 rounds fault almost nothing (under load the heap settled
    # one round later once: 5 rounds of 32768 faults, then 16384, then 0, 0, 0)
    assert max(tuned["faults"][-3:]) < 0.05 * pages, tuned


def test_cpu_allocator_setting_is_checked(monkeypatch):
    from ddlib.engine import device

    monkeypatch.setattr(device, "_allocator_state", [])
    monkeypatch.setenv("DDLIB_CPU_ALLOCATOR", "jemalloc")
    with pytest.raises(ValueError, match="DDLIB_CPU_ALLOCATOR='jemalloc'"):
        device.tune_cpu_allocator()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_layout_of_the_input_does_not_change_the_model(digits, one_thread, precision):
    """A 1-channel tensor is "contiguous" with stride 1 or H*W on its channel axis, and PyTorch picks
    the convolution kernel (so the rounding: other models, in fp32 too) and its speed from the strides.
    The engine trains and tests on a row-major copy (ddlib.data.layout): the same model from either
    layout. Datasets hold row-major tensors whatever the loader gave them."""
    from ddlib.data.datasets import Dataset
    from ddlib.engine.train import standard_layout

    assert digits.train_images.stride() == (64, 64, 8, 1)  # the loader's, made row-major (tests/test_data.py)
    subset = random_subset(digits, 5, seed=0)
    channel_stride_1 = torch.empty_strided(subset.images.shape, (64, 1, 8, 1)).copy_(subset.images)
    assert channel_stride_1.stride()[1] == 1 and torch.equal(channel_stride_1, subset.images)
    assert standard_layout(channel_stride_1).stride() == (64, 64, 8, 1)
    assert standard_layout(subset.images) is subset.images  # no copy where the strides are already row-major
    other = type(subset)(**{**vars(subset), "images": channel_stride_1})
    recipe = Recipe(epochs=5, batch_size=25, precision=precision)
    (a,), (b,) = (_train(digits, s, [0], recipe=recipe, keep_models=True) for s in (subset, other))
    assert a.epoch_losses == b.epoch_losses and a.test_accuracy == b.test_accuracy
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    held = Dataset("x", channel_stride_1, subset.labels, channel_stride_1, subset.labels, tuple("0123456789"), (0.5,), (0.25,))
    assert held.train_images.stride() == held.test_images.stride() == (64, 64, 8, 1)


@pytest.mark.parametrize("batched", [False, True])
def test_on_epoch_reports_each_model_group_and_epoch(digits, batched):
    """The loop says where it is (the runner shows it per running cell): which models train now
    (seed, lr), each epoch from 0 (starting) to the last, how many of the call's models trained
    before them, and an ETA for the call at the current pace."""
    seen = []
    subset = random_subset(digits, 2, seed=0)
    _train(digits, subset, [0, 1], lrs=[0.01, 0.05], recipe=Recipe(epochs=3, batch_size=32), desc="syn_hard",
           batched=batched, on_epoch=seen.append)
    assert {p.desc for p in seen} == {"syn_hard"} and {(p.epochs, p.models) for p in seen} == {(3, 2)}
    groups = [(p.runs, p.models_before) for p in seen if p.epoch == 0]
    assert groups == ([(((0, 0.01), (1, 0.05)), 0)] if batched else [(((0, 0.01),), 0), (((1, 0.05),), 1)])
    for runs, _before in groups:
        epochs = [p for p in seen if p.runs == runs]
        assert [p.epoch for p in epochs] == [0, 1, 2, 3] and epochs[0].eta_seconds is None
        assert all(p.seconds >= 0 and p.eta_seconds >= 0 for p in epochs[1:])
    first_model_done = next(p for p in seen if p.epoch == 3)
    if not batched:  # the second model is still to train: the ETA covers it at the first one's pace
        assert first_model_done.eta_seconds == pytest.approx(first_model_done.seconds)
