"""The few ``nn.Module`` s torch lacks for a portable layer, written in torch's primitives.

Each is a handful of lines a torch user can read and copy; its parameters keep torch's own
layouts. Images stay channels-last between layers, as in unitrain, so that the module takes
what ``Trainer.predict`` takes; :class:`ChannelsFirst` gives torch's image layers their
``(N, C, *positions)`` layout around them.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from unitrain.onnx_export._image import same_padding

__all__ = [
    "ActivatedMLP",
    "Attention",
    "ChannelsFirst",
    "Concatenation",
    "GatedFeedForward",
    "LearnedPositions",
    "PerChannel",
    "Recurrent",
    "ResidualBranch",
    "SamePadding",
    "SinusoidalPositions",
    "TransformerLayer",
]


class ChannelsFirst(nn.Module):
    """Runs ``layer`` (a torch image layer) on channels-last input, giving channels-last."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rank = x.dim()
        y = self.layer(x.permute(0, rank - 1, *range(1, rank - 1)))
        if y.dim() != rank:  # pooled to (N, C): no positions left to move
            return y
        return y.permute(0, *range(2, rank), 1)


class PerChannel(nn.Module):
    """Runs ``layer`` (``nn.BatchNorm1d``) on ``(N, ..., C)`` as ``(N * positions, C)``: in
    eval mode each channel is scaled on its own, so every rank reads the same way."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.reshape(-1, x.shape[-1])).reshape(x.shape)


class SamePadding(nn.Module):
    """TensorFlow's "same" zero padding for a strided convolution on channels-first input
    (torch's ``padding="same"`` only allows stride 1); the odd zero goes after."""

    def __init__(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]):
        super().__init__()
        self.kernel, self.stride, self.dilation = kernel, stride, dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads: list[int] = []
        sizes = x.shape[2:]
        # F.pad lists the last axis first.
        for axis in reversed(range(len(sizes))):
            pads += same_padding(
                int(sizes[axis]), self.kernel[axis], self.stride[axis], self.dilation[axis]
            )
        return F.pad(x, pads)


class ActivatedMLP(nn.Module):
    """``MLP``: ``layers`` (``nn.Linear``) with ``activation`` between them."""

    def __init__(self, layers: list[nn.Linear], activation: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(self.activation(x))
        return x


class ResidualBranch(nn.Module):
    """``x + branch(x)``."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


class Concatenation(nn.Module):
    """The branches' outputs joined on ``axis`` of one example."""

    def __init__(self, branches: list[nn.Module], axis: int) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)
        self.axis = axis if axis < 0 else axis + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=self.axis)


class GatedFeedForward(nn.Module):
    """``down(activation(gate(x)) * up(x))`` (SwiGLU with SiLU)."""

    def __init__(self, gate: nn.Linear, up: nn.Linear, down: nn.Linear, activation: nn.Module):
        super().__init__()
        self.gate, self.up, self.down, self.activation = gate, up, down, activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.gate(x)) * self.up(x))


class LearnedPositions(nn.Module):
    """Adds the first ``L`` rows of a learned ``(max_len, dim)`` table to ``(N, L, dim)``."""

    def __init__(self, max_len: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(max_len, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight[: x.shape[1]]


class SinusoidalPositions(nn.Module):
    """Adds the fixed sine/cosine signal of the first ``L`` positions to ``(N, L, dim)``."""

    def __init__(self, table: np.ndarray) -> None:
        super().__init__()
        # Not saved: the table is a function of the length, not a trained value.
        self.register_buffer("table", torch.from_numpy(table.astype(np.float32)), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.get_buffer("table")[: x.shape[1]]


class Attention(nn.Module):
    """Multi-head self-attention with separate ``query``/``key``/``value``/``out``
    projections and optional rotary positions (half-split form), on ``(N, L, dim)``.

    ``nn.MultiheadAttention`` has neither rotary positions nor projections without their
    packed ``in_proj_weight``; this keeps unitrain's four ``nn.Linear`` s and torch's fused
    ``scaled_dot_product_attention``.
    """

    def __init__(self, dim: int, heads: int, causal: bool, bias: bool, rotary: bool) -> None:
        super().__init__()
        self.heads, self.causal, self.rotary = heads, causal, rotary
        self.query, self.key, self.value, self.out = (nn.Linear(dim, dim, bias) for _ in "qkvo")

    def _rotate(self, y: torch.Tensor) -> torch.Tensor:
        length, size = y.shape[-2], y.shape[-1]
        half = size // 2
        inverse = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2.0 / size)
        angles = torch.arange(length, dtype=torch.float64)[:, None] * inverse[None, :]
        angles = torch.cat([angles, angles], dim=1)
        cos, sin = torch.cos(angles).to(y.dtype), torch.sin(angles).to(y.dtype)
        return y * cos + torch.cat([-y[..., half:], y[..., :half]], dim=-1) * sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape

        def heads_of(projection: nn.Linear) -> torch.Tensor:  # (N, L, E) -> (N, H, L, Dh)
            return projection(x).view(batch, length, self.heads, -1).transpose(1, 2)

        q, k, v = heads_of(self.query), heads_of(self.key), heads_of(self.value)
        if self.rotary:
            q, k = self._rotate(q), self._rotate(k)
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(mixed.transpose(1, 2).reshape(batch, length, dim))


class TransformerLayer(nn.Module):
    """A Transformer block: attention then a feed-forward network, each with a residual
    connection, LayerNorm before (``pre``) or after (``post``) each."""

    def __init__(
        self,
        attention: Attention,
        norm1: nn.LayerNorm,
        norm2: nn.LayerNorm,
        fc1: nn.Linear,
        fc2: nn.Linear,
        activation: nn.Module,
        post_norm: bool,
    ) -> None:
        super().__init__()
        self.norm1, self.attention, self.norm2 = norm1, attention, norm2
        self.fc1, self.fc2, self.activation, self.post_norm = fc1, fc2, activation, post_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def feed_forward(h: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.activation(self.fc1(h)))

        if self.post_norm:
            x = self.norm1(x + self.attention(x))
            return self.norm2(x + feed_forward(x))
        x = x + self.attention(self.norm1(x))
        return x + feed_forward(self.norm2(x))


class Recurrent(nn.Module):
    """``nn.LSTM``/``nn.GRU`` (batch first) giving every position or the last one; a
    stateful layer starts from its saved state (buffers ``h`` and, for an LSTM, ``c``)."""

    def __init__(self, rnn: nn.LSTM | nn.GRU, sequences: bool, state: dict[str, int]) -> None:
        super().__init__()
        self.rnn, self.sequences, self.stateful = rnn, sequences, bool(state)
        for name, batch in state.items():
            self.register_buffer(name, torch.zeros(batch, rnn.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = None
        if self.stateful:
            h = self.get_buffer("h")[None]
            start = (h, self.get_buffer("c")[None]) if isinstance(self.rnn, nn.LSTM) else h
        out, _ = self.rnn(x, start)
        return out if self.sequences else out[:, -1]
