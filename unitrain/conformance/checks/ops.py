"""ops: every function of the op contract, and its gradient, against the float64 reference.

One check per row of :data:`~unitrain.conformance._op_cases.OP_CASES`: the backend's ops module (its
``ops`` attribute) runs the case on inputs in the check's dtype, and its outputs and vector-Jacobian
products are compared within ``step`` with the numpy reference's, computed in float64 on the same
(rounded) inputs. A layer written in ops is only as portable as the ops under it, so this family is
what a new backend passes first; a backend without an ops module is skipped.
"""

from __future__ import annotations

from types import ModuleType

from unitrain.backends.registry import get_backend
from unitrain.conformance._context import Context
from unitrain.conformance._op_cases import OP_CASES, OpCase, run_case
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
