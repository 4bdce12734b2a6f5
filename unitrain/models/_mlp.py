"""The MLP shortcut: ``Linear -> activation -> dropout`` per hidden layer, named as before.

Its parameters keep the names they had before the layer language existed, so checkpoints
written then still load:

``layers.{i}.weight``  shape ``(in_features, out_features)``; the layer computes ``x @ W + b``
``layers.{i}.bias``    shape ``(out_features,)``
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape
from unitrain.models._basic import (
    ACTIVATION_LAYERS,
    Dropout,
    Linear,
    chain_output_shape,
    run_children,
)
from unitrain.models._scope import Scope

__all__ = ["ACTIVATIONS", "MLP"]

#: Hidden-layer activations of :class:`MLP`, and the layers that compute them.
_ACTIVATION_LAYERS = ACTIVATION_LAYERS
ACTIVATIONS = tuple(_ACTIVATION_LAYERS)


@dataclasses.dataclass(frozen=True)
class MLP(AbstractLayer, type_name="mlp"):
    """A multi-layer perceptron: ``Linear -> activation -> dropout`` per hidden layer.

    Args:
        sizes: layer widths from input to output, at least two, e.g. ``(64, 128, 10)``.
        activation: one of :data:`ACTIVATIONS` (``gelu`` is the exact erf form).
        dropout: probability of zeroing a hidden activation in train mode (inverted dropout:
            survivors are scaled by ``1 / (1 - dropout)``); never applied to the output.

    Examples:
        >>> model = MLP((4, 8, 3))
        >>> for name, value in model.init_params(seed=0).items():
        ...     print(name, value.shape)
        layers.0.weight (4, 8)
        layers.0.bias (8,)
        layers.1.weight (8, 3)
        layers.1.bias (3,)
    """

    sizes: tuple[int, ...]
    activation: str = "relu"
    dropout: float = 0.0
    # The stream the MLP's weights were always drawn from, so that seeds reproduce them.
    _seed_tag: ClassVar[int] = 0x4D4C50
    only_runs_children: ClassVar[bool] = True

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if len(sizes) < 2 or any(isinstance(s, bool) or not isinstance(s, int) for s in sizes):
            raise ConfigError(f"MLP: sizes must be two or more ints, got sizes={self.sizes!r}")
        if any(s <= 0 for s in sizes):
            raise ConfigError(f"MLP: every size must be positive, got sizes={self.sizes!r}")
        object.__setattr__(self, "sizes", sizes)
        if self.activation not in ACTIVATIONS:
            raise ConfigError(
                f"MLP: unknown activation {self.activation!r}; choose one of {ACTIVATIONS}"
            )
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ConfigError(f"MLP: dropout must be in [0, 1), got dropout={self.dropout!r}")

    @property
    def in_features(self) -> int:
        """Width of the input."""
        return self.sizes[0]

    @property
    def out_features(self) -> int:
        """Width of the output (number of classes for cross-entropy)."""
        return self.sizes[-1]

    @property
    def num_layers(self) -> int:
        """Number of linear layers."""
        return len(self.sizes) - 1

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        kids: list[tuple[str, AbstractLayer]] = []
        last = self.num_layers - 1
        for i, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:])):
            kids.append((f"layers.{i}", Linear(fan_in, fan_out)))
            if i < last:
                kids.append((f"activation.{i}", _ACTIVATION_LAYERS[self.activation]()))
                if self.dropout:
                    kids.append((f"dropout.{i}", Dropout(self.dropout)))
        return tuple(kids)

    def forward(self, scope: Scope, x: Any) -> Any:
        return run_children(self, scope, x)

    def _output_shape(self, shape: Shape) -> Shape:
        return chain_output_shape(self, shape)
