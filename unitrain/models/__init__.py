"""Portable models: one description, one set of numpy initial weights, every backend.

A model is a tree of layers from this package, e.g. a small conv net::

    Sequential([Conv2d(1, 8, 3, padding=1), BatchNorm(8), ReLU(), MaxPool2d(2),
                Flatten(), Linear(4 * 4 * 8, 10)])

or a character-level Transformer::

    Sequential([Embedding(96, 64), PositionalEmbedding(128, 64),
                TransformerBlock(64, 4, causal=True), LayerNorm(64), Linear(64, 96)])

Every backend builds the same computation natively from the description. Parameters
(trained) and state (non-trainable tensors such as BatchNorm running statistics) have
canonical names (the dotted path of children: ``"0.weight"``, ``"2.running_var"``) and
layouts, so a checkpoint written by one backend loads in any other:

- images are channels-last ``(N, H, W, C)``; conv kernels ``(kh, kw, in, out)``;
- linear weights ``(in, out)`` and every dense layer computes ``x @ W + b`` over the last axis;
- sequence models take integer tokens ``(N, L)`` and give logits ``(N, L, V)``.

A model offers ``param_shapes()`` / ``init_params(seed, dtype)`` and ``state_shapes()`` /
``init_state(dtype)``; a backend's ``state_dict`` holds both under ``model.<name>``.
``output_shape(input_shape)`` infers shapes and ``check_input(batch)`` refuses data that does
not fit (DataError naming the layer and both shapes). Every model round-trips through
``to_dict()`` / :func:`model_from_dict`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from unitrain._errors import ConfigError
from unitrain.models import init
from unitrain.models._base import AbstractLayer, InputCheck, Shape, layer_from_dict
from unitrain.models._basic import (
    GELU,
    Dropout,
    Flatten,
    Linear,
    ReLU,
    Residual,
    Sequential,
    Sigmoid,
    SiLU,
    Tanh,
)
from unitrain.models._concatenate import Concatenate
from unitrain.models._conv import AvgPool2d, Conv2d, GlobalAvgPool, MaxPool2d
from unitrain.models._conv1d import Conv1d
from unitrain.models._conv_transpose import ConvTranspose2d
from unitrain.models._gated_mlp import GatedMLP
from unitrain.models._group_norm import GroupNorm
from unitrain.models._mlp import ACTIVATIONS, MLP
from unitrain.models._norm import BatchNorm, LayerNorm
from unitrain.models._recurrent import GRU, LSTM
from unitrain.models._reshape import Identity, Reshape, Upsample
from unitrain.models._rms_norm import RMSNorm
from unitrain.models._scope import Draw, Pass, Scope, apply
from unitrain.models._sequence import (
    Embedding,
    MultiHeadAttention,
    PositionalEmbedding,
    TransformerBlock,
)
from unitrain.models._sinusoidal import SinusoidalPositionalEmbedding
from unitrain.models.init import Initialized

__all__ = [
    "GRU",
    "LSTM",
    "Initialized",
    "init",
    "SinusoidalPositionalEmbedding",
    "RMSNorm",
    "Upsample",
    "Reshape",
    "Identity",
    "GroupNorm",
    "GatedMLP",
    "ConvTranspose2d",
    "Conv1d",
    "Concatenate",
    "ACTIVATIONS",
    "GELU",
    "MLP",
    "AbstractLayer",
    "AvgPool2d",
    "BatchNorm",
    "Conv2d",
    "Draw",
    "Dropout",
    "Embedding",
    "Flatten",
    "GlobalAvgPool",
    "InputCheck",
    "LayerNorm",
    "Linear",
    "MaxPool2d",
    "MultiHeadAttention",
    "Pass",
    "PositionalEmbedding",
    "ReLU",
    "Residual",
    "Scope",
    "Sequential",
    "Shape",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "TransformerBlock",
    "apply",
    "model_from_dict",
    "model_from_json",
]


def model_from_dict(data: Mapping[str, Any]) -> AbstractLayer:
    """Rebuild a portable model from its ``to_dict()`` output.

    Raises:
        ConfigError: the type is unknown, a field is missing or unknown, or a value is bad.

    Examples:
        >>> model = Sequential([Linear(4, 8), GELU(), Linear(8, 2)])
        >>> model_from_dict(model.to_dict()) == model
        True
    """
    return layer_from_dict(data)


def model_from_json(text: str) -> AbstractLayer:
    """Rebuild a portable model from ``to_json()`` output; bad JSON raises ConfigError."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model_from_json: not valid JSON ({error})") from error
    return model_from_dict(data)
