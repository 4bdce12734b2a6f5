"""Running an op case on a backend's ops module: its outputs and input gradients as float64
numpy arrays, for comparison with the reference's (the kit's ``ops`` family and the tests)."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain.conformance._op_cases import OpCase, make_inputs, rounded

__all__ = ["cotangents_for", "relative_error", "run_case"]


def run_case(
    module: Any, case: OpCase, dtype: str, rounded_to: str | None = None
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``case`` on the backend whose ops module is ``module``, its floating inputs in
    ``dtype``: the outputs and the input gradients for the cotangents of
    :func:`cotangents_for`, as float64 numpy arrays.

    ``rounded_to`` (default ``dtype``) is the dtype whose values the inputs and cotangents
    hold: the reference runs in float64 on the values a backend in ``rounded_to`` was given,
    so what is compared is the op, not the rounding of its inputs.

    The backend's module provides, beside the contract, ``to_numpy(x)`` and
    ``vjp(fn, arrays, wrt) -> (outputs, pullback)``: ``outputs`` the list of ``fn``'s output
    arrays (one, or each of a tuple or list), ``pullback(cotangents)`` the gradients of the
    inputs at positions ``wrt`` (zeros where an output does not depend on one).
    """
    from unitrain import ops

    rounded_to = rounded_to or dtype
    arrays = make_inputs(case, rounded_to)
    native = [module.asarray(a, dtype if a.dtype.kind == "f" else None) for a in arrays]
    wrt = case.grad_positions()
    with ops.using(module):
        outputs, pullback = module.vjp(lambda *xs: case.call(ops, *xs), native, wrt)
        host = [np.asarray(module.to_numpy(o), dtype=np.float64) for o in outputs]
        cotangents = cotangents_for(case, [o.shape for o in host], rounded_to)
        grads = pullback([module.asarray(c, module.dtype(o)) for c, o in zip(cotangents, outputs)])
    return host, [np.asarray(module.to_numpy(g), dtype=np.float64) for g in grads]


def cotangents_for(
    case: OpCase, shapes: Sequence[tuple[int, ...]], rounded_to: str = "float64"
) -> list[np.ndarray]:
    """The seeded cotangents that weigh each output of ``case`` (shapes of its outputs),
    holding values of ``rounded_to``."""
    rng = np.random.default_rng(zlib.crc32(f"{case.name}/cotangent".encode()))
    return [rounded(rng.standard_normal(shape), rounded_to) for shape in shapes]


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """``||got - want|| / ||want||`` (the absolute norm when ``want`` is all zeros); inf when
    the shapes differ."""
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.linalg.norm(want))
    difference = float(np.linalg.norm(got - want))
    return difference / scale if scale > 0 else difference
