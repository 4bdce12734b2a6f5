"""Convolution, transposed convolution and pooling ops of a traced forward, channels last.

ONNX's ``Conv``, ``ConvTranspose``, ``MaxPool`` and ``AveragePool`` read channels first:
the input is transposed in and the output back, and the kernel into ONNX's layout (``conv``:
``(*window, in / groups, out)`` to ``(out, in / groups, *window)``), so a layer of your own
that calls ``ops.conv`` exports as the built-in Conv2d does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unitrain.onnx_export._image import same_padding
from unitrain.onnx_export._symbolic import Dims, Symbolic

if TYPE_CHECKING:
    from unitrain.onnx_export._graph import Graph

__all__ = ["ImageOps"]


def _per_axis(value: Any, rank: int) -> list[int]:
    return [int(n) for n in value] if isinstance(value, (tuple, list)) else [int(value)] * rank


class ImageOps:
    """``conv``, ``conv_transpose``, ``max_pool`` and ``avg_pool`` for the Tracer."""

    graph: Graph
    prefix: str

    # Provided by the Tracer this is mixed into.
    def tensor(self, value: Any, like: Symbolic | None = None) -> Symbolic:
        raise NotImplementedError

    def _new(
        self, op_type: str, inputs: Any, shape: Dims, kind: str = "float", **attributes: Any
    ) -> Symbolic:
        raise NotImplementedError

    def _window_op(
        self,
        op_type: str,
        x: Symbolic,
        window: list[int],
        stride: list[int],
        padding: Any,
        dilation: list[int],
        extra: list[Symbolic],
        channels: int | None,
        **attributes: Any,
    ) -> Symbolic:
        rank = len(window)
        spatial = [int(n or 0) for n in x.shape[1:-1]]
        if padding == "same":
            pairs = [same_padding(*axis) for axis in zip(spatial, window, stride, dilation)]
        else:
            sizes = [0] * rank if padding == "valid" else _per_axis(padding, rank)
            pairs = [(p, p) for p in sizes]
        first = self._new("Transpose", [x], x.shape, perm=[0, rank + 1, *range(1, rank + 1)])
        y = self._new(
            op_type,
            [first, *extra],
            x.shape,
            kernel_shape=window,
            strides=stride,
            pads=[before for before, _ in pairs] + [after for _, after in pairs],
            **attributes,
        )
        out = [
            (size + before + after - d * (k - 1) - 1) // s + 1
            for size, (before, after), k, s, d in zip(spatial, pairs, window, stride, dilation)
        ]
        shape = (None, *out, channels if channels is not None else x.shape[-1])
        return self._new("Transpose", [y], shape, perm=[0, *range(2, rank + 2), 1])

    def conv(
        self,
        x: Any,
        kernel: Any,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        bias: Any = None,
    ) -> Symbolic:
        x, kernel = self.tensor(x), self.tensor(kernel)
        rank = len(x.shape) - 2
        window = [int(n or 0) for n in kernel.shape[:rank]]
        weight = self._new("Transpose", [kernel], kernel.shape, perm=[rank + 1, rank, *range(rank)])
        extra = [weight] + ([] if bias is None else [self.tensor(bias)])
        dilations = _per_axis(dilation, rank)
        return self._window_op(
            "Conv",
            x,
            window,
            _per_axis(stride, rank),
            padding,
            dilations,
            extra,
            kernel.shape[-1],
            dilations=dilations,
            group=int(groups),
        )

    def conv_transpose(
        self,
        x: Any,
        kernel: Any,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        dilation: Any = 1,
    ) -> Symbolic:
        x, kernel = self.tensor(x), self.tensor(kernel)
        rank = len(x.shape) - 2
        window = [int(n or 0) for n in kernel.shape[:rank]]
        settings = (stride, padding, output_padding, dilation)
        strides, pads, extra, dilations = (_per_axis(value, rank) for value in settings)
        # (*window, out, in) -> ONNX's (in, out, *window)
        weight = self._new("Transpose", [kernel], kernel.shape, perm=[rank + 1, rank, *range(rank)])
        first = self._new("Transpose", [x], x.shape, perm=[0, rank + 1, *range(1, rank + 1)])
        y = self._new(
            "ConvTranspose",
            [first, weight],
            x.shape,
            kernel_shape=window,
            strides=strides,
            pads=pads + pads,
            output_padding=extra,
            dilations=dilations,
        )
        out = [
            (int(size or 0) - 1) * s - 2 * p + d * (k - 1) + o + 1
            for size, s, p, d, k, o in zip(x.shape[1:-1], strides, pads, dilations, window, extra)
        ]
        shape = (None, *out, kernel.shape[rank])
        return self._new("Transpose", [y], shape, perm=[0, *range(2, rank + 2), 1])

    def max_pool(self, x: Any, window: Any, stride: Any = None, padding: Any = 0) -> Symbolic:
        return self._pool("MaxPool", x, window, stride, padding)

    def avg_pool(self, x: Any, window: Any, stride: Any = None, padding: Any = 0) -> Symbolic:
        # Padded positions are left out of the count, ONNX's count_include_pad=0.
        return self._pool("AveragePool", x, window, stride, padding)

    def _pool(self, op_type: str, x: Any, window: Any, stride: Any, padding: Any) -> Symbolic:
        x = self.tensor(x)
        rank = len(x.shape) - 2
        windows = _per_axis(window, rank)
        strides = windows if stride is None else _per_axis(stride, rank)
        ones = [1] * rank
        return self._window_op(op_type, x, windows, strides, padding, ones, [], None)
