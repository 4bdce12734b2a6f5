"""torch modules from a portable description: ``torch.nn`` layers wherever torch has the
layer, with the canonical weights turned into torch's layouts (``nn.Linear`` ``(out, in)``,
conv kernels ``(out, in, *window)``, recurrent gates stacked by rows).

Each builder returns the module and its ``state_dict`` as numpy arrays under the module's
own names; the whole module loads it with ``load_state_dict(strict=True)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

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
from unitrain.native_export import torch_modules as modules
from unitrain.native_export._walk import Builder, Walker, join
from unitrain.onnx_export._image import conv_padding

__all__ = ["BUILDERS", "torch_module"]

Built = tuple[nn.Module, dict[str, np.ndarray]]

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # the exact erf form, as unitrain's
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
}
_ACTIVATION_LAYERS = {ReLU: "relu", GELU: "gelu", Tanh: "tanh", Sigmoid: "sigmoid", SiLU: "silu"}


def _nest(parts: dict[str, Built]) -> dict[str, np.ndarray]:
    """The state of a module whose submodules ``parts`` are named by their keys."""
    return {
        f"{name}.{key}": value for name, (_, state) in parts.items() for key, value in state.items()
    }


def linear(walker: Walker, layer: Linear, prefix: str) -> Built:
    """``nn.Linear`` with the transposed ``(out, in)`` weight."""
    state = {"weight": walker.array(prefix, "weight").T}
    if layer.bias:
        state["bias"] = walker.array(prefix, "bias")
    return nn.Linear(layer.in_features, layer.out_features, layer.bias), state


def _activation(walker: Walker, layer: Any, prefix: str) -> Built:
    return _ACTIVATIONS[_ACTIVATION_LAYERS[type(layer)]](), {}


def _stateless(module: type[nn.Module]) -> Builder:
    def build(walker: Walker, layer: Any, prefix: str) -> Built:
        return module(), {}

    return build


def _chain(walker: Walker, layer: AbstractLayer, prefix: str) -> Built:
    parts = {name: walker.child(layer, prefix, name) for name in layer.child_names()}
    if list(parts) == [""]:  # a transparent wrapper (Initialized): the child itself
        return parts[""]
    return nn.Sequential(*(module for module, _ in parts.values())), _nest(
        {str(i): built for i, built in enumerate(parts.values())}
    )


def _mlp(walker: Walker, layer: MLP, prefix: str) -> Built:
    names = [f"layers.{i}" for i in range(layer.num_layers)]
    built = [walker.child(layer, prefix, name) for name in names]
    # Dropout only acts in training; an export is for inference.
    module = modules.ActivatedMLP([m for m, _ in built], _ACTIVATIONS[layer.activation]())
    return module, _nest(dict(zip(names, built)))


def _residual(walker: Walker, layer: Residual, prefix: str) -> Built:
    branch = _chain(walker, Sequential(layer.layers), prefix)
    return modules.ResidualBranch(branch[0]), _nest({"branch": branch})


def _concatenate(walker: Walker, layer: Concatenate, prefix: str) -> Built:
    built = [walker.child(layer, prefix, name) for name in layer.child_names()]
    module = modules.Concatenation([m for m, _ in built], layer.axis)
    return module, _nest({f"branches.{i}": b for i, b in enumerate(built)})


def _gated_mlp(walker: Walker, layer: GatedMLP, prefix: str) -> Built:
    parts = {name: walker.child(layer, prefix, name) for name in ("gate", "up", "down")}
    gate, up, down = (parts[name][0] for name in ("gate", "up", "down"))
    activation = _ACTIVATIONS[layer.activation]()
    return modules.GatedFeedForward(gate, up, down, activation), _nest(parts)


def _flatten(walker: Walker, layer: Flatten, prefix: str) -> Built:
    return nn.Flatten(), {}  # channels-last tensors flatten in unitrain's order


def _reshape(walker: Walker, layer: Reshape, prefix: str) -> Built:
    return nn.Sequential(nn.Flatten(), nn.Unflatten(1, layer.shape)), {}


def _channels_first(built: Built) -> Built:
    return modules.ChannelsFirst(built[0]), _nest({"layer": built})


def _conv(walker: Walker, layer: Conv2d | Conv1d, prefix: str) -> Built:
    rank = layer.rank
    # Normalised to one int per spatial axis by the layer; torch takes the tuples as they are.
    kernel_size: Any = layer.kernel_size
    kernel = walker.array(prefix, "weight")  # (*window, in / groups, out)
    state = {"weight": kernel.transpose(rank + 1, rank, *range(rank))}
    if layer.bias:
        state["bias"] = walker.array(prefix, "bias")
    conv_type = nn.Conv2d if rank == 2 else nn.Conv1d
    options: dict[str, Any] = {
        "stride": layer.stride,
        "dilation": layer.dilation,
        "groups": layer.groups,
        "bias": layer.bias,
    }
    if layer.padding == "same":  # depends on the input's size when strided
        conv = conv_type(layer.in_channels, layer.out_channels, kernel_size, **options)
        pad = modules.SamePadding(kernel_size, options["stride"], options["dilation"])
        return _channels_first((nn.Sequential(pad, conv), {f"1.{k}": v for k, v in state.items()}))
    padding: Any = tuple(before for before, _ in conv_padding(layer, [0] * rank))
    conv = conv_type(layer.in_channels, layer.out_channels, kernel_size, padding=padding, **options)
    return _channels_first((conv, state))


def _conv_transpose(walker: Walker, layer: ConvTranspose2d, prefix: str) -> Built:
    # (kh, kw, out, in) -> torch's (in, out, kh, kw)
    state = {"weight": walker.array(prefix, "weight").transpose(3, 2, 0, 1)}
    if layer.bias:
        state["bias"] = walker.array(prefix, "bias")
    conv = nn.ConvTranspose2d(
        layer.in_channels,
        layer.out_channels,
        as_pair(layer.kernel_size),
        stride=as_pair(layer.stride),
        padding=as_pair(layer.padding),
        output_padding=as_pair(layer.output_padding),
        dilation=as_pair(layer.dilation),
        bias=layer.bias,
    )
    return _channels_first((conv, state))


def _pool(walker: Walker, layer: MaxPool2d | AvgPool2d, prefix: str) -> Built:
    pool_type = nn.MaxPool2d if isinstance(layer, MaxPool2d) else nn.AvgPool2d
    return _channels_first((pool_type(as_pair(layer.kernel_size), as_pair(layer.stride)), {}))


def _global_avg_pool(walker: Walker, layer: GlobalAvgPool, prefix: str) -> Built:
    pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return modules.ChannelsFirst(pool), {}


def _upsample(walker: Walker, layer: Upsample, prefix: str) -> Built:
    # Nearest neighbour by a whole factor repeats each pixel, as the layer does.
    scale = tuple(float(s) for s in as_pair(layer.scale))
    return _channels_first((nn.Upsample(scale_factor=scale, mode="nearest"), {}))


def _batch_norm(walker: Walker, layer: BatchNorm, prefix: str) -> Built:
    names = ("weight", "bias", "running_mean", "running_var")
    state = {name: walker.array(prefix, name) for name in names}
    state["num_batches_tracked"] = np.zeros((), np.int64)  # torch's own counter, unused here
    norm = nn.BatchNorm1d(layer.num_features, eps=layer.eps)
    return modules.PerChannel(norm), _nest({"layer": (norm, state)})


def _layer_norm(walker: Walker, layer: LayerNorm, prefix: str) -> Built:
    bias = getattr(layer, "bias", True)
    state = {"weight": walker.array(prefix, "weight")}
    if bias:
        state["bias"] = walker.array(prefix, "bias")
    return nn.LayerNorm(layer.num_features, eps=layer.eps, bias=bias), state


def _rms_norm(walker: Walker, layer: RMSNorm, prefix: str) -> Built:
    return nn.RMSNorm(layer.num_features, eps=layer.eps), {"weight": walker.array(prefix, "weight")}


def _group_norm(walker: Walker, layer: GroupNorm, prefix: str) -> Built:
    norm = nn.GroupNorm(layer.groups, layer.num_channels, eps=layer.eps)
    state = {name: walker.array(prefix, name) for name in ("weight", "bias")}
    return _channels_first((norm, state))


def _embedding(walker: Walker, layer: Embedding, prefix: str) -> Built:
    return nn.Embedding(layer.num_embeddings, layer.dim), {"weight": walker.array(prefix, "weight")}


def _positional(walker: Walker, layer: PositionalEmbedding, prefix: str) -> Built:
    module = modules.LearnedPositions(layer.max_len, layer.dim)
    return module, {"weight": walker.array(prefix, "weight")}


def _sinusoidal(walker: Walker, layer: SinusoidalPositionalEmbedding, prefix: str) -> Built:
    # A table long enough for any sequence the model is likely to see; sliced per call.
    return modules.SinusoidalPositions(layer.table(4096)), {}


def _attention(walker: Walker, layer: MultiHeadAttention, prefix: str) -> Built:
    module = modules.Attention(layer.dim, layer.heads, layer.causal, layer.bias, layer.rotary)
    parts = {
        part: linear(walker, Linear(layer.dim, layer.dim, layer.bias), join(prefix, part))
        for part in ("query", "key", "value", "out")
    }
    return module, _nest(parts)


def _transformer_block(walker: Walker, layer: TransformerBlock, prefix: str) -> Built:
    names = ("norm1", "attention", "norm2", "fc1", "fc2")
    parts = {name: walker.child(layer, prefix, name) for name in names}
    norm1, attention, norm2, fc1, fc2 = (parts[name][0] for name in names)
    activation = _ACTIVATIONS[layer.activation]()
    post_norm = layer.norm == "post"
    module = modules.TransformerLayer(
        attention,
        norm1,
        norm2,
        fc1,
        fc2,
        activation,
        post_norm,
    )
    return module, _nest(parts)


def _gates(weight: np.ndarray) -> np.ndarray:
    """``(in, gates * hidden)`` columns -> torch's ``(gates * hidden, in)`` rows (the
    gate orders are torch's already)."""
    return np.ascontiguousarray(weight.T)


def _recurrent(walker: Walker, layer: LSTM | GRU, prefix: str) -> Built:
    rnn_type = nn.LSTM if isinstance(layer, LSTM) else nn.GRU
    rnn = rnn_type(layer.input_size, layer.hidden_size, batch_first=True)
    state = {
        "rnn.weight_ih_l0": _gates(walker.array(prefix, "weight_ih")),
        "rnn.weight_hh_l0": _gates(walker.array(prefix, "weight_hh")),
    }
    if isinstance(layer, LSTM):  # torch's two biases are only ever summed
        state["rnn.bias_ih_l0"] = walker.array(prefix, "bias")
        state["rnn.bias_hh_l0"] = np.zeros_like(state["rnn.bias_ih_l0"])
    else:
        state["rnn.bias_ih_l0"] = walker.array(prefix, "bias_ih")
        state["rnn.bias_hh_l0"] = walker.array(prefix, "bias_hh")
    carried = {}
    if layer.batch_size is not None:
        carried = dict.fromkeys(layer.carried, layer.batch_size)
        state.update({name: walker.array(prefix, name) for name in layer.carried})
    return modules.Recurrent(rnn, layer.return_sequences, carried), state


BUILDERS: dict[type, Builder] = {
    Linear: linear,
    **dict.fromkeys(_ACTIVATION_LAYERS, _activation),
    Dropout: _stateless(nn.Identity),  # dropout only acts in training
    Identity: _stateless(nn.Identity),
    Flatten: _flatten,
    Reshape: _reshape,
    Sequential: _chain,
    Initialized: _chain,
    MLP: _mlp,
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


def torch_module(model: AbstractLayer, weights: dict[str, np.ndarray]) -> nn.Module:
    """``model`` as a torch module in eval mode, its weights loaded strictly (float32)."""
    module, state = Walker("torch", BUILDERS, weights).build(model, "")
    tensors = {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in state.items()}
    module.load_state_dict(tensors, strict=True)
    return module.eval()
