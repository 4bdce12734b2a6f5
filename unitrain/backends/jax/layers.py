"""Portable layers built natively in JAX: one pure function per model, canonical names.

:func:`layers_apply` turns a :mod:`unitrain.models` description into
``apply(params, state, x, *, train, rng) -> (outputs, new_state)`` over flat dicts keyed by
the canonical names. The canonical layouts are JAX's own: images NHWC, conv kernels HWIO,
dense weights ``(in, out)``, so nothing is transposed. Train mode returns the BatchNorm
statistics moved by the batch; eval mode returns the state unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

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

__all__ = ["layers_apply"]


@dataclasses.dataclass
class _Pass:
    """What one traced forward pass reads and writes."""

    params: dict[str, jax.Array]
    state: dict[str, jax.Array]
    new_state: dict[str, jax.Array]
    train: bool
    rng: Any
    drops: int = 0

    def next_key(self) -> jax.Array:
        """A fresh key for the next Dropout, in the order the layers run."""
        self.drops += 1
        return jax.random.fold_in(self.rng, self.drops)


Layer = Callable[[jax.Array, _Pass], jax.Array]


def _name(prefix: str, local: str) -> str:
    return f"{prefix}.{local}" if prefix else local


def _linear(spec: Linear, prefix: str) -> Layer:
    def run(x: jax.Array, p: _Pass) -> jax.Array:
        return x @ p.params[_name(prefix, "weight")] + p.params[_name(prefix, "bias")]

    return run


def _conv(spec: Conv2d, prefix: str) -> Layer:
    (ph, pw), stride = as_pair(spec.padding), as_pair(spec.stride)

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        out = lax.conv_general_dilated(
            x,
            p.params[_name(prefix, "weight")],
            window_strides=stride,
            padding=((ph, ph), (pw, pw)),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=lax.Precision.HIGHEST,
        )
        return out + p.params[_name(prefix, "bias")]

    return run


def _pool(spec: MaxPool2d | AvgPool2d, prefix: str) -> Layer:
    (kh, kw), (sh, sw) = as_pair(spec.kernel_size), as_pair(spec.stride)
    window, strides = (1, kh, kw, 1), (1, sh, sw, 1)

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        if isinstance(spec, MaxPool2d):
            return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, "VALID")
        total = lax.reduce_window(x, 0.0, lax.add, window, strides, "VALID")
        return total / (kh * kw)

    return run


def _function(function: Callable[[jax.Array], jax.Array]) -> Callable[[Any, str], Layer]:
    return lambda spec, prefix: lambda x, p: function(x)


def _dropout(spec: Dropout, prefix: str) -> Layer:
    keep = 1.0 - spec.p

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        if not (p.train and spec.p):
            return x
        draw = jax.random.uniform(p.next_key(), x.shape, x.dtype)
        return x * ((draw < keep).astype(x.dtype) / keep)

    return run


def _wide(x: jax.Array) -> jax.Array:
    """``x`` in float32 when it is bfloat16/float16 (under mixed precision), else unchanged.

    Normalisation layers reduce in it and hand their output on in ``x``'s own dtype, as
    torch's autocast, Keras and Flax do: statistics taken in bfloat16 lose digits that
    the running averages keep.
    """
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _batch_norm(spec: BatchNorm, prefix: str) -> Layer:
    mean_name, var_name = _name(prefix, "running_mean"), _name(prefix, "running_var")

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        low, x = x.dtype, _wide(x)
        axes = tuple(range(x.ndim - 1))
        if p.train:
            mean = jnp.mean(x, axis=axes)
            var = jnp.mean(jnp.square(x - mean), axis=axes)  # biased, to normalise
            count = x.size // x.shape[-1]
            m = spec.momentum
            p.new_state[mean_name] = (1 - m) * p.state[mean_name] + m * mean
            unbiased = var * (count / (count - 1))  # torch's running variance
            p.new_state[var_name] = (1 - m) * p.state[var_name] + m * unbiased
        else:
            mean, var = p.state[mean_name].astype(x.dtype), p.state[var_name].astype(x.dtype)
        return _scale_shift(prefix, (x - mean) * lax.rsqrt(var + spec.eps), p, low)

    return run


def _layer_norm(spec: LayerNorm, prefix: str) -> Layer:
    def run(x: jax.Array, p: _Pass) -> jax.Array:
        low, x = x.dtype, _wide(x)
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return _scale_shift(prefix, (x - mean) * lax.rsqrt(var + spec.eps), p, low)

    return run


def _scale_shift(prefix: str, xhat: jax.Array, p: _Pass, low: Any) -> jax.Array:
    """``xhat * weight + bias`` in ``xhat``'s dtype, handed on in the input's dtype ``low``."""
    weight = p.params[_name(prefix, "weight")].astype(xhat.dtype)
    return (xhat * weight + p.params[_name(prefix, "bias")].astype(xhat.dtype)).astype(low)


def _embedding(spec: Embedding, prefix: str) -> Layer:
    # Ids are range-checked on the host before they get here: jnp.take would return a NaN
    # row for an id out of range, and plain indexing would clamp it.
    return lambda x, p: jnp.take(p.params[_name(prefix, "weight")], x, axis=0)


def _positional(spec: PositionalEmbedding, prefix: str) -> Layer:
    return lambda x, p: x + p.params[_name(prefix, "weight")][: x.shape[1]]


def _attention(spec: MultiHeadAttention, prefix: str) -> Layer:
    heads, head_dim = spec.heads, spec.head_dim

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        n, length, dim = x.shape

        def project(part: str) -> jax.Array:  # (N, L, E) -> (N, H, L, Dh)
            y = x @ p.params[_name(prefix, f"{part}.weight")]
            y = y + p.params[_name(prefix, f"{part}.bias")]
            return y.reshape(n, length, heads, head_dim).transpose(0, 2, 1, 3)

        q, k, v = project("query"), project("key"), project("value")
        scores = jnp.einsum("nhqd,nhkd->nhqk", q, k) / jnp.sqrt(head_dim).astype(x.dtype)
        if spec.causal:
            allowed = jnp.tril(jnp.ones((length, length), bool))
            scores = jnp.where(allowed, scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        mixed = jnp.einsum("nhqk,nhkd->nhqd", weights, v)
        mixed = mixed.transpose(0, 2, 1, 3).reshape(n, length, dim)
        out = mixed @ p.params[_name(prefix, "out.weight")]
        return out + p.params[_name(prefix, "out.bias")]

    return run


def _children(spec: AbstractLayer, prefix: str) -> list[Layer]:
    return [_build(child, _name(prefix, name)) for name, child in spec.children()]


def _chain(spec: AbstractLayer, prefix: str) -> Layer:
    layers = _children(spec, prefix)

    def run(x: jax.Array, p: _Pass) -> jax.Array:
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
    gelu = functools.partial(jax.nn.gelu, approximate=False)

    def run(x: jax.Array, p: _Pass) -> jax.Array:
        x = x + drop(attention(norm1(x, p), p), p)
        return x + drop(fc2(gelu(fc1(norm2(x, p), p)), p), p)

    return run


#: How each layer type is built.
_BUILDERS: dict[type, Callable[[Any, str], Layer]] = {
    Linear: _linear,
    Conv2d: _conv,
    MaxPool2d: _pool,
    AvgPool2d: _pool,
    GlobalAvgPool: _function(lambda x: jnp.mean(x, axis=(1, 2))),
    Flatten: _function(lambda x: x.reshape(x.shape[0], -1)),
    ReLU: _function(jax.nn.relu),
    GELU: _function(functools.partial(jax.nn.gelu, approximate=False)),  # the exact erf form
    Tanh: _function(jnp.tanh),
    Sigmoid: _function(jax.nn.sigmoid),
    SiLU: _function(jax.nn.silu),
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
        raise ConfigError(f"the jax backend has no implementation of {type(spec).__name__}")
    return builder(spec, prefix)


def layers_apply(spec: AbstractLayer) -> Callable[..., tuple[jax.Array, dict[str, jax.Array]]]:
    """``apply(params, state, x, *, train, rng) -> (outputs, new_state)`` of ``spec``.

    ``params`` and ``state`` are flat dicts under canonical names; ``rng`` is the pass's
    dropout key (None when nothing drops or in eval mode).
    """
    network = _build(spec, "")

    def apply(params: Any, state: Any, x: jax.Array, *, train: bool, rng: Any) -> Any:
        run = _Pass(dict(params), dict(state), dict(state), train, rng)
        return network(x, run), run.new_state

    return apply
