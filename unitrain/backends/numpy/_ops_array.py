"""The numpy reference's tracked array, how its ops record on the graph, and the operators' ops.

An op computes its forward on plain numpy values and, when an input is :class:`Tracked`, returns
a Tracked node holding the op's vector-Jacobian product, for :mod:`._tape` to sweep; with no
tracked input it returns the plain value. :func:`unary` and :func:`binary` do this for most ops
of the reference's other modules, :func:`record` for the rest.

The arithmetic (``add`` to ``power``, ``negative``), ``matmul`` and basic indexing live here,
apart from the other elementwise, linear algebra and indexing ops, because :class:`Tracked`'s
operators (``+ - * / ** @``, unary ``-``, ``[]``) call them: the class and these functions need
each other, so they share a module. ``einsum`` stays beside ``matmul``.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unitrain.backends.numpy import _tape
from unitrain.ops import Array, Axis


class Tracked(_tape.Node):
    """A numpy value being differentiated by ``ops.vjp``: ops and operators record on it."""

    __slots__ = ()
    # ndarray + Tracked (and every other operator) defers to Tracked's reflected method.
    __array_ufunc__ = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def ndim(self) -> int:
        return int(self.value.ndim)

    @property
    def dtype(self) -> np.dtype:
        return self.value.dtype

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"Tracked({self.value!r})"

    def __add__(self, other: Any) -> Any:
        return add(self, other)

    def __radd__(self, other: Any) -> Any:
        return add(other, self)

    def __sub__(self, other: Any) -> Any:
        return subtract(self, other)

    def __rsub__(self, other: Any) -> Any:
        return subtract(other, self)

    def __mul__(self, other: Any) -> Any:
        return multiply(self, other)

    def __rmul__(self, other: Any) -> Any:
        return multiply(other, self)

    def __truediv__(self, other: Any) -> Any:
        return divide(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return divide(other, self)

    def __pow__(self, other: Any) -> Any:
        return power(self, other)

    def __rpow__(self, other: Any) -> Any:
        return power(other, self)

    def __matmul__(self, other: Any) -> Any:
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return matmul(other, self)

    def __neg__(self) -> Any:
        return negative(self)

    def __getitem__(self, index: Any) -> Any:
        return getitem(self, index)


# -- recording ---------------------------------------------------------------------------------


def value_of(x: Any) -> Any:
    """``x``'s plain value: ``x`` itself unless it is tracked."""
    return x.value if isinstance(x, Tracked) else x


def record(value: Any, inputs: Sequence[Any], vjp: _tape.VJP) -> Any:
    """``value``, tracked with ``vjp`` (one gradient per input) when an input is tracked."""
    parents = tuple((i, a) for i, a in enumerate(inputs) if isinstance(a, Tracked))
    return Tracked(value, parents, vjp) if parents else value


def unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """``grad`` summed over the axes broadcasting added or stretched to reach ``shape``."""
    if np.shape(grad) == shape:
        return grad
    extra = np.ndim(grad) - len(shape)
    stretched = tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    return np.sum(grad, axis=tuple(range(extra)) + stretched).reshape(shape)


def unary(x: Any, forward: Callable[[Any], Any], derivative: Callable[..., Any]) -> Any:
    """``forward(x)``; the gradient is ``derivative(cotangent, x, output)``."""
    xv = value_of(x)
    out = forward(xv)
    if not isinstance(x, Tracked):
        return out
    return Tracked(out, ((0, x),), lambda g: (derivative(g, xv, out),))


def binary(x: Any, y: Any, forward: Callable, dx: Callable, dy: Callable) -> Any:
    """``forward(x, y)`` with broadcasting; ``dx``/``dy(cotangent, x, y, output)`` give the
    gradients before they are summed back to each operand's shape (only tracked ones run)."""
    xv, yv = value_of(x), value_of(y)
    out = forward(xv, yv)
    x_tracked, y_tracked = isinstance(x, Tracked), isinstance(y, Tracked)
    if not (x_tracked or y_tracked):
        return out

    def vjp(g: Any) -> tuple[Any, Any]:
        return (
            unbroadcast(dx(g, xv, yv, out), np.shape(xv)) if x_tracked else None,
            unbroadcast(dy(g, xv, yv, out), np.shape(yv)) if y_tracked else None,
        )

    return record(out, (x, y), vjp)


# -- dtypes and axes ---------------------------------------------------------------------------

_DTYPES = {
    name: np.dtype(name) for name in ("float16", "float32", "float64", "int32", "int64", "bool")
}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a contract's dtype string."""
    found = _DTYPES.get(name)
    if found is not None:
        return found
    if name == "bfloat16":  # numpy has none; ml_dtypes (JAX's and TensorFlow's) adds it
        try:
            import ml_dtypes
        except ImportError as error:
            raise ImportError(
                "the numpy reference needs ml_dtypes for bfloat16: pip install ml-dtypes"
            ) from error
        return np.dtype(ml_dtypes.bfloat16)
    raise ValueError(f"unknown dtype {name!r}; one of {[*_DTYPES, 'bfloat16']}")


def is_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` carries gradients: a float, bfloat16 included (numpy's kind "V")."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """``axis`` as a sorted tuple of non-negative axes (all of them for None)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for an array of {ndim} dimensions")
    return tuple(sorted(int(a) % ndim for a in axes)) if ndim else ()


# -- arithmetic --------------------------------------------------------------------------------


def add(x: Array, y: Array) -> Array:
    return binary(x, y, np.add, lambda g, *_: g, lambda g, *_: g)


def subtract(x: Array, y: Array) -> Array:
    return binary(x, y, np.subtract, lambda g, *_: g, lambda g, *_: -g)


def multiply(x: Array, y: Array) -> Array:
    return binary(x, y, np.multiply, lambda g, x, y, _: g * y, lambda g, x, y, _: g * x)


def divide(x: Array, y: Array) -> Array:
    return binary(x, y, np.divide, lambda g, x, y, _: g / y, lambda g, x, y, out: -g * out / y)


def _power_base(g: Any, x: Any, y: Any, _: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** (y - 1) for y < 1
        return g * y * np.power(x, y - 1)


def _power_exponent(g: Any, x: Any, y: Any, out: Any) -> Any:
    positive = np.greater(x, 0)
    return np.where(positive, g * out * np.log(np.where(positive, x, 1)), 0)


def power(x: Array, y: Array) -> Array:
    return binary(x, y, np.power, _power_base, _power_exponent)


def negative(x: Array) -> Array:
    return unary(x, np.negative, lambda g, *_: -g)


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    xv, yv = value_of(x), value_of(y)

    def vjp(g: Any) -> tuple[Any, Any]:
        # A vector operand is a matrix of one row (x) or column (y) whose axis the product drops.
        x2 = xv[None, :] if xv.ndim == 1 else xv
        y2 = yv[:, None] if yv.ndim == 1 else yv
        g2 = g[..., None] if yv.ndim == 1 else g
        g2 = np.expand_dims(g2, -2) if xv.ndim == 1 else g2
        dx = dy = None
        if isinstance(x, Tracked):
            dx = unbroadcast(g2 @ np.swapaxes(y2, -1, -2), x2.shape).reshape(xv.shape)
        if isinstance(y, Tracked):
            dy = unbroadcast(np.swapaxes(x2, -1, -2) @ g2, y2.shape).reshape(yv.shape)
        return dx, dy

    return record(np.matmul(xv, yv), (x, y), vjp)


def einsum(subscripts: str, *operands: Array) -> Array:
    inputs_part, arrow, output = subscripts.replace(" ", "").partition("->")
    inputs = inputs_part.split(",")
    if not arrow or "." in subscripts or len(inputs) != len(operands):
        raise ValueError(
            f"einsum takes explicit output subscripts without '...' and one term per operand, "
            f"got {subscripts!r} for {len(operands)} operands"
        )
    if any(len(set(term)) != len(term) for term in inputs):
        raise ValueError(f"einsum takes no repeated letter within an operand, got {subscripts!r}")
    values = [value_of(a) for a in operands]

    def vjp(g: Any) -> list[Any]:
        grads: list[Any] = []
        for i, (term, operand) in enumerate(zip(inputs, operands)):
            if not isinstance(operand, Tracked):
                grads.append(None)
                continue
            others = inputs[:i] + inputs[i + 1 :]
            present = set(output).union(*others)
            # A letter only this operand has was summed away: its gradient is the same along it.
            kept = "".join(letter for letter in term if letter in present)
            grad = np.einsum(
                f"{','.join([output, *others])}->{kept}",
                g,
                *values[:i],
                *values[i + 1 :],
                optimize=True,
            )
            if kept != term:
                stretch = [
                    n if letter in present else 1 for letter, n in zip(term, values[i].shape)
                ]
                grad = np.broadcast_to(grad.reshape(stretch), values[i].shape)
            grads.append(grad)
        return grads

    return record(np.einsum(subscripts, *values, optimize=True), operands, vjp)


# -- indexing ----------------------------------------------------------------------------------


def _is_basic(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return builtins.all(
        p is None or p is Ellipsis or isinstance(p, slice)
        or (isinstance(p, int | np.integer) and not isinstance(p, bool | np.bool_))
        for p in parts
    )  # fmt: skip


def getitem(x: Array, index: Any) -> Array:
    index = tuple(value_of(p) for p in index) if isinstance(index, tuple) else value_of(index)
    xv = value_of(x)
    basic = _is_basic(index)

    def vjp(g: Any) -> tuple[Any]:
        grad = np.zeros(np.shape(xv), np.asarray(xv).dtype)
        if basic:  # each element picked at most once
            grad[index] = g
        else:
            np.add.at(grad, index, g)
        return (grad,)

    return record(np.asarray(xv)[index], (x,), vjp)
