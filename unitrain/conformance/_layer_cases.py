"""The layers every backend is checked on: one small case per layer kind and option.

Shapes are tiny so that the float64 finite-difference test of the numpy reference and the
per-layer comparisons of every backend take seconds. Each case is ``(id, layer, input shape
with the batch axis)``; :func:`layer_input` draws its input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain.models import (
    GELU,
    GRU,
    LSTM,
    AbstractLayer,
    AvgPool2d,
    BatchNorm,
    Concatenate,
    Conv1d,
    Conv2d,
    ConvTranspose2d,
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
    init,
)

__all__ = ["LAYER_CASES", "layer_input"]

LAYER_CASES: tuple[tuple[str, AbstractLayer, tuple[int, ...]], ...] = (
    ("linear", Linear(5, 3), (2, 4, 5)),
    ("conv", Conv2d(2, 3, 3), (2, 5, 6, 2)),
    ("conv_stride2_pad1", Conv2d(2, 3, 3, stride=2, padding=1), (2, 8, 8, 2)),
    ("conv_rect", Conv2d(3, 2, (2, 3), stride=(1, 2), padding=(1, 0)), (2, 5, 7, 3)),
    ("max_pool", MaxPool2d(2), (2, 6, 6, 3)),
    ("max_pool_overlap", MaxPool2d(3, stride=2), (2, 7, 7, 2)),
    ("avg_pool", AvgPool2d(2, stride=1), (2, 4, 5, 3)),
    ("global_avg_pool", GlobalAvgPool(), (2, 4, 4, 3)),
    ("flatten", Flatten(), (2, 3, 3, 2)),
    ("relu", ReLU(), (3, 5)),
    ("gelu", GELU(), (3, 5)),
    ("tanh", Tanh(), (3, 5)),
    ("sigmoid", Sigmoid(), (3, 5)),
    ("silu", SiLU(), (3, 5)),
    ("batch_norm", BatchNorm(3), (4, 3, 3, 3)),
    ("batch_norm_dense", BatchNorm(4, momentum=0.3), (6, 4)),
    ("layer_norm", LayerNorm(6), (2, 4, 6)),
    ("embedding", Embedding(7, 4), (2, 5)),
    ("positional_embedding", PositionalEmbedding(6, 4), (2, 5, 4)),
    ("attention", MultiHeadAttention(8, 2), (2, 5, 8)),
    ("attention_causal", MultiHeadAttention(8, 4, causal=True), (2, 5, 8)),
    ("transformer_block", TransformerBlock(8, 2, mlp_ratio=2, causal=True), (2, 4, 8)),
    ("residual", Residual((Linear(4, 4), Tanh())), (3, 4)),
    # Added through the seam: each is one core file and this row, no adapter code.
    ("linear_no_bias", Linear(5, 3, bias=False), (2, 4, 5)),
    (
        "conv_same_dilated_grouped",
        Conv2d(2, 4, 3, stride=2, padding="same", dilation=(1, 2), groups=2),
        (2, 7, 8, 2),
    ),
    ("conv1d", Conv1d(3, 4, 3, stride=2, padding=1, bias=False), (2, 9, 3)),
    (
        "conv_transpose",
        ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
        (2, 3, 4, 3),
    ),
    ("group_norm", GroupNorm(2, 4), (2, 3, 3, 4)),
    ("rms_norm", RMSNorm(6), (2, 4, 6)),
    ("upsample", Upsample((2, 3)), (2, 2, 3, 2)),
    ("reshape", Reshape((3, -1)), (2, 12)),
    ("concatenate", Concatenate((Identity(), Linear(4, 3))), (3, 4)),
    ("sinusoidal_positions", SinusoidalPositionalEmbedding(6), (2, 5, 6)),
    ("gated_mlp", GatedMLP(6, 8), (2, 3, 6)),
    ("attention_rotary", MultiHeadAttention(8, 2, causal=True, bias=False, rotary=True), (2, 5, 8)),
    (
        "transformer_post_ln",
        TransformerBlock(8, 2, mlp_ratio=1.5, norm="post", activation="relu"),
        (2, 4, 8),
    ),
    (
        "transformer_no_bias",
        TransformerBlock(8, 2, mlp_ratio=2, causal=True, bias=False, norm_bias=False),
        (2, 4, 8),
    ),
    ("lstm", LSTM(3, 4), (2, 5, 3)),
    ("gru_last", GRU(3, 4, return_sequences=False), (2, 5, 3)),
    ("lstm_stateful", LSTM(3, 4, batch_size=2), (2, 5, 3)),
    (
        "initialized",
        Initialized(Linear(4, 3), {"weight": init.GlorotUniform(), "bias": init.Constant(0.1)}),
        (3, 4),
    ),
    (
        "cnn",
        Sequential(
            (
                Conv2d(1, 4, 3, padding=1),
                BatchNorm(4),
                ReLU(),
                MaxPool2d(2),
                Flatten(),
                Linear(4 * 3 * 3, 3),
            )
        ),
        (3, 6, 6, 1),
    ),
)


def layer_input(layer: AbstractLayer, shape: tuple[int, ...], seed: int = 0) -> Any:
    """A random input of ``shape`` for ``layer``: token ids or standard normal float64."""
    rng = np.random.default_rng([seed, len(shape)])
    if layer.input_kind == "tokens":
        first = next(leaf for _, leaf in layer.named_layers() if not leaf.children())
        return rng.integers(0, first.num_embeddings, size=shape)  # type: ignore[attr-defined]
    return rng.standard_normal(shape)
