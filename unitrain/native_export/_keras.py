"""A functional Keras 3 model from a portable description, of ``keras.layers``.

Keras keeps unitrain's layouts (channels-last images, ``(in, out)`` dense kernels, conv
kernels ``(kh, kw, in, out)``, transposed-conv kernels ``(kh, kw, out, in)``, LSTM gates
i, f, c, o), so most weights pass as they are; explicit padding becomes a ``ZeroPadding``
or ``Cropping`` layer beside a ``"valid"`` convolution. Each builder takes the symbolic
input and returns the output, recording the weights of each Keras layer it creates; the
model's ``set_weights`` then takes them in the model's order.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

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
from unitrain.models._base import Shape, as_pair
from unitrain.native_export import keras_layers
from unitrain.native_export._walk import Builder, Walker, join
from unitrain.onnx_export._image import conv_padding

__all__ = ["BUILDERS", "keras_model"]

_ACTIVATION_LAYERS = {ReLU: "relu", GELU: "gelu", Tanh: "tanh", Sigmoid: "sigmoid", SiLU: "silu"}
#: Keras' GRU gates are z, r, h; unitrain's (torch's) r, z, n.
_GRU_GATES = (1, 0, 2)


class KerasWalker(Walker):
    """A :class:`Walker` that remembers the weights of each Keras layer it makes."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        super().__init__("keras", BUILDERS, weights)
        self.assigned: list[tuple[Any, list[np.ndarray]]] = []

    def use(self, layer: Any, weights: list[np.ndarray], x: Any) -> Any:
        """``layer(x)``, with ``weights`` (in the layer's order) to set once built."""
        y = layer(x)
        self.assigned.append((layer, weights))
        return y


def _activation_of(name: str) -> Any:
    # Keras' "gelu" is the exact erf form by default, as unitrain's.
    return keras.layers.Activation(name)


def _dense(walker: KerasWalker, layer: Linear, prefix: str, x: Any) -> Any:
    weights = [walker.array(prefix, "weight")]
    if layer.bias:
        weights.append(walker.array(prefix, "bias"))
    return walker.use(keras.layers.Dense(layer.out_features, use_bias=layer.bias), weights, x)


def _activation(walker: KerasWalker, layer: Any, prefix: str, x: Any) -> Any:
    return _activation_of(_ACTIVATION_LAYERS[type(layer)])(x)


def _unchanged(walker: KerasWalker, layer: Any, prefix: str, x: Any) -> Any:
    return x  # dropout only acts in training


def _chain(walker: KerasWalker, layer: AbstractLayer, prefix: str, x: Any) -> Any:
    for name in layer.child_names():
        x = walker.child(layer, prefix, name, x)
    return x


def _residual(walker: KerasWalker, layer: Residual, prefix: str, x: Any) -> Any:
    return keras.layers.Add()([x, _chain(walker, layer, prefix, x)])


def _concatenate(walker: KerasWalker, layer: Concatenate, prefix: str, x: Any) -> Any:
    outputs = [walker.child(layer, prefix, name, x) for name in layer.child_names()]
    axis = layer.axis if layer.axis < 0 else layer.axis + 1
    return keras.layers.Concatenate(axis=axis)(outputs)


def _gated_mlp(walker: KerasWalker, layer: GatedMLP, prefix: str, x: Any) -> Any:
    gate = _activation_of(layer.activation)(walker.child(layer, prefix, "gate", x))
    product = keras.layers.Multiply()([gate, walker.child(layer, prefix, "up", x)])
    return walker.child(layer, prefix, "down", product)


def _flatten(walker: KerasWalker, layer: Flatten, prefix: str, x: Any) -> Any:
    return keras.layers.Flatten()(x)


def _reshape(walker: KerasWalker, layer: Reshape, prefix: str, x: Any) -> Any:
    return keras.layers.Reshape(layer.output_shape(tuple(x.shape[1:])))(x)


def _conv(walker: KerasWalker, layer: Conv2d | Conv1d, prefix: str, x: Any) -> Any:
    pads = conv_padding(layer, tuple(x.shape[1:-1]))
    if any(before or after for before, after in pads):
        padding_type = keras.layers.ZeroPadding2D if layer.rank == 2 else keras.layers.ZeroPadding1D
        x = padding_type(tuple(pads) if layer.rank == 2 else pads[0])(x)
    conv_type = keras.layers.Conv2D if layer.rank == 2 else keras.layers.Conv1D
    stride: Any = layer.stride  # one int per spatial axis
    # Keras refuses a stride with a dilation: convolve at stride 1, then keep every
    # stride-th position (a 1-wide max pool with that stride), the same numbers and size.
    subsample = any(s > 1 for s in stride) and any(d > 1 for d in layer.dilation)  # type: ignore[union-attr]
    conv = conv_type(
        layer.out_channels,
        layer.kernel_size,
        strides=1 if subsample else stride,
        dilation_rate=layer.dilation,
        groups=layer.groups,
        use_bias=layer.bias,
    )
    weights = [walker.array(prefix, "weight")]  # (*window, in / groups, out): Keras' layout
    if layer.bias:
        weights.append(walker.array(prefix, "bias"))
    y = walker.use(conv, weights, x)
    if subsample:
        pool_type = keras.layers.MaxPooling2D if layer.rank == 2 else keras.layers.MaxPooling1D
        y = pool_type(pool_size=1, strides=stride)(y)
    return y


def _conv_transpose(walker: KerasWalker, layer: ConvTranspose2d, prefix: str, x: Any) -> Any:
    # "valid" with the output padding gives torch's size before its padding; the padding is
    # then cropped from each side (the output padding stays at the end, as in torch).
    conv = keras.layers.Conv2DTranspose(
        layer.out_channels,
        as_pair(layer.kernel_size),
        strides=as_pair(layer.stride),
        padding="valid",
        output_padding=as_pair(layer.output_padding),
        dilation_rate=as_pair(layer.dilation),
        use_bias=layer.bias,
    )
    weights = [walker.array(prefix, "weight")]  # (kh, kw, out, in): Keras' layout
    if layer.bias:
        weights.append(walker.array(prefix, "bias"))
    y = walker.use(conv, weights, x)
    ph, pw = as_pair(layer.padding)
    return keras.layers.Cropping2D(((ph, ph), (pw, pw)))(y) if ph or pw else y


def _pool(walker: KerasWalker, layer: MaxPool2d | AvgPool2d, prefix: str, x: Any) -> Any:
    pool_type = (
        keras.layers.MaxPooling2D if isinstance(layer, MaxPool2d) else keras.layers.AveragePooling2D
    )
    return pool_type(as_pair(layer.kernel_size), as_pair(layer.stride), padding="valid")(x)


def _global_avg_pool(walker: KerasWalker, layer: GlobalAvgPool, prefix: str, x: Any) -> Any:
    return keras.layers.GlobalAveragePooling2D()(x)


def _upsample(walker: KerasWalker, layer: Upsample, prefix: str, x: Any) -> Any:
    return keras.layers.UpSampling2D(as_pair(layer.scale), interpolation="nearest")(x)


def _batch_norm(walker: KerasWalker, layer: BatchNorm, prefix: str, x: Any) -> Any:
    names = ("weight", "bias", "running_mean", "running_var")
    norm = keras.layers.BatchNormalization(epsilon=layer.eps)
    return walker.use(norm, [walker.array(prefix, name) for name in names], x)


def _layer_norm(walker: KerasWalker, layer: LayerNorm, prefix: str, x: Any) -> Any:
    bias = getattr(layer, "bias", True)
    norm = keras.layers.LayerNormalization(epsilon=layer.eps, center=bias)
    weights = [walker.array(prefix, "weight")] + ([walker.array(prefix, "bias")] if bias else [])
    return walker.use(norm, weights, x)


def _rms_norm(walker: KerasWalker, layer: RMSNorm, prefix: str, x: Any) -> Any:
    norm = keras.layers.RMSNormalization(epsilon=layer.eps)
    return walker.use(norm, [walker.array(prefix, "weight")], x)


def _group_norm(walker: KerasWalker, layer: GroupNorm, prefix: str, x: Any) -> Any:
    norm = keras.layers.GroupNormalization(layer.groups, epsilon=layer.eps)
    return walker.use(norm, [walker.array(prefix, n) for n in ("weight", "bias")], x)


def _embedding(walker: KerasWalker, layer: Embedding, prefix: str, x: Any) -> Any:
    embedding = keras.layers.Embedding(layer.num_embeddings, layer.dim)
    return walker.use(embedding, [walker.array(prefix, "weight")], x)


def _positional(walker: KerasWalker, layer: PositionalEmbedding, prefix: str, x: Any) -> Any:
    positions = keras_layers.LearnedPositions(layer.max_len, layer.dim)
    return walker.use(positions, [walker.array(prefix, "weight")], x)


def _sinusoidal(
    walker: KerasWalker, layer: SinusoidalPositionalEmbedding, prefix: str, x: Any
) -> Any:
    return keras_layers.SinusoidalPositions(x.shape[1], layer.dim, layer.base)(x)


def _attention(walker: KerasWalker, layer: MultiHeadAttention, prefix: str, x: Any) -> Any:
    heads, size, dim = layer.heads, layer.head_dim, layer.dim
    weights: list[np.ndarray] = []
    if layer.rotary:  # keras.layers.MultiHeadAttention has no rotary positions
        for part in ("query", "key", "value", "out"):
            weights.append(walker.array(join(prefix, part), "weight"))
            if layer.bias:
                weights.append(walker.array(join(prefix, part), "bias"))
        rotary = keras_layers.RotaryAttention(dim, heads, layer.causal, layer.bias)
        return walker.use(rotary, weights, x)
    for part in ("query", "key", "value"):  # (dim, dim) -> (dim, heads, head size)
        weights.append(walker.array(join(prefix, part), "weight").reshape(dim, heads, size))
        if layer.bias:
            weights.append(walker.array(join(prefix, part), "bias").reshape(heads, size))
    weights.append(walker.array(join(prefix, "out"), "weight").reshape(heads, size, dim))
    if layer.bias:
        weights.append(walker.array(join(prefix, "out"), "bias"))
    attention = keras.layers.MultiHeadAttention(heads, size, use_bias=layer.bias)
    y = attention(x, x, use_causal_mask=layer.causal)
    walker.assigned.append((attention, weights))
    return y


def _transformer_block(walker: KerasWalker, layer: TransformerBlock, prefix: str, x: Any) -> Any:
    def call(name: str, h: Any) -> Any:
        return walker.child(layer, prefix, name, h)

    def feed_forward(h: Any) -> Any:
        return call("fc2", _activation_of(layer.activation)(call("fc1", h)))

    add = keras.layers.Add
    if layer.norm == "post":
        x = call("norm1", add()([x, call("attention", x)]))
        return call("norm2", add()([x, feed_forward(x)]))
    x = add()([x, call("attention", call("norm1", x))])
    return add()([x, feed_forward(call("norm2", x))])


def _recurrent(walker: KerasWalker, layer: LSTM | GRU, prefix: str, x: Any) -> Any:
    start = None
    if layer.batch_size is not None:  # stateful: every call starts from the saved state
        names = ("h", "c") if isinstance(layer, LSTM) else ("h",)
        saved = keras_layers.SavedStates(len(names), layer.batch_size, layer.hidden_size)
        start = saved(x)
        walker.assigned.append((saved, [walker.array(prefix, name) for name in names]))
    weight_ih, weight_hh = walker.array(prefix, "weight_ih"), walker.array(prefix, "weight_hh")
    if isinstance(layer, LSTM):  # i, f, c, o: unitrain's order
        weights = [weight_ih, weight_hh, walker.array(prefix, "bias")]
        rnn = keras.layers.LSTM(layer.hidden_size, return_sequences=layer.return_sequences)
    else:  # reset after, with an input and a recurrent bias row

        def gates(array: np.ndarray) -> np.ndarray:
            blocks = np.split(array, 3, axis=-1)
            return np.concatenate([blocks[i] for i in _GRU_GATES], axis=-1)

        biases = np.stack([gates(walker.array(prefix, n)) for n in ("bias_ih", "bias_hh")])
        weights = [gates(weight_ih), gates(weight_hh), biases]
        rnn = keras.layers.GRU(
            layer.hidden_size, return_sequences=layer.return_sequences, reset_after=True
        )
    y = rnn(x, initial_state=start)
    walker.assigned.append((rnn, weights))
    return y


BUILDERS: dict[type, Builder] = {
    Linear: _dense,
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


def keras_model(model: AbstractLayer, weights: dict[str, np.ndarray], shape: Shape) -> Any:
    """``model`` as a functional ``keras.Model`` for inputs of ``shape`` (one example),
    its weights set with ``set_weights`` (float32)."""
    tokens = model.input_kind == "tokens"
    inputs = keras.Input(shape, dtype="int32" if tokens else "float32", name="input")
    walker = KerasWalker(weights)
    outputs = walker.build(model, "", inputs)
    built = keras.Model(inputs, outputs, name="unitrain")
    # Each variable's value, by identity: the model's order is Keras' to choose.
    values: dict[int, np.ndarray] = {}
    for layer, arrays in walker.assigned:
        assert len(layer.weights) == len(arrays), (layer.name, len(layer.weights), len(arrays))
        for variable, array in zip(layer.weights, arrays):
            assert tuple(variable.shape) == array.shape, (variable.path, array.shape)
            values[id(variable)] = array
    built.set_weights([values[id(variable)] for variable in built.weights])
    return built
