"""The one table of tolerances, per parameter dtype, that every numeric check reads.

A check compares a backend with the float64 numpy reference in one of five ways, and each
way has its own bar per dtype. The float32 bars come from measurements recorded in the
project's anchors (``shared/anchors/optimizer-schedule-parity.md``): a correct float32
optimizer stays within 5-7e-7 normwise of the float64 reference over 100 updates, so 1e-6
passes it with margin while catching a 1e-6 drift; a float32 learning rate rounded on the
host is within 6e-8 of the schedule, so 5e-7 passes it while a schedule evaluated in
float32 inside a compiled graph (1.4-2.1e-6 off near its minimum) fails. Whole training runs
amplify rounding through the data, so their losses get 1e-4 (the cross-backend parity bar).
The bfloat16 and float16 rows scale these by the unit roundoff (2**-8 and 2**-11), as
``torch.testing`` does for single ops.

Discrete outcomes (stop epoch, best epoch, LR change steps, state keys, shapes, dtypes) are
never compared with a tolerance, and same-device round trips are compared bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = ["KINDS", "TOLERANCES", "Tolerance", "tolerance_for"]

#: The ways a number is compared; each is a field of :class:`Tolerance`.
KINDS = ("lr", "trajectory", "step", "training", "evaluate")


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Relative error bars for one parameter dtype.

    Attributes:
        lr: the learning rate a backend applied, relative to the schedule's float64 value.
        trajectory: normwise relative error of parameters after 100 optimizer updates with
            a changing learning rate, against the float64 reference.
        step: normwise relative error of a few updates computed two ways that should agree
            (fused vs three calls, k micro-batches vs one batch, clipping).
        training: relative error of losses and weights of a whole training run (many
            batches, through the data) against the reference.
        evaluate: relative error of ``evaluate`` metrics at identical weights.
    """

    lr: float
    trajectory: float
    step: float
    training: float
    evaluate: float

    def replace(self, overrides: Mapping[str, float]) -> Tolerance:
        """A copy with some fields replaced (a backend's declared overrides)."""
        unknown = sorted(set(overrides) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown tolerance kind(s) {unknown}; known: {list(KINDS)}")
        return dataclasses.replace(self, **{k: float(v) for k, v in overrides.items()})


#: The table. Rows not listed (a backend declaring ``"int8"``) have no numeric checks.
TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(lr=1e-13, trajectory=1e-12, step=1e-12, training=1e-9, evaluate=1e-12),
    "float32": Tolerance(lr=5e-7, trajectory=1e-6, step=1e-6, training=1e-4, evaluate=1e-5),
    "float16": Tolerance(lr=2e-3, trajectory=2e-2, step=1e-2, training=5e-2, evaluate=5e-3),
    "bfloat16": Tolerance(lr=1e-2, trajectory=1e-1, step=5e-2, training=1e-1, evaluate=3e-2),
}


def tolerance_for(
    dtype: str, overrides: Mapping[str, Mapping[str, float]] | None = None
) -> Tolerance:
    """The tolerance row of ``dtype`` with a backend's declared overrides applied.

    Args:
        dtype: a parameter dtype name, e.g. ``"float32"``.
        overrides: the backend's ``conformance_tolerances``: dtype -> {kind: value}.

    Returns:
        The row to use.

    Examples:
        >>> tolerance_for("float32").trajectory
        1e-06
        >>> tolerance_for("float32", {"float32": {"trajectory": 2e-6}}).trajectory
        2e-06
    """
    if dtype not in TOLERANCES:
        raise ValueError(f"no tolerance row for dtype {dtype!r}; known: {sorted(TOLERANCES)}")
    row = TOLERANCES[dtype]
    if overrides and dtype in overrides:
        row = row.replace(overrides[dtype])
    return row
