"""Which torch kernels the PyTorch backend may use, decided by running them, not by assumption.

torch ships up to three implementations of each optimizer — ``fused`` (one kernel for all
tensors), ``foreach`` (multi-tensor ops) and the plain per-tensor loop — and which of them
exist and are correct depends on the torch version, the device and the dtype. Two examples
seen on the versions this package allows: torch 2.13's fused SGD on the CPU leaves bfloat16
tensors of more than a few dozen elements unchanged (no error, the update is lost), and
the CUDA build has no bfloat16 kernel for the non-finite check of ``GradScaler``.

So each choice is made once per (settings, device, dtype) by a probe: the candidate kernel and
the plain loop — torch's reference implementation of its published formulas — take the same
two updates on the same tensors (with a state round-trip through ``Optimizer.load_state_dict``
between them, as a resume does), and the candidate is used only if it agrees to within a few
units in the last place. The probe costs about a millisecond, once per process. The
conformance kit then holds whatever was chosen to the float64 reference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from unitrain import optim
from unitrain.backends.torch.core import UNSUPPORTED

__all__ = [
    "OPTIMIZERS",
    "ForeachOptimizer",
    "NativeOptimizer",
    "TorchOptimizer",
    "build_optimizer",
    "optimizer_for",
    "optimizer_kernel",
]

#: Kernels in order of preference; "plain" always exists and is the reference.
_KERNELS = ("fused", "foreach", "plain")
_KERNEL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "plain": {"foreach": False},
}


def build_optimizer(
    kind: Any, params: list[torch.nn.Parameter], settings: dict[str, Any]
) -> torch.optim.Optimizer:
    """``kind(params, lr=0.0, **settings)`` on the fastest kernel that computes correctly here.

    Args:
        kind: ``torch.optim.SGD`` or ``torch.optim.Adam``.
        params: the parameters, all on one device and of one dtype.
        settings: the optimizer's hyperparameters besides the learning rate.
    """
    sample = params[0]
    kernel = optimizer_kernel(kind, tuple(sorted(settings.items())), sample.device, sample.dtype)
    return kind(params, lr=0.0, **settings, **_KERNEL_ARGUMENTS[kernel])


@functools.cache
def optimizer_kernel(
    kind: Any,
    settings: tuple[tuple[str, Any], ...],
    device: torch.device,
    dtype: torch.dtype,
) -> str:
    """The first of fused, foreach, plain whose updates match the plain loop's on a probe."""
    reference = _probe_updates(kind, dict(settings), device, dtype, "plain")
    assert reference is not None, "torch's plain optimizer loop failed on its own probe"
    for kernel in _KERNELS[:-1]:
        candidate = _probe_updates(kind, dict(settings), device, dtype, kernel)
        if candidate is not None and _agree(candidate, reference, dtype):
            return kernel
    return "plain"


def _probe_tensors(device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """A matrix and a vector large enough for every vectorised code path (SIMD, CUDA blocks)."""
    generator = torch.Generator().manual_seed(0x0B7)
    shapes = ((48, 40), (40,))
    return [
        (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5).to(device, dtype)
        for shape in shapes
    ]


def _probe_updates(
    kind: Any,
    settings: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    kernel: str,
) -> list[torch.Tensor] | None:
    """The parameters after two updates on ``kernel``, or None when torch refuses it.

    The weights are small (±0.05) and the steps large (lr 0.5 on gradients of ±0.5), so an
    update that is lost or misapplied changes the result far beyond rounding.
    """
    try:
        params = [torch.nn.Parameter(t * 0.1) for t in _probe_tensors(device, dtype)]
        grads = _probe_tensors(device, dtype)
        optimizer = kind(params, lr=0.5, **settings, **_KERNEL_ARGUMENTS[kernel])
        for update in range(2):
            for p, g in zip(params, grads):
                p.grad = g * (update + 1)
            optimizer.step()
            if update == 0:  # the second update runs on state restored as a resume restores it
                optimizer.load_state_dict(optimizer.state_dict())
        return [p.detach().to(torch.float64) for p in params]
    except UNSUPPORTED:
        return None


def _agree(
    candidate: list[torch.Tensor], reference: list[torch.Tensor], dtype: torch.dtype
) -> bool:
    """Equal to within 4 units in the last place of ``dtype`` at the tensor's largest value.

    Kernels legitimately round apart (a fused kernel computes bfloat16 updates in float32);
    a lost or misapplied update is off by the size of the update itself.
    """
    eps = torch.finfo(dtype).eps
    return all(
        bool(torch.allclose(c.cpu(), r.cpu(), rtol=0.0, atol=4 * eps * float(r.abs().max())))
        for c, r in zip(candidate, reference)
    )


# -- the table ------------------------------------------------------------------------------


class TorchOptimizer(Protocol):
    """What the backend asks of one optimizer's implementation."""

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
    computes them correctly here (:func:`build_optimizer`), its state under canonical names.

    torch uses fused or multi-tensor kernels by default only when every parameter is on CUDA;
    on the CPU it loops over the parameters in Python, one op per tensor. For the 32-64-10 MLP
    of the W2 benchmark SGD's step costs 27 µs that way and 8 µs fused, of a ~150 µs step
    (benchmarks/README.md).

    Args:
        spec: the optimizer description.
        params: the parameters by canonical name.
        kind: the ``torch.optim`` class.
        settings: its hyperparameters besides the learning rate.
        names: canonical slot -> the name torch keeps it under.
        counts_steps: whether torch keeps a ``step`` per parameter (it must be restored).
    """

    def __init__(
        self,
        spec: optim.AbstractOptimizer,
        params: Mapping[str, nn.Parameter],
        kind: Any,
        settings: dict[str, Any],
        names: Mapping[str, str],
        *,
        counts_steps: bool,
    ) -> None:
        self.params = dict(params)
        self.names = {slot: names[slot] for slot in spec.state_slots}
        self.optimizer = build_optimizer(kind, list(self.params.values()), settings)
        self._counts_steps = counts_steps

    def step(self, lr: float, step: int) -> None:
        """One update of the torch optimizer at ``lr``."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
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
        for index, name in enumerate(self.params):
            entry = {
                torch_name: torch.from_numpy(np.array(slots[f"{name}.{slot}"]))
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
        self._slots = {
            slot: [torch.zeros_like(p, requires_grad=False) for p in self.params.values()]
            for slot in spec.state_slots
        }

    def step(self, lr: float, step: int) -> None:
        """Run the rule on the parameters that have gradients."""
        params = list(self.params.values())
        live = [i for i, p in enumerate(params) if p.grad is not None]
        slots = {slot: [tensors[i] for i in live] for slot, tensors in self._slots.items()}
        with torch.no_grad():
            self.rule(
                self.spec,
                [params[i] for i in live],
                [params[i].grad for i in live],
                slots,
                lr,
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
            slot: [
                torch.from_numpy(np.array(slots[f"{name}.{slot}"])).to(p.device, p.dtype)
                for name, p in self.params.items()
            ]
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


def _lion(
    spec: optim.Lion,
    p: _Tensors,
    g: _Tensors,
    slots: dict[str, _Tensors],
    lr: float,
    step: int,
) -> None:
    # torch has no Lion: the sign of the beta1 interpolation, the decoupled decay in the same
    # expression, then the momentum's own beta2 update.
    m = slots["exp_avg"]
    direction = torch._foreach_mul(m, spec.beta1)
    torch._foreach_add_(direction, torch._foreach_mul(g, 1.0 - spec.beta1))
    torch._foreach_sign_(direction)
    if spec.weight_decay:
        torch._foreach_add_(direction, p, alpha=spec.weight_decay)
    torch._foreach_add_(p, direction, alpha=-lr)
    torch._foreach_lerp_(m, g, 1.0 - spec.beta2)


_Factory = Callable[[Any, Mapping[str, nn.Parameter]], TorchOptimizer]

#: Optimizer type -> its implementation on torch. A type missing here is refused.
OPTIMIZERS: dict[type[optim.AbstractOptimizer], _Factory] = {
    optim.SGD: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.SGD,
        {"momentum": spec.momentum, "nesterov": spec.nesterov, "weight_decay": spec.weight_decay},
        {"momentum": "momentum_buffer"},
        counts_steps=False,
    ),
    optim.Adam: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.Adam,
        {"betas": (spec.beta1, spec.beta2), "eps": spec.eps, "weight_decay": spec.weight_decay},
        {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"},
        counts_steps=True,
    ),
    optim.AdamW: lambda spec, params: ForeachOptimizer(spec, params, _adamw),
    optim.RMSprop: lambda spec, params: NativeOptimizer(
        spec,
        params,
        torch.optim.RMSprop,
        {
            "alpha": spec.alpha,
            "eps": spec.eps,
            "centered": spec.centered,
            "momentum": spec.momentum,
            "weight_decay": spec.weight_decay,
        },
        {"square_avg": "square_avg", "momentum": "momentum_buffer", "grad_avg": "grad_avg"},
        counts_steps=True,
    ),
    optim.Lion: lambda spec, params: ForeachOptimizer(spec, params, _lion),
}


def optimizer_for(
    spec: optim.AbstractOptimizer, params: Mapping[str, nn.Parameter]
) -> TorchOptimizer:
    """The implementation of ``spec`` from :data:`OPTIMIZERS`, over ``params``.

    Raises:
        ConfigError: torch's table has no entry for the optimizer's type.
    """
    return optim.implementation(OPTIMIZERS, spec, "torch")(spec, params)
