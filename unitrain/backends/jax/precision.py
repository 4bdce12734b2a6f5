"""The JAX backend's precision policy: matmul precision names, compute casts, the loss scaler.

- ``matmul_precision`` is traced into every compiled function with
  ``jax.default_matmul_precision`` (see :func:`.compiled.build_functions`), under the
  names of the algorithms it stands for: "highest" float32, "high" TF32, "medium" one
  bfloat16 pass. On a CPU all three compute in float32.
- Mixed precision casts the float32 parameters and inputs to the compute dtype inside the
  loss, so the gradients come back to float32 through the casts' own derivatives (the
  master weights and optimizer state never leave float32), and casts the outputs back to
  float32 before the loss.
- ``"16-mixed"`` keeps the scaler's state in the update counters, as ``log2(scale)`` (scales
  are powers of two, so this is exact) and the count of finite updates, and advances it with
  :func:`unitrain.backends.precision.next_loss_scale` on ``jnp.where``: on the device, no host sync.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from unitrain.backends.precision import LossScaler, next_loss_scale

__all__ = ["MATMUL_ALGORITHMS", "advance_scaler", "cast_floats", "initial_exponent", "scale_of"]

MATMUL_ALGORITHMS = {"highest": "float32", "high": "tensorfloat32", "medium": "bfloat16"}


def cast_floats(tree: Any, dtype: Any) -> Any:
    """Every floating leaf of ``tree`` cast to ``dtype`` (integer leaves, labels, unchanged)."""
    return jax.tree.map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree
    )


def initial_exponent(rule: LossScaler) -> int:
    """``log2`` of the rule's initial scale (a power of two)."""
    return int(np.frexp(rule.initial_scale)[1]) - 1


def scale_of(exponent: jax.Array) -> jax.Array:
    """The float32 scale ``2**exponent``, exactly."""
    return jnp.ldexp(jnp.float32(1.0), exponent)


def advance_scaler(
    rule: LossScaler, exponent: jax.Array, good_steps: jax.Array, finite: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The ``(exponent, good_steps)`` after an update whose gradients were ``finite`` or not."""
    scale, good = next_loss_scale(rule, scale_of(exponent), good_steps, finite, jnp.where)
    return (jnp.frexp(scale)[1] - 1).astype(jnp.int32), good.astype(jnp.int32)
