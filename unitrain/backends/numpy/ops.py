"""The :mod:`unitrain.ops` contract in numpy, with derivatives of its own: the oracle.

Every op computes its forward with numpy in its input's dtype (float64 for the oracle; float32
inputs stay float32, so the same code measures what float32 costs) and, when an input is a
:class:`Tracked` array, records a hand-written vector-Jacobian product on the graph of
:mod:`._tape`. With no tracked input an op returns a plain ndarray, so forward-only code pays
nothing for the graph. No framework is imported: that is what makes these derivatives an
independent check of torch's, JAX's and TensorFlow's. The error function is computed here too
(numpy has none, and scipy is not a dependency of unitrain).

Where frameworks differ the contract's docstrings decide; the choices that show in the
derivatives: ties of ``maximum``/``minimum``/``max``/``min`` split the gradient evenly;
``relu`` and ``abs`` have gradient 0 at 0; ``max_pool`` gives the gradient to the first maximum
of each window; ``conv_transpose`` is the input gradient of ``conv`` (the same helpers compute
both).

Examples:
    >>> import numpy as np
    >>> outputs, pullback = vjp(lambda x: sum(x * x), [np.array([1.0, 2.0])], (0,))
    >>> outputs[0], pullback([np.array(1.0)])[0]
    (array(5.), array([2., 4.]))
"""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from unitrain.backends.numpy import _tape
from unitrain.ops import CONTRACT

__all__ = [*CONTRACT, "Tracked", "to_numpy", "vjp"]
Array = Any
Axis = int | tuple[int, ...] | None
Pairish = int | Sequence[int]


class Tracked(_tape.Node):
    """A numpy value being differentiated by :func:`vjp`: ops and operators record on it."""

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
        return _getitem(self, index)


# -- recording ---------------------------------------------------------------------------------


def _value(x: Any) -> Any:
    return x.value if isinstance(x, Tracked) else x


def _record(value: Any, inputs: Sequence[Any], vjp: _tape.VJP) -> Any:
    """``value``, tracked with ``vjp`` (one gradient per input) when an input is tracked."""
    parents = tuple((i, a) for i, a in enumerate(inputs) if isinstance(a, Tracked))
    return Tracked(value, parents, vjp) if parents else value


def _unbroadcast(grad: Any, shape: tuple[int, ...]) -> Any:
    """``grad`` summed over the axes broadcasting added or stretched to reach ``shape``."""
    if np.shape(grad) == shape:
        return grad
    extra = np.ndim(grad) - len(shape)
    stretched = tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    return np.sum(grad, axis=tuple(range(extra)) + stretched).reshape(shape)


def _unary(x: Any, forward: Callable[[Any], Any], derivative: Callable[..., Any]) -> Any:
    """``forward(x)``; the gradient is ``derivative(cotangent, x, output)``."""
    xv = _value(x)
    out = forward(xv)
    if not isinstance(x, Tracked):
        return out
    return Tracked(out, ((0, x),), lambda g: (derivative(g, xv, out),))


def _binary(x: Any, y: Any, forward: Callable, dx: Callable, dy: Callable) -> Any:
    """``forward(x, y)`` with broadcasting; ``dx``/``dy(cotangent, x, y, output)`` give the
    gradients before they are summed back to each operand's shape (only tracked ones run)."""
    xv, yv = _value(x), _value(y)
    out = forward(xv, yv)
    x_tracked, y_tracked = isinstance(x, Tracked), isinstance(y, Tracked)
    if not (x_tracked or y_tracked):
        return out

    def vjp(g: Any) -> tuple[Any, Any]:
        return (
            _unbroadcast(dx(g, xv, yv, out), np.shape(xv)) if x_tracked else None,
            _unbroadcast(dy(g, xv, yv, out), np.shape(yv)) if y_tracked else None,
        )

    return _record(out, (x, y), vjp)


# -- about arrays ------------------------------------------------------------------------------

_DTYPES = {
    name: np.dtype(name) for name in ("float16", "float32", "float64", "int32", "int64", "bool")
}


def _numpy_dtype(name: str) -> np.dtype:
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


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


def shape(x: Array) -> tuple[int, ...]:
    return tuple(int(n) for n in np.shape(_value(x)))


def dtype(x: Array) -> str:
    x = _value(x)
    return (x if isinstance(x, np.ndarray | np.generic) else asarray(x)).dtype.name


def to_numpy(x: Array) -> np.ndarray:
    """``x`` as a numpy array (bfloat16 as float32)."""
    array = np.asarray(_value(x))
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


# -- making arrays -----------------------------------------------------------------------------


def asarray(x: Any, dtype: str | None = None) -> Array:
    if isinstance(x, Tracked):
        return x if dtype is None or x.dtype == _numpy_dtype(dtype) else cast(x, dtype)
    if dtype is not None:
        return np.asarray(x, dtype=_numpy_dtype(dtype))
    array = np.asarray(x)
    # Python floats (and lists of them) become float32, as a framework's tensor() makes them.
    if array.dtype == np.float64 and not isinstance(x, np.ndarray | np.generic):
        return array.astype(np.float32)
    return array


def zeros(shape: Sequence[int], dtype: str = "float32") -> Array:
    return np.zeros(tuple(shape), _numpy_dtype(dtype))


def ones(shape: Sequence[int], dtype: str = "float32") -> Array:
    return np.ones(tuple(shape), _numpy_dtype(dtype))


def full(shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
    return np.full(tuple(shape), value, _numpy_dtype(dtype))


def zeros_like(x: Array) -> Array:
    return np.zeros_like(_value(x))


def ones_like(x: Array) -> Array:
    return np.ones_like(_value(x))


def arange(n: int, dtype: str = "int64") -> Array:
    return np.arange(n, dtype=_numpy_dtype(dtype))


def cast(x: Array, dtype: str) -> Array:
    xv = np.asarray(_value(x))
    out = xv.astype(_numpy_dtype(dtype))
    if not (isinstance(x, Tracked) and _is_float(xv.dtype) and _is_float(out.dtype)):
        return out
    return Tracked(out, ((0, x),), lambda g: (np.asarray(g).astype(xv.dtype),))


# -- elementwise -------------------------------------------------------------------------------


def add(x: Array, y: Array) -> Array:
    return _binary(x, y, np.add, lambda g, *_: g, lambda g, *_: g)


def subtract(x: Array, y: Array) -> Array:
    return _binary(x, y, np.subtract, lambda g, *_: g, lambda g, *_: -g)


def multiply(x: Array, y: Array) -> Array:
    return _binary(x, y, np.multiply, lambda g, x, y, _: g * y, lambda g, x, y, _: g * x)


def divide(x: Array, y: Array) -> Array:
    return _binary(x, y, np.divide, lambda g, x, y, _: g / y, lambda g, x, y, out: -g * out / y)


def _power_base(g: Any, x: Any, y: Any, _: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** (y - 1) for y < 1
        return g * y * np.power(x, y - 1)


def _power_exponent(g: Any, x: Any, y: Any, out: Any) -> Any:
    positive = np.greater(x, 0)
    return np.where(positive, g * out * np.log(np.where(positive, x, 1)), 0)


def power(x: Array, y: Array) -> Array:
    return _binary(x, y, np.power, _power_base, _power_exponent)


def _first_wins(g: Any, x: Any, y: Any) -> Any:
    """``g`` where ``x`` beats ``y``, half of it at a tie, zero where it loses."""
    return np.where(np.greater(x, y), g, np.where(np.equal(x, y), 0.5 * g, 0))


def maximum(x: Array, y: Array) -> Array:
    return _binary(
        x,
        y,
        np.maximum,
        lambda g, x, y, _: _first_wins(g, x, y),
        lambda g, x, y, _: _first_wins(g, y, x),
    )


def minimum(x: Array, y: Array) -> Array:
    return _binary(
        x,
        y,
        np.minimum,
        lambda g, x, y, _: _first_wins(g, y, x),
        lambda g, x, y, _: _first_wins(g, x, y),
    )


def where(condition: Array, x: Array, y: Array) -> Array:
    picks = np.asarray(_value(condition), dtype=bool)
    xv, yv = _value(x), _value(y)

    def vjp(g: Any) -> tuple[None, Any, Any]:
        return (
            None,
            _unbroadcast(np.where(picks, g, 0), np.shape(xv)) if isinstance(x, Tracked) else None,
            _unbroadcast(np.where(picks, 0, g), np.shape(yv)) if isinstance(y, Tracked) else None,
        )

    return _record(np.where(picks, xv, yv), (condition, x, y), vjp)


def clip(x: Array, low: float, high: float) -> Array:
    return _unary(
        x,
        lambda x: np.clip(x, low, high),
        lambda g, x, _: np.where((x >= low) & (x <= high), g, 0),
    )


def negative(x: Array) -> Array:
    return _unary(x, np.negative, lambda g, *_: -g)


def abs(x: Array) -> Array:
    return _unary(x, np.abs, lambda g, x, _: g * np.sign(x))


def sign(x: Array) -> Array:
    return np.sign(_value(x))


def exp(x: Array) -> Array:
    return _unary(x, np.exp, lambda g, _, out: g * out)


def expm1(x: Array) -> Array:
    return _unary(x, np.expm1, lambda g, _, out: g * (out + 1))


def log(x: Array) -> Array:
    return _unary(x, np.log, lambda g, x, _: g / x)


def log1p(x: Array) -> Array:
    return _unary(x, np.log1p, lambda g, x, _: g / (x + 1))


def sqrt(x: Array) -> Array:
    return _unary(x, np.sqrt, lambda g, _, out: 0.5 * g / out)


def rsqrt(x: Array) -> Array:
    return _unary(x, lambda x: 1 / np.sqrt(x), lambda g, x, out: -0.5 * g * out / x)


def square(x: Array) -> Array:
    return _unary(x, np.square, lambda g, x, _: 2 * g * x)


def sin(x: Array) -> Array:
    return _unary(x, np.sin, lambda g, x, _: g * np.cos(x))


def cos(x: Array) -> Array:
    return _unary(x, np.cos, lambda g, x, _: -g * np.sin(x))


def tanh(x: Array) -> Array:
    return _unary(x, np.tanh, lambda g, _, out: g * (1 - out * out))


# The error function, in float64 for every input dtype, to 1e-15 relative (erfc to 1e-14):
# below 1.25 the series erf(x) = 2/sqrt(pi) e^(-x^2) sum_k (2x^2)^k x / (1*3*...*(2k+1)),
# whose terms are all positive (no cancellation, unlike Taylor's); from 1.25 on Laplace's
# continued fraction erfc(x) = e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))),
# which converges the slower the smaller x is. The term counts reach float64 rounding at each
# band's lower end, the worst case (measured against mpmath at 40 digits).
_SERIES_END, _SERIES_TERMS = 1.25, 22
_FAR, _MIDDLE_TERMS, _FAR_TERMS = 2.0, 150, 55
_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_SERIES_COEFFICIENTS = [1 / math.prod(range(1, 2 * k + 2, 2)) for k in range(_SERIES_TERMS)]


def _exp_minus_square(x: np.ndarray) -> np.ndarray:
    """``e ** -x**2`` without the rounding of ``x**2`` (which e**-36 would amplify 36 times):
    ``x`` split into a head with few bits, whose square is exact, and the rest."""
    head = np.round(x * 16) / 16
    return np.exp(-head * head) * np.exp(-(x - head) * (x + head))


def _erf_series(x: np.ndarray) -> np.ndarray:
    # Horner's rule over the coefficients 1 / (1*3*...*(2k+1)) of (2x^2)^k, in place.
    twice_square = 2 * x * x
    total = np.full_like(x, _SERIES_COEFFICIENTS[-1])
    for coefficient in _SERIES_COEFFICIENTS[-2::-1]:
        total *= twice_square
        total += coefficient
    return _TWO_OVER_SQRT_PI * _exp_minus_square(x) * x * total


def _erfc_fraction(x: np.ndarray, terms: int) -> np.ndarray:
    tail = x.copy()  # evaluated from the deepest level up, in place
    for k in range(terms, 0, -1):
        np.divide(k / 2, tail, out=tail)
        tail += x
    return _exp_minus_square(x) / (math.sqrt(math.pi) * tail)


def _erf_and_erfc(x: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(erf(x), erfc(x))`` in float64, each accurate where it is small."""
    x = np.asarray(x, dtype=np.float64)
    size = np.abs(x)
    erf_size, erfc_size = np.empty_like(size), np.empty_like(size)
    near, far = size < _SERIES_END, ~(size < _FAR)  # NaN goes far, and stays NaN
    middle = ~near & ~far
    erf_size[near] = _erf_series(size[near])
    erfc_size[near] = 1 - erf_size[near]
    erfc_size[middle] = _erfc_fraction(size[middle], _MIDDLE_TERMS)
    # erfc(28) rounds to 0 in float64: larger sizes (inf) take its value.
    erfc_size[far] = _erfc_fraction(np.minimum(size[far], 28.0), _FAR_TERMS)
    erf_size[~near] = 1 - erfc_size[~near]
    return np.copysign(erf_size, x), np.where(x < 0, 2 - erfc_size, erfc_size)


def _float_dtype(x: Any) -> np.dtype:
    """The dtype a transcendental function of ``x`` returns: ``x``'s, float64 for integers."""
    found = np.asarray(x).dtype
    return found if _is_float(found) else np.dtype(np.float64)


def _erf(x: Any) -> Any:
    return _erf_and_erfc(x)[0].astype(_float_dtype(x))


def _normal_cdf(x: Any) -> Any:
    """``Phi(x) = erfc(-x / sqrt(2)) / 2``: accurate far into the lower tail."""
    return (0.5 * _erf_and_erfc(-np.asarray(x) / math.sqrt(2.0))[1]).astype(_float_dtype(x))


def erf(x: Array) -> Array:
    return _unary(x, _erf, lambda g, x, _: g * _TWO_OVER_SQRT_PI * np.exp(-x * x))


def _sigmoid(x: Any) -> Any:
    small = np.exp(-np.abs(x))  # never overflows; the two branches are the same function
    return np.where(np.greater_equal(x, 0), 1 / (1 + small), small / (1 + small))


def _sigmoid_derivative(x: Any) -> Any:
    small = np.exp(-np.abs(x))  # s (1 - s), without 1 - s rounding to 0 for large x
    return small / ((1 + small) * (1 + small))


def sigmoid(x: Array) -> Array:
    return _unary(x, _sigmoid, lambda g, x, _: g * _sigmoid_derivative(x))


def relu(x: Array) -> Array:
    return _unary(x, lambda x: np.maximum(x, 0), lambda g, x, _: np.where(x > 0, g, 0))


_GELU_C, _GELU_CUBIC = math.sqrt(2 / math.pi), 0.044715


def _gelu_tanh(x: Any) -> Any:
    return 0.5 * x * (1 + np.tanh(_GELU_C * (x + _GELU_CUBIC * x**3)))


def _gelu_tanh_derivative(x: Any) -> Any:
    t = np.tanh(_GELU_C * (x + _GELU_CUBIC * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_CUBIC * x * x)


def gelu(x: Array, approximate: bool = False) -> Array:
    if approximate:
        return _unary(x, _gelu_tanh, lambda g, x, _: g * _gelu_tanh_derivative(x))
    return _unary(
        x,
        lambda x: x * _normal_cdf(x),
        lambda g, x, _: g * (_normal_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
    )


def silu(x: Array) -> Array:
    def derivative(g: Any, x: Any, _: Any) -> Any:
        s = _sigmoid(x)
        return g * s * (1 + x * (1 - s))

    return _unary(x, lambda x: x * _sigmoid(x), derivative)


def softplus(x: Array) -> Array:
    return _unary(
        x,
        lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x))),
        lambda g, x, _: g * _sigmoid(x),
    )


# -- comparisons (no gradient) -----------------------------------------------------------------


def equal(x: Array, y: Array) -> Array:
    return np.equal(_value(x), _value(y))


def less(x: Array, y: Array) -> Array:
    return np.less(_value(x), _value(y))


def greater(x: Array, y: Array) -> Array:
    return np.greater(_value(x), _value(y))


def logical_and(x: Array, y: Array) -> Array:
    return np.logical_and(_value(x), _value(y))


def logical_not(x: Array) -> Array:
    return np.logical_not(_value(x))


def isfinite(x: Array) -> Array:
    return np.isfinite(_value(x))


# -- reductions --------------------------------------------------------------------------------


def _axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    """``axis`` as a sorted tuple of non-negative axes (all of them for None)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of range for an array of {ndim} dimensions")
    return tuple(sorted(int(a) % ndim for a in axes)) if ndim else ()


def _spread(g: Any, axes: tuple[int, ...], keepdims: bool, shape: tuple[int, ...]) -> Any:
    """A reduction's cotangent broadcast back over the reduced axes."""
    return np.broadcast_to(g if keepdims else np.expand_dims(g, axes), shape)


def sum(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    xv = np.asarray(_value(x))
    axes = _axes(axis, xv.ndim)
    return _unary(
        x,
        lambda x: np.sum(x, axis=axes, keepdims=keepdims),
        lambda g, x, _: _spread(g, axes, keepdims, x.shape),
    )


def mean(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    xv = np.asarray(_value(x))
    axes = _axes(axis, xv.ndim)
    count = math.prod(xv.shape[a] for a in axes)
    return _unary(
        x,
        lambda x: np.mean(x, axis=axes, keepdims=keepdims),
        lambda g, x, _: _spread(g / count, axes, keepdims, x.shape),
    )


def _extreme(x: Array, axis: Axis, keepdims: bool, reduce: Callable) -> Array:
    xv = np.asarray(_value(x))
    axes = _axes(axis, xv.ndim)

    def derivative(g: Any, x: Any, out: Any) -> Any:
        winners = x == _spread(out, axes, keepdims, x.shape)
        count = np.sum(winners, axis=axes, keepdims=True, dtype=g.dtype)
        return np.where(winners, _spread(g, axes, keepdims, x.shape) / count, 0)

    return _unary(x, lambda x: reduce(x, axis=axes, keepdims=keepdims), derivative)


def max(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return _extreme(x, axis, keepdims, np.max)


def min(x: Array, axis: Axis = None, keepdims: bool = False) -> Array:
    return _extreme(x, axis, keepdims, np.min)


def argmax(x: Array, axis: int = -1) -> Array:
    return np.argmax(_value(x), axis=axis).astype(np.int64)


def moments(x: Array, axis: Axis, keepdims: bool = False) -> tuple[Array, Array]:
    # Two passes from tracked ops: the variance's gradient 2 (x - mean) / n comes out of the
    # chain rule, and the deviations are what keeps large offsets exact.
    axes = _axes(axis, len(shape(x)))
    centre = mean(x, axes, keepdims=True)
    variance = mean(square(subtract(x, centre)), axes, keepdims)
    return (centre if keepdims else squeeze(centre, axes)), variance


def logsumexp(x: Array, axis: Axis = -1, keepdims: bool = False) -> Array:
    xv = np.asarray(_value(x))
    axes = _axes(axis, xv.ndim)
    shift = np.max(xv, axis=axes, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0)
    with np.errstate(divide="ignore"):  # all -inf: log(0) = -inf is the answer
        kept = np.log(np.sum(np.exp(xv - shift), axis=axes, keepdims=True)) + shift
    out = kept if keepdims else np.squeeze(kept, axes)
    return _record(out, (x,), lambda g: (_spread(g, axes, keepdims, xv.shape) * np.exp(xv - kept),))


# -- linear algebra ----------------------------------------------------------------------------


def matmul(x: Array, y: Array) -> Array:
    xv, yv = _value(x), _value(y)

    def vjp(g: Any) -> tuple[Any, Any]:
        # A vector operand is a matrix of one row (x) or column (y) whose axis the product drops.
        x2 = xv[None, :] if xv.ndim == 1 else xv
        y2 = yv[:, None] if yv.ndim == 1 else yv
        g2 = g[..., None] if yv.ndim == 1 else g
        g2 = np.expand_dims(g2, -2) if xv.ndim == 1 else g2
        dx = dy = None
        if isinstance(x, Tracked):
            dx = _unbroadcast(g2 @ np.swapaxes(y2, -1, -2), x2.shape).reshape(xv.shape)
        if isinstance(y, Tracked):
            dy = _unbroadcast(np.swapaxes(x2, -1, -2) @ g2, y2.shape).reshape(yv.shape)
        return dx, dy

    return _record(np.matmul(xv, yv), (x, y), vjp)


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
    values = [_value(a) for a in operands]

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

    return _record(np.einsum(subscripts, *values, optimize=True), operands, vjp)


# -- shapes ------------------------------------------------------------------------------------


def _reshaped(x: Array, forward: Callable[[Any], Any]) -> Array:
    """An op that only rearranges ``x``'s elements into a new shape, in the same order."""
    return _unary(x, forward, lambda g, x, _: np.reshape(g, np.shape(x)))


def reshape(x: Array, shape: Sequence[int]) -> Array:
    return _reshaped(x, lambda x: np.reshape(x, tuple(shape)))


def transpose(x: Array, axes: Sequence[int] | None = None) -> Array:
    ndim = len(np.shape(_value(x)))
    order = tuple(range(ndim))[::-1] if axes is None else tuple(a % ndim for a in axes)
    inverse = tuple(np.argsort(order))
    return _unary(x, lambda x: np.transpose(x, order), lambda g, *_: np.transpose(g, inverse))


def expand_dims(x: Array, axis: int) -> Array:
    return _reshaped(x, lambda x: np.expand_dims(x, axis))


def squeeze(x: Array, axis: int | tuple[int, ...]) -> Array:
    return _reshaped(x, lambda x: np.squeeze(x, axis))


def broadcast_to(x: Array, shape: Sequence[int]) -> Array:
    return _unary(
        x,
        lambda x: np.broadcast_to(x, tuple(shape)),
        lambda g, x, _: _unbroadcast(g, np.shape(x)),
    )


def concat(arrays: Sequence[Array], axis: int = 0) -> Array:
    values = [_value(a) for a in arrays]
    out = np.concatenate(values, axis=axis)
    ends = np.cumsum([np.shape(v)[axis] for v in values])[:-1]
    return _record(out, tuple(arrays), lambda g: np.split(g, ends, axis=axis))


def stack(arrays: Sequence[Array], axis: int = 0) -> Array:
    out = np.stack([_value(a) for a in arrays], axis=axis)
    return _record(out, tuple(arrays), lambda g: list(np.moveaxis(g, axis, 0)))


def split(x: Array, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    dims = shape(x)
    axis = _axes(axis, len(dims))[0]
    if builtins.sum(sizes) != dims[axis]:
        raise ValueError(f"split sizes {list(sizes)} do not add up to axis {axis}'s {dims[axis]}")
    ends = np.cumsum([0, *sizes]).tolist()
    lead = (slice(None),) * axis
    return [_getitem(x, (*lead, slice(a, b))) for a, b in itertools.pairwise(ends)]


def pad(x: Array, widths: Sequence[tuple[int, int]], value: float = 0.0) -> Array:
    xv = _value(x)
    widths = [(int(before), int(after)) for before, after in widths]
    if len(widths) != np.ndim(xv):
        raise ValueError(f"pad takes one (before, after) pair per axis of {np.shape(xv)}")
    inside = tuple(slice(b, b + n) for (b, _), n in zip(widths, np.shape(xv)))
    return _unary(x, lambda x: np.pad(x, widths, constant_values=value), lambda g, *_: g[inside])


# -- indexing ----------------------------------------------------------------------------------


def _is_basic(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return builtins.all(
        p is None or p is Ellipsis or isinstance(p, slice)
        or (isinstance(p, int | np.integer) and not isinstance(p, bool | np.bool_))
        for p in parts
    )  # fmt: skip


def _getitem(x: Array, index: Any) -> Array:
    index = tuple(_value(p) for p in index) if isinstance(index, tuple) else _value(index)
    xv = _value(x)
    basic = _is_basic(index)

    def vjp(g: Any) -> tuple[Any]:
        grad = np.zeros(np.shape(xv), np.asarray(xv).dtype)
        if basic:  # each element picked at most once
            grad[index] = g
        else:
            np.add.at(grad, index, g)
        return (grad,)

    return _record(np.asarray(xv)[index], (x,), vjp)


def take(x: Array, indices: Array, axis: int = 0) -> Array:
    xv, picks = _value(x), np.asarray(_value(indices))
    axis = _axes(axis, xv.ndim)[0]
    picked = list(range(axis, axis + picks.ndim))

    def vjp(g: Any) -> tuple[Any, None]:
        grad = np.zeros(xv.shape, xv.dtype)
        # Along axis first, np.add.at adds every pick's row, repeats included.
        np.add.at(
            np.moveaxis(grad, axis, 0), picks, np.moveaxis(g, picked, list(range(picks.ndim)))
        )
        return grad, None

    return _record(np.take(xv, picks, axis=axis), (x, indices), vjp)


def take_along_axis(x: Array, indices: Array, axis: int) -> Array:
    xv, picks = _value(x), np.asarray(_value(indices))
    axis = _axes(axis, xv.ndim)[0]
    out = np.take_along_axis(xv, picks, axis=axis)

    def vjp(g: Any) -> tuple[Any, None]:
        # put_along_axis would keep one of two picks of an element: add.at with the full
        # index grid adds them (an axis x has of length 1 was broadcast: all at 0).
        grid = []
        for d, n in enumerate(out.shape):
            if d == axis:
                grid.append(picks)
                continue
            along = np.arange(n) if xv.shape[d] == n else np.zeros(n, np.int64)
            grid.append(along.reshape([n if e == d else 1 for e in range(out.ndim)]))
        grad = np.zeros(xv.shape, xv.dtype)
        np.add.at(grad, tuple(grid), g)
        return grad, None

    return _record(out, (x, indices), vjp)


def one_hot(indices: Array, depth: int, dtype: str = "float32") -> Array:
    picks = np.asarray(_value(indices))
    return (picks[..., None] == np.arange(depth)).astype(_numpy_dtype(dtype))


# -- networks ----------------------------------------------------------------------------------


def _softmax_vjp(g: Any, probabilities: Any, axis: int) -> Any:
    return probabilities * (g - np.sum(g * probabilities, axis=axis, keepdims=True))


def softmax(x: Array, axis: int = -1) -> Array:
    def forward(x: Any) -> Any:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)

    return _unary(x, forward, lambda g, _, out: _softmax_vjp(g, out, axis))


def log_softmax(x: Array, axis: int = -1) -> Array:
    return _unary(
        x,
        lambda x: x - logsumexp(x, axis, keepdims=True),
        lambda g, _, out: g - np.exp(out) * np.sum(g, axis=axis, keepdims=True),
    )


def _masked_softmax(x: Array, keep: np.ndarray) -> Array:
    """Softmax over the last axis of the kept entries; dropped ones and rows that keep nothing
    are 0 (so is their gradient)."""

    def forward(x: Any) -> Any:
        kept = np.broadcast_to(keep, x.shape)
        shift = np.max(np.where(kept, x, -np.inf), axis=-1, keepdims=True)
        shift = np.where(np.isfinite(shift), shift, 0)
        e = np.exp(np.where(kept, x - shift, -np.inf))
        total = np.sum(e, axis=-1, keepdims=True)
        return e / np.where(total > 0, total, 1)

    return _unary(x, forward, lambda g, _, out: _softmax_vjp(g, out, -1))


# Convolution and pooling share one view: every window of a padded input as an array
# (N, *out, C, *window), read through sliding_window_view without a copy.


def _per_axis(value: Pairish, rank: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int | np.integer):
        return (int(value),) * rank
    values = tuple(int(v) for v in value)
    if len(values) != rank:
        raise ValueError(f"{name} needs one value per spatial axis ({rank}), got {value!r}")
    return values


def _same_padding(size: int, window: int, stride: int, dilation: int) -> tuple[int, int]:
    """TensorFlow's "same": ceil(size / stride) outputs, the odd padding after."""
    total = builtins.max((-(-size // stride) - 1) * stride + (window - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def _windows(
    padded: np.ndarray, window: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> np.ndarray:
    """Every window of ``padded`` (N, *spatial, C), as a view (N, *out, C, *window)."""
    rank = len(window)
    span = tuple((k - 1) * d + 1 for k, d in zip(window, dilation))
    view = sliding_window_view(padded, span, axis=tuple(range(1, rank + 1)))
    every = (slice(None, None, s) for s in stride)
    taps = (slice(None, None, d) for d in dilation)
    return view[(slice(None), *every, slice(None), *taps)]


def _offsets(
    window: Sequence[int], stride: Sequence[int], dilation: Sequence[int], out: Sequence[int]
) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """Each position of a window, with the slice of the padded input it covers across outputs."""
    for offset in np.ndindex(*window):
        yield (
            offset,
            tuple(
                slice(o * d, o * d + s * (n - 1) + 1, s)
                for o, d, s, n in zip(offset, dilation, stride, out)
            ),
        )


def _channel(group: int, width: int) -> slice:
    return slice(group * width, (group + 1) * width)


def _correlate(padded, kernel, stride, dilation, groups: int, out: Any = None) -> np.ndarray:
    """The cross-correlation of ``padded`` (N, *spatial, C) with ``kernel``
    (*window, C // groups, C_out), at the first ``out`` positions when given."""
    rank = kernel.ndim - 2
    windows = _windows(padded, kernel.shape[:rank], stride, dilation)
    if out is not None:
        windows = windows[(slice(None), *(slice(n) for n in out))]
    width, group_out = kernel.shape[rank], kernel.shape[-1] // groups
    contracted = ([1 + rank, *range(2 + rank, 2 + 2 * rank)], [rank, *range(rank)])
    parts = [
        np.tensordot(
            windows[(slice(None),) * (1 + rank) + (_channel(group, width),)],
            kernel[..., _channel(group, group_out)],
            axes=contracted,
        )
        for group in range(groups)
    ]
    return parts[0] if groups == 1 else np.concatenate(parts, axis=-1)


def _correlate_input_grad(g, kernel, padded_shape, stride, dilation, groups: int) -> np.ndarray:
    """The gradient of :func:`_correlate` with respect to its padded input."""
    rank = kernel.ndim - 2
    width, group_out = kernel.shape[rank], kernel.shape[-1] // groups
    grad = np.zeros(padded_shape, np.result_type(g, kernel))
    for offset, covered in _offsets(kernel.shape[:rank], stride, dilation, g.shape[1:-1]):
        for group in range(groups):
            tap = kernel[offset][:, _channel(group, group_out)]
            target = (slice(None), *covered, _channel(group, width))
            grad[target] += g[..., _channel(group, group_out)] @ tap.T
    return grad


def _correlate_kernel_grad(padded, g, window, stride, dilation, groups: int) -> np.ndarray:
    """The gradient of :func:`_correlate` with respect to its kernel."""
    rank = len(window)
    windows = _windows(padded, window, stride, dilation)
    windows = windows[(slice(None), *(slice(n) for n in g.shape[1:-1]))]
    width, group_out = padded.shape[-1] // groups, g.shape[-1] // groups
    positions = list(range(1 + rank))
    parts = [  # each (C // groups, *window, C_out // groups)
        np.tensordot(
            windows[(slice(None),) * (1 + rank) + (_channel(group, width),)],
            g[..., _channel(group, group_out)],
            axes=(positions, positions),
        )
        for group in range(groups)
    ]
    return np.moveaxis(np.concatenate(parts, axis=-1), 0, rank)


def _crop(padded: np.ndarray, widths: Sequence[tuple[int, int]], spatial: Sequence[int]) -> Any:
    return padded[(slice(None), *(slice(b, b + n) for (b, _), n in zip(widths, spatial)))]


def conv(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: str | Pairish = 0,
    dilation: Pairish = 1,
    groups: int = 1,
) -> Array:
    xv, kv = _value(x), _value(kernel)
    rank, spatial = xv.ndim - 2, xv.shape[1:-1]
    if kv.ndim != rank + 2 or xv.shape[-1] != kv.shape[-2] * groups or kv.shape[-1] % groups:
        raise ValueError(
            f"conv of an input {xv.shape} with a kernel {kv.shape} in {groups} groups: the "
            "kernel is (*window, C_in // groups, C_out) with C_out divisible by groups"
        )
    window = kv.shape[:rank]
    strides, dilations = _per_axis(stride, rank, "stride"), _per_axis(dilation, rank, "dilation")
    if isinstance(padding, str) and padding.lower() in ("same", "valid"):
        widths = tuple(
            _same_padding(*sizes) if padding.lower() == "same" else (0, 0)
            for sizes in zip(spatial, window, strides, dilations)
        )
    elif isinstance(padding, str):
        raise ValueError(f"conv padding is 'same', 'valid' or ints, got {padding!r}")
    else:
        widths = tuple((p, p) for p in _per_axis(padding, rank, "padding"))
    padded = np.pad(xv, ((0, 0), *widths, (0, 0))) if np.any(widths) else xv
    out = _correlate(padded, kv, strides, dilations, groups)

    def vjp(g: Any) -> tuple[Any, Any]:
        dx = dk = None
        if isinstance(x, Tracked):
            full = _correlate_input_grad(g, kv, padded.shape, strides, dilations, groups)
            dx = _crop(full, widths, spatial)
        if isinstance(kernel, Tracked):
            dk = _correlate_kernel_grad(padded, g, window, strides, dilations, groups)
        return dx, dk

    return _record(out, (x, kernel), vjp)


def conv_transpose(
    x: Array,
    kernel: Array,
    stride: Pairish = 1,
    padding: Pairish = 0,
    output_padding: Pairish = 0,
    dilation: Pairish = 1,
) -> Array:
    xv, kv = _value(x), _value(kernel)
    rank, spatial = xv.ndim - 2, xv.shape[1:-1]
    if kv.ndim != rank + 2 or kv.shape[-1] != xv.shape[-1]:
        raise ValueError(
            f"conv_transpose of an input {xv.shape} with a kernel {kv.shape}: the kernel is "
            "(*window, C_out, C_in)"
        )
    window = kv.shape[:rank]
    strides, dilations = _per_axis(stride, rank, "stride"), _per_axis(dilation, rank, "dilation")
    pads = _per_axis(padding, rank, "padding")
    extra = _per_axis(output_padding, rank, "output_padding")
    sizes = [
        (n - 1) * s - 2 * p + d * (k - 1) + e + 1
        for n, s, p, d, k, e in zip(spatial, strides, pads, dilations, window, extra)
    ]
    widths = tuple((p, p) for p in pads)
    padded_shape = (xv.shape[0], *(n + 2 * p for n, p in zip(sizes, pads)), kv.shape[-2])
    # The conv whose input gradient this is maps the padded output (sizes + 2 * padding) to x.
    full = _correlate_input_grad(xv, kv, padded_shape, strides, dilations, 1)

    def vjp(g: Any) -> tuple[Any, Any]:
        padded = np.pad(g, ((0, 0), *widths, (0, 0)))
        dx = dk = None
        if isinstance(x, Tracked):
            dx = _correlate(padded, kv, strides, dilations, 1, spatial)
        if isinstance(kernel, Tracked):
            dk = _correlate_kernel_grad(padded, xv, window, strides, dilations, 1)
        return dx, dk

    return _record(_crop(full, widths, sizes), (x, kernel), vjp)


def _pool_setup(x: Array, window: Pairish, stride: Pairish | None, padding: Pairish, fill: float):
    xv = _value(x)
    rank = xv.ndim - 2
    windows = _per_axis(window, rank, "window")
    strides = windows if stride is None else _per_axis(stride, rank, "stride")
    widths = tuple((p, p) for p in _per_axis(padding, rank, "padding"))
    padded = np.pad(xv, ((0, 0), *widths, (0, 0)), constant_values=fill)
    return xv, windows, strides, widths, padded


def max_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    xv, windows, strides, widths, padded = _pool_setup(x, window, stride, padding, -np.inf)
    view = _windows(padded, windows, strides, (1,) * len(windows))
    flat = view.reshape(*view.shape[: xv.ndim], -1)
    first = np.argmax(flat, axis=-1)  # the first maximum of each window, as torch
    out = np.take_along_axis(flat, first[..., None], axis=-1)[..., 0]

    def vjp(g: Any) -> tuple[Any]:
        grad = np.zeros(padded.shape, g.dtype)
        dilation = (1,) * len(windows)
        for tap, (_, covered) in enumerate(_offsets(windows, strides, dilation, out.shape[1:-1])):
            grad[(slice(None), *covered)] += np.where(first == tap, g, 0)
        return (_crop(grad, widths, xv.shape[1:-1]),)

    return _record(out, (x,), vjp)


def avg_pool(
    x: Array, window: Pairish, stride: Pairish | None = None, padding: Pairish = 0
) -> Array:
    xv, windows, strides, widths, padded = _pool_setup(x, window, stride, padding, 0.0)
    rank, dilation = len(windows), (1,) * len(windows)
    taps = tuple(range(-rank, 0))
    real = np.pad(np.ones((1, *xv.shape[1:-1], 1), xv.dtype), ((0, 0), *widths, (0, 0)))
    count = np.sum(_windows(real, windows, strides, dilation), axis=taps)  # (1, *out, 1)
    out = np.sum(_windows(padded, windows, strides, dilation), axis=taps) / count

    def vjp(g: Any) -> tuple[Any]:
        share = g / count
        grad = np.zeros(padded.shape, g.dtype)
        for _, covered in _offsets(windows, strides, dilation, out.shape[1:-1]):
            grad[(slice(None), *covered)] += share
        return (_crop(grad, widths, xv.shape[1:-1]),)

    return _record(out, (x,), vjp)


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    mask: Array | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Array:
    dims = shape(key)
    factor = 1 / math.sqrt(dims[-1]) if scale is None else float(scale)
    swap = (*range(len(dims) - 2), len(dims) - 1, len(dims) - 2)
    scores = multiply(matmul(query, transpose(key, swap)), factor)
    keep = None if mask is None else np.asarray(_value(mask), dtype=bool)
    if causal:
        queries, keys = shape(scores)[-2:]
        below = np.tril(np.ones((queries, keys), dtype=bool))
        keep = below if keep is None else keep & below
    probabilities = softmax(scores, -1) if keep is None else _masked_softmax(scores, keep)
    return matmul(probabilities, value)


def stop_gradient(x: Array) -> Array:
    return _value(x)


# -- differentiation ---------------------------------------------------------------------------


def vjp(
    fn: Callable[..., Any], arrays: Sequence[Any], wrt: Sequence[int]
) -> tuple[list[np.ndarray], Callable[[Sequence[Any]], list[np.ndarray]]]:
    """``fn(*arrays)``'s outputs and their pullback to the inputs at positions ``wrt``.

    Args:
        fn: computes an array, or a tuple or list of arrays, from ``arrays``.
        arrays: its inputs; those at ``wrt`` are tracked.
        wrt: the positions of the inputs to differentiate.

    Returns:
        The outputs as numpy arrays, and ``pullback(cotangents)`` (one per output) giving the
        gradient of each input in ``wrt``: zeros where no output depends on it.
    """
    inputs = list(arrays)
    for i in wrt:
        inputs[i] = Tracked(np.asarray(_value(arrays[i])))
    result = fn(*inputs)
    outputs = list(result) if isinstance(result, tuple | list) else [result]

    def pullback(cotangents: Sequence[Any]) -> list[np.ndarray]:
        if len(cotangents) != len(outputs):
            raise ValueError(f"{len(cotangents)} cotangents for {len(outputs)} outputs")
        grads = _tape.backpropagate(outputs, [np.asarray(_value(c)) for c in cotangents])
        gradients = []
        for i in wrt:
            grad = grads.get(id(inputs[i]))
            leaf = inputs[i].value
            gradients.append(np.zeros_like(leaf) if grad is None else np.require(grad, None, "W"))
        return gradients

    return [np.asarray(_value(o)) for o in outputs], pullback
