"""Portable layers built natively in PyTorch, with canonical names and layouts.

:func:`build_module` turns a :mod:`unitrain.models` description into an ``nn.Module`` whose
``named_parameters()`` and ``named_buffers()`` are exactly the model's canonical parameter and
state names, in the canonical layouts (linear ``(in, out)``, conv ``(kh, kw, in, out)``), so
a state dict needs no renaming or transposing.

Images travel between layers as channels-last ``(N, H, W, C)`` tensors. An image op sees
them through ``permute(0, 3, 1, 2)``: a free view that torch reads as an NCHW tensor in the
``channels_last`` memory format, so convolutions and pooling run their channels-last
kernels and give channels-last outputs, which permute back to ``(N, H, W, C)`` for free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from unitrain import ConfigError, DataError
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

__all__ = ["DropoutSource", "build_module", "build_portable"]


class DropoutSource:
    """The one generator every Dropout of a model draws from, seeded per forward pass."""

    def __init__(self) -> None:
        self.generator: torch.Generator | None = None


def _nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1)


class _Leaf(nn.Module):
    """A layer with its canonical parameters (and buffers) created empty in ``spec``'s shapes."""

    # Registered by name in __init__; declared so that type checkers see tensors where
    # nn.Module.__getattr__ is typed ``Tensor | Module``. A layer has those its spec names.
    weight: torch.Tensor
    bias: torch.Tensor

    def __init__(self, spec: AbstractLayer) -> None:
        super().__init__()
        self.spec = spec
        for name, shape in spec.own_param_shapes().items():
            _attach_tensor(self, name, nn.Parameter(torch.empty(shape)))
        for name, shape in spec.own_state_shapes().items():
            self.register_buffer(name, torch.empty(shape))


def _attach_tensor(module: nn.Module, dotted: str, value: nn.Parameter) -> None:
    """Register ``value`` under a dotted name (``query.weight``) through plain sub-modules."""
    *path, leaf = dotted.split(".")
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, nn.Module())
        module = getattr(module, part)
    module.register_parameter(leaf, value)


def _affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ weight + bias`` over the last axis of ``x``, as one ``addmm``.

    Under mixed precision, autocast casts all three operands of ``addmm`` to the compute
    dtype, so the output stays bfloat16/float16, as ``nn.Linear``'s does. A separate ``+ bias``
    would add the float32 master bias to the low-precision product and promote it back to
    float32: every later op then reads and writes twice the bytes, and the next matmul casts
    it down again (a pre-LN Transformer step on the CPU took 1.2x the time of the same network
    in ``nn`` layers under bf16-mixed).
    """
    if x.ndim == 2:
        return torch.addmm(bias, x, weight)
    flat = torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight)
    return flat.view(*x.shape[:-1], weight.shape[1])


class _Linear(_Leaf):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _affine(x, self.weight, self.bias)


class _Conv(_Leaf):
    spec: Conv2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.weight.permute(3, 2, 0, 1)  # (kh, kw, in, out) -> (out, in, kh, kw)
        stride, padding = as_pair(self.spec.stride), as_pair(self.spec.padding)
        return _nhwc(F.conv2d(_nchw(x), kernel, self.bias, stride, padding))


class _MaxPool(_Leaf):
    spec: MaxPool2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, stride = as_pair(self.spec.kernel_size), as_pair(self.spec.stride)
        return _nhwc(F.max_pool2d(_nchw(x), kernel, stride))


class _AvgPool(_Leaf):
    spec: AvgPool2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, stride = as_pair(self.spec.kernel_size), as_pair(self.spec.stride)
        return _nhwc(F.avg_pool2d(_nchw(x), kernel, stride))


class _Elementwise(_Leaf):
    """A layer that is one function of its input (activations, pooling over axes, flatten)."""

    FUNCTIONS: ClassVar[dict[type, Callable[[torch.Tensor], torch.Tensor]]] = {
        ReLU: F.relu,
        GELU: F.gelu,  # the exact erf form by default
        Tanh: torch.tanh,
        Sigmoid: torch.sigmoid,
        SiLU: F.silu,
        GlobalAvgPool: lambda x: x.mean(dim=(1, 2)),
        Flatten: lambda x: x.reshape(len(x), -1),
    }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.FUNCTIONS[type(self.spec)](x)


class _BatchNorm(_Leaf):
    """torch's convention (the pinned one), computed here in two passes.

    ``F.batch_norm`` on the CPU takes the batch variance in one pass, which loses float32
    digits when a channel's mean is large against its spread: at mean/std = 100 its output
    is 3e-5 off in the channels-last format (1e-5 contiguous), where the two-pass
    ``mean((x - mean)**2)`` stays at 1e-7. A ResNet's stem sees such channels, and the
    error grew to 1e-3 of the weights within ten updates. The formulas are the reference's.
    """

    spec: BatchNorm
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Under mixed precision x arrives in bfloat16/float16: the statistics and the
        # normalisation are computed in the parameters' float32, and the output goes on in
        # x's dtype, as nn.BatchNorm's does (float32 parameters would otherwise promote it,
        # and every later op would run in float32).
        low = x.dtype
        x = x.to(self.weight.dtype)
        axes = tuple(range(x.ndim - 1))
        if self.training:
            count = x.numel() // x.shape[-1]
            if count < 2:
                raise DataError(
                    f"BatchNorm({self.spec.num_features}) in train mode needs more than one "
                    f"value per channel, got input shape {tuple(x.shape)}; use a larger batch"
                )
            mean = x.mean(dim=axes)
            centered = x - mean
            var = centered.square().mean(dim=axes)  # biased: what the batch is scaled by
            with torch.no_grad():
                m = self.spec.momentum
                self.running_mean.mul_(1 - m).add_(m * mean)
                self.running_var.mul_(1 - m).add_(m * var * (count / (count - 1)))
        else:
            centered, var = x - self.running_mean, self.running_var
        return (centered * torch.rsqrt(var + self.spec.eps) * self.weight + self.bias).to(low)


class _LayerNorm(_Leaf):
    spec: LayerNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.spec.num_features,), self.weight, self.bias, self.spec.eps)


class _Embedding(_Leaf):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x, self.weight)


class _Positional(_Leaf):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[: x.shape[1]]


class _Attention(_Leaf):
    spec: MultiHeadAttention
    # Plain sub-modules holding the projections' ``weight`` and ``bias`` (_attach_tensor).
    query: Any
    key: Any
    value: Any
    out: Any

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        heads = self.spec.heads

        def project(part: Any) -> torch.Tensor:  # (N, L, E) -> (N, H, L, Dh)
            y = _affine(x, part.weight, part.bias)
            return y.view(n, length, heads, dim // heads).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(
            project(self.query), project(self.key), project(self.value), is_causal=self.spec.causal
        )
        mixed = mixed.transpose(1, 2).reshape(n, length, dim)
        return _affine(mixed, self.out.weight, self.out.bias)


class _Dropout(_Leaf):
    spec: Dropout

    def __init__(self, spec: AbstractLayer, source: DropoutSource) -> None:
        super().__init__(spec)
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.spec.p):
            return x
        keep = 1.0 - self.spec.p
        draw = torch.rand(x.shape, generator=self.source.generator, device=x.device)
        return x * (draw < keep).to(x.dtype) / keep


class _Chain(nn.Module):
    """Children in order; each is registered under its (possibly dotted) canonical name."""

    def __init__(self, spec: AbstractLayer, source: DropoutSource) -> None:
        super().__init__()
        self.order: list[nn.Module] = []
        for name, child in spec.children():
            module = build_module(child, source)
            *path, leaf = name.split(".")
            parent: nn.Module = self
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, nn.Module())
                parent = getattr(parent, part)
            parent.add_module(leaf, module)
            self.order.append(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.order:
            x = module(x)
        return x


class _Residual(_Chain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


class _Block(_Chain):
    spec: TransformerBlock

    def __init__(self, spec: TransformerBlock, source: DropoutSource) -> None:
        super().__init__(spec, source)
        self.drop = _Dropout(Dropout(spec.dropout), source)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm1, attention, norm2, fc1, fc2 = self.order
        x = x + self.drop(attention(norm1(x)))
        return x + self.drop(fc2(F.gelu(fc1(norm2(x)))))


#: How each layer type is built: a leaf module class or a composite's builder.
_MODULES: dict[type, Callable[[Any, DropoutSource], nn.Module]] = {
    Linear: lambda spec, _: _Linear(spec),
    Conv2d: lambda spec, _: _Conv(spec),
    MaxPool2d: lambda spec, _: _MaxPool(spec),
    AvgPool2d: lambda spec, _: _AvgPool(spec),
    BatchNorm: lambda spec, _: _BatchNorm(spec),
    LayerNorm: lambda spec, _: _LayerNorm(spec),
    Embedding: lambda spec, _: _Embedding(spec),
    PositionalEmbedding: lambda spec, _: _Positional(spec),
    MultiHeadAttention: lambda spec, _: _Attention(spec),
    Dropout: _Dropout,
    Sequential: _Chain,
    MLP: _Chain,
    Residual: _Residual,
    TransformerBlock: _Block,
    **{kind: lambda spec, _: _Elementwise(spec) for kind in _Elementwise.FUNCTIONS},
}


def build_module(spec: AbstractLayer, source: DropoutSource | None = None) -> nn.Module:
    """The ``nn.Module`` of ``spec`` with empty canonical parameters and buffers."""
    builder = _MODULES.get(type(spec))
    if builder is None:
        raise ConfigError(f"the torch backend has no implementation of {type(spec).__name__}")
    return builder(spec, source or DropoutSource())


def build_portable(spec: AbstractLayer, seed: int, dtype: torch.dtype, device: Any) -> nn.Module:
    """The module of a whole portable model, holding ``spec.init_params(seed)`` and its state.

    Its parameter and buffer names are the canonical ones. A model with dropout gets a
    ``generator`` attribute: the generator its Dropout layers draw from, for the caller to
    seed before each forward pass.
    """
    source = DropoutSource()
    module = build_module(spec, source).to(device, dtype)
    numpy_dtype = np.float64 if dtype == torch.float64 else np.float32
    values = spec.init_params(seed, numpy_dtype) | spec.init_state(numpy_dtype)
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        for name, value in values.items():
            tensors[name].copy_(torch.from_numpy(value))
    if spec.drops_out:
        source.generator = torch.Generator(device)
        # nn.Module.__setattr__ is typed for tensors and modules; any attribute is allowed.
        module.generator = source.generator  # type: ignore[assignment]
    return module
