"""Adversarial attacks for robustness scores (BEARD protocol), on torchattacks 3.5.1, done right.

A library the protocols use, not a protocol (as torchattacks is to its users): a registry of
attacks (``catalog.py``: ``create_attack(spec, model, num_classes)`` builds a torchattacks attack
from a spec), the space an attack acts in (``spaces.py``: :class:`PixelModel`), targets and seeds
(``targets.py``), the argument checks (``checks.py``), the measuring loop (``run.py``:
:func:`clean_pass`, :func:`run_attack`) and black-box transfer (``surrogate.py``: :func:`transfer_attack`,
crafted on a surrogate, scored on targets). A spec is a registry name, a one-key mapping
``{name: {param: value}}`` (the YAML form), or an :class:`AttackSpec`::

    attacks: [fgsm, {pgd: {eps: 4/255, random_start: true}}, {pgd_l2: {eps: 128/255, alpha: 15/255}}]

Adding an attack is one decorated function (:func:`register_attack`), anywhere::

    @register_attack("my_fgsm", norm="Linf")
    def my_fgsm(model, num_classes, seed, *, eps: float = 8 / 255):
        return torchattacks.FGSM(model, eps=eps)

What BEARD (Zhou et al. 2024, ``Code/eva_utils.py:epoch``) gets wrong and this package does not:

* **Pixel space.** torchattacks assumes inputs in [0, 1]: its ε, step sizes and clamping are in
  pixel units. BEARD feeds it *normalised* tensors, so its "ε = 8/255" is 8/255 in normalised
  units (8/255 × std ≈ 1.6/255 in pixels for CIFAR-10), while its [0, 1] clamp acts on normalised
  values: every pixel below its channel mean or above mean + std is moved there, a pixel-space
  change far larger than any ε. Here models are wrapped in :class:`PixelModel`, which normalises
  inside its forward, and images are pixels in [0, 1]. ``space="beard_compat"`` (see
  :func:`run_attack`) reproduces BEARD's pipeline exactly, to check a published number against it;
  its results are never a pixel-space robustness.
* **Targets for any number of classes.** BEARD targets ``(y + 1) % 10`` whatever the dataset
  (``eva_utils.epoch``, every targeted attack, CIFAR-100 and TinyImageNet included: only classes
  0-9 are ever targets there); :func:`target_labels` uses the dataset's class count (``next``),
  draws another class at random from a private, seeded generator (``random``), or gives BEARD's
  targets as a named kind (``next_mod10``, for ``beard_compat`` on other than 10 classes).
* **Skipped, not faked.** In targeted mode BEARD runs no attack for DeepFool and AutoAttack and
  logs the *clean* accuracy as their robust accuracy. Here an attack whose torchattacks class cannot
  target (``"targeted" not in atk.supported_mode``) is reported as skipped, with no accuracy.
* **Seeds.** BEARD seeds from the clock (``get_network`` and AutoAttack's ``seed=None`` both use
  ``time.time()``). Here each batch runs inside ``torch.random.fork_rng`` seeded from
  (seed, batch index), on CPU and CUDA, and AutoAttack gets the seed too: the same seed gives the
  same adversarial images, and the global generators are left as they were.
* **BEARD's PGD step** was ``alpha=2/225``, a typo for 2/255 (so 0.00889, not 0.00784); the
  default here is 2/255. Pass ``alpha: 2/225`` to reproduce BEARD.

Measurements (:func:`run_attack`): robust accuracy over all N images; the attack success rate as
the BEARD paper defines it (clean-correct and wrong after the attack, over all N); BEARD's code
convention clean − robust accuracy; targeted success; wall time of the attack pass (crafting +
classifying, synchronised on CUDA) next to :func:`clean_pass`'s time for BEARD's AE score; and the
largest L∞ and L2 perturbation actually applied, in pixel space.
"""

from ddlib.attacks.catalog import (ATTACKS, AttackSpec, create_attack, get_entry, list_attacks, parse_attack,
                                   parse_attacks, register_attack, supports_targeted, targeted_skip_reason)
from ddlib.attacks import autoattack_parts  # noqa: F401  (registers aa_apgd_ce, aa_apgd_t, aa_fab_t, aa_square)
from ddlib.attacks.spaces import SPACES, PixelModel
from ddlib.attacks.targets import TARGET_KINDS, batch_seed, target_labels
from ddlib.attacks.run import AttackOutcome, CleanOutcome, clean_pass, run_attack
from ddlib.attacks.surrogate import TransferOutcome, transfer_attack

__all__ = [
    "ATTACKS",
    "SPACES",
    "PixelModel",
    "AttackSpec",
    "CleanOutcome",
    "AttackOutcome",
    "TARGET_KINDS",
    "list_attacks",
    "get_entry",
    "parse_attack",
    "parse_attacks",
    "create_attack",
    "register_attack",
    "supports_targeted",
    "targeted_skip_reason",
    "target_labels",
    "batch_seed",
    "clean_pass",
    "run_attack",
    "TransferOutcome",
    "transfer_attack",
]
