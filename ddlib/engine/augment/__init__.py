"""The one augmentation registry: every training-time augmentation a protocol can name in YAML.

The training loop (:func:`ddlib.engine.train.train_and_test`) calls ``x, targets = augment(x, targets,
generator)`` on every batch. ``x`` is already normalised with the dataset mean/std; ``targets`` are
int labels (N,) or float target rows (N x num_classes); ``generator`` is a private
``torch.Generator`` on ``x``'s device. Every op here draws from that generator only (never from the
global RNG), works on the whole batch on the device with per-sample parameters, and is
differentiable w.r.t. ``x`` where the op allows it (DSA runs inside distillation, where gradients
flow through it).

A spec (from YAML) is ``None`` / ``"none"`` / ``[]`` (no augmentation), an op name, or a list of
ops, each a name or a single-key mapping ``{op: {params}}``, applied in order::

    augment:
      - dsa: {strategy: color_crop_cutout_flip_scale_rotate, mode: one}
      - cutmix: {alpha: 1.0}

Ops: ``dsa`` (Zhao & Bilen, ICML 2021, ported from VICO-UoE/DatasetCondensation ``utils.py``),
``mixup`` / ``cutmix`` (timm ``timm/data/mixup.py`` batch mode), ``random_resized_crop``
(torchvision's sampling), ``flip``, ``patch_shuffle`` (RDED's ``ShufflePatches``), ``torchvision``
(any ``torchvision.transforms.v2`` list, per sample, seeded), DC-Bench's ``autoaugment``,
``randaugment`` and ``imagenet_aug`` (torchvision's kernels on uint8 pixels, one draw per batch as
DC-Bench by default, per image with ``draw: image``; not differentiable), DC's own evaluation
augmentation ``dc_augment`` (crop / scale / rotate / noise, one per image; not differentiable) and
``none``. ZCA whitening is a preprocessing module (:class:`ZCA`,
:func:`fit_zca`), not a random op: it maps pixels to the model's input in place of the
normalisation, so the ops after it see whitened batches (as in MTT/DATM/DD-Ranking).

This package holds the op registry (``OPS``, on :class:`ddlib.specs.registry.Registry`) and the
:class:`Augment` pipeline built from a spec (``pipeline.py``), parameter validation (``_params.py``) and
one file per family, each registering its ops on import: ``dsa_ops.py`` (``dsa``), ``mixing.py``
(``mixup``, ``cutmix``), ``geometric.py`` (``random_resized_crop``, ``flip``, ``patch_shuffle``),
``torchvision_ops.py`` (``torchvision``), ``policies.py`` (DC-Bench's ``autoaugment``, ``randaugment``,
``imagenet_aug``; both on the pixel-space round trip of ``_pixels.py``), ``dc_augment.py``
(``dc_augment``) and ``zca.py``. Adding an op is adding a file that uses :func:`register_op` and
importing it below.
"""

from ddlib.engine.augment.pipeline import OPS, Augment, AugmentContext, create_augment, list_ops, op_params, register_op
# the families, each registering its ops on import (in this order)
from ddlib.engine.augment.dsa_ops import DSA_DEFAULT_STRATEGY, DSA_OPS, DSAParams, dsa, dsa_op
from ddlib.engine.augment import mixing, geometric, torchvision_ops, policies, dc_augment  # noqa: F401
from ddlib.engine.augment.zca import ZCA, ZCA_NAME, fit_zca, zca_to_pixels

__all__ = [
    "Augment",
    "AugmentContext",
    "OPS",
    "DSAParams",
    "DSA_DEFAULT_STRATEGY",
    "DSA_OPS",
    "ZCA",
    "create_augment",
    "dsa",
    "dsa_op",
    "fit_zca",
    "list_ops",
    "op_params",
    "register_op",
    "zca_to_pixels",
    "ZCA_NAME",
]
