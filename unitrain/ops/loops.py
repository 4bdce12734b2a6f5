"""``scan``: a loop over the leading axis of an array, carrying state, as one op.

Public for the adapters: an eager backend's ``scan`` is :func:`loop_scan` over its own ops.

Recurrent layers (LSTM, GRU) are written once on it. A backend that compiles whole programs
implements it natively (JAX's ``lax.scan`` traces the step once instead of once per position);
the others run :func:`loop_scan`, the same loop in plain Python over the contract's own ops,
whose gradients their autodiff takes step by step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unitrain.ops._dispatch import current
from unitrain.ops._types import Array

__all__ = ["loop_scan", "loop_scan_of", "scan"]

#: ``step(carry, x_t) -> (carry, y_t)``; a carry is an array or a tuple of arrays.
Step = Callable[[Any, Array], tuple[Any, Array]]


def scan(step: Step, init: Any, xs: Array) -> tuple[Any, Array]:
    """Run ``carry, y_t = step(carry, xs[t])`` for ``t = 0, 1, ...`` from ``carry = init``;
    return the last carry and the ``y_t`` stacked along a new leading axis.

    The carry (an array or a tuple of arrays) keeps its shapes and dtypes from step to step,
    and ``xs`` has at least one position. Gradients flow to ``init``, ``xs`` and whatever
    ``step`` closes over (a recurrent layer's weights).
    """
    return current().scan(step, init, xs)


def loop_scan(step: Step, init: Any, xs: Array, module: Any) -> tuple[Any, Array]:
    """:func:`scan` as a Python loop over the ops of ``module`` (for eager backends)."""
    length = module.shape(xs)[0]
    if length < 1:
        raise ValueError(f"scan needs at least one position along axis 0, got {module.shape(xs)}")
    carry, outputs = init, []
    for t in range(length):
        carry, y = step(carry, xs[t])
        outputs.append(y)
    return carry, module.stack(outputs, 0)


def loop_scan_of(module: Any) -> Callable[[Step, Any, Array], tuple[Any, Array]]:
    """The contract's ``scan`` for ``module``: :func:`loop_scan` over its ops. An eager backend
    runs it step by step; under ``tf.function`` the loop is unrolled while tracing."""

    def scan(step: Step, init: Any, xs: Array) -> tuple[Any, Array]:
        return loop_scan(step, init, xs, module)

    return scan
