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
from typing import Any

import torch
from torch import nn

from unitrain import optim

__all__ = ["build_optimizer", "finite_check", "optimizer_for", "optimizer_kernel"]

#: Kernels in order of preference; "plain" always exists and is the reference.
_KERNELS = ("fused", "foreach", "plain")
_KERNEL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "plain": {"foreach": False},
}
# torch raises any of these for a kernel it lacks, depending on version and device.
_UNSUPPORTED = (RuntimeError, NotImplementedError, TypeError, ValueError)


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
    except _UNSUPPORTED:
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


def finite_check(device: torch.device, dtype: torch.dtype) -> Any:
    """``check(grads) -> bool``: whether every gradient is finite, for this device/dtype.

    GradScaler's fused kernel (``_amp_foreach_non_finite_check_and_unscale_``, one pass,
    multiplying by an exact 1.0) is about ten times cheaper than a norm on small models, but
    not every build has it for every dtype (CUDA has no bfloat16 one). Where it is missing or
    does not flag a probe infinity, the check is the largest magnitude per tensor
    (``_foreach_norm`` with ``ord=inf``), which propagates NaN and infinity and, unlike the
    L2 norm, never overflows on finite values.
    """
    return _amp_check(device) if _amp_check_works(device, dtype) else _max_abs_check


@functools.cache
def _amp_check_works(device: torch.device, dtype: torch.dtype) -> bool:
    check = _amp_check(device)
    try:
        finite = [torch.ones(64, device=device, dtype=dtype)]
        infinite = [torch.ones(64, device=device, dtype=dtype), finite[0].clone()]
        infinite[0][17] = float("inf")
        return bool(check(finite)) and not bool(check(infinite))
    except _UNSUPPORTED:
        return False


def _amp_check(device: torch.device) -> Any:
    found = torch.zeros(1, device=device)
    one = torch.ones(1, device=device)

    def check(grads: list[torch.Tensor]) -> bool:
        found.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
        return not bool(found)  # the one read of the flag: no comparison tensor per step

    return check


def _max_abs_check(grads: list[torch.Tensor]) -> bool:
    return bool(torch.isfinite(torch.stack(torch._foreach_norm(grads, ord=float("inf")))).all())


def optimizer_for(spec: optim.Optimizer, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """The torch optimizer of ``spec``, on the fastest kernel that is correct here.

    torch uses fused or multi-tensor kernels by default only when every parameter is on CUDA;
    on the CPU it loops over the parameters in Python, one op per tensor. For the 32-64-10 MLP
    of the W2 benchmark SGD's step costs 27 µs that way and 8 µs fused, of a ~150 µs step
    (benchmarks/README.md). The formulas are the same, but not every kernel exists, or is
    right, for every device and dtype: :func:`build_optimizer` probes them.
    """
    if isinstance(spec, optim.AdamW):
        # AdamW's update is computed by hand (see the module doc); a plain SGD object with lr 0
        # still serves zero_grad.
        return torch.optim.SGD(params, lr=0.0)
    if isinstance(spec, optim.Adam):
        kind: Any = torch.optim.Adam
        settings: dict[str, Any] = {"betas": (spec.beta1, spec.beta2), "eps": spec.eps}
    else:
        kind = torch.optim.SGD
        settings = {"momentum": spec.momentum, "nesterov": spec.nesterov}
    settings["weight_decay"] = spec.weight_decay
    return build_optimizer(kind, params, settings)
