"""Optimizers of the PyTorch adapter: each optimizer's rule in ops, and faster native forms.

Any optimizer runs by its :meth:`~unitrain.optim.AbstractOptimizer.update`, written once in
:mod:`unitrain.ops`, one parameter at a time (:class:`ForeachOptimizer` over :func:`in_ops`).
:data:`OPTIMIZERS` keeps faster forms that the kit holds to that rule: torch's own classes where
their formulas are the rule's (SGD, Adam, RMSprop), on the fastest kernel that computes them
correctly here (:func:`.kernels.on_fastest_kernel` decides by running them), and
``torch._foreach`` ops for AdamW, whose torch class decays the weights in a separate multiply.

Parameter groups (:class:`unitrain.optim.Group`) become torch's own param groups in a native
form, each with its options and ``lr_scale`` times the learning rate; the other forms run
their rule once per group.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from unitrain import ops, optim
from unitrain.backends.torch import ops as torch_ops
from unitrain.backends.torch.core import tensor_like
from unitrain.backends.torch.kernels import on_fastest_kernel

__all__ = [
    "OPTIMIZERS",
    "ForeachOptimizer",
    "NativeOptimizer",
    "TorchOptimizer",
    "in_ops",
    "optimizer_for",
]


class TorchOptimizer(Protocol):
    """What the backend asks of one optimizer's implementation."""

    @property
    def native(self) -> torch.optim.Optimizer | None:
        """The ``torch.optim`` object when torch runs the update (its fused kernels can skip
        a step on a device flag, see :func:`.kernels.device_guard`), else None."""

    def step(self, lr: float, step: int) -> None:
        """Apply one update at ``lr`` to the parameters with gradients (``step`` counts it)."""

    def zero_grad(self) -> None:
        """Drop the gradients."""

    def slots(self) -> dict[str, torch.Tensor | None]:
        """The state as ``{"<param>.<slot>": tensor}`` (None: not created yet, read as 0)."""

    def load_slots(self, slots: Mapping[str, np.ndarray], step: int) -> None:
        """Replace the state with ``slots`` (canonical names) after ``step`` updates."""


class NativeOptimizer:
    """A ``torch.optim`` class whose formulas are the reference's, on the fastest kernel that
    computes them correctly here (:func:`on_fastest_kernel`), its state under canonical names.

    torch uses fused or multi-tensor kernels by default only when every parameter is on CUDA;
    on the CPU it loops over the parameters in Python, one op per tensor. For the 32-64-10 MLP
    of the W2 benchmark SGD's step costs 27 µs that way and 8 µs fused, of a ~150 µs step
    (benchmarks/README.md).

    Args:
        spec: the optimizer description.
        params: the parameters by canonical name.
        kind: the ``torch.optim`` class.
        settings: its hyperparameters besides the learning rate, from an optimizer's options.
        names: canonical slot -> the name torch keeps it under.
        counts_steps: whether torch keeps a ``step`` per parameter (it must be restored).
    """

    def __init__(
        self,
        spec: optim.AbstractOptimizer,
        params: Mapping[str, nn.Parameter],
        kind: Any,
        settings: Callable[[Any], dict[str, Any]],
        names: Mapping[str, str],
        *,
        counts_steps: bool,
    ) -> None:
        self.params = dict(params)
        self.names = {slot: names[slot] for slot in spec.state_slots}
        optimizer = on_fastest_kernel(kind, list(self.params.values()), settings(spec))
        groups = optim.parameter_groups(spec, self.params)
        if spec.groups:  # torch's param groups, on the kernel chosen for the whole model
            optimizer = kind(
                [
                    {"params": [self.params[n] for n in group.names], **settings(group.optimizer)}
                    for group in groups
                ],
                **optimizer.defaults,
            )
        self.native = self.optimizer = optimizer
        #: Canonical names in torch's order (group by group), which its state_dict indexes.
        self._order = [name for group in groups for name in group.names]
        self._scales = [group.lr_scale for group in groups]
        self._counts_steps = counts_steps

    def step(self, lr: float, step: int) -> None:
        """One update of the torch optimizer at ``lr`` (times each group's ``lr_scale``)."""
        for group, scale in zip(self.optimizer.param_groups, self._scales, strict=True):
            group["lr"] = lr * scale
        self.optimizer.step()

    def zero_grad(self) -> None:
        """The torch optimizer's ``zero_grad``."""
        self.optimizer.zero_grad()

    def slots(self) -> dict[str, torch.Tensor | None]:
        """torch's per-parameter state under canonical names."""
        tensors: dict[str, torch.Tensor | None] = {}
        for name, p in self.params.items():
            state = self.optimizer.state.get(p, {})
            for slot, torch_name in self.names.items():
                tensors[f"{name}.{slot}"] = state.get(torch_name)
        return tensors

    def load_slots(self, slots: Mapping[str, np.ndarray], step: int) -> None:
        """Through torch's own ``load_state_dict``, which puts each tensor where the chosen
        kernel wants it (a fused Adam keeps ``step`` on the parameters' device)."""
        saved = self.optimizer.state_dict()
        saved["state"] = {}
        for index, name in enumerate(self._order):
            entry = {
                torch_name: tensor_like(slots[f"{name}.{slot}"], self.params[name])
                for slot, torch_name in self.names.items()
            }
            if entry and self._counts_steps:  # one tensor each: torch increments it in place
                entry["step"] = torch.tensor(float(step))
            if entry:
                saved["state"][index] = entry
        self.optimizer.load_state_dict(saved)


_Tensors = list[torch.Tensor]
#: ``rule(spec, params, grads, slots, lr, step)``: one update in place (see ForeachOptimizer).
_Rule = Callable[[Any, _Tensors, _Tensors, dict[str, _Tensors], float, int], None]


class ForeachOptimizer:
    """An update torch has no class for, written with ``torch._foreach`` ops in the
    reference's form; the slots are kept here, one tensor per parameter.

    Args:
        spec: the optimizer description.
        params: the parameters by canonical name.
        rule: ``rule(spec, params, grads, slots, lr, step)`` updates the parameters that have
            gradients and their slots in place, under ``torch.no_grad``.
    """

    def __init__(
        self, spec: optim.AbstractOptimizer, params: Mapping[str, nn.Parameter], rule: _Rule
    ) -> None:
        self.spec, self.params, self.rule = spec, dict(params), rule
        self.native: torch.optim.Optimizer | None = None
        position = {name: index for index, name in enumerate(self.params)}
        #: ``(options, lr_scale, parameter indices)`` per group.
        self._groups = [
            (group.optimizer, group.lr_scale, [position[name] for name in group.names])
            for group in optim.parameter_groups(spec, self.params)
        ]
        self._slots = {
            slot: [torch.zeros_like(p, requires_grad=False) for p in self.params.values()]
            for slot in spec.state_slots
        }

    def step(self, lr: float, step: int) -> None:
        """Run the rule on the parameters that have gradients, group by group."""
        params = list(self.params.values())
        for options, scale, indices in self._groups:
            live = [i for i in indices if params[i].grad is not None]
            slots = {slot: [tensors[i] for i in live] for slot, tensors in self._slots.items()}
            with torch.no_grad():
                self.rule(
                    options,
                    [params[i] for i in live],
                    [grad for i in live if (grad := params[i].grad) is not None],
                    slots,
                    lr * scale,
                    step,
                )

    def zero_grad(self) -> None:
        """Drop the gradients (as ``torch.optim``'s ``zero_grad`` does by default)."""
        for p in self.params.values():
            p.grad = None

    def slots(self) -> dict[str, torch.Tensor | None]:
        """The slots under canonical names, parameter by parameter."""
        return {
            f"{name}.{slot}": tensors[index]
            for index, name in enumerate(self.params)
            for slot, tensors in self._slots.items()
        }

    def load_slots(self, slots: Mapping[str, np.ndarray], step: int) -> None:
        """Copy ``slots`` in, on the parameters' device and in their dtype."""
        self._slots = {
            slot: [tensor_like(slots[f"{name}.{slot}"], p) for name, p in self.params.items()]
            for slot in self.spec.state_slots
        }


def _adamw(
    spec: optim.AdamW,
    p: list[torch.Tensor],
    g: list[torch.Tensor],
    slots: dict[str, _Tensors],
    lr: float,
    step: int,
) -> None:
    # torch.optim.AdamW decays the weights in a separate multiply before the Adam step, which
    # rounds differently from the reference's single p -= lr * (u + wd * p) and drifts close
    # to 1e-6 over 100 float32 steps.
    m, v = slots["exp_avg"], slots["exp_avg_sq"]
    torch._foreach_lerp_(m, g, 1.0 - spec.beta1)
    torch._foreach_mul_(v, spec.beta2)
    torch._foreach_addcmul_(v, g, g, value=1.0 - spec.beta2)
    bias_correction1 = 1.0 - spec.beta1**step
    sqrt_bias_correction2 = math.sqrt(1.0 - spec.beta2**step)
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, sqrt_bias_correction2)
    torch._foreach_add_(denom, spec.eps)
    direction = torch._foreach_div(m, bias_correction1)
    torch._foreach_div_(direction, denom)
    torch._foreach_add_(direction, p, alpha=spec.weight_decay)
    torch._foreach_add_(p, direction, alpha=-lr)


def in_ops(
    spec: optim.AbstractOptimizer,
    params: _Tensors,
    grads: _Tensors,
    slots: dict[str, _Tensors],
    lr: float,
    step: int,
) -> None:
    """Any optimizer's own update, written in ops, run on each parameter and copied back."""
    with ops.using(torch_ops):  # lr is a float: a group's lr_scale is already in it
        for index, (p, g) in enumerate(zip(params, grads, strict=True)):
            mine = {slot: tensors[index] for slot, tensors in slots.items()}
            new_p, new_slots = spec.update(p, g, mine, lr, step)
            p.copy_(new_p)
            for slot, value in new_slots.items():
                mine[slot].copy_(value)


_Factory = Callable[[Any, Mapping[str, nn.Parameter]], TorchOptimizer]

#: Optimizer type -> its native form on torch. A type missing here runs its update in ops.
OPTIMIZERS: dict[type[optim.AbstractOptimizer], _Factory] = {
    optim.SGD: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.SGD,
        lambda s: {"momentum": s.momentum, "nesterov": s.nesterov, "weight_decay": s.weight_decay},
        {"momentum": "momentum_buffer"},
        counts_steps=False,
    ),
    optim.Adam: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.Adam,
        lambda s: {"betas": (s.beta1, s.beta2), "eps": s.eps, "weight_decay": s.weight_decay},
        {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
        counts_steps=True,
    ),
    optim.AdamW: lambda spec, params: ForeachOptimizer(spec, params, _adamw),
    optim.RMSprop: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.RMSprop,
        lambda s: {
            "alpha": s.alpha,
            "eps": s.eps,
            "centered": s.centered,
            "momentum": s.momentum,
            "weight_decay": s.weight_decay,
        },
        {"square_avg": "square_avg", "momentum": "momentum_buffer", "grad_avg": "grad_avg"},
        counts_steps=True,
    ),
}


def optimizer_for(
    spec: optim.AbstractOptimizer, params: Mapping[str, nn.Parameter]
) -> TorchOptimizer:
    """The native form of ``spec`` from :data:`OPTIMIZERS`, else its update in ops, over
    ``params``.

    Raises:
        ConfigError: the optimizer has neither (only a numpy ``reference_update``).
    """
    generic = lambda spec, params: ForeachOptimizer(spec, params, in_ops)  # noqa: E731
    if not params:  # a model without parameters (pooling alone): torch.optim refuses none
        return generic(spec, params)
    return optim.implementation(OPTIMIZERS, spec, "torch", generic)(spec, params)
