"""The ops module of a traced forward: each op of :mod:`unitrain.ops` as ONNX nodes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from unitrain._errors import ConfigError
from unitrain.models import AbstractLayer
from unitrain.onnx_export._dense import activation
from unitrain.onnx_export._graph import Graph, Value
from unitrain.onnx_export._symbolic import (
    BATCH,
    ELEMENT,
    BatchSize,
    Dims,
    Symbolic,
    as_kind,
    broadcast,
    kind_of,
    numpy_dtype,
    swap_last,
)
from unitrain.onnx_export._tracer_image import ImageOps

__all__ = ["Tracer"]


class Tracer(ImageOps):
    """The ops module while a layer's forward is traced: one method per mapped op."""

    def __init__(self, graph: Graph, layer: AbstractLayer, prefix: str) -> None:
        self.graph, self.layer, self.prefix = graph, layer, prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ConfigError(
            f"export_onnx: {type(self.layer).__name__} (at {self.prefix or 'the top'}) uses "
            f"unitrain.ops.{name}, which has no ONNX mapping; write the layer with the ops "
            "that have one (docs/export.md lists them) or compose it from built-in layers"
        )

    # -- making tensors --------------------------------------------------------------------

    def _new(
        self,
        op_type: str,
        inputs: Sequence[Any],
        shape: Dims,
        kind: str = "float",
        **attributes: Any,
    ) -> Symbolic:
        names = [self.tensor(i).name if not isinstance(i, str) else i for i in inputs]
        return Symbolic(self, self.graph.op(op_type, names, self.prefix, **attributes), shape, kind)

    def tensor(self, value: Any, like: Symbolic | None = None) -> Symbolic:
        """``value`` as a Symbolic: itself, or a constant of ``like``'s kind."""
        if isinstance(value, Symbolic):
            return value
        array = np.asarray(value)
        kind = like.kind if like is not None and array.ndim == 0 else kind_of(array.dtype)
        array = array.astype({"float": np.float32, "int64": np.int64, "bool": bool}[kind])
        name = self.graph.constant(array, self.graph.name_for(self.prefix, "constant"))
        return Symbolic(self, name, array.shape, kind)

    def _pair(self, x: Any, y: Any) -> tuple[Symbolic, Symbolic]:
        first = x if isinstance(x, Symbolic) else None
        second = y if isinstance(y, Symbolic) else None
        return self.tensor(x, second), self.tensor(y, first)

    def _binary(self, op_type: str, x: Any, y: Any) -> Symbolic:
        a, b = self._pair(x, y)
        return self._new(op_type, [a, b], broadcast(a.shape, b.shape), a.kind)

    def _unary(self, op_type: str, x: Any) -> Symbolic:
        x = self.tensor(x)
        return self._new(op_type, [x], x.shape, x.kind)

    # -- about arrays ----------------------------------------------------------------------

    def shape(self, x: Symbolic) -> tuple[int, ...]:
        return tuple(BATCH if d is None else d for d in self.tensor(x).shape)

    def dtype(self, x: Symbolic) -> str:
        return {"float": "float32", "int64": "int64", "bool": "bool"}[self.tensor(x).kind]

    def asarray(self, x: Any, dtype: str | None = None) -> Symbolic:
        return x if isinstance(x, Symbolic) else self.tensor(np.asarray(x, numpy_dtype(dtype)))

    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Symbolic:
        return self.full(shape, 0, dtype)

    def ones(self, shape: Sequence[int], dtype: str = "float32") -> Symbolic:
        return self.full(shape, 1, dtype)

    def full(self, shape: Sequence[int], value: float, dtype: str = "float32") -> Symbolic:
        if any(isinstance(d, BatchSize) for d in shape):
            raise self._refuse("full", "an array the size of the batch")
        return self.tensor(np.full(tuple(shape), value, numpy_dtype(dtype)))

    def cast(self, x: Any, dtype: str) -> Symbolic:
        x, kind = self.tensor(x), kind_of(np.dtype(numpy_dtype(dtype)))
        return x if kind == x.kind else self._new("Cast", [x], x.shape, kind, to=ELEMENT[kind])

    def stop_gradient(self, x: Any) -> Symbolic:
        return self.tensor(x)  # no gradients in an exported graph

    # -- elementwise -----------------------------------------------------------------------

    def add(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Add", x, y)

    def subtract(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Sub", x, y)

    def multiply(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Mul", x, y)

    def divide(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Div", x, y)

    def power(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Pow", x, y)

    def maximum(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Max", x, y)

    def minimum(self, x: Any, y: Any) -> Symbolic:
        return self._binary("Min", x, y)

    def equal(self, x: Any, y: Any) -> Symbolic:
        return as_kind(self._binary("Equal", x, y), "bool")

    def less(self, x: Any, y: Any) -> Symbolic:
        return as_kind(self._binary("Less", x, y), "bool")

    def greater(self, x: Any, y: Any) -> Symbolic:
        return as_kind(self._binary("Greater", x, y), "bool")

    def where(self, condition: Any, x: Any, y: Any) -> Symbolic:
        a, b = self._pair(x, y)
        c = self.tensor(condition)
        return self._new("Where", [c, a, b], broadcast(c.shape, a.shape, b.shape), a.kind)

    def clip(self, x: Any, low: float, high: float) -> Symbolic:
        x = self.tensor(x)
        return self._new("Clip", [x, self.tensor(low, x), self.tensor(high, x)], x.shape)

    def negative(self, x: Any) -> Symbolic:
        return self._unary("Neg", x)

    def abs(self, x: Any) -> Symbolic:
        return self._unary("Abs", x)

    def sign(self, x: Any) -> Symbolic:
        return self._unary("Sign", x)

    def exp(self, x: Any) -> Symbolic:
        return self._unary("Exp", x)

    def log(self, x: Any) -> Symbolic:
        return self._unary("Log", x)

    def sqrt(self, x: Any) -> Symbolic:
        return self._unary("Sqrt", x)

    def rsqrt(self, x: Any) -> Symbolic:
        return self._unary("Reciprocal", self.sqrt(x))

    def square(self, x: Any) -> Symbolic:
        return self.multiply(x, x)

    def sin(self, x: Any) -> Symbolic:
        return self._unary("Sin", x)

    def cos(self, x: Any) -> Symbolic:
        return self._unary("Cos", x)

    def tanh(self, x: Any) -> Symbolic:
        return self._unary("Tanh", x)

    def erf(self, x: Any) -> Symbolic:
        return self._unary("Erf", x)

    def sigmoid(self, x: Any) -> Symbolic:
        return self._unary("Sigmoid", x)

    def relu(self, x: Any) -> Symbolic:
        return self._unary("Relu", x)

    def softplus(self, x: Any) -> Symbolic:
        return self._unary("Softplus", x)

    def silu(self, x: Any) -> Symbolic:
        return self._activation("silu", x)

    def gelu(self, x: Any, approximate: bool = False) -> Symbolic:
        if approximate:
            raise self._refuse("gelu", "approximate=True")
        return self._activation("gelu", x)

    def _activation(self, name: str, x: Any) -> Symbolic:
        x = self.tensor(x)
        y = activation(self.graph, name, self.prefix, Value(x.name, ()))
        return Symbolic(self, y.name, x.shape)

    # -- reductions ------------------------------------------------------------------------

    def _reduce(self, op_type: str, x: Any, axis: Any, keepdims: bool) -> Symbolic:
        x = self.tensor(x)
        rank = len(x.shape)
        axes = range(rank) if axis is None else (axis,) if isinstance(axis, int) else axis
        axes = sorted(a % rank for a in axes)
        shape = tuple((1 if keepdims else -1) if i in axes else d for i, d in enumerate(x.shape))
        shape = tuple(d for d in shape if d != -1)
        axes_name = self.graph.ints(axes, self.prefix)
        return self._new(op_type, [x, axes_name], shape, x.kind, keepdims=int(keepdims))

    def sum(self, x: Any, axis: Any = None, keepdims: bool = False) -> Symbolic:
        return self._reduce("ReduceSum", x, axis, keepdims)

    def mean(self, x: Any, axis: Any = None, keepdims: bool = False) -> Symbolic:
        return self._reduce("ReduceMean", x, axis, keepdims)

    def max(self, x: Any, axis: Any = None, keepdims: bool = False) -> Symbolic:
        return self._reduce("ReduceMax", x, axis, keepdims)

    def min(self, x: Any, axis: Any = None, keepdims: bool = False) -> Symbolic:
        return self._reduce("ReduceMin", x, axis, keepdims)

    def moments(self, x: Any, axis: Any, keepdims: bool = False) -> tuple[Symbolic, Symbolic]:
        mean = self.mean(x, axis, keepdims=True)
        centred = self.subtract(x, mean)
        variance = self.mean(self.multiply(centred, centred), axis, keepdims)
        return (mean if keepdims else self.mean(x, axis)), variance

    def softmax(self, x: Any, axis: int = -1) -> Symbolic:
        return self._unary_attributes("Softmax", x, axis=axis)

    def log_softmax(self, x: Any, axis: int = -1) -> Symbolic:
        return self._unary_attributes("LogSoftmax", x, axis=axis)

    def _unary_attributes(self, op_type: str, x: Any, **attributes: Any) -> Symbolic:
        x = self.tensor(x)
        return self._new(op_type, [x], x.shape, x.kind, **attributes)

    # -- linear algebra --------------------------------------------------------------------

    def matmul(self, x: Any, y: Any) -> Symbolic:
        a, b = self.tensor(x), self.tensor(y)
        shape: Dims
        if len(b.shape) == 1:
            shape = a.shape[:-1]
        elif len(a.shape) == 1:
            shape = (*b.shape[:-2], b.shape[-1])
        else:
            shape = (*broadcast(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        return self._new("MatMul", [a, b], shape)

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Symbolic:
        y = self.matmul(x, weight)
        return y if bias is None else self.add(y, bias)

    def scaled_dot_product_attention(
        self,
        query: Any,
        key: Any,
        value: Any,
        mask: Any = None,
        causal: bool = False,
        scale: float | None = None,
    ) -> Symbolic:
        q, k = self.tensor(query), self.tensor(key)
        length, size = q.shape[-2], k.shape[-2]
        if length is None or size is None or q.shape[-1] is None:
            raise self._refuse("scaled_dot_product_attention", "the batch axis as a sequence")
        factor = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = self.multiply(self.matmul(q, self.transpose(k, swap_last(len(k.shape)))), factor)
        if causal:
            mask = np.tril(np.ones((length, size), bool))
        if mask is not None:
            scores = self.where(mask, scores, -np.inf)
        return self.matmul(self.softmax(scores, axis=-1), value)

    def take(self, x: Any, indices: Any, axis: int = 0) -> Symbolic:
        x, ids = self.tensor(x), self.cast(indices, "int64")
        axis %= len(x.shape)
        shape = (*x.shape[:axis], *ids.shape, *x.shape[axis + 1 :])
        return self._new("Gather", [x, ids], shape, x.kind, axis=axis)

    def broadcast_to(self, x: Any, shape: Sequence[int]) -> Symbolic:
        x = self.tensor(x)
        target = [1 if isinstance(d, BatchSize) else int(d) for d in shape]
        out = tuple(None if isinstance(d, BatchSize) else int(d) for d in shape)
        return self._new("Expand", [x, self.graph.ints(target, self.prefix)], out, x.kind)

    def layer_norm(self, x: Any, weight: Any, bias: Any, eps: float = 1e-5) -> Symbolic:
        x = self.tensor(x)
        inputs = [x, self.tensor(weight), self.tensor(bias)]
        return self._new("LayerNormalization", inputs, x.shape, axis=-1, epsilon=float(eps))

    # -- shapes ----------------------------------------------------------------------------

    def reshape(self, x: Any, shape: Sequence[int]) -> Symbolic:
        x, target = self.tensor(x), [int(d) if not isinstance(d, BatchSize) else d for d in shape]
        if x.shape and x.shape[0] is None:
            head = target[0]
            if not (isinstance(head, BatchSize) or (head == -1 and -1 not in target[1:])):
                raise self._refuse("reshape", f"a new batch axis ({tuple(shape)})")
            rest = target[1:]
            size = math.prod(d for d in x.shape[1:] if d is not None)
            known = math.prod(d for d in rest if d != -1)
            rest = [size // known if d == -1 else d for d in rest]
            out: Dims = (None, *rest)
            target = [-1, *rest]
        else:
            out = tuple(np.empty(x.shape).reshape(target).shape) if x.shape else tuple(target)
        return self._new("Reshape", [x, self.graph.ints(target, self.prefix)], out, x.kind)

    def transpose(self, x: Any, axes: Sequence[int] | None = None) -> Symbolic:
        x = self.tensor(x)
        perm = (
            list(reversed(range(len(x.shape))))
            if axes is None
            else [a % len(x.shape) for a in axes]
        )
        return self._new("Transpose", [x], tuple(x.shape[a] for a in perm), x.kind, perm=perm)

    def expand_dims(self, x: Any, axis: int) -> Symbolic:
        x = self.tensor(x)
        axis = axis % (len(x.shape) + 1)
        shape = (*x.shape[:axis], 1, *x.shape[axis:])
        return self._new("Unsqueeze", [x, self.graph.ints((axis,), self.prefix)], shape, x.kind)

    def squeeze(self, x: Any, axis: int | tuple[int, ...]) -> Symbolic:
        x = self.tensor(x)
        axes = sorted(a % len(x.shape) for a in ((axis,) if isinstance(axis, int) else axis))
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return self._new("Squeeze", [x, self.graph.ints(axes, self.prefix)], shape, x.kind)

    def concat(self, arrays: Sequence[Any], axis: int = 0) -> Symbolic:
        parts = [self.tensor(a) for a in arrays]
        rank = len(parts[0].shape)
        axis %= rank
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] or 0 for p in parts)
        return self._new("Concat", parts, tuple(shape), parts[0].kind, axis=axis)

    def index(self, x: Symbolic, index: Any) -> Symbolic:
        """Basic indexing: ints, slices, None and one ``...``."""
        items = list(index) if isinstance(index, tuple) else [index]
        if Ellipsis in items:
            at = items.index(Ellipsis)
            fill = len(x.shape) - (len(items) - 1 - items.count(None))
            items[at : at + 1] = [slice(None)] * fill
        cuts: list[tuple[int, int, int, int]] = []  # (axis, start, stop, step) of each Slice
        dropped: list[int] = []
        added: list[int] = []
        shape: list[int | None] = []
        axis = 0
        for item in items:
            if item is None:
                added.append(len(shape))
                shape.append(1)
                continue
            size = x.shape[axis]
            if isinstance(item, slice) and item == slice(None):
                shape.append(size)
            elif size is None:
                raise self._refuse("indexing", "the batch axis (index it with : only)")
            elif isinstance(item, slice):
                start, stop, step = item.indices(size)
                # A stop of -1 (stepping down to the start) means "the last" to ONNX.
                cuts.append((axis, start, stop if stop >= 0 else -size - 1, step))
                shape.append(len(range(start, stop, step)))
            else:
                position = int(item) % size
                cuts.append((axis, position, position + 1, 1))
                dropped.append(axis)
            axis += 1
        shape += x.shape[axis:]
        y = x
        if cuts:
            columns = [self.graph.ints(column, self.prefix) for column in zip(*cuts)]
            y = self._new("Slice", [x, columns[1], columns[2], columns[0], columns[3]], x.shape)
        if dropped:
            y = self._new("Squeeze", [y, self.graph.ints(dropped, self.prefix)], y.shape)
        if added:
            y = self._new("Unsqueeze", [y, self.graph.ints(added, self.prefix)], y.shape)
        return Symbolic(self, y.name, tuple(shape), x.kind)

    def _refuse(self, op: str, what: str) -> ConfigError:
        return ConfigError(
            f"export_onnx: {type(self.layer).__name__} (at {self.prefix or 'the top'}) uses "
            f"unitrain.ops.{op} on {what}, which an ONNX graph with a free batch axis cannot "
            "hold; keep the batch axis as it is (reshape with -1 or ops.shape(x)[0] first)"
        )
