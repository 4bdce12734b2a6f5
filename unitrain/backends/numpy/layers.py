"""Forward and backward of every portable layer, by hand in numpy: the oracle of the kit.

Each layer of a :mod:`unitrain.models` description becomes a node. ``forward(x, run)``
computes the output and keeps what the backward pass needs; ``backward(dy, run)`` adds the
parameter gradients into ``run.grads`` and returns the input gradient. Everything is computed
in the run's dtype (float32 or float64), and meant to be checked by reading it. Under mixed
precision a node computes as usual on operands the container has rounded (``Run.low``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import special

from unitrain import DataError
from unitrain.backends.protocol import as_pair
from unitrain.models import (
    GELU,
    AvgPool2d,
    BatchNorm,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    GlobalAvgPool,
    LayerNorm,
    Linear,
    MaxPool2d,
    PositionalEmbedding,
    ReLU,
    Sigmoid,
    SiLU,
    Tanh,
)

__all__ = ["LEAVES", "Node", "Run"]

_SQRT_2, _SQRT_2PI = np.sqrt(2.0), np.sqrt(2.0 * np.pi)


@dataclasses.dataclass
class Run:
    """What one forward/backward pass reads and writes, shared by every node.

    Attributes:
        params: parameters by canonical name.
        state: model state by canonical name; BatchNorm updates it in train mode.
        grads: gradient buffers by canonical name; backward adds into them.
        train: train mode (dropout on, batch statistics) or eval mode.
        dropout_seed: seeds the dropout masks of this pass; None when nothing drops.
        rounding: under mixed precision, rounds a float32 array to the compute dtype (values
            kept as float32); None computes in the run's dtype throughout.
    """

    params: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]
    train: bool
    dropout_seed: list[int] | None = None
    rounding: Callable[[np.ndarray], np.ndarray] | None = None
    _rng: np.random.Generator | None = None

    def low(self, a: Any) -> Any:
        """``a`` rounded to the compute dtype; unchanged without mixed precision, and for
        what is not a float array (token ids, an Embedding's absent input gradient)."""
        if self.rounding is None or not isinstance(a, np.ndarray) or a.dtype != np.float32:
            return a
        return self.rounding(a)

    def dropout_rng(self) -> np.random.Generator:
        """One generator per pass, drawn by the dropout layers in the order they run."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.dropout_seed)
        return self._rng


class Node:
    """One layer's computation; ``prefix`` is its canonical name (params are ``prefix.x``)."""

    def __init__(self, spec: Any, prefix: str) -> None:
        self.spec, self.prefix = spec, prefix

    def name(self, local: str) -> str:
        """The canonical name of the own parameter or state ``local``."""
        return f"{self.prefix}.{local}" if self.prefix else local

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        """The output; in train mode also keep what backward needs."""
        raise NotImplementedError

    def backward(self, dy: np.ndarray, run: Run) -> Any:
        """Add parameter gradients into ``run.grads``; return the input gradient."""
        raise NotImplementedError


class _LinearNode(Node):
    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.x = x
        return x @ run.params[self.name("weight")] + run.params[self.name("bias")]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        weight = run.params[self.name("weight")]
        run.grads[self.name("weight")] += self.x.reshape(-1, weight.shape[0]).T @ dy.reshape(
            -1, weight.shape[1]
        )
        run.grads[self.name("bias")] += dy.reshape(-1, weight.shape[1]).sum(axis=0)
        return dy @ weight.T


def _windows(x: np.ndarray, spec: Any) -> np.ndarray:
    """Every window of ``spec`` (a conv or pool) over ``x`` (N, H, W, C), as a view
    (N, Ho, Wo, C, kh, kw)."""
    view = sliding_window_view(x, as_pair(spec.kernel_size), axis=(1, 2))
    sh, sw = as_pair(spec.stride)
    return view[:, ::sh, ::sw]


def _scatter_windows(dx: np.ndarray, per_offset: Any, spec: Any) -> None:
    """Add ``per_offset(i, j)`` (N, Ho, Wo, C) into every window's ``(i, j)`` element of dx."""
    (kh, kw), (sh, sw) = as_pair(spec.kernel_size), as_pair(spec.stride)
    for i in range(kh):
        for j in range(kw):
            part = per_offset(i, j)
            rows, cols = part.shape[1], part.shape[2]
            dx[:, i : i + sh * rows : sh, j : j + sw * cols : sw] += part


class _ConvNode(Node):
    spec: Conv2d

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        ph, pw = as_pair(self.spec.padding)
        self.padded_shape = (x.shape[0], x.shape[1] + 2 * ph, x.shape[2] + 2 * pw, x.shape[3])
        padded = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
        self.windows = _windows(padded, self.spec)
        weight = run.params[self.name("weight")]  # (kh, kw, in, out)
        out = np.tensordot(self.windows, weight, axes=([4, 5, 3], [0, 1, 2]))
        return out + run.params[self.name("bias")]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        weight = run.params[self.name("weight")]
        grad = np.tensordot(self.windows, dy, axes=([0, 1, 2], [0, 1, 2]))  # (in, kh, kw, out)
        run.grads[self.name("weight")] += grad.transpose(1, 2, 0, 3)
        run.grads[self.name("bias")] += dy.sum(axis=(0, 1, 2))
        dx = np.zeros(self.padded_shape, dy.dtype)
        _scatter_windows(dx, lambda i, j: dy @ weight[i, j].T, self.spec)
        (ph, pw), (_, height, width, _) = as_pair(self.spec.padding), self.padded_shape
        return dx[:, ph : height - ph, pw : width - pw]


class _MaxPoolNode(Node):
    spec: MaxPool2d

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        windows = _windows(x, self.spec)
        flat = windows.reshape(*windows.shape[:4], -1)
        self.x_shape, self.argmax = x.shape, flat.argmax(axis=-1)  # the first maximum, as torch
        return np.take_along_axis(flat, self.argmax[..., None], axis=-1)[..., 0]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        dx = np.zeros(self.x_shape, dy.dtype)
        kw = as_pair(self.spec.kernel_size)[1]
        _scatter_windows(dx, lambda i, j: dy * (self.argmax == i * kw + j), self.spec)
        return dx


class _AvgPoolNode(Node):
    spec: AvgPool2d

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.x_shape = x.shape
        return _windows(x, self.spec).mean(axis=(-2, -1))

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        dx = np.zeros(self.x_shape, dy.dtype)
        kh, kw = as_pair(self.spec.kernel_size)
        share = dy / dy.dtype.type(kh * kw)
        _scatter_windows(dx, lambda i, j: share, self.spec)
        return dx


class _GlobalAvgPoolNode(Node):
    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.x_shape = x.shape
        return x.mean(axis=(1, 2))

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        _, height, width, _ = self.x_shape
        share = dy[:, None, None, :] / dy.dtype.type(height * width)
        return np.broadcast_to(share, self.x_shape).copy()


class _FlattenNode(Node):
    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.x_shape = x.shape
        return x.reshape(len(x), -1)

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        return dy.reshape(self.x_shape)


class _DropoutNode(Node):
    spec: Dropout

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.mask = None
        if not (run.train and self.spec.p):
            return x
        keep = 1.0 - self.spec.p
        draw = run.dropout_rng().random(x.shape)
        self.mask = (draw < keep).astype(x.dtype) / x.dtype.type(keep)
        return x * self.mask

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        return dy if self.mask is None else dy * self.mask


class _ActivationNode(Node):
    """An elementwise function; the subclass gives ``f(z)`` and ``f'(z)`` from ``z, f(z)``."""

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.z, self.a = x, self.value(x)
        return self.a

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        return dy * self.derivative(self.z, self.a)

    def value(self, z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class _ReLUNode(_ActivationNode):
    def value(self, z: np.ndarray) -> np.ndarray:
        return np.maximum(z, 0)

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return (z > 0).astype(z.dtype)


class _TanhNode(_ActivationNode):
    def value(self, z: np.ndarray) -> np.ndarray:
        return np.tanh(z)

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return 1 - a * a


class _SigmoidNode(_ActivationNode):
    def value(self, z: np.ndarray) -> np.ndarray:
        return special.expit(z)

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        return a * (1 - a)


class _GELUNode(_ActivationNode):
    # The constants in z's dtype: a numpy float64 scalar would turn float32 arrays into
    # float64 ones (NEP 50), and the float32 row would not be float32.
    def value(self, z: np.ndarray) -> np.ndarray:
        return 0.5 * z * (1.0 + special.erf(z / z.dtype.type(_SQRT_2)))  # the exact erf form

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        cdf = 0.5 * (1.0 + special.erf(z / z.dtype.type(_SQRT_2)))
        return cdf + z * np.exp(-0.5 * z * z) / z.dtype.type(_SQRT_2PI)


class _SiLUNode(_ActivationNode):
    def value(self, z: np.ndarray) -> np.ndarray:
        return z * special.expit(z)

    def derivative(self, z: np.ndarray, a: np.ndarray) -> np.ndarray:
        s = special.expit(z)
        return s * (1 + z * (1 - s))


def _normalize_backward(dxhat: np.ndarray, xhat: np.ndarray, inv: np.ndarray, axes: Any) -> Any:
    """The input gradient of ``xhat = (x - mean) * inv`` with mean and biased variance taken
    over ``axes``: ``inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))``."""
    mean_d = dxhat.mean(axis=axes, keepdims=True)
    mean_dx = (dxhat * xhat).mean(axis=axes, keepdims=True)
    return inv * (dxhat - mean_d - xhat * mean_dx)


class _BatchNormNode(Node):
    spec: BatchNorm

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        axes = tuple(range(x.ndim - 1))
        running_mean, running_var = self.name("running_mean"), self.name("running_var")
        if run.train:
            count = x.size // x.shape[-1]
            if count < 2:
                raise DataError(
                    f"BatchNorm({self.spec.num_features}) in train mode needs more than one value "
                    f"per channel, got input shape {x.shape}; use a larger batch"
                )
            mean, var = x.mean(axis=axes), x.var(axis=axes)
            m = x.dtype.type(self.spec.momentum)
            unbiased = var * x.dtype.type(count / (count - 1))
            run.state[running_mean] = (1 - m) * run.state[running_mean] + m * mean
            run.state[running_var] = (1 - m) * run.state[running_var] + m * unbiased
        else:
            mean, var = run.state[running_mean], run.state[running_var]
        self.axes, self.inv = axes, 1 / np.sqrt(var + x.dtype.type(self.spec.eps))
        self.xhat = (x - mean) * self.inv
        return self.xhat * run.params[self.name("weight")] + run.params[self.name("bias")]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        run.grads[self.name("weight")] += (dy * self.xhat).sum(axis=self.axes)
        run.grads[self.name("bias")] += dy.sum(axis=self.axes)
        dxhat = dy * run.params[self.name("weight")]
        return _normalize_backward(dxhat, self.xhat, self.inv, self.axes)


class _LayerNormNode(Node):
    spec: LayerNorm

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
        self.inv = 1 / np.sqrt(var + x.dtype.type(self.spec.eps))
        self.xhat = (x - mean) * self.inv
        return self.xhat * run.params[self.name("weight")] + run.params[self.name("bias")]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        width = dy.shape[-1]
        run.grads[self.name("weight")] += (dy * self.xhat).reshape(-1, width).sum(axis=0)
        run.grads[self.name("bias")] += dy.reshape(-1, width).sum(axis=0)
        dxhat = dy * run.params[self.name("weight")]
        return _normalize_backward(dxhat, self.xhat, self.inv, -1)


class _EmbeddingNode(Node):
    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        self.ids = np.asarray(x)  # range checked up front by the model's check_input
        return run.params[self.name("weight")][self.ids]

    def backward(self, dy: np.ndarray, run: Run) -> None:
        np.add.at(run.grads[self.name("weight")], self.ids, dy)
        return None  # ids have no gradient


class _PositionalNode(Node):
    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        return x + run.params[self.name("weight")][: x.shape[1]]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        run.grads[self.name("weight")][: dy.shape[1]] += dy.sum(axis=0)
        return dy


#: The node of every leaf layer type; composites are built in :mod:`.model`.
LEAVES: dict[type, type[Node]] = {
    Linear: _LinearNode,
    Conv2d: _ConvNode,
    MaxPool2d: _MaxPoolNode,
    AvgPool2d: _AvgPoolNode,
    GlobalAvgPool: _GlobalAvgPoolNode,
    Flatten: _FlattenNode,
    Dropout: _DropoutNode,
    ReLU: _ReLUNode,
    Tanh: _TanhNode,
    Sigmoid: _SigmoidNode,
    GELU: _GELUNode,
    SiLU: _SiLUNode,
    BatchNorm: _BatchNormNode,
    LayerNorm: _LayerNormNode,
    Embedding: _EmbeddingNode,
    PositionalEmbedding: _PositionalNode,
}
