"""Cases run INSIDE DD-Ranking's own environment (``ddranking==0.2.0``, see ``tests/peer.py``).

Never imports ddlib. ``python peer_ddranking.py IN.pt OUT.pt``: ``IN.pt`` is ``{case: inputs}``;
each case calls the peer's own code on its inputs; ``OUT.pt`` is ``{case: outputs}`` (or
``{case: {"error": traceback}}``), tensors and plain Python values only. Where the peer draws from
the global RNG (``np.random``, ``torch.randperm``), a case forces the draw it is given, so ddlib can
be run on the same draw; the patches are undone after each case.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import torch


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def case_zca(inputs):
    """``ddranking.utils.data.get_dataset(..., use_zca=True)`` on a CIFAR-10 folder: the whitened
    training and test tensors it trains and tests on. torchvision's md5 check is bypassed (the
    folder is a re-encoded CIFAR-10), as ``bench/ddranking_wrapper.py`` does."""
    import torchvision.datasets.cifar as cifar
    from ddranking.utils import data

    with patched(cifar, "check_integrity", lambda *a, **k: True):
        out = data.get_dataset("CIFAR10", inputs["root"], (32, 32), True, None, "cpu")
    _, _, _, _, _, dst_train, dst_test_real, _, _, _ = out
    return {"train": dst_train.images, "train_labels": dst_train.targets, "test": dst_test_real.images}


def case_dsa(inputs):
    """Each of ``ddranking.aug.DSA``'s ops (``rand_<op>``) on ``x`` after ``torch.manual_seed(seed)``,
    the parameters of the peer's demo config (``configs/Demo_LRS_Hard_Label.yaml``), not Siamese
    (``seed=-1``, the evaluation default)."""
    from ddranking.aug import DSA

    dsa = DSA(dict(inputs["params"]))
    dsa.params["siamese"], dsa.params["latestseed"] = False, -1
    out = {"ops": [f.__name__[len("rand_"):] for f in dsa.transform_funcs], "aug_mode": dsa.aug_mode,
           "params": {k: v for k, v in dsa.params.items() if k not in ("siamese", "latestseed")}}
    for op in inputs["ops"]:
        for seed in inputs["seeds"]:
            torch.manual_seed(seed)
            out[(op, seed)] = getattr(dsa, f"rand_{op}")(inputs["x"].clone())
    return out


def _forced(inputs):
    """np.random.beta -> the given lambda, np.random.randint -> the given centres in order,
    torch.randperm -> the batch in reverse order (ddlib's partner)."""
    centres = iter(inputs.get("centres", ()))
    stack = contextlib.ExitStack()
    stack.enter_context(patched(np.random, "beta", lambda a, b: inputs["lam"]))
    stack.enter_context(patched(np.random, "randint", lambda high: next(centres)))
    stack.enter_context(patched(torch, "randperm", lambda n, **kw: torch.arange(n - 1, -1, -1)))
    return stack


def case_cutmix(inputs):
    """``ddranking.aug.Cutmix({'beta': 1.0})`` on ``x`` for each forced (lambda, row centre, column centre)."""
    from ddranking.aug import Cutmix

    out = []
    for lam, r, c in inputs["draws"]:
        with _forced({"lam": lam, "centres": (r, c)}):
            out.append(Cutmix({"beta": 1.0})(inputs["x"].clone()))
    return {"images": out}


def case_mixup(inputs):
    """``ddranking.aug.Mixup({'lambda': 0.8})`` on ``x`` for each forced lambda."""
    from ddranking.aug import Mixup

    out = []
    for lam in inputs["lams"]:
        with _forced({"lam": lam}):
            out.append(Mixup({"lambda": 0.8})(inputs["x"].clone()))
    return {"images": out}


def case_losses(inputs):
    """The peer's soft-label losses (``ddranking.loss``) on the same student/teacher logits."""
    from ddranking.loss import KLDivergenceLoss, MSEGTLoss, SoftCrossEntropyLoss

    stu, tea, gt = inputs["student"], inputs["teacher"], inputs["labels"]
    out = {}
    for t in inputs["temperatures"]:
        for scale in (False, True):
            out[("kl", t, scale)] = KLDivergenceLoss(temperature=t, scale_loss=scale)(stu, tea)
        out[("sce", t)] = SoftCrossEntropyLoss(temperature=t, scale_loss=False)(stu, tea)
    for mse_w, ce_w in inputs["mse_gt"]:
        out[("mse_gt", mse_w, ce_w)] = MSEGTLoss(mse_weight=mse_w, ce_weight=ce_w)(stu, tea, gt)
    return out


def case_convnet(inputs):
    """``ddranking.utils.build_model(name)`` loaded with the given state dict, forward in eval and train mode."""
    from ddranking.utils import build_model

    out = {}
    for name, spec in inputs["models"].items():
        model = build_model(name, num_classes=spec["num_classes"], im_size=spec["im_size"], pretrained=False,
                            device="cpu")
        missing = model.load_state_dict(spec["state"], strict=True)
        model.eval()
        with torch.no_grad():
            evaluated = model(spec["x"])
        model.train()
        with torch.no_grad():
            trained = model(spec["x"])
        out[name] = {"eval": evaluated, "train": trained, "keys": list(model.state_dict()), "load": str(missing)}
    return out


def case_train_step(inputs):
    """One step of the peer's own ``train_one_epoch`` (soft_label_mode M, teachers relabel the batch,
    ``Cutmix`` with forced draws, ``MSEGTLoss``): the loss its step computes, the mixed images and
    the targets its loss's CE term received, for each forced (lambda, row centre, column centre)."""
    from ddranking.aug import Cutmix
    from ddranking.loss import MSEGTLoss
    from ddranking.utils import build_model, train_one_epoch

    class Recording(MSEGTLoss):
        def forward(self, stu, tea, gt):
            loss = super().forward(stu, tea, gt)
            seen.append({"loss": loss.detach().clone(), "ground_truth": gt.clone(), "teacher": tea.detach().clone()})
            return loss

    def model(state):
        net = build_model("ConvNet-3", num_classes=10, im_size=(32, 32), pretrained=False, device="cpu")
        net.load_state_dict(state, strict=True)
        return net

    out = []
    for lam, r, c in inputs["draws"]:
        seen, images = [], []
        student, teacher = model(inputs["student"]), model(inputs["teacher"])
        teacher.eval()
        cutmix = Cutmix({"beta": 1.0})

        def augment(x):
            images.append(cutmix(x).clone())
            return images[-1]

        with _forced({"lam": lam, "centres": (r, c)}):
            train_one_epoch(0, student, [(inputs["x"].clone(), inputs["y"].clone())],
                            Recording(*inputs["weights"]), torch.optim.SGD(student.parameters(), lr=0.0),
                            soft_label_mode="M", aug_func=augment, tea_models=[teacher], device="cpu")
        out.append({**seen[0], "images": images[0]})
    return out


def case_schedule(inputs):
    """The lr of every epoch under the peer's ``get_lr_scheduler`` (stepped once per epoch, as its
    ``train_one_epoch`` does)."""
    from ddranking.utils import get_lr_scheduler

    out = {}
    for name, epochs, step_size in inputs["schedules"]:
        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=inputs["lr"])
        scheduler = get_lr_scheduler(name, optimizer, epochs, step_size)
        lrs = []
        for _ in range(epochs):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        out[(name, epochs)] = lrs
    return out


def _flow(cls, attrs: dict, kwargs: dict, num_eval: int, ipc: int, num_classes: int) -> list:
    """Run ``cls.compute_metrics`` with its training loop (``train_one_epoch``, ``validate``) and its
    random-data draw replaced by recorders: every model it trains, as one record (the run, which set,
    its labels, lr, optimizer, schedule, augmentation, loss, teachers). Nothing is trained."""
    import ddranking.metrics.hard_label as hard_mod
    import ddranking.metrics.soft_label as soft_mod

    module = hard_mod if cls.__module__ == hard_mod.__name__ else soft_mod
    records, run, draws = [], [-1], []
    syn = kwargs["image_tensor"]
    real = torch.utils.data.TensorDataset(torch.zeros(4, 3, 2, 2), torch.zeros(4, dtype=torch.long))

    def which(dataset) -> tuple[str, str]:
        if dataset is real:
            return "real", "hard"
        images, labels = dataset.images, dataset.targets
        name = "syn" if images is syn else f"rdm{int(images.flatten()[0])}"
        kind = "hard" if not labels.is_floating_point() else ("stored" if labels is kwargs.get("soft_labels")
                                                               else "teacher_logits")
        return name, kind

    def train_one_epoch(epoch, stu_model, loader, loss_fn, optimizer, soft_label_mode="S", aug_func=None,
                        tea_models=None, lr_scheduler=None, class_map=None, **_):
        if epoch == 0:
            name, kind = which(loader.dataset)
            records.append({"run": run[0], "set": name, "labels": kind, "lr": optimizer.param_groups[0]["lr"],
                            "optimizer": type(optimizer).__name__, "scheduler": type(lr_scheduler).__name__,
                            "aug": type(aug_func).__name__ if aug_func is not None else None,
                            "loss": type(loss_fn).__name__, "relabel": soft_label_mode == "M" and tea_models is not None,
                            "batch": loader.batch_size})

    def random_tensors(*args, **kw):
        n = len(draws)
        draws.append(run[0])
        return torch.full((ipc * num_classes, 3, 2, 2), float(n)), torch.arange(num_classes).repeat_interleave(ipc)

    def set_seed(seed=None):
        run[0] += 1

    obj = object.__new__(cls)
    with tempfile.TemporaryDirectory() as tmp:
        obj.__dict__.update({"use_dist": False, "rank": 0, "world_size": 1, "device": "cpu", "num_eval": num_eval,
                             "ipc": ipc, "num_classes": num_classes, "eval_full_data": True, "dataset": "CIFAR10",
                             "model_name": "ConvNet-3", "stu_use_torchvision": False, "use_torchvision": False,
                             "im_size": (32, 32), "test_loader_real": None, "test_loader_syn": None,
                             "random_data_format": "tensor", "random_data_path": tmp, "dst_train": real,
                             "class_to_indices": None, "class_map": None, "num_workers": 0, "num_epochs": 20,
                             "test_interval": 20, "save_path": str(Path(tmp) / "scores.csv"),
                             "teacher_model": lambda x: torch.ones(len(x), num_classes), **attrs})
        stack = contextlib.ExitStack()
        for name, value in (("train_one_epoch", train_one_epoch), ("validate", lambda *a, **k: 50.0),
                            ("set_seed", set_seed), ("save_results", lambda results, path: None),
                            ("get_random_data_tensors", random_tensors),
                            ("build_model", lambda *a, **k: torch.nn.Linear(1, 1))):
            stack.enter_context(patched(module, name, value))
        with stack:
            obj.compute_metrics(**kwargs)
    return {"trainings": records, "draws": draws}


def case_flow(inputs):
    """What the peer's LRS evaluators train per evaluation run, for the given configs (see :func:`_flow`)."""
    from ddranking.aug import DSA, Cutmix
    from ddranking.loss import KLDivergenceLoss, MSEGTLoss, SoftCrossEntropyLoss
    from ddranking.metrics import LabelRobustScoreHard, LabelRobustScoreSoft

    out = {}
    for name, cfg in inputs["configs"].items():
        aug = {"dsa": lambda: DSA(dict(cfg["aug_params"])), "cutmix": lambda: Cutmix({"beta": 1.0}),
               None: lambda: None}[cfg["aug"]]()
        n, ipc = cfg["num_classes"], cfg["ipc"]
        syn = torch.rand(n * ipc, 3, 2, 2) + 100.0
        attrs = {"aug_func": aug, "optimizer": cfg["optimizer"], "lr_scheduler": cfg["scheduler"],
                 "step_size": cfg.get("step_size"), "weight_decay": 0.0005, "momentum": 0.9,
                 "real_batch_size": 256, "syn_batch_size": cfg["batch"]}
        kwargs = {"image_tensor": syn, "syn_lr": cfg["syn_lr"]}
        if cfg["evaluator"] == "hard":
            cls = LabelRobustScoreHard
        else:
            cls = LabelRobustScoreSoft
            loss = {"sce": SoftCrossEntropyLoss, "kl": KLDivergenceLoss, "mse_gt": MSEGTLoss}[cfg["criterion"]]
            attrs.update({"soft_label_mode": cfg["mode"], "soft_label_criterion": cfg["criterion"],
                          "loss_fn_kwargs": cfg["loss_kwargs"], "use_aug_for_hard": cfg["use_aug_for_hard"],
                          "teacher_models": [lambda x: torch.zeros(len(x), n)]})
            if cfg["mode"] == "S":
                kwargs["soft_labels"] = torch.randn(n * ipc, n)
            del loss
        out[name] = _flow(cls, attrs, kwargs, cfg["num_eval"], ipc, n)
    return out


def _scores(cls, helpers: dict, attrs: dict, kwargs: dict):
    """Run ``cls.compute_metrics`` with its accuracy helpers replaced by the given per-run values:
    the peer's own arithmetic (differences, exponential map, mean and std over runs)."""
    import ddranking.metrics.aug_robust as aug_mod
    import ddranking.metrics.hard_label as hard_mod
    import ddranking.metrics.soft_label as soft_mod

    obj = object.__new__(cls)
    with tempfile.TemporaryDirectory() as tmp:
        obj.__dict__.update({"use_dist": False, "rank": 0, "world_size": 1, "device": "cpu",
                             "save_path": str(Path(tmp) / "scores.csv"), **attrs})
        for name, fn in helpers.items():
            setattr(obj, name, fn)
        stack = contextlib.ExitStack()
        for mod in (aug_mod, hard_mod, soft_mod):
            stack.enter_context(patched(mod, "set_seed", lambda seed=None: None))
        # LabelRobustScoreHard.compute_metrics appends each run's LRS twice (hard_label.py), so its
        # save_results (a DataFrame of unequal columns) raises: keep the file out of it. Its mean and
        # population std are those of the runs all the same.
        stack.enter_context(patched(hard_mod, "save_results", lambda results, path: None))
        with stack:
            return {k: float(v) for k, v in obj.compute_metrics(**kwargs).items()}


def case_scores(inputs):
    """LRS (``LabelRobustScoreHard``, ``LabelRobustScoreSoft``) and ARS (``AugmentationRobustScore``)
    of the peer, given the accuracies of every evaluation run."""
    from ddranking.metrics import AugmentationRobustScore, LabelRobustScoreHard, LabelRobustScoreSoft

    out = {}
    for unit, scale in (("fraction", 1.0), ("percent", 100.0)):
        for w in inputs["weights"]:
            runs = inputs["lrs_runs"]
            n = len(runs)

            # hard: syn (mode syn), real (mode real), random (mode real, random tensors) per run
            calls = iter([v for r in runs for v in (r["syn_hard"], r["real_hard"], r["rdm_hard"])])
            hard = _scores(LabelRobustScoreHard,
                           {"_compute_hard_label_metrics_helper":
                            lambda *a, calls=calls, scale=scale, **k: (next(calls) * scale, 0.01),
                            "_get_random_data_helper": lambda eval_iter: (None, torch.zeros(1), torch.zeros(1))},
                           {"num_eval": n, "ipc": 1, "num_classes": 10, "eval_full_data": True, "dataset": "CIFAR10",
                            "model_name": "ConvNet-3"},
                           {"image_tensor": torch.zeros(1), "lrs_lambda": w})
            out[("lrs_hard", unit, w)] = hard
            hard_calls = iter([v for i in range(n) for v in (runs[i]["syn_hard"], runs[i]["real_hard"])])
            soft_calls = iter([v for i in range(n) for v in (runs[i]["syn_any"], runs[i]["rdm_any"])])
            soft = _scores(LabelRobustScoreSoft,
                           {"_compute_hard_label_metrics_helper":
                            lambda *a, c=hard_calls, scale=scale, **k: (next(c) * scale, 0.01),
                            "_compute_soft_label_metrics_helper":
                            lambda *a, c=soft_calls, scale=scale, **k: (next(c) * scale, 0.01),
                            "_get_random_data_helper": lambda eval_iter: (None, torch.zeros(1), torch.zeros(1, 10))},
                           {"num_eval": n, "ipc": 1, "num_classes": 10, "eval_full_data": True, "dataset": "CIFAR10",
                            "model_name": "ConvNet-3", "soft_label_mode": "M"},
                           {"image_tensor": torch.zeros(1), "lrs_lambda": w})
            out[("lrs_soft", unit, w)] = soft
        for gamma in inputs["weights"]:
            runs = inputs["ars_runs"]
            n = len(runs)
            with_aug = iter([v for r in runs for v in (r["syn_aug"], r["rdm_aug"])])
            without_aug = iter([v for r in runs for v in (r["syn_noaug"], r["rdm_noaug"])])
            ars = _scores(AugmentationRobustScore,
                          {"_compute_with_aug_metrics_helper": lambda *a, c=with_aug, scale=scale, **k: (next(c) * scale, 0.01),
                           "_compute_without_aug_metrics_helper":
                           lambda *a, c=without_aug, scale=scale, **k: (next(c) * scale, 0.01),
                           "_get_random_data_helper": lambda eval_iter: (None, torch.zeros(1), torch.zeros(1), None)},
                          {"num_eval": n, "ipc": 1, "num_classes": 10, "label_type": "hard", "soft_label_mode": "M"},
                          {"image_tensor": torch.zeros(1), "ars_lambda": gamma})
            out[("ars", unit, gamma)] = ars
    return out


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


def main(in_path: str, out_path: str) -> None:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    requested = torch.load(in_path, weights_only=False)
    results = {}
    for name, inputs in requested.items():
        try:
            results[name] = CASES[name](inputs)
        except Exception:  # noqa: BLE001 - reported to the test, which fails naming it
            results[name] = {"error": traceback.format_exc()}
    torch.save(results, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
