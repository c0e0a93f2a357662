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

Opt-in levers for the GPU (issue 55; the engine's loop does not use them, and the default path above
is unchanged bit for bit): ``stacked_leaves`` (the parameters as stacked leaves, no stack per step),
:class:`StackedSGD` (one foreach update for every model, each at its own lr), :class:`StackedTrainStep`
(the whole step as one function: eager, compiled, or a CUDA graph), channels-last stacks
(:func:`channels_last_batch`). ``bench/engine_levers.py`` measures them against the sequential mode;
one becomes the default only after a GPU has measured it the winner.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, vmap

from ddlib.engine.device import compile_cache_dir

__all__ = ["StackedModels", "stochastic_layers", "StackedSGD", "StackedTrainStep", "channels_last_batch"]


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


def _leaf_layout(stacked: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A stacked parameter as a fresh leaf; a stacked conv weight (S, O, C, kh, kw) with ``channels_last``
    laid out (S, O, kh, kw, C) in memory, so vmap's (S*O, C, kh, kw) view of it is channels-last."""
    if channels_last and stacked.dim() == 5:
        return stacked.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3).detach()
    return stacked.detach().clone()


def channels_last_batch(x: torch.Tensor) -> torch.Tensor:
    """An S x B x C x H x W batch laid out (B, H, W, S, C) in memory: vmap's grouped convolution then
    sees a channels-last (B, S*C, H, W) view of it, without a copy (the ``channels_last`` lever)."""
    return x.permute(1, 3, 4, 0, 2).contiguous().permute(3, 0, 4, 1, 2)


class StackedModels:
    """``models`` (same architecture, same device) driven by one vmapped forward.

    ``self(x)`` takes an S x B x ... batch (model s sees ``x[s]``) and returns S x B x K logits;
    :meth:`forward_shared` gives every model the same B x ... batch (test passes). Call
    :meth:`release` when done, so each model owns its buffers again (and not views of the stack).
    """

    def __init__(self, models: Sequence[nn.Module], compile: bool | str = False, stacked_leaves: bool = False,
                 channels_last: bool = False):
        """``compile``: True, or a ``torch.compile`` mode ("max-autotune-no-cudagraphs", "reduce-overhead").
        Opt-in levers (issue 55, ``bench/engine_levers.py``; the default path is today's, bit for bit, and
        one becomes the default only after a GPU measures it the winner): ``stacked_leaves`` keeps the
        parameters as one stacked leaf tensor per name (:meth:`parameters`, for :class:`StackedSGD`),
        copied back into the models by :meth:`release`/:meth:`sync_models`, so no ``torch.stack`` per step;
        ``channels_last`` (with ``stacked_leaves``) lays the leaves out so that vmap's grouped
        convolutions see channels-last weights (feed :func:`channels_last_batch` inputs)."""
        if channels_last and not stacked_leaves:
            raise ValueError("channels_last needs stacked_leaves (the layout lives in the stacked tensors)")
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
            if isinstance(compile, str):
                self._train_forward = torch.compile(self._each, dynamic=False, mode=compile)
            else:
                self._train_forward = torch.compile(self._each, dynamic=False)
        self.leaves: dict[str, torch.Tensor] | None = None
        if stacked_leaves:
            with torch.no_grad():
                self.leaves = {n: _leaf_layout(torch.stack([m.get_parameter(n) for m in self.models]), channels_last)
                               .requires_grad_(True) for n in self.param_names}

    def __len__(self) -> int:
        return len(self.models)

    def _call(self, params, buffers, x):
        return functional_call(self.base, (params, buffers), (x,))

    def stacked_params(self) -> dict[str, torch.Tensor]:
        """Every parameter stacked over the models (differentiable: gradients reach each model's own),
        or the stacked leaves themselves (``stacked_leaves``)."""
        if self.leaves is not None:
            return self.leaves
        return {n: torch.stack([m.get_parameter(n) for m in self.models]) for n in self.param_names}

    def parameters(self) -> list[torch.Tensor]:
        """The stacked leaves (``stacked_leaves`` only): what a :class:`StackedSGD` steps."""
        if self.leaves is None:
            raise ValueError("parameters() needs stacked_leaves=True: otherwise each model owns its parameters")
        return list(self.leaves.values())

    def sync_models(self) -> None:
        """Copy the stacked leaves into each model's own parameters (``stacked_leaves``; else a no-op)."""
        if self.leaves is None:
            return
        with torch.no_grad():
            for n, leaf in self.leaves.items():
                for model, value in zip(self.models, leaf.unbind(0)):
                    model.get_parameter(n).copy_(value)

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
        """Give each model its own copy of its buffers (and of its stacked leaves); return the models."""
        self.sync_models()
        for name, stacked in self.buffers.items():
            for model, view in zip(self.models, stacked.unbind(0)):
                _set_buffer(model, name, view.clone())
        self.buffers = {}
        return self.models


class StackedSGD(torch.optim.Optimizer):
    """torch's SGD update (momentum, weight decay, no dampening or Nesterov) over stacked leaves, each
    model at its own lr, in one set of foreach launches for all models (opt-in lever; the engine's
    default is one ``torch.optim.SGD`` per lr over each model's own parameters). The group's ``lr`` is
    a factor (1.0 at the start) that the recipe's schedules scale: model s steps at ``lrs[s] x factor``
    (the same lrs as its own optimizer for ``step``, ``dc_step``, ``cosine_half``; ``cosine`` only with
    ``lr_min`` 0). Momentum buffers start at zero (0 x m + g is g, torch's first step) and keep their
    addresses across a state reset (``dc_step``): a CUDA graph can hold the step."""

    def __init__(self, params, lrs: Sequence[float], momentum: float = 0.0, weight_decay: float = 0.0):
        params = list(params)
        super().__init__(params, {"lr": 1.0, "momentum": momentum, "weight_decay": weight_decay})
        self.model_lrs = [float(v) for v in lrs]
        if any(p.shape[0] != len(self.model_lrs) for p in params):
            raise ValueError(f"{len(self.model_lrs)} lrs but stacked leaves of {sorted({p.shape[0] for p in params})}")
        self._lr = torch.zeros(len(self.model_lrs), dtype=params[0].dtype, device=params[0].device)
        self._factor: float | None = None
        self._momentum = {p: torch.zeros_like(p) for p in params} if momentum else {}
        self.prepare()

    def prepare(self) -> None:
        """Bring the device-side lrs and the momentum state up to date (outside a captured graph)."""
        factor = self.param_groups[0]["lr"]
        if factor != self._factor:
            self._lr.copy_(torch.tensor([lr * factor for lr in self.model_lrs], dtype=self._lr.dtype))
            self._factor = factor
        for p, buf in self._momentum.items():
            if "momentum_buffer" not in self.state[p]:  # new, or cleared by a schedule: from zero again
                self.state[p]["momentum_buffer"] = buf.zero_()

    @torch.no_grad()
    def apply(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """One update of ``params`` by ``grads`` (no host sync, no allocation but temporaries)."""
        group = self.param_groups[0]
        if group["weight_decay"]:
            grads = torch._foreach_add(grads, params, alpha=group["weight_decay"])
        if group["momentum"]:
            bufs = [self._momentum[p] for p in params]
            torch._foreach_mul_(bufs, group["momentum"])
            torch._foreach_add_(bufs, grads)
            grads = bufs
        columns = [self._lr.view(-1, *[1] * (p.dim() - 1)) for p in params]
        torch._foreach_addcmul_(params, columns, grads, value=-1.0)

    def step(self, closure=None):
        self.prepare()
        params = [p for p in self.param_groups[0]["params"] if p.grad is not None]
        self.apply(params, [p.grad for p in params])


class StackedTrainStep:
    """The whole training step of a stack (forward, per-model cross-entropy, backward, update) as one
    function of (x, y): ``torch.func.grad`` of the vmapped forward and a :class:`StackedSGD` update,
    run eagerly (``how="eager"``), through ``torch.compile`` (``"compile"``, ``compile_mode``), or
    captured once per input shape in a CUDA graph and replayed (``"cudagraph"``: the first ``warmup``
    steps of a shape run eagerly on a side stream; they are real steps). Opt-in lever (issue 55,
    ``bench/engine_levers.py``): the engine's loop does not use it. Needs ``stacked_leaves``; the
    default loss only (``cross_entropy`` per model, hard labels). Returns the S losses (the graph's
    output tensor: read it before the next call)."""

    def __init__(self, stack: StackedModels, optimizer: StackedSGD, how: str = "eager",
                 autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 compile_mode: str | None = None, warmup: int = 3):
        if stack.leaves is None:
            raise ValueError("StackedTrainStep needs StackedModels(..., stacked_leaves=True)")
        if how not in ("eager", "compile", "cudagraph"):
            raise ValueError(f"how must be eager, compile or cudagraph, got {how!r}")
        self.stack, self.optimizer, self.how, self.autocast, self.warmup = stack, optimizer, how, autocast, warmup
        self.params = list(stack.leaves.values())
        self._grad = torch.func.grad(self._loss, has_aux=True)
        self._step = self._eager
        if how == "compile":
            compile_cache_dir()
            # the step updates these in place: static addresses let "reduce-overhead" keep its CUDA graphs
            for t in [*self.params, *optimizer._momentum.values(), optimizer._lr]:
                torch._dynamo.mark_static_address(t)
            self._step = torch.compile(self._eager, dynamic=False, mode=compile_mode)
        self._new_step = compile_mode is not None and "reduce-overhead" in compile_mode
        self._graphs: dict[tuple, tuple] = {}
        self._seen: dict[tuple, int] = {}

    def _loss(self, params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor):
        """The summed loss and the S losses; ``buffers`` an input (BatchNorm updates them in place, which
        a grad transform allows only on its inputs)."""
        with self.autocast():
            logits = self.stack._each(params, buffers, x).float()
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
        return losses.sum(), losses.detach()

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, losses = self._grad(dict(self.stack.leaves), self.stack.buffers, x, y)
        self.optimizer.apply(self.params, [grads[n] for n in self.stack.leaves])
        return losses

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.optimizer.prepare()
        self.optimizer._opt_called = True  # an update runs: what the schedules' order check looks for
        if self.how != "cudagraph":
            if self._new_step:
                torch.compiler.cudagraph_mark_step_begin()
            return self._step(x, y)
        key = (tuple(x.shape), x.dtype, tuple(x.stride()), tuple(y.shape))
        if key in self._graphs:
            graph, static_x, static_y, losses = self._graphs[key]
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            return losses
        seen = self._seen[key] = self._seen.get(key, 0) + 1
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            losses = self._eager(x, y)
        torch.cuda.current_stream().wait_stream(side)
        if seen == self.warmup:  # capture the next step of this shape
            static_x, static_y = x.clone(), y.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_losses = self._eager(static_x, static_y)
            self._graphs[key] = (graph, static_x, static_y, static_losses)
        return losses
