"""ops: every function of the op contract, and its gradient, against the float64 reference.

One check per row of :data:`~unitrain.conformance._op_cases.OP_CASES`: the backend's ops module (its
``ops`` attribute) runs the case on inputs in the check's dtype, and its outputs and vector-Jacobian
products are compared within ``step`` with the numpy reference's, computed in float64 on the same
(rounded) inputs. A layer written in ops is only as portable as the ops under it, so this family is
what a new backend passes first; a backend without an ops module is skipped.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

from unitrain.backends.registry import get_backend
from unitrain.conformance._context import Context
from unitrain.conformance._op_cases import OP_CASES, OpCase
from unitrain.conformance._op_run import run_case
from unitrain.conformance._registry import add_check


def _ops_of(ctx: Context) -> ModuleType:
    module = getattr(ctx.backend.factory, "ops", None)
    if not isinstance(module, ModuleType):
        ctx.skip("the backend offers no ops module (an `ops` attribute: unitrain.ops's contract)")
    return module  # type: ignore[return-value]


def _reference() -> ModuleType:
    """The numpy reference's ops, found like any backend's (the kit imports no adapter)."""
    module: ModuleType = getattr(get_backend("numpy"), "ops")  # noqa: B009 - not on `type`
    return module


def check_op(ctx: Context, case: OpCase) -> None:
    """``case`` on the backend against the float64 reference: outputs, then gradients."""
    module = _ops_of(ctx)
    if ctx.device != "cpu":
        ctx.skip("ops modules make new arrays on their default device; checked on the CPU")
    outputs, grads = run_case(module, case, ctx.dtype)
    want_outputs, want_grads = run_case(_reference(), case, "float64", ctx.dtype)
    ctx.require_equal("number of outputs", len(outputs), len(want_outputs))
    for i, (got, want) in enumerate(zip(outputs, want_outputs)):
        ctx.require_equal(f"output {i} shape", got.shape, want.shape)
        ctx.compare(f"output {i}", got, want, "step")
    for position, got, want in zip(case.grad_positions(), grads, want_grads):
        ctx.require_equal(f"gradient of input {position}: shape", got.shape, want.shape)
        ctx.compare(f"gradient of input {position}", got, want, "step")


def _draws(module: ModuleType, dtype: str) -> dict[str, np.ndarray]:
    """What the portable generator draws on ``module`` from one key and keys derived from it."""
    from unitrain import ops

    with ops.using(module):
        key = ops.random.key(2**40 + 7)
        step = ops.random.fold_in(key, module.asarray(np.array(12345)))
        first, second = ops.random.split(step, 2)
        drawn = {
            "key": key,
            "fold_in of an array": step,
            "fold_in of an int": ops.random.fold_in(key, 12345),
            "bits": ops.random.bits(first, (3, 5)),
            f"uniform ({dtype})": ops.random.uniform(second, (7,), dtype, -1.0, 3.0),
            "bernoulli": ops.random.bernoulli(second, 0.3, (4, 4)),
            f"normal ({dtype})": ops.random.normal(first, (9,), dtype),
        }
        return {name: np.asarray(module.to_numpy(value)) for name, value in drawn.items()}


def check_random(ctx: Context) -> None:
    """unitrain.ops.random draws the reference's numbers: bits exactly, normals to rounding."""
    module = _ops_of(ctx)
    if ctx.device != "cpu":
        ctx.skip("ops modules make new arrays on their default device; checked on the CPU")
    got, want = _draws(module, ctx.dtype), _draws(_reference(), ctx.dtype)
    for name, expected in want.items():
        actual = got[name]
        ctx.require_equal(f"{name}: shape", actual.shape, expected.shape)
        if name.startswith("normal"):  # log, sqrt and cos round differently per framework
            ctx.compare(name, actual.astype(np.float64), expected.astype(np.float64), "step")
        else:
            ctx.require(
                bool(np.array_equal(actual.astype(expected.dtype), expected)),
                f"{name}: the portable generator drew {actual.ravel()[:6]}, the reference "
                f"{expected.ravel()[:6]} (int32 add/multiply must wrap and bitwise_right_shift "
                "be arithmetic; see the ops::bitwise_* checks)",
            )


def _register() -> None:
    for case in OP_CASES:

        def run(ctx: Context, case: OpCase = case) -> None:
            check_op(ctx, case)

        run.__qualname__ = f"ops_{case.name}"
        add_check(
            "ops",
            case.name,
            run,
            description=f"ops.{case.op} ({case.name}): outputs and gradients",
            guards=f"ops.{case.op} with another convention than the contract, or a wrong gradient",
        )


_register()
add_check(
    "ops",
    "random",
    check_random,
    description="unitrain.ops.random draws the reference's bits from the same keys",
    guards="a generator whose integer ops differ (no wrap-around, a logical right shift), so "
    "dropout and noise would differ by backend",
)
