"""A pure JAX function from a portable description, in ``jax.numpy`` and ``jax.lax``.

The canonical layouts are JAX's own (``x @ W`` with ``W`` ``(in, out)``, ``NHWC`` images
with ``HWIO`` kernels), so the parameters are the canonical tensors in float32 under their
canonical names; each builder returns ``f(params, x)`` for its layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from unitrain.models import (
    GELU,
    GRU,
    LSTM,
    MLP,
    AbstractLayer,
    AvgPool2d,
    BatchNorm,
    Concatenate,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
    Dropout,
    Embedding,
    Flatten,
    GatedMLP,
    GlobalAvgPool,
    GroupNorm,
    Identity,
    Initialized,
    LayerNorm,
    Linear,
    MaxPool2d,
    MultiHeadAttention,
    PositionalEmbedding,
    ReLU,
    Reshape,
    Residual,
    RMSNorm,
    Sequential,
    Sigmoid,
    SiLU,
    SinusoidalPositionalEmbedding,
    Tanh,
    TransformerBlock,
    Upsample,
)
from unitrain.models._base import as_pair
from unitrain.models._sequence import _rotary_tables
from unitrain.native_export._walk import Builder, Walker, join
from unitrain.onnx_export._image import conv_padding

__all__ = ["BUILDERS", "jax_function"]

Apply = Callable[[dict[str, Any], Any], Any]
#: float32 matmuls and convolutions at full precision on every device (TPUs and GPUs would
#: otherwise use bfloat16 or TF32 passes).
_PRECISION = lax.Precision.HIGHEST

_ACTIVATIONS: dict[str, Callable[[Any], Any]] = {
    "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid,
    "silu": jax.nn.silu,
}
_ACTIVATION_LAYERS = {ReLU: "relu", GELU: "gelu", Tanh: "tanh", Sigmoid: "sigmoid", SiLU: "silu"}


def _linear(walker: Walker, layer: Linear, prefix: str) -> Apply:
    weight, bias = join(prefix, "weight"), join(prefix, "bias")

    def apply(p: dict[str, Any], x: Any) -> Any:
        y = jnp.matmul(x, p[weight], precision=_PRECISION)
        return y + p[bias] if layer.bias else y

    return apply


def _activation(walker: Walker, layer: Any, prefix: str) -> Apply:
    function = _ACTIVATIONS[_ACTIVATION_LAYERS[type(layer)]]
    return lambda p, x: function(x)


def _unchanged(walker: Walker, layer: Any, prefix: str) -> Apply:
    return lambda p, x: x  # dropout only acts in training


def _chain(walker: Walker, layer: AbstractLayer, prefix: str) -> Apply:
    parts = [walker.child(layer, prefix, name) for name in layer.child_names()]

    def apply(p: dict[str, Any], x: Any) -> Any:
        for part in parts:
            x = part(p, x)
        return x

    return apply


def _residual(walker: Walker, layer: Residual, prefix: str) -> Apply:
    branch = _chain(walker, layer, prefix)
    return lambda p, x: x + branch(p, x)


def _concatenate(walker: Walker, layer: Concatenate, prefix: str) -> Apply:
    parts = [walker.child(layer, prefix, name) for name in layer.child_names()]
    axis = layer.axis if layer.axis < 0 else layer.axis + 1
    return lambda p, x: jnp.concatenate([part(p, x) for part in parts], axis=axis)


def _gated_mlp(walker: Walker, layer: GatedMLP, prefix: str) -> Apply:
    gate, up, down = (walker.child(layer, prefix, n) for n in ("gate", "up", "down"))
    act = _ACTIVATIONS[layer.activation]
    return lambda p, x: down(p, act(gate(p, x)) * up(p, x))


def _flatten(walker: Walker, layer: Flatten, prefix: str) -> Apply:
    return lambda p, x: jnp.reshape(x, (x.shape[0], -1))


def _reshape(walker: Walker, layer: Reshape, prefix: str) -> Apply:
    return lambda p, x: jnp.reshape(x, (x.shape[0], *layer.shape))


def _conv(walker: Walker, layer: Conv2d | Conv1d, prefix: str) -> Apply:
    numbers = ("NHWC", "HWIO", "NHWC") if layer.rank == 2 else ("NWC", "WIO", "NWC")
    weight, bias = join(prefix, "weight"), join(prefix, "bias")
    # Normalised to one int per spatial axis by the layer.
    stride: Any = layer.stride
    dilation: Any = layer.dilation

    def apply(p: dict[str, Any], x: Any) -> Any:
        y = lax.conv_general_dilated(
            x,
            p[weight],
            window_strides=stride,
            padding=conv_padding(layer, x.shape[1:-1]),
            rhs_dilation=dilation,
            dimension_numbers=numbers,
            feature_group_count=layer.groups,
            precision=_PRECISION,
        )
        return y + p[bias] if layer.bias else y

    return apply


def _conv_transpose(walker: Walker, layer: ConvTranspose2d, prefix: str) -> Apply:
    # torch's transposed convolution as a convolution of the input dilated by the stride,
    # with the kernel flipped and padded by dilation * (kernel - 1) - padding (plus the
    # output padding after).
    weight, bias = join(prefix, "weight"), join(prefix, "bias")
    kernel, stride, padding, extra, dilation = (
        as_pair(getattr(layer, name))
        for name in ("kernel_size", "stride", "padding", "output_padding", "dilation")
    )
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + e)
        for k, p, e, d in zip(kernel, padding, extra, dilation)
    ]

    def apply(p: dict[str, Any], x: Any) -> Any:
        flipped = jnp.transpose(p[weight][::-1, ::-1], (0, 1, 3, 2))  # (kh, kw, in, out)
        y = lax.conv_general_dilated(
            x,
            flipped,
            window_strides=(1, 1),
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=_PRECISION,
        )
        return y + p[bias] if layer.bias else y

    return apply


def _pool(walker: Walker, layer: MaxPool2d | AvgPool2d, prefix: str) -> Apply:
    window = (1, *as_pair(layer.kernel_size), 1)
    strides = (1, *as_pair(layer.stride), 1)
    if isinstance(layer, MaxPool2d):
        return lambda p, x: lax.reduce_window(x, -jnp.inf, lax.max, window, strides, "VALID")
    size = window[1] * window[2]
    return lambda p, x: lax.reduce_window(x, 0.0, lax.add, window, strides, "VALID") / size


def _global_avg_pool(walker: Walker, layer: GlobalAvgPool, prefix: str) -> Apply:
    return lambda p, x: jnp.mean(x, axis=(1, 2))


def _upsample(walker: Walker, layer: Upsample, prefix: str) -> Apply:
    sh, sw = as_pair(layer.scale)
    return lambda p, x: jnp.repeat(jnp.repeat(x, sh, axis=1), sw, axis=2)


def _batch_norm(walker: Walker, layer: BatchNorm, prefix: str) -> Apply:
    names = [join(prefix, n) for n in ("weight", "bias", "running_mean", "running_var")]

    def apply(p: dict[str, Any], x: Any) -> Any:
        weight, bias, mean, var = (p[n] for n in names)
        return (x - mean) * lax.rsqrt(var + layer.eps) * weight + bias

    return apply


def _layer_norm(walker: Walker, layer: LayerNorm, prefix: str) -> Apply:
    weight, bias = join(prefix, "weight"), join(prefix, "bias")
    has_bias = getattr(layer, "bias", True)

    def apply(p: dict[str, Any], x: Any) -> Any:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        y = (x - mean) * lax.rsqrt(var + layer.eps) * p[weight]
        return y + p[bias] if has_bias else y

    return apply


def _rms_norm(walker: Walker, layer: RMSNorm, prefix: str) -> Apply:
    weight = join(prefix, "weight")

    def apply(p: dict[str, Any], x: Any) -> Any:
        mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return x * lax.rsqrt(mean_square + layer.eps) * p[weight]

    return apply


def _group_norm(walker: Walker, layer: GroupNorm, prefix: str) -> Apply:
    weight, bias = join(prefix, "weight"), join(prefix, "bias")

    def apply(p: dict[str, Any], x: Any) -> Any:
        groups = jnp.reshape(x, (*x.shape[:-1], layer.groups, -1))
        axes = (*range(1, x.ndim - 1), x.ndim)  # the positions and the group's channels
        mean = jnp.mean(groups, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(groups - mean), axis=axes, keepdims=True)
        normalised = jnp.reshape((groups - mean) * lax.rsqrt(var + layer.eps), x.shape)
        return normalised * p[weight] + p[bias]

    return apply


def _embedding(walker: Walker, layer: Embedding, prefix: str) -> Apply:
    weight = join(prefix, "weight")
    return lambda p, x: jnp.take(p[weight], x, axis=0)


def _positional(walker: Walker, layer: PositionalEmbedding, prefix: str) -> Apply:
    weight = join(prefix, "weight")
    return lambda p, x: x + p[weight][: x.shape[1]]


def _sinusoidal(walker: Walker, layer: SinusoidalPositionalEmbedding, prefix: str) -> Apply:
    return lambda p, x: x + jnp.asarray(layer.table(x.shape[1]), x.dtype)


def _rotate(y: Any) -> Any:
    """Rotary positions of ``y`` ``(N, H, L, size)`` in the half-split form."""
    length, size = y.shape[-2], y.shape[-1]
    cos, sin = (jnp.asarray(table, y.dtype) for table in _rotary_tables(length, size, 10000.0))
    half = size // 2
    return y * cos + jnp.concatenate([-y[..., half:], y[..., :half]], axis=-1) * sin


def _attention(walker: Walker, layer: MultiHeadAttention, prefix: str) -> Apply:
    projections = {
        part: _linear(walker, Linear(layer.dim, layer.dim, layer.bias), join(prefix, part))
        for part in ("query", "key", "value", "out")
    }

    def apply(p: dict[str, Any], x: Any) -> Any:
        batch, length, _ = x.shape

        def heads_of(part: str) -> Any:  # (N, L, E) -> (N, H, L, Dh)
            y = jnp.reshape(projections[part](p, x), (batch, length, layer.heads, -1))
            return jnp.transpose(y, (0, 2, 1, 3))

        q, k, v = heads_of("query"), heads_of("key"), heads_of("value")
        if layer.rotary:
            q, k = _rotate(q), _rotate(k)
        scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=_PRECISION)
        scores = scores / np.sqrt(layer.head_dim).astype(np.float32)
        if layer.causal:  # position i sees positions j <= i
            scores = jnp.where(jnp.tril(jnp.ones((length, length), bool)), scores, -jnp.inf)
        mixed = jnp.matmul(jax.nn.softmax(scores, axis=-1), v, precision=_PRECISION)
        merged = jnp.reshape(jnp.transpose(mixed, (0, 2, 1, 3)), (batch, length, layer.dim))
        return projections["out"](p, merged)

    return apply


def _transformer_block(walker: Walker, layer: TransformerBlock, prefix: str) -> Apply:
    norm1, attention, norm2, fc1, fc2 = (
        walker.child(layer, prefix, name) for name in ("norm1", "attention", "norm2", "fc1", "fc2")
    )
    act = _ACTIVATIONS[layer.activation]

    def apply(p: dict[str, Any], x: Any) -> Any:
        def feed_forward(h: Any) -> Any:
            return fc2(p, act(fc1(p, h)))

        if layer.norm == "post":
            x = norm1(p, x + attention(p, x))
            return norm2(p, x + feed_forward(x))
        x = x + attention(p, norm1(p, x))
        return x + feed_forward(norm2(p, x))

    return apply


def _recurrent(walker: Walker, layer: LSTM | GRU, prefix: str) -> Apply:
    names = {local: join(prefix, local) for local in layer.param_shapes()}
    state = {local: join(prefix, local) for local in layer.carried}
    hidden = layer.hidden_size

    def lstm_step(p: dict[str, Any], carry: Any, projected: Any) -> Any:
        h, c = carry
        gates = projected + jnp.matmul(h, p[names["weight_hh"]], precision=_PRECISION)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c

    def gru_step(p: dict[str, Any], carry: Any, projected: Any) -> Any:
        (h,) = carry
        recurrent = jnp.matmul(h, p[names["weight_hh"]], precision=_PRECISION)
        x_r, x_z, x_n = jnp.split(projected, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(recurrent + p[names["bias_hh"]], 3, axis=-1)
        r, z = jax.nn.sigmoid(x_r + h_r), jax.nn.sigmoid(x_z + h_z)
        n = jnp.tanh(x_n + r * h_n)
        return ((1 - z) * n + z * h,)

    step = lstm_step if isinstance(layer, LSTM) else gru_step
    input_bias = names["bias"] if isinstance(layer, LSTM) else names["bias_ih"]

    def apply(p: dict[str, Any], x: Any) -> Any:
        projected = jnp.matmul(x, p[names["weight_ih"]], precision=_PRECISION) + p[input_bias]
        if layer.batch_size is None:
            start = tuple(jnp.zeros((x.shape[0], hidden), x.dtype) for _ in layer.carried)
        else:  # a stateful layer starts from its saved state
            start = tuple(p[state[name]] for name in layer.carried)

        def scan_step(carry: Any, position: Any) -> tuple[Any, Any]:
            carry = step(p, carry, position)
            return carry, carry[0]

        last, outputs = lax.scan(scan_step, start, jnp.swapaxes(projected, 0, 1))
        return jnp.swapaxes(outputs, 0, 1) if layer.return_sequences else last[0]

    return apply


BUILDERS: dict[type, Builder] = {
    Linear: _linear,
    **dict.fromkeys(_ACTIVATION_LAYERS, _activation),
    Dropout: _unchanged,
    Identity: _unchanged,
    Flatten: _flatten,
    Reshape: _reshape,
    Sequential: _chain,
    Initialized: _chain,
    MLP: _chain,
    Residual: _residual,
    Concatenate: _concatenate,
    GatedMLP: _gated_mlp,
    Conv2d: _conv,
    Conv1d: _conv,
    ConvTranspose2d: _conv_transpose,
    MaxPool2d: _pool,
    AvgPool2d: _pool,
    GlobalAvgPool: _global_avg_pool,
    Upsample: _upsample,
    BatchNorm: _batch_norm,
    LayerNorm: _layer_norm,
    RMSNorm: _rms_norm,
    GroupNorm: _group_norm,
    Embedding: _embedding,
    PositionalEmbedding: _positional,
    SinusoidalPositionalEmbedding: _sinusoidal,
    MultiHeadAttention: _attention,
    TransformerBlock: _transformer_block,
    LSTM: _recurrent,
    GRU: _recurrent,
}


def jax_function(
    model: AbstractLayer, weights: dict[str, np.ndarray]
) -> tuple[Apply, dict[str, Any]]:
    """``model`` as ``apply(params, x)`` and its float32 ``params`` by canonical name."""
    apply = Walker("jax", BUILDERS, weights).build(model, "")
    params = {name: jnp.asarray(value, jnp.float32) for name, value in sorted(weights.items())}
    return apply, params
