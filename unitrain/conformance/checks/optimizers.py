"""optimizers: 100 updates with a changing learning rate match the float64 reference.

Halfway through, the run continues on a fresh backend loaded with the first one's state
dict, and the final state dict must hold exactly the reference's keys: optimizer state that
is not saved, not restored, or saved under another name than its declared slots fails.
(The slots' values are not compared: near tiny gradients they carry the targets' float32
rounding, while the parameters they move are what the trajectory bar was measured on.)

Gradients are injected through the linear probe (see :mod:`unitrain.conformance._probes`),
so the backend and the reference see the same gradient at every update, and the comparison
isolates the optimizer's arithmetic: parameters and optimizer state, normwise, against the
``trajectory`` tolerance (1e-6 in float32). hypothesis draws hyperparameters, gradient
scales and seeds from bounded, realistic ranges; explicit examples cover the known traps
(a learning rate that changes every step, which separates ``w -= lr * b`` from Keras's
``b = mu * b - lr * g``; tiny gradients, where Adam's epsilon placement matters). The cases
are the rows of :data:`unitrain.conformance.optimizer_cases.OPTIMIZER_CASES`.

A parameter group whose pattern selects no parameter must be refused by name
(``group_matching_nothing_is_refused``): a typo in a recipe would otherwise train with the
base options and nothing would say so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import optim
from unitrain.conformance._context import Context
from unitrain.conformance._hypothesis import explore
from unitrain.conformance._probes import LINEAR_PROBE, model_state, optimizer_trajectory
from unitrain.conformance._registry import add_check, check
from unitrain.conformance.optimizer_cases import (
    EITHER,
    OPTIMIZER_CASES,
    LogRange,
    OptimizerCase,
)

__all__: list[str] = []

STEPS = 100


def _lrs(seed: int, low: float, high: float) -> list[float]:
    rng = np.random.default_rng([seed, 0x1A])
    return [float(v) for v in 10.0 ** rng.uniform(np.log10(low), np.log10(high), STEPS)]


def _run_example(ctx: Context, case: OptimizerCase) -> Any:
    def run(example: dict[str, Any]) -> None:
        got, want = optimizer_trajectory(
            ctx,
            case.build(example),
            seed=example["seed"],
            lrs=_lrs(example["seed"], example["lr_low"], example["lr_high"]),
            grad_scale=example["grad_scale"],
            handoff_at=STEPS // 2,
        )
        what = f"parameters after {STEPS} updates"
        ctx.compare(what, model_state(got), model_state(want), "trajectory")
        ctx.require_equal("optimizer.step", int(got["optimizer.step"]), STEPS)
        ctx.require_equal("state dict keys", sorted(got), sorted(want))

    return run


def _strategy(case: OptimizerCase) -> Any:
    """hypothesis's examples around ``case``: a seed, an LR range inside ``case.lr``, a
    gradient scale in ``case.grad``, and the hyperparameters of ``case.explore``."""
    explored = case.explore
    if explored is None:
        return None

    def make() -> Any:
        from hypothesis import strategies as st

        def floats(low: float, high: float, log: bool = False) -> Any:
            if log:
                return st.floats(np.log10(low), np.log10(high)).map(lambda e: float(10.0**e))
            return st.floats(low, high)

        (lr_low, lr_high), (grad_low, grad_high) = case.lr, case.grad
        fields = {
            "seed": st.integers(0, 2**16),
            "lr_low": floats(lr_low, lr_low * 10, log=True),
            "lr_high": floats(lr_high / 10, lr_high, log=True),
            "grad_scale": floats(grad_low, grad_high, log=True),
        }
        for name, value in explored.items():
            if isinstance(value, LogRange):
                fields[name] = floats(value.low, value.high, log=True)
            elif value == EITHER:
                fields[name] = st.booleans()
            elif isinstance(value, tuple):
                fields[name] = floats(*value)
            else:
                fields[name] = st.just(value)
        return st.fixed_dictionaries(fields)

    return make


def _register(name: str, case: OptimizerCase) -> None:
    def run(ctx: Context) -> None:
        explore(ctx, _run_example(ctx, case), strategy=_strategy(case), explicit=case.examples)

    add_check(
        "optimizers",
        name,
        run,
        description=f"{case.description}: {STEPS} updates vs float64",
        guards=case.guards,
    )


for _name, _case in OPTIMIZER_CASES.items():
    _register(_name, _case)


@check(
    "optimizers",
    "group_matching_nothing_is_refused",
    guards="a parameter group that selects nothing silently ignored (its options never used)",
)
def group_matching_nothing_is_refused(ctx: Context) -> None:
    """A parameter group whose name pattern or layer type selects nothing is refused, by name.

    The backend may refuse when it is built or at its first update; either way the error must
    name the entry (the probe has one Linear layer: no ``head``, no LayerNorm).
    """
    x = ctx.host(np.eye(8))
    for entry in ("head.*", "LayerNorm"):
        spec = optim.AdamW(groups=(optim.Group(entry, weight_decay=0.0),))
        try:
            backend = ctx.make(LINEAR_PROBE, loss="mse", optimizer=spec)
            ctx.update(backend, (x, ctx.host(np.zeros((8, 4)))), 1e-3)
        except Exception as error:
            ctx.require(
                repr(entry) in str(error),
                f"a group matching {entry!r} was refused, but the error does not name it: {error}",
            )
            continue
        ctx.require(False, f"a group matching {entry!r} (no parameter of the probe) was accepted")
