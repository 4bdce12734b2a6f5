"""GatedMLP: the gated feed-forward network of Shazeer (2020), SwiGLU with SiLU."""

from __future__ import annotations

import dataclasses
from typing import Any

from unitrain.models._base import AbstractLayer, Shape, check_int, set_checked
from unitrain.models._basic import Linear, activation_function, check_bool
from unitrain.models._scope import Scope

__all__ = ["GatedMLP"]


@dataclasses.dataclass(frozen=True)
class GatedMLP(AbstractLayer, type_name="gated_mlp"):
    """``down(act(gate(x)) * up(x))`` over the last axis: SwiGLU with ``activation="silu"``
    (LLaMA's feed-forward network), GEGLU with ``"gelu"``.

    Children ``gate`` and ``up`` (``dim -> hidden``) and ``down`` (``hidden -> dim``);
    without biases by default, as in LLaMA.

    Examples:
        >>> list(GatedMLP(8, 16).param_shapes())
        ['gate.weight', 'up.weight', 'down.weight']
    """

    dim: int
    hidden: int
    activation: str = "silu"
    bias: bool = False

    def __post_init__(self) -> None:
        set_checked(self, "dim", check_int("GatedMLP", "dim", self.dim))
        set_checked(self, "hidden", check_int("GatedMLP", "hidden", self.hidden))
        activation_function("GatedMLP", self.activation)
        check_bool("GatedMLP", "bias", self.bias)

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (
            ("gate", Linear(self.dim, self.hidden, self.bias)),
            ("up", Linear(self.dim, self.hidden, self.bias)),
            ("down", Linear(self.hidden, self.dim, self.bias)),
        )

    @property
    def input_kind(self) -> str:
        return "float"

    def forward(self, scope: Scope, x: Any) -> Any:
        act = activation_function("GatedMLP", self.activation)
        return scope.call("down", act(scope.call("gate", x)) * scope.call("up", x))

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.dim:
            raise self._refuse(shape, f"(..., {self.dim})")
        return shape
