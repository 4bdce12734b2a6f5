"""What a failed comparison says besides its numbers, so that it points at the bug.

A relative error alone ("0.00169 exceeds 1e-6") leaves the author of a backend to bisect. The
kit adds what it can tell from the arrays it compared:

- which tensor is furthest off, with its layer (and the layer's type) or its optimizer slot:
  ``'model.1.running_var' (state 'running_var' of layer '1', a BatchNorm)``;
- where in an array: the first position of a sequence that is off (the first epoch, the first
  update), the element furthest off of a tensor, the first tensor and element holding a NaN or
  an infinity. A lazy framework raises nothing where a value goes wrong, so the first place
  the kit sees it is the best pointer it has;
- that an error in a float64 row has the size float32 arithmetic leaves (see
  :func:`float32_sized`): an op, a kernel or a constant without a float64 path;
- for two runs that should be bit-identical (a resumed run and an uninterrupted one), the
  first update after which they differ and whether they agreed when the run resumed
  (:func:`first_divergence`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from unitrain.conformance._tolerances import TOLERANCES

__all__ = [
    "FLOAT32_HINT",
    "array_detail",
    "describe_key",
    "first_divergence",
    "float32_sized",
    "mapping_detail",
]

#: Relative errors of this size in a float64 row are what float32 arithmetic leaves: float32
#: rounds at 6e-8, one float32 op inside a float64 computation shows as 1e-9 to 1e-7 after
#: the float64 parts average it, and a whole update or run done in float32 as up to 1e-5
#: (the float32 row's bars; a training run's 1e-4).
FLOAT32_BAND = (1e-9, 1e-5)

FLOAT32_HINT = (
    "looks like a float32 computation: an error of float32's size (1e-9 to 1e-5 relative) in a "
    "float64 row; is an op, a kernel or a constant of the backend computed in float32?"
)


def float32_sized(dtype: str, kind: str, relative_error: float) -> bool:
    """Whether ``relative_error`` of a ``kind`` comparison in row ``dtype`` is the size of
    float32 arithmetic in a float64 computation.

    Examples:
        >>> float32_sized("float64", "evaluate", 3.96e-9), float32_sized("float32", "step", 1e-7)
        (True, False)
        >>> float32_sized("float64", "training", 5e-5), float32_sized("float64", "step", 5e-5)
        (True, False)
    """
    if dtype != "float64" or not math.isfinite(relative_error):
        return False
    low, high = FLOAT32_BAND
    return low <= relative_error <= max(high, getattr(TOLERANCES["float32"], kind, high))


def _layers(models: Iterable[Any]) -> list[dict[str, Any]]:
    found = []
    for model in models:
        named = getattr(model, "named_layers", None)
        if named is not None:
            found.append(dict(named()))
    return found


def describe_key(key: str, models: Iterable[Any] = ()) -> str:
    """``key`` quoted, with what it is: a parameter or state of which layer (and the layer's
    type, when one of ``models`` has it), or which optimizer slot of which parameter.

    Examples:
        >>> from unitrain.models import BatchNorm, Conv2d, Sequential
        >>> describe_key("model.1.running_var", [Sequential((Conv2d(1, 3, 3), BatchNorm(3)))])
        "'model.1.running_var' (state 'running_var' of layer '1', a BatchNorm)"
        >>> describe_key("optimizer.layers.0.weight.momentum")
        "'optimizer.layers.0.weight.momentum' (optimizer slot 'momentum' of 'layers.0.weight')"
        >>> describe_key("optimizer.step")
        "'optimizer.step' (the optimizer's update counter)"
    """
    section, _, rest = key.partition(".")
    if section == "model" and rest:
        path, _, leaf = rest.rpartition(".")
        for layers in _layers(models):
            layer = layers.get(path)
            if layer is None:
                continue
            if leaf in layer.own_param_shapes():
                kind = "parameter"
            elif leaf in layer.own_state_shapes():
                kind = "state"
            else:
                continue
            where = f"of layer {path!r}" if path else "of the model"
            return f"{key!r} ({kind} {leaf!r} {where}, a {type(layer).__name__})"
        return f"{key!r} ({leaf!r} of layer {path!r})" if path else repr(key)
    if section == "optimizer" and rest:
        if rest == "step":
            return f"{key!r} (the optimizer's update counter)"
        param, _, slot = rest.rpartition(".")
        if param:
            return f"{key!r} (optimizer slot {slot!r} of {param!r})"
        return f"{key!r} (optimizer state {slot!r})"
    return repr(key)


def _index(position: tuple[int, ...]) -> str:
    return f"[{', '.join(str(i) for i in position)}]"


def _nonfinite(actual: np.ndarray) -> str | None:
    bad = ~np.isfinite(actual)
    if not bad.any():
        return None
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{int(bad.sum())} non-finite value(s), the first {actual[first]} at {_index(first)}"


def array_detail(actual: Any, expected: Any, tolerance: float) -> str:
    """Where two arrays of the same shape differ: the first non-finite value; in a sequence
    (1-d), the first position off by more than ``tolerance`` relative; else the element
    with the largest difference. Empty for scalars and arrays of different shapes."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if a.shape != e.shape or a.size <= 1:
        return ""
    nonfinite = _nonfinite(a)
    if nonfinite is not None:
        return nonfinite
    difference = np.abs(a - e)
    if a.ndim == 1:
        scale = np.maximum(np.abs(e), np.finfo(np.float64).tiny)
        off = np.flatnonzero(difference / scale > tolerance)
        if off.size:
            i = int(off[0])
            return f"first off at [{i}] of {a.size} ({a[i]:.9g}, expected {e[i]:.9g})"
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(difference)), a.shape))
    return f"largest difference at {_index(worst)} ({a[worst]:.9g}, expected {e[worst]:.9g})"


def _relative(actual: Any, expected: Any) -> float:
    a, e = np.asarray(actual, np.float64).ravel(), np.asarray(expected, np.float64).ravel()
    if not np.all(np.isfinite(a)):
        return math.inf
    norm, error = float(np.linalg.norm(e)), float(np.linalg.norm(a - e))
    if norm == 0.0:
        return 0.0 if error == 0.0 else math.inf
    return error / norm


def mapping_detail(
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    tolerance: float,
    models: Sequence[Any] = (),
) -> str:
    """Which tensor of a dict comparison to look at: the first (in ``expected``'s order) that
    holds a non-finite value, else the one furthest off, with where in it and how many
    tensors exceed ``tolerance`` on their own."""
    compared = [
        key
        for key in expected
        if key in actual and np.shape(actual[key]) == np.shape(expected[key])
    ]
    if not compared:
        return ""
    for key in compared:
        nonfinite = _nonfinite(np.asarray(actual[key], np.float64))
        if nonfinite is not None:
            return f"first non-finite: {describe_key(key, models)} holds {nonfinite}"
    errors = {key: _relative(actual[key], expected[key]) for key in compared}
    worst = max(compared, key=lambda key: errors[key])
    over = sum(error > tolerance for error in errors.values())
    where = array_detail(actual[worst], expected[worst], tolerance)
    text = f"furthest off: {describe_key(worst, models)}, relative error {errors[worst]:.3g}"
    text += f", {where}" if where else ""
    if len(compared) > 1:
        text += f"; {over} of {len(compared)} tensors exceed the tolerance on their own"
    return text


def first_differing(
    actual: Mapping[str, Any], expected: Mapping[str, Any]
) -> tuple[str | None, int]:
    """The first key (in ``expected``'s order) whose arrays are not bit-identical, and how
    many keys differ (a key missing on one side differs)."""
    different = [
        key
        for key in expected
        if key not in actual
        or np.shape(actual[key]) != np.shape(expected[key])
        or np.asarray(actual[key]).tobytes() != np.asarray(expected[key]).tobytes()
    ]
    different += [key for key in actual if key not in expected]
    return (different[0] if different else None), len(different)


def first_divergence(
    ours: Mapping[int, Mapping[str, Any]],
    theirs: Mapping[int, Mapping[str, Any]],
    resumed_at: int,
    models: Sequence[Any] = (),
) -> str:
    """Where a resumed run (``ours``: update count -> state dict after it) left the
    uninterrupted one (``theirs``), for the message of a failed bit-exact comparison.

    Says whether the state right after resuming at update ``resumed_at`` already differed
    (the load did not restore it) or the runs agreed then and first differed after a later
    update (the update depends on something the state dict does not hold). Empty when the
    snapshots cannot tell.
    """
    start_ours, start_theirs = ours.get(resumed_at), theirs.get(resumed_at)
    if start_ours is not None and start_theirs is not None:
        key, count = first_differing(start_ours, start_theirs)
        if key is not None:
            return (
                f"the state right after resuming at update {resumed_at} already differs from "
                f"the uninterrupted run's there ({describe_key(key, models)}, {count} tensor(s)):"
                " load_state_dict or the checkpoint does not restore it exactly"
            )
    for step in sorted(s for s in ours if s > resumed_at):
        if step not in theirs:
            continue
        key, count = first_differing(ours[step], theirs[step])
        if key is None:
            continue
        first = " (the first update after resuming)" if step == resumed_at + 1 else ""
        agreed = f"the runs agreed right after resuming at update {resumed_at} and "
        return (
            f"{agreed if start_ours is not None else ''}first differ after update {step}"
            f"{first}, in {describe_key(key, models)} and {count - 1} more: the update depends "
            "on something the state dict does not hold and a resume does not restore (a "
            "micro-batch or step counter, a random stream, a cached value)"
        )
    return ""
