"""S models of one architecture run as one: a vectorised forward over stacked parameters.

The training loop's batched mode (:func:`ddlib.engine.train.train_and_test` with several seeds
or learning rates) trains many small models at once: with ``torch.func.functional_call`` and
``torch.func.vmap`` one forward/backward pass runs all of them, each on its own batch (torch
turns the vmapped convolutions into grouped convolutions). On a GPU a 3-layer ConvNet on 10 images
leaves the device mostly idle, so this is where many models per step pay.

Layout (why not ``torch.func.stack_module_state``): the *parameters* stay each model's own leaf
tensors, stacked afresh at every step (a copy of a few hundred thousand numbers per model), so
that every model keeps an ordinary torch optimizer (its own momentum, its own learning rate and
scheduler, exactly the update of the sequential path) and the trained models are ordinary modules.
The *buffers* (BatchNorm running statistics) live in one stacked tensor per name, and each model
holds views of its slice: the vmapped forward updates every model's own statistics in place.

``compile=True`` (the recipe's ``compile``) puts the training forward through ``torch.compile``
(Inductor, static shapes): it fuses the dozen memory-bound elementwise passes (normalisation, ReLU,
pooling, autocast's casts) that bound the eager batched step on a GPU. Measured on an H200
(``bench/batched_compile.py``, 25 ConvNet-3 models at IPC 10, bf16): 130,000-160,000 images/s
against 57,000 eager in one run, 65,700 against 53,000 in a later one (open, bench/README.md),
after 14-33 s of compiling per shape; per-epoch losses within 2.4e-7 of eager
(fp32, CUDA and CPU). Test passes (:meth:`forward_shared`) stay eager: one pass per model.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn as nn
from torch.func import functional_call, vmap

from ddlib.engine.device import compile_cache_dir

__all__ = ["StackedModels", "stochastic_layers"]


def stochastic_layers(model: nn.Module) -> list[str]:
    """Names of the layers that draw random numbers in training (dropout, drop-path). vmap cannot
    draw them per model from each model's own stream, so such models train sequentially."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append(name)
        elif type(module).__name__ == "DropPath" and getattr(module, "drop_prob", 0) > 0:
            found.append(name)
    return found


def _set_buffer(model: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    model.get_submodule(owner)._buffers[leaf] = value


def _float_input(module: nn.Module, args: tuple) -> tuple:
    """BatchNorm under vmap on CUDA takes a bf16 input only with fp32 running statistics it cannot
    have there ("Expected running_mean to have type BFloat16 but got Float", ResNet-18-BN under bf16
    autocast on an H200; vmap's rule calls it without the affine weight that allows the mixed
    types): it normalises an fp32 copy, so its output is fp32 where a sequential model's is bf16."""
    x = args[0]
    return (x.float(),) + tuple(args[1:]) if x.dtype in (torch.bfloat16, torch.float16) else args


class StackedModels:
    """``models`` (same architecture, same device) driven by one vmapped forward.

    ``self(x)`` takes an S x B x ... batch (model s sees ``x[s]``) and returns S x B x K logits;
    :meth:`forward_shared` gives every model the same B x ... batch (test passes). Call
    :meth:`release` when done, so each model owns its buffers again (and not views of the stack).
    """

    def __init__(self, models: Sequence[nn.Module], compile: bool = False):
        if not models:
            raise ValueError("StackedModels needs at least one model")
        self.models = list(models)
        first = self.models[0]
        kinds = {type(m) for m in self.models}
        if len(kinds) != 1:
            raise ValueError(f"models of one architecture only, got {sorted(k.__name__ for k in kinds)}")
        if stochastic_layers(first):
            raise ValueError(f"{type(first).__name__} has random layers {stochastic_layers(first)[:3]}: "
                             "they cannot be drawn per model in one vectorised pass")
        self.base = copy.deepcopy(first).to("meta")  # the structure; functional_call supplies every tensor
        self.param_names = [n for n, _ in first.named_parameters()]
        self.buffers: dict[str, torch.Tensor] = {}
        for name, _ in first.named_buffers():
            stacked = torch.stack([m.get_buffer(name) for m in self.models])
            for model, view in zip(self.models, stacked.unbind(0)):
                _set_buffer(model, name, view)
            self.buffers[name] = stacked
        self.batchnorm_on_cuda = any(p.is_cuda for p in first.parameters()) and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in self.base.modules())
        if self.batchnorm_on_cuda:
            for module in self.base.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.register_forward_pre_hook(_float_input)
        self._each = vmap(self._call, in_dims=(0, 0, 0))
        self._shared = vmap(self._call, in_dims=(0, 0, None))
        self._train_forward = self._each
        if compile:
            compile_cache_dir()  # kernels cached per instruction set (a stale one trained to NaN)
            self._train_forward = torch.compile(self._each, dynamic=False)

    def __len__(self) -> int:
        return len(self.models)

    def _call(self, params, buffers, x):
        return functional_call(self.base, (params, buffers), (x,))

    def stacked_params(self) -> dict[str, torch.Tensor]:
        """Every parameter stacked over the models (differentiable: gradients reach each model's own)."""
        return {n: torch.stack([m.get_parameter(n) for m in self.models]) for n in self.param_names}

    def train(self, mode: bool = True) -> "StackedModels":
        self.base.train(mode)
        for m in self.models:
            m.train(mode)
        return self

    def eval(self) -> "StackedModels":
        return self.train(False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != len(self.models):
            raise ValueError(f"{len(self.models)} models but a stack of {x.shape[0]} batches")
        return self._train_forward(self.stacked_params(), self.buffers, x)

    def forward_shared(self, x: torch.Tensor) -> torch.Tensor:
        """All models on the same batch ``x`` (B x ...): S x B x K logits. BatchNorm on CUDA cannot
        take an unbatched input under vmap ("NYI: querying is_contiguous inside of vmap", H200), so
        there every model gets its own copy of the batch."""
        if self.batchnorm_on_cuda:
            return self._each(self.stacked_params(), self.buffers, x.expand(len(self.models), *x.shape).contiguous())
        return self._shared(self.stacked_params(), self.buffers, x)

    def release(self) -> list[nn.Module]:
        """Give each model its own copy of its buffers; return the models."""
        for name, stacked in self.buffers.items():
            for model, view in zip(self.models, stacked.unbind(0)):
                _set_buffer(model, name, view.clone())
        self.buffers = {}
        return self.models
