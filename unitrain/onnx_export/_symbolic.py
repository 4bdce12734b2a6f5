"""Symbolic tensors: what a layer's forward computes with while it is traced into ONNX."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from unitrain.onnx_export._tracer import Tracer

__all__ = ["BATCH", "ELEMENT", "BatchSize", "Dims", "Symbolic", "broadcast", "example_shape"]

#: ONNX element types by unitrain dtype; every float is exported as float32.
ELEMENT = {"float": 1, "int64": 7, "bool": 9}


class BatchSize(int):
    """``ops.shape(x)[0]`` of a batched tensor: stands for the free batch axis."""


BATCH = BatchSize(1)

#: A shape with None for the batch axis.
Dims = tuple[int | None, ...]


def broadcast(*shapes: Dims) -> Dims:
    rank = max(len(s) for s in shapes)
    out: list[int | None] = []
    for dims in zip(*((1,) * (rank - len(s)) + tuple(s) for s in shapes)):
        out.append(None if None in dims else max(d for d in dims if d is not None))
    return tuple(out)


class Symbolic:
    """A tensor of the graph while a forward is traced: its name, shape and dtype kind."""

    __array_priority__ = 1000  # numpy arrays defer to these operators

    def __init__(self, tracer: Tracer, name: str, shape: Dims, kind: str = "float") -> None:
        self.tracer, self.name, self.shape, self.kind = tracer, name, shape, kind

    def __add__(self, other: Any) -> Symbolic:
        return self.tracer.add(self, other)

    def __radd__(self, other: Any) -> Symbolic:
        return self.tracer.add(other, self)

    def __sub__(self, other: Any) -> Symbolic:
        return self.tracer.subtract(self, other)

    def __rsub__(self, other: Any) -> Symbolic:
        return self.tracer.subtract(other, self)

    def __mul__(self, other: Any) -> Symbolic:
        return self.tracer.multiply(self, other)

    def __rmul__(self, other: Any) -> Symbolic:
        return self.tracer.multiply(other, self)

    def __truediv__(self, other: Any) -> Symbolic:
        return self.tracer.divide(self, other)

    def __rtruediv__(self, other: Any) -> Symbolic:
        return self.tracer.divide(other, self)

    def __pow__(self, other: Any) -> Symbolic:
        return self.tracer.power(self, other)

    def __matmul__(self, other: Any) -> Symbolic:
        return self.tracer.matmul(self, other)

    def __neg__(self) -> Symbolic:
        return self.tracer.negative(self)

    def __getitem__(self, index: Any) -> Symbolic:
        return self.tracer.index(self, index)


def example_shape(x: Symbolic) -> tuple[int, ...]:
    """The shape of one example of ``x``, a tensor with a batch axis."""
    rest = [d for d in x.shape[1:] if d is not None]
    assert x.shape[:1] == (None,) and len(rest) == len(x.shape) - 1, x.shape
    return tuple(rest)


def swap_last(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]


def kind_of(dtype: np.dtype) -> str:
    return "float" if dtype.kind == "f" else "bool" if dtype.kind == "b" else "int64"


def numpy_dtype(dtype: str | None) -> Any:
    return None if dtype is None else np.float32 if dtype == "bfloat16" else dtype


def as_kind(x: Symbolic, kind: str) -> Symbolic:
    x.kind = kind
    return x
