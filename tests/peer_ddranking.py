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
    out = {"ops": [f.__name__[len("rand_"):] for f in dsa.transform_funcs], "aug_mode": dsa.aug_mode}
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
