"""Contract functions composed from other contract functions, for a backend without a fused
kernel of its own: ``layer_norm = layer_norm_of(this_module)`` in its ops module.

Public for the adapters, like :func:`unitrain.ops.loops.loop_scan_of`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unitrain.ops._types import Array

__all__ = ["layer_norm_of"]


def layer_norm_of(module: Any) -> Callable[..., Array]:
    """The contract's ``layer_norm`` composed from ``module``'s own ops (``moments``, ``rsqrt``,
    ``cast``), for a backend without a fused kernel; the numpy reference differentiates it
    through its ops' derivatives."""

    def layer_norm(
        x: Array, weight: Array | None = None, bias: Array | None = None, eps: float = 1e-5
    ) -> Array:
        low = module.dtype(x)
        work = "float32" if low in ("bfloat16", "float16") else low
        x = module.cast(x, work) if work != low else x
        mean, var = module.moments(x, -1, keepdims=True)
        out = (x - mean) * module.rsqrt(var + eps)
        if weight is not None:
            out = out * module.cast(weight, work)
        if bias is not None:
            out = out + module.cast(bias, work)
        return module.cast(out, low) if work != low else out

    return layer_norm
