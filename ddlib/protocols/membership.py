"""Who is a member: the images each target of the privacy protocol is asked about (issue 54.5).

A membership attack can only see a leak of the images a model learnt from. Members drawn uniformly
from the whole training split hold at most IPC x C / N of a set's own images (AUC <= 0.5 + f / 2:
0.501 for CIFAR-10 at IPC 10), so the protocol asks each target about the real images it was made
from, where they are known:

* a built-in selection (random, K-Center, herding, forgetting, EL2N) records the training indices it
  picked (``provenance["indices"]``); DM from real or K-Center images records its starting images
  (``provenance["init_indices"]``); a user gives them for a file's set (``member_indices``);
* with ``member_half: true`` the set is made by its built-in source from a seeded half of each class
  of the training split, and that half is the member set (Dong et al., "Privacy for free: how does
  dataset condensation help privacy?", ICML 2022): a sample of it is attacked;
* otherwise (a file's set without ``member_indices``, DM from noise) membership cannot be measured:
  the set's side gets no attack value and the cell says so.

Non-members are test images throughout; the shadow models are asked the same question as their target
(their own training images, or their own half).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ddlib.data.datasets import Dataset
from ddlib.data.distilled import DistilledSet
from ddlib.specs.shown import shown

__all__ = ["Split", "split_members", "member_half", "half_dataset", "set_members", "at_most", "check_member_params",
           "UNKNOWN"]

UNKNOWN = ("membership not measured: the images this set was made from are unknown (a file's set, DM from noise); "
           "give member_indices, or member_half: true for a built-in method")
HALF_SALT = 7_919  # the member half's draw, apart from the members' (same attack_seed)


@dataclass(frozen=True)
class Split:
    """Which images are attacked (members of the full-data model, non-members) and the attacker's data (indices)."""

    members: torch.Tensor  # into the training split: the full-data model's members
    nonmembers: torch.Tensor  # into the test split: every target's non-members
    shadow_pool: torch.Tensor  # the training split without the members: shadow models train on it
    shadow_out: torch.Tensor  # the test split without the non-members: what shadow models never saw


def split_members(n_train: int, n_test: int, members: int, seed: int) -> Split:
    """``members`` training and as many test indices (at most half of either split), drawn with ``seed``;
    the rest of each split is the shadow data."""
    n = min(members, n_train // 2, n_test // 2)
    if n < 1:
        raise ValueError(f"members: {n_train} training and {n_test} test images leave none to attack")
    g = torch.Generator().manual_seed(seed)
    train, test = torch.randperm(n_train, generator=g), torch.randperm(n_test, generator=g)
    return Split(train[:n].sort().values, test[:n].sort().values, train[n:].sort().values, test[n:].sort().values)


def member_half(labels: torch.Tensor, num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the member half, the other half) of the training split: half of each class (rounded down), drawn with ``seed``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + HALF_SALT)
    half, rest = [], []
    for c in range(num_classes):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        half.append(idx[:len(idx) // 2])
        rest.append(idx[len(idx) // 2:])
    return torch.cat(half).sort().values, torch.cat(rest).sort().values


def half_dataset(ds: Dataset, indices: torch.Tensor) -> Dataset:
    """The training split cut to ``indices`` (the test split kept): what a member-half set is made from."""
    return replace(ds, train_images=ds.train_images[indices], train_labels=ds.train_labels[indices],
                   source=f"{ds.source} [member half: {len(indices)} of {len(ds.train_labels)} training images]")


def at_most(indices: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """``indices`` if there are at most ``n``, else ``n`` of them drawn with ``seed`` (sorted)."""
    if len(indices) <= n:
        return indices
    g = torch.Generator().manual_seed(seed)
    return indices[torch.randperm(len(indices), generator=g)[:n]].sort().values


def set_members(params: dict, distilled: DistilledSet, half: torch.Tensor | None) -> tuple[torch.Tensor | None, str]:
    """The training indices the set's models are asked about, and where they come from (None: unknown,
    with :data:`UNKNOWN`). ``half``: the member half, in ``member_half`` mode."""
    if params["member_indices"] is not None:
        return torch.tensor(sorted(params["member_indices"]), dtype=torch.long), "member_indices (given)"
    if half is not None:
        return half, "the member half the set was made from (member_half)"
    kind = params["source"]["kind"]
    if kind == "file":  # a file's provenance may name indices of other data: only the user's word counts
        return None, UNKNOWN
    for key, what in (("indices", f"the real images {kind} selected"), ("init_indices", f"the real images {kind} started from")):
        found = distilled.provenance.get(key)
        if found is not None:
            return torch.as_tensor(found, dtype=torch.long).sort().values, what
    return None, UNKNOWN


def check_member_params(p: dict, n_train: int | None) -> None:
    """One-line errors for ``member_indices`` and ``member_half`` (``n_train``: the cell's training images, None if
    the data does not load here)."""
    indices, half, kind = p["member_indices"], p["member_half"], p["source"]["kind"]
    if not isinstance(half, bool):
        raise ValueError(f"member_half must be true or false, got {shown(half)}")
    if half and kind in ("file", "full"):
        raise ValueError(f"member_half: method {p['method']!r} (kind {kind}) is not made by ddlib from the training "
                         "split; give member_indices instead")
    if indices is None:
        return
    if half:
        raise ValueError("member_indices and member_half: give one (member_half makes the set from a half of its own)")
    if kind == "full":
        raise ValueError(f"member_indices: method {p['method']!r} is the whole training split; leave it out")
    if (not isinstance(indices, list) or not indices
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices)):
        raise ValueError(f"member_indices must be a non-empty list of non-negative integers (training-split indices), "
                         f"got {shown(indices)}")
    if len(set(indices)) != len(indices):
        raise ValueError(f"member_indices: {len(indices) - len(set(indices))} repeated index(es)")
    if n_train is not None and max(indices) >= n_train:
        raise ValueError(f"member_indices: index {max(indices)} is past the {n_train} training images of {p['dataset']}")
