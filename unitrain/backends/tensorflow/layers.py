"""Portable layers built natively in TensorFlow, as one ``tf.Module`` with canonical names.

:class:`TFPortable` holds a model's parameters (trainable ``tf.Variable``) and state
(non-trainable, e.g. BatchNorm statistics) under the canonical names, in the canonical
layouts, which are TensorFlow's own: images NHWC, conv filters HWIO, dense weights
``(in, out)``. Calling it in training mode assigns the moved BatchNorm statistics, as
torch's forward does; eval mode reads them and changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from unitrain import ConfigError
from unitrain.backends.protocol import as_pair
from unitrain.models import (
    GELU,
    MLP,
    AbstractLayer,
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
    MultiHeadAttention,
    PositionalEmbedding,
    ReLU,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Tanh,
    TransformerBlock,
)

__all__ = ["TFPortable"]

#: Philox on every device, so a mask does not depend on where it was drawn.
_RNG_ALGORITHM = "philox"


@dataclasses.dataclass
class _Pass:
    """What one forward pass reads: variables, mode, the dropout key and a counter."""

    variables: dict[str, Any]
    training: bool
    key: Any
    drops: int = 0

    def next_key(self) -> tf.Tensor:
        """A fresh key for the next Dropout, in the order the layers run."""
        self.drops += 1
        return tf.random.experimental.stateless_fold_in(self.key, self.drops, alg=_RNG_ALGORITHM)


Layer = Callable[[tf.Tensor, _Pass], tf.Tensor]


def _name(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _gelu(x: tf.Tensor) -> tf.Tensor:
    # The exact erf form written out: tf.nn.gelu(approximate=False) is only ~1e-9 accurate in
    # float64 (see tensorflow/model.py).
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def _linear(spec: Linear, prefix: str) -> Layer:
    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        weight, bias = p.variables[_name(prefix, "weight")], p.variables[_name(prefix, "bias")]
        if len(x.shape) == 2:
            return tf.matmul(x, weight) + bias
        return tf.tensordot(x, weight, axes=1) + bias

    return run


def _conv(spec: Conv2d, prefix: str) -> Layer:
    (ph, pw), (sh, sw) = as_pair(spec.padding), as_pair(spec.stride)
    padding = [[0, 0], [ph, ph], [pw, pw], [0, 0]]

    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        kernel = p.variables[_name(prefix, "weight")]
        out = tf.nn.conv2d(x, kernel, strides=[1, sh, sw, 1], padding=padding)
        return out + p.variables[_name(prefix, "bias")]

    return run


def _pool(spec: MaxPool2d | AvgPool2d, prefix: str) -> Layer:
    kernel, stride = as_pair(spec.kernel_size), as_pair(spec.stride)
    pool = tf.nn.max_pool2d if isinstance(spec, MaxPool2d) else tf.nn.avg_pool2d
    return lambda x, p: pool(x, ksize=kernel, strides=stride, padding="VALID")


def _function(function: Callable[[tf.Tensor], tf.Tensor]) -> Callable[[Any, str], Layer]:
    return lambda spec, prefix: lambda x, p: function(x)


def _dropout(spec: Dropout, prefix: str) -> Layer:
    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        if not (p.training and spec.p and p.key is not None):
            return x
        keep = tf.constant(1.0 - spec.p, x.dtype)
        draw = tf.random.stateless_uniform(
            tf.shape(x), seed=p.next_key(), dtype=x.dtype, alg=_RNG_ALGORITHM
        )
        return x * (tf.cast(draw < keep, x.dtype) / keep)

    return run


def _normalize(x: tf.Tensor, mean: Any, var: Any, eps: float) -> tf.Tensor:
    return (x - mean) * tf.math.rsqrt(var + tf.constant(eps, x.dtype))


def _moments(x: tf.Tensor, axes: list[int], keepdims: bool = False) -> tuple[Any, Any]:
    """Mean and biased variance over ``axes``, accurate in float32.

    TensorFlow's CPU ``reduce_mean`` adds in float32 with an error that grows with the count
    (``tf.nn.moments`` too): over a 32x8x8 batch whose channel mean is 10 its mean is off by
    4e-5 of the channel's spread, which moved a ResNet 1e-3 away from the reference within
    ten updates. The mean of the residuals ``x - mean`` corrects it (those are small, so
    their sum's error is too); the variance is then taken around the corrected mean.
    """
    mean = tf.reduce_mean(x, axes, keepdims=True)
    mean += tf.reduce_mean(x - mean, axes, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axes, keepdims=keepdims)
    return (mean if keepdims else tf.squeeze(mean, axes)), var


def _wide(x: tf.Tensor) -> tf.Tensor:
    """``x`` in float32 when it is bfloat16/float16 (under mixed precision), else unchanged.

    Normalisation layers reduce in it and hand their output on in ``x``'s own dtype, as
    torch's autocast, Keras and Flax do: statistics taken in bfloat16 lose digits that
    the running averages keep.
    """
    return tf.cast(x, tf.float32) if x.dtype in (tf.bfloat16, tf.float16) else x


def _scale_shift(prefix: str, xhat: tf.Tensor, p: _Pass, low: tf.DType) -> tf.Tensor:
    """``xhat * weight + bias`` in ``xhat``'s dtype, handed on in the input's dtype ``low``."""
    weight = tf.cast(p.variables[_name(prefix, "weight")], xhat.dtype)
    return tf.cast(xhat * weight + tf.cast(p.variables[_name(prefix, "bias")], xhat.dtype), low)


def _batch_norm(spec: BatchNorm, prefix: str) -> Layer:
    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        low, x = x.dtype, _wide(x)
        running_mean = p.variables[_name(prefix, "running_mean")]
        running_var = p.variables[_name(prefix, "running_var")]
        if p.training:
            axes = list(range(len(x.shape) - 1))
            mean, var = _moments(x, axes)  # biased variance, to normalise
            kept = running_mean.dtype  # the state's: float32 also under mixed precision
            count = tf.cast(tf.size(x) // tf.shape(x)[-1], kept)
            m = tf.constant(spec.momentum, kept)
            running_mean.assign((1 - m) * running_mean + m * tf.cast(mean, kept))
            running_var.assign((1 - m) * running_var + m * tf.cast(var, kept) * count / (count - 1))
        else:
            mean, var = tf.cast(running_mean, x.dtype), tf.cast(running_var, x.dtype)
        return _scale_shift(prefix, _normalize(x, mean, var, spec.eps), p, low)

    return run


def _layer_norm(spec: LayerNorm, prefix: str) -> Layer:
    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        low, x = x.dtype, _wide(x)
        mean, var = _moments(x, [-1], keepdims=True)
        return _scale_shift(prefix, _normalize(x, mean, var, spec.eps), p, low)

    return run


def _embedding(spec: Embedding, prefix: str) -> Layer:
    return lambda x, p: tf.gather(p.variables[_name(prefix, "weight")], x)


def _positional(spec: PositionalEmbedding, prefix: str) -> Layer:
    return lambda x, p: x + p.variables[_name(prefix, "weight")][: tf.shape(x)[1]]


def _attention(spec: MultiHeadAttention, prefix: str) -> Layer:
    heads, head_dim = spec.heads, spec.head_dim

    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        n, length = tf.shape(x)[0], tf.shape(x)[1]

        def project(part: str) -> tf.Tensor:  # (N, L, E) -> (N, H, L, Dh)
            y = tf.tensordot(x, p.variables[_name(prefix, f"{part}.weight")], axes=1)
            y = y + p.variables[_name(prefix, f"{part}.bias")]
            return tf.transpose(tf.reshape(y, [n, length, heads, head_dim]), [0, 2, 1, 3])

        q, k, v = project("query"), project("key"), project("value")
        scores = tf.einsum("nhqd,nhkd->nhqk", q, k) / tf.constant(math.sqrt(head_dim), x.dtype)
        if spec.causal:
            allowed = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
            scores = tf.where(allowed, scores, tf.constant(-math.inf, x.dtype))
        weights = tf.nn.softmax(scores, axis=-1)
        mixed = tf.transpose(tf.einsum("nhqk,nhkd->nhqd", weights, v), [0, 2, 1, 3])
        mixed = tf.reshape(mixed, [n, length, spec.dim])
        out = tf.tensordot(mixed, p.variables[_name(prefix, "out.weight")], axes=1)
        return out + p.variables[_name(prefix, "out.bias")]

    return run


def _children(spec: AbstractLayer, prefix: str) -> list[Layer]:
    return [_build(child, _name(prefix, name)) for name, child in spec.children()]


def _chain(spec: AbstractLayer, prefix: str) -> Layer:
    layers = _children(spec, prefix)

    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        for layer in layers:
            x = layer(x, p)
        return x

    return run


def _residual(spec: Residual, prefix: str) -> Layer:
    branch = _chain(spec, prefix)
    return lambda x, p: x + branch(x, p)


def _block(spec: TransformerBlock, prefix: str) -> Layer:
    norm1, attention, norm2, fc1, fc2 = _children(spec, prefix)
    drop = _dropout(Dropout(spec.dropout), prefix)

    def run(x: tf.Tensor, p: _Pass) -> tf.Tensor:
        x = x + drop(attention(norm1(x, p), p), p)
        return x + drop(fc2(_gelu(fc1(norm2(x, p), p)), p), p)

    return run


#: How each layer type is built.
_BUILDERS: dict[type, Callable[[Any, str], Layer]] = {
    Linear: _linear,
    Conv2d: _conv,
    MaxPool2d: _pool,
    AvgPool2d: _pool,
    GlobalAvgPool: _function(lambda x: tf.reduce_mean(x, axis=[1, 2])),
    Flatten: _function(lambda x: tf.reshape(x, [tf.shape(x)[0], -1])),
    ReLU: _function(tf.nn.relu),
    GELU: _function(_gelu),
    Tanh: _function(tf.tanh),
    Sigmoid: _function(tf.sigmoid),
    SiLU: _function(tf.nn.silu),
    Dropout: _dropout,
    BatchNorm: _batch_norm,
    LayerNorm: _layer_norm,
    Embedding: _embedding,
    PositionalEmbedding: _positional,
    MultiHeadAttention: _attention,
    Sequential: _chain,
    MLP: _chain,
    Residual: _residual,
    TransformerBlock: _block,
}


def _build(spec: AbstractLayer, prefix: str) -> Layer:
    builder = _BUILDERS.get(type(spec))
    if builder is None:
        raise ConfigError(f"the tensorflow backend has no implementation of {type(spec).__name__}")
    return builder(spec, prefix)


class TFPortable(tf.Module):
    """A portable model as a ``tf.Module`` with canonical variable names.

    Args:
        spec: the architecture.
        params: initial parameters under canonical names (``spec.init_params(seed)``).
        state: initial state under canonical names (``spec.init_state()``).
        dtype: the parameter dtype.
        compute_dtype: under mixed precision, the dtype the parameters are read in (the caller
            casts the inputs); None computes in ``dtype``.
    """

    def __init__(
        self,
        spec: AbstractLayer,
        params: dict[str, Any],
        state: dict[str, Any],
        dtype: tf.DType,
        compute_dtype: tf.DType | None = None,
    ) -> None:
        super().__init__(name="portable")
        self.spec, self.compute_dtype = spec, compute_dtype
        self.params = {k: tf.Variable(v, dtype=dtype, name=k) for k, v in params.items()}
        self.state = {
            k: tf.Variable(v, dtype=dtype, trainable=False, name=k) for k, v in state.items()
        }
        self._network = _build(spec, "")

    def named_variables(self) -> dict[str, tf.Variable]:
        """Parameters under canonical names, in ``spec.param_shapes()`` order."""
        return dict(self.params)

    def named_state(self) -> dict[str, tf.Variable]:
        """Model state (non-trainable) under canonical names."""
        return dict(self.state)

    def __call__(self, x: tf.Tensor, training: bool = False, key: tf.Tensor | None = None) -> Any:
        """Outputs of ``x``; training mode moves BatchNorm statistics and, with a ``key``,
        drops values out."""
        params: dict[str, Any] = self.params
        if self.compute_dtype is not None:
            # The float32 master variables read in the compute dtype; their gradients come
            # back in float32 through the cast. The state stays float32 (see BatchNorm).
            params = {k: tf.cast(v, self.compute_dtype) for k, v in params.items()}
        return self._network(x, _Pass(params | self.state, training, key))
