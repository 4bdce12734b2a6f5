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

:func:`on_fastest_kernel` is not an optimizer builder of its own (that is
:func:`.optimizers.optimizer_for`, the name in every adapter): it only picks the kernel of the
torch class a native form uses. It was ``build_optimizer``, which still works, with a
deprecation warning.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from unitrain import optim
from unitrain.backends.common.renamed import renamed_getattr

__all__ = [
    "DeviceGuard",
    "device_guard",
    "finite_check",
    "on_fastest_kernel",
    "optimizer_kernel",
    "skips_on_device",
]

#: The names this module used to give its functions.
RENAMED = {"build_optimizer": "on_fastest_kernel"}

#: Kernels in order of preference; "plain" always exists and is the reference.
_KERNELS = ("fused", "foreach", "plain")
_KERNEL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "fused": {"fused": True},
    "foreach": {"foreach": True},
    "plain": {"foreach": False},
}
# torch raises any of these for a kernel it lacks, depending on version and device.
_UNSUPPORTED = (RuntimeError, NotImplementedError, TypeError, ValueError)


def on_fastest_kernel(
    kind: Any, params: list[torch.nn.Parameter], settings: dict[str, Any]
) -> torch.optim.Optimizer:
    """``kind(params, lr=0.0, **settings)`` on the fastest kernel that computes correctly here.

    Args:
        kind: ``torch.optim.SGD`` or ``torch.optim.Adam``.
        params: the parameters, all on one device and of one dtype.
        settings: the optimizer's hyperparameters besides the learning rate.
    """
    sample = params[0]
    if hasattr(sample, "device_mesh"):  # FSDP2's DTensors: torch shards no fused kernel
        return kind(params, lr=0.0, **settings, **_KERNEL_ARGUMENTS["foreach"])
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


class DeviceGuard:
    """The non-finite guard of a fused optimizer, decided on the device: no host sync per step.

    Reading a non-finite flag on the host every step makes the host wait for the GPU, so the
    next step's kernels are queued only after the previous ones ran: the GPU idles for the
    host's share of every step (a 4096-wide MLP on an H200 spent ~25 % of its step there).
    torch's fused SGD and Adam kernels take the flag as a tensor, ``found_inf``, and leave
    the parameters and the optimizer state unchanged where it is set (the mechanism
    ``GradScaler`` uses), so the skip is decided where the gradients are. The skips are
    counted on the device too and read only when asked for (:meth:`take_skipped`: at logging
    points and checkpoints).

    Args:
        optimizer: a torch optimizer on the fused kernel (see :func:`skips_on_device`).
        clip_norm: the global-norm clipping bound, or None.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> None:
        sample = optimizer.param_groups[0]["params"][0]
        self.clip_norm = clip_norm
        self.found = torch.zeros((), device=sample.device)  # the kernels read it as found_inf
        self._skipped = torch.zeros((), device=sample.device)
        self._one = torch.ones((), device=sample.device)
        self._amp = _amp_check_works(sample.device, sample.dtype)
        optimizer.found_inf = self.found  # type: ignore[attr-defined]  # read by step()
        for group in optimizer.param_groups:
            if group.get("momentum"):
                # A skipped first step must not leave torch's lazily allocated (uninitialised)
                # buffers behind: a zero buffer gives "buffer = gradient" on the first update.
                for p in group["params"]:
                    optimizer.state[p].setdefault("momentum_buffer", torch.zeros_like(p))

    def check(self, grads: list[torch.Tensor]) -> None:
        """Set the flag for ``grads`` (clipping them in place first, if configured)."""
        if self.clip_norm is not None:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            torch.logical_not(torch.isfinite(norm), out=self.found)
            scale = torch.clamp(self.clip_norm / (norm + optim.CLIP_EPSILON), max=1.0)
            torch._foreach_mul_(grads, scale)  # non-finite only when the step is skipped
        elif self._amp:
            self.found.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found, self._one)
        else:
            largest = torch.stack(torch._foreach_norm(grads, ord=float("inf")))
            torch.logical_not(torch.isfinite(largest).all(), out=self.found)
        self._skipped.add_(self.found)

    def take_skipped(self) -> int:
        """Updates skipped since the last call (one read of a device counter)."""
        skipped = int(self._skipped.item())
        self._skipped.zero_()
        return skipped


def device_guard(
    optimizer: torch.optim.Optimizer | None, clip_norm: float | None
) -> DeviceGuard | None:
    """A :class:`DeviceGuard` for ``optimizer`` if it runs a fused kernel that skips on a
    device flag here (see :func:`skips_on_device`), else None: the host reads the flag (also
    when torch does not run the update: ``optimizer`` None)."""
    if optimizer is None or not optimizer.defaults.get("fused"):
        return None
    sample = optimizer.param_groups[0]["params"][0]
    settings = tuple(
        sorted((k, v) for k, v in optimizer.defaults.items() if k not in ("lr", "fused"))
    )
    kind = type(optimizer)  # hashable, like every class; mypy does not see it for this one
    if not skips_on_device(kind, settings, sample.device, sample.dtype):  # type: ignore[arg-type]
        return None
    return DeviceGuard(optimizer, clip_norm)


@functools.cache
def skips_on_device(
    kind: Any,
    settings: tuple[tuple[str, Any], ...],
    device: torch.device,
    dtype: torch.dtype,
) -> bool:
    """Whether the fused ``kind`` leaves parameters and state untouched when ``found_inf`` is set
    and updates them when it is clear, on this device and dtype (a probe, as for the kernels)."""
    try:
        params = [torch.nn.Parameter(t * 0.1) for t in _probe_tensors(device, dtype)]
        optimizer = kind(params, lr=0.5, **dict(settings), fused=True)
        guard = DeviceGuard(optimizer, clip_norm=None)
        before: list[torch.Tensor] = []
        for update, poisoned in enumerate((False, True, False)):
            for p, g in zip(params, _probe_tensors(device, dtype)):
                p.grad = g * (update + 1)
            if poisoned:
                params[1].grad[3] = float("nan")  # type: ignore[index]
                before = _snapshot(params, optimizer)
            guard.check([p.grad for p in params if p.grad is not None])
            optimizer.step()
            after = _snapshot(params, optimizer)
            if poisoned and not all(torch.equal(a, b) for a, b in zip(before, after)):
                return False
        return not any(torch.equal(a, b) for a, b in zip(before, after)) and (
            guard.take_skipped() == 1
        )
    except _UNSUPPORTED:
        return False


def _snapshot(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> list[Any]:
    state = [v for p in params for v in optimizer.state[p].values() if torch.is_tensor(v)]
    return [t.detach().clone() for t in [*params, *state]]


__getattr__ = renamed_getattr(__name__, RENAMED, globals())
