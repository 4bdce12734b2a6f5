"""The cases every backend's ops are held to: one row per op and setting that matters.

Each :class:`OpCase` names the contract function it exercises, the arrays it takes (made
from a seed, so every backend sees the same numbers) and a call written against an ops
module, operators included. The numpy reference's derivatives are checked on these cases
against finite differences (``tests/ops/test_ops_reference.py``); every backend's forward and
vector-Jacobian product are checked against the reference on them (:mod:`._op_run` runs a
case).

Inputs are drawn away from the points where a derivative jumps (``relu`` at 0, ties of
``max``), since there the frameworks may pick different one-sided derivatives.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["OP_CASES", "OpCase", "make_inputs", "rounded"]


@dataclasses.dataclass(frozen=True)
class OpCase:
    """One op under one setting.

    Attributes:
        name: the case's id, ``op`` or ``op.setting`` (a kit check's name).
        op: the contract function exercised (several cases may share it).
        inputs: ``(kind, shape)`` of each array argument. Kinds: ``normal``; ``positive``
            (0.5 to 2); ``unit`` (-0.9 to 0.9); ``apart`` (at least 0.13 from 0, 0.09 from
            each other and from +-0.5, for kinks, ties and clip bounds); ``int:N`` (0 to
            N - 1, int64); ``bool``; ``ties`` (-1, -0.5, 0, 0.5, 1); ``same:K`` (input K's
            values again); ``large`` (normal, with every other entry spread evenly from -120
            to 120, past float32's ``exp`` range); ``offset`` (64 plus a spread of 0.25,
            where a one-pass variance cancels).
        call: ``call(ops, *arrays)`` computes the case's output (an array, or a tuple or
            list of arrays).
        differentiable: the positions of the inputs that get a gradient (floating inputs
            by default; integer and bool inputs never do).
        on_kinks: the inputs sit on purpose where a derivative jumps (ties, zeros, clip
            bounds): the gradient there is the contract's convention, held against the
            reference, not a derivative that finite differences could check.
    """

    name: str
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    call: Callable[..., Any]
    differentiable: tuple[int, ...] | None = None
    on_kinks: bool = False

    @property
    def op(self) -> str:
        return self.name.partition(".")[0]

    def grad_positions(self) -> tuple[int, ...]:
        if self.differentiable is not None:
            return self.differentiable
        return tuple(
            i
            for i, (kind, _) in enumerate(self.inputs)
            if kind in FLOAT_KINDS or kind.startswith("same:")
        )


FLOAT_KINDS = ("normal", "positive", "unit", "apart", "ties", "large", "offset")


def make_inputs(case: OpCase, rounded_to: str = "float64") -> list[np.ndarray]:
    """The case's arrays, the same everywhere: floats in float64, holding values of the dtype
    ``rounded_to`` (so a reference fed them computes on exactly what a backend in that dtype
    was given), int64 and bool for those kinds."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    made: list[np.ndarray] = []
    for kind, shape in case.inputs:
        size = int(np.prod(shape))
        value: np.ndarray
        if kind == "normal":
            value = rng.standard_normal(shape)
        elif kind == "positive":
            value = rng.uniform(0.5, 2.0, shape)
        elif kind == "unit":
            value = rng.uniform(-0.9, 0.9, shape)
        elif kind == "apart":  # magnitudes 0.13, 0.23, ... (shuffled), random signs
            magnitudes = 0.13 + 0.1 * rng.permutation(size) + rng.uniform(0, 0.01, size)
            value = (magnitudes * rng.choice([-1.0, 1.0], size)).reshape(shape)
        elif kind == "ties":  # -1, -0.5, 0, 0.5, 1: ties, zeros and clip bounds
            value = 0.5 * rng.integers(-2, 3, shape).astype(np.float64)
        elif kind.startswith("same:"):  # the values of an earlier input: a tie across inputs
            value = made[int(kind[5:])].copy()
        elif kind == "large":  # normal, every other entry -120 to 120: past float32's exp
            flat = rng.standard_normal(size)  # range (88), while the normal ones still carry
            far = np.linspace(-120.0, 120.0, size // 2)  # most of each gradient's norm
            flat[1::2] = rng.permutation(far)
            value = flat.reshape(shape)
        elif kind == "offset":  # far from 0 relative to the spread: a variance test
            value = 64.0 + 0.25 * rng.standard_normal(shape)
        elif kind.startswith("int:"):
            value = rng.integers(0, int(kind[4:]), shape, dtype=np.int64)
        elif kind == "bool":
            value = rng.random(shape) < 0.6
        else:  # pragma: no cover - a typo in the table
            raise ValueError(f"unknown input kind {kind!r}")
        made.append(rounded(value, rounded_to) if value.dtype == np.float64 else value)
    return made


def rounded(value: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has none: keep the top 16 bits of float32, to nearest even
        bits = value.astype(np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
        return bits.view(np.float32).astype(np.float64)
    return value.astype(dtype).astype(np.float64)


def _case(
    name: str,
    inputs: Sequence[tuple[str, tuple[int, ...]]],
    call: Callable[..., Any],
    differentiable: tuple[int, ...] | None = None,
) -> OpCase:
    return OpCase(name, tuple(inputs), call, differentiable)


def _on_kinks(name: str, inputs: Sequence[tuple[str, tuple[int, ...]]], call: Any) -> OpCase:
    return OpCase(name, tuple(inputs), call, on_kinks=True)


def _unary(name: str, kind: str = "normal", shape: tuple[int, ...] = (3, 4)) -> OpCase:
    return _case(name, [(kind, shape)], lambda ops, x: getattr(ops, name)(x))


def _binary(name: str, a: str = "normal", b: str = "normal") -> OpCase:
    return _case(name, [(a, (3, 4)), (b, (4,))], lambda ops, x, y: getattr(ops, name)(x, y))


def _bitwise(name: str, shift: bool = False) -> OpCase:
    """An int32 bitwise op on words that wrapped (``i * 2654435761`` passes 2**31), as the
    portable generator uses them, its result steering a float output."""

    def call(ops: Any, x: Any, i: Any, j: Any) -> Any:
        words = ops.multiply(ops.cast(i, "int32"), -1640531535)  # 2654435761 as an int32
        other = 13 if shift else ops.cast(j, "int32")
        return x * ops.cast(getattr(ops, name)(words, other), ops.dtype(x))

    return _case(name, [("normal", (3, 4)), ("int:999", (3, 4)), ("int:999", (3, 4))], call)


N, C = 2, 3  # batch and channels of the image cases

OP_CASES: tuple[OpCase, ...] = (
    # making arrays and casts
    _case("asarray", [("normal", (2, 3))], lambda ops, x: ops.asarray(x) * 2.0),
    _case("zeros", [("normal", (2, 3))], lambda ops, x: x + ops.zeros((2, 3), ops.dtype(x))),
    _case("ones", [("normal", (2, 3))], lambda ops, x: x * ops.ones((3,), ops.dtype(x))),
    _case("full", [("normal", (2, 3))], lambda ops, x: x * ops.full((2, 1), 1.5, ops.dtype(x))),
    _case("zeros_like", [("normal", (2, 3))], lambda ops, x: x + ops.zeros_like(x)),
    _case("ones_like", [("normal", (2, 3))], lambda ops, x: x * ops.ones_like(x)),
    _case(
        "arange",
        [("normal", (4,))],
        lambda ops, x: x * ops.cast(ops.arange(4), ops.dtype(x)),
    ),
    _case("cast", [("normal", (2, 3))], lambda ops, x: ops.cast(x, "float32")),
    _case("shape", [("normal", (2, 3))], lambda ops, x: x * float(sum(ops.shape(x)))),
    # elementwise, with broadcasting
    _binary("add"),
    _binary("subtract"),
    _binary("multiply"),
    _binary("divide", "normal", "apart"),
    _binary("power", "positive", "normal"),
    _binary("maximum", "apart", "apart"),
    _binary("minimum", "apart", "apart"),
    _case(
        "where",
        [("bool", (3, 4)), ("normal", (3, 4)), ("normal", (4,))],
        lambda ops, c, x, y: ops.where(c, x, y),
    ),
    _case("clip", [("apart", (3, 4))], lambda ops, x: ops.clip(x, -0.5, 0.5)),
    _unary("negative"),
    _unary("abs", "apart"),
    _unary("sign", "apart"),
    _unary("exp"),
    _unary("expm1", "unit"),
    _unary("log", "positive"),
    _unary("log1p", "unit"),
    _unary("sqrt", "positive"),
    _unary("rsqrt", "positive"),
    _unary("square"),
    _unary("sin"),
    _unary("cos"),
    _unary("tanh"),
    _unary("erf"),
    _unary("sigmoid"),
    _case("sigmoid.large", [("large", (8,))], lambda ops, x: ops.sigmoid(x)),
    _unary("relu", "apart"),
    _unary("gelu"),
    _case("gelu.tanh", [("normal", (3, 4))], lambda ops, x: ops.gelu(x, approximate=True)),
    _unary("silu"),
    _unary("softplus"),
    _case("softplus.large", [("large", (8,))], lambda ops, x: ops.softplus(x)),
    # comparisons: their bools steer a differentiable pick
    _case(
        "equal",
        [("int:3", (3, 4)), ("normal", (3, 4))],
        lambda ops, i, x: ops.where(ops.equal(i, 1), x, 0.0 * x),
    ),
    _case(
        "less",
        [("apart", (3, 4)), ("normal", (3, 4))],
        lambda ops, a, x: ops.where(ops.less(a, 0.0), x, -x),
        (1,),
    ),
    _case(
        "greater",
        [("apart", (3, 4)), ("normal", (3, 4))],
        lambda ops, a, x: ops.where(ops.greater(a, 0.0), x, 2.0 * x),
        (1,),
    ),
    _case(
        "logical_and",
        [("bool", (3, 4)), ("bool", (3, 4)), ("normal", (3, 4))],
        lambda ops, p, q, x: ops.where(ops.logical_and(p, q), x, -x),
    ),
    _case(
        "logical_not",
        [("bool", (3, 4)), ("normal", (3, 4))],
        lambda ops, p, x: ops.where(ops.logical_not(p), x, 3.0 * x),
    ),
    _case(
        "isfinite",
        [("normal", (3, 4))],
        lambda ops, x: ops.where(ops.isfinite(ops.log(x * x)), x, 0.0 * x),
    ),
    # reductions
    _case("sum", [("normal", (2, 3, 4))], lambda ops, x: ops.sum(x)),
    _case("sum.axis", [("normal", (2, 3, 4))], lambda ops, x: ops.sum(x, axis=1)),
    _case(
        "sum.axes-keepdims",
        [("normal", (2, 3, 4))],
        lambda ops, x: ops.sum(x, axis=(0, 2), keepdims=True),
    ),
    _case("mean", [("normal", (2, 3, 4))], lambda ops, x: ops.mean(x, axis=-1)),
    _case("max", [("apart", (3, 5))], lambda ops, x: ops.max(x, axis=1)),
    _case("max.all", [("apart", (3, 5))], lambda ops, x: ops.max(x)),
    _case("min", [("apart", (3, 5))], lambda ops, x: ops.min(x, axis=0, keepdims=True)),
    _case(
        "argmax",
        [("apart", (3, 5)), ("normal", (3, 5))],
        lambda ops, a, x: ops.take_along_axis(x, ops.expand_dims(ops.argmax(a, 1), 1), 1),
        (1,),
    ),
    _case("moments", [("normal", (4, 6))], lambda ops, x: ops.moments(x, axis=1)),
    _case(
        "moments.offset",
        [("offset", (4, 6))],
        lambda ops, x: ops.moments(x, axis=(0, 1), keepdims=True),
    ),
    _case("logsumexp", [("normal", (3, 5))], lambda ops, x: ops.logsumexp(x, axis=-1)),
    _case(
        "logsumexp.large",
        [("large", (3, 5))],
        lambda ops, x: ops.logsumexp(x, axis=0, keepdims=True),
    ),
    # linear algebra
    _case("matmul", [("normal", (3, 4)), ("normal", (4, 5))], lambda ops, a, b: ops.matmul(a, b)),
    _case(
        "matmul.batched",
        [("normal", (2, 3, 4)), ("normal", (4, 5))],
        lambda ops, a, b: a @ b,
    ),
    _case(
        "scan",
        # Weights in (-1, 1): larger ones amplify float32 rounding through every step.
        [("normal", (3, 4)), ("normal", (4, 3, 4)), ("unit", (4, 4))],
        lambda ops, h, xs, w: ops.scan(lambda c, x: (ops.tanh(c @ w + x), c * x), h, xs),
    ),
    _case(
        "linear",
        [("normal", (2, 3, 4)), ("normal", (4, 5)), ("normal", (5,))],
        lambda ops, x, w, b: ops.linear(x, w, b),
    ),
    _case(
        "linear.matrix-no-bias",
        [("normal", (3, 4)), ("normal", (4, 5))],
        lambda ops, x, w: ops.linear(x, w),
    ),
    _case(
        "matmul.vector", [("normal", (3, 4)), ("normal", (4,))], lambda ops, a, b: ops.matmul(a, b)
    ),
    _case(
        "einsum",
        [("normal", (2, 3, 4)), ("normal", (2, 4, 5))],
        lambda ops, a, b: ops.einsum("bij,bjk->bik", a, b),
    ),
    _case(
        "einsum.heads",
        [("normal", (2, 3, 4)), ("normal", (4, 2, 5))],
        lambda ops, a, b: ops.einsum("nld,dhk->nhlk", a, b),
    ),
    # shapes
    _case("reshape", [("normal", (2, 3, 4))], lambda ops, x: ops.reshape(x, (6, -1))),
    _case("transpose", [("normal", (2, 3, 4))], lambda ops, x: ops.transpose(x, (2, 0, 1))),
    _case("transpose.reverse", [("normal", (2, 3))], lambda ops, x: ops.transpose(x)),
    _case("expand_dims", [("normal", (2, 3))], lambda ops, x: ops.expand_dims(x, 1)),
    _case("squeeze", [("normal", (2, 1, 3))], lambda ops, x: ops.squeeze(x, 1)),
    _case("broadcast_to", [("normal", (3, 1))], lambda ops, x: ops.broadcast_to(x, (2, 3, 4))),
    _case(
        "concat",
        [("normal", (2, 3)), ("normal", (2, 4))],
        lambda ops, a, b: ops.concat([a, b], axis=1),
    ),
    _case(
        "stack",
        [("normal", (2, 3)), ("normal", (2, 3))],
        lambda ops, a, b: ops.stack([a, b], axis=-1),
    ),
    _case("split", [("normal", (2, 7))], lambda ops, x: ops.split(x, [2, 5], axis=1)),
    _case("pad", [("normal", (2, 3))], lambda ops, x: ops.pad(x, [(1, 0), (2, 1)], 0.5)),
    _case("getitem", [("normal", (4, 5, 3))], lambda ops, x: x[1:3, ::2, -1] * 2.0),
    _case("getitem.newaxis", [("normal", (4, 5))], lambda ops, x: x[None, ..., 0]),
    # indexing
    _case(
        "take",
        [("normal", (6, 4)), ("int:6", (3, 5))],
        lambda ops, table, i: ops.take(table, i, axis=0),
    ),
    _case(
        "take.repeated",
        [("normal", (3, 4)), ("int:3", (9,))],
        lambda ops, table, i: ops.take(table, i, axis=0),
    ),
    _case(
        "take.axis1",
        [("normal", (3, 6)), ("int:6", (4,))],
        lambda ops, x, i: ops.take(x, i, axis=1),
    ),
    _case(
        "take_along_axis",
        [("normal", (4, 5)), ("int:5", (4, 1))],
        lambda ops, x, i: ops.take_along_axis(x, i, 1),
    ),
    _case(
        "one_hot",
        [("int:5", (4,)), ("normal", (4, 5))],
        lambda ops, i, x: ops.one_hot(i, 5, ops.dtype(x)) * x,
    ),
    # integer bits
    *(_bitwise(f"bitwise_{name}") for name in ("and", "or", "xor")),
    *(_bitwise(f"bitwise_{name}_shift", shift=True) for name in ("left", "right")),
    # networks
    _case("softmax", [("normal", (3, 5))], lambda ops, x: ops.softmax(x)),
    _case("softmax.axis0-large", [("large", (3, 5))], lambda ops, x: ops.softmax(x, 0)),
    _case("log_softmax", [("normal", (3, 5))], lambda ops, x: ops.log_softmax(x, axis=-1)),
    _case(
        "layer_norm",
        [("normal", (2, 3, 5)), ("normal", (5,)), ("normal", (5,))],
        lambda ops, x, w, b: ops.layer_norm(x, w, b, 1e-3),
    ),
    # Not on "offset" data: normalising data at 64 with a spread of 0.25 multiplies float32's
    # rounding of the mean by 256, more than a step's tolerance; moments.offset checks that.
    _case("layer_norm.bare", [("normal", (4, 6))], lambda ops, x: ops.layer_norm(x, eps=1e-3)),
    _case(
        "conv.1d",
        [("normal", (N, 9, C)), ("normal", (3, C, 4))],
        lambda ops, x, k: ops.conv(x, k),
    ),
    _case(
        "conv.1d-stride-dilation-pad",
        [("normal", (N, 11, C)), ("normal", (3, C, 4))],
        lambda ops, x, k: ops.conv(x, k, stride=2, padding=2, dilation=2),
    ),
    _case(
        "conv.2d",
        [("normal", (N, 6, 5, C)), ("normal", (3, 2, C, 4))],
        lambda ops, x, k: ops.conv(x, k, padding=(1, 0)),
    ),
    _case(
        "conv.2d-bias",
        [("normal", (N, 6, 5, C)), ("normal", (3, 3, C, 4)), ("normal", (4,))],
        lambda ops, x, k, b: ops.conv(x, k, stride=2, padding=1, bias=b),
    ),
    _case(
        "conv.2d-same-stride2",
        [("normal", (N, 7, 6, C)), ("normal", (3, 3, C, 2))],
        lambda ops, x, k: ops.conv(x, k, stride=2, padding="same"),
    ),
    _case(
        "conv.2d-valid",
        [("normal", (N, 7, 6, C)), ("normal", (2, 3, C, 2))],
        lambda ops, x, k: ops.conv(x, k, stride=(2, 1), padding="valid"),
    ),
    _case(
        "conv.2d-groups",
        [("normal", (N, 5, 5, 4)), ("normal", (3, 3, 2, 6))],
        lambda ops, x, k: ops.conv(x, k, padding=1, groups=2),
    ),
    _case(
        "conv_transpose.1d",
        [("normal", (N, 5, C)), ("normal", (3, 4, C))],
        lambda ops, x, k: ops.conv_transpose(x, k, stride=2),
    ),
    _case(
        "conv_transpose.2d",
        [("normal", (N, 4, 3, C)), ("normal", (3, 3, 2, C))],
        lambda ops, x, k: ops.conv_transpose(x, k, stride=2, padding=1, output_padding=1),
    ),
    _case("max_pool.1d", [("apart", (N, 8, C))], lambda ops, x: ops.max_pool(x, 2)),
    _case(
        "max_pool.2d",
        [("apart", (N, 6, 5, C))],
        lambda ops, x: ops.max_pool(x, (3, 2), stride=(2, 1), padding=(1, 0)),
    ),
    _case("avg_pool.1d", [("normal", (N, 8, C))], lambda ops, x: ops.avg_pool(x, 3, 2)),
    _case(
        "avg_pool.2d-padded",
        [("normal", (N, 5, 5, C))],
        lambda ops, x: ops.avg_pool(x, 3, stride=2, padding=1),
    ),
    _case(
        "scaled_dot_product_attention",
        [("normal", (N, 2, 4, 3)), ("normal", (N, 2, 5, 3)), ("normal", (N, 2, 5, 2))],
        lambda ops, q, k, v: ops.scaled_dot_product_attention(q, k, v),
    ),
    _case(
        "scaled_dot_product_attention.causal-scale",
        [("normal", (N, 4, 3)), ("normal", (N, 4, 3)), ("normal", (N, 4, 3))],
        lambda ops, q, k, v: ops.scaled_dot_product_attention(q, k, v, causal=True, scale=0.3),
    ),
    _case(
        "scaled_dot_product_attention.mask",
        [("normal", (N, 3, 2)), ("normal", (N, 4, 2)), ("normal", (N, 4, 2)), ("bool", (N, 3, 4))],
        lambda ops, q, k, v, m: ops.scaled_dot_product_attention(
            q, k, v, mask=ops.logical_and(m, ops.less(ops.arange(4), 3))
        ),
    ),
    _case(
        "scaled_dot_product_attention.empty-row",
        [("normal", (1, 2, 2)), ("normal", (1, 3, 2)), ("normal", (1, 3, 2))],
        lambda ops, q, k, v: ops.scaled_dot_product_attention(
            q, k, v, mask=ops.less(ops.arange(3), ops.reshape(ops.arange(2), (2, 1)))
        ),
    ),
    _case("stop_gradient", [("normal", (3, 4))], lambda ops, x: x * ops.stop_gradient(x)),
    # the contract's gradients where a derivative jumps: ties split evenly, 0 at a kink,
    # clip's bounds inclusive, the first maximum of a pooling window
    _on_kinks(
        "maximum.ties",
        [("ties", (3, 4)), ("same:0", (3, 4))],
        lambda ops, x, y: ops.maximum(x, y),
    ),
    _on_kinks(
        "minimum.ties",
        [("ties", (3, 4)), ("same:0", (3, 4))],
        lambda ops, x, y: ops.minimum(x, y),
    ),
    _on_kinks("max.ties", [("ties", (4, 6))], lambda ops, x: ops.max(x, axis=1)),
    _on_kinks("min.ties", [("ties", (4, 6))], lambda ops, x: ops.min(x)),
    _on_kinks("relu.zeros", [("ties", (4, 6))], lambda ops, x: ops.relu(x)),
    _on_kinks("abs.zeros", [("ties", (4, 6))], lambda ops, x: ops.abs(x)),
    _on_kinks("clip.bounds", [("ties", (4, 6))], lambda ops, x: ops.clip(x, -0.5, 0.5)),
    _on_kinks(
        "argmax.ties",
        [("ties", (4, 6)), ("normal", (4, 6))],
        lambda ops, a, x: ops.take_along_axis(x, ops.expand_dims(ops.argmax(a, 1), 1), 1),
    ),
    _on_kinks(
        "max_pool.ties",
        [("ties", (N, 6, 6, C))],
        lambda ops, x: ops.max_pool(x, 3, stride=2, padding=1),
    ),
)
