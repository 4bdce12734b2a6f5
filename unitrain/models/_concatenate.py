"""Concatenate: several branches read the same input; their outputs are joined on one axis."""

from __future__ import annotations

import dataclasses
from typing import Any

from unitrain import ops
from unitrain._errors import ConfigError, DataError
from unitrain.models._base import AbstractLayer, Shape, set_checked
from unitrain.models._basic import check_layers
from unitrain.models._scope import Scope

__all__ = ["Concatenate"]


@dataclasses.dataclass(frozen=True)
class Concatenate(AbstractLayer, type_name="concatenate"):
    """Run every branch on the input and join the outputs along ``axis`` of the example.

    ``axis`` counts the example's axes (the batch axis is not one of them), negative from
    the end; the branches' outputs must agree on every other axis. With an
    :class:`Identity` branch this is a skip connection that keeps the input beside what a
    block made of it, as in a U-Net or DenseNet. Branches are children ``"0"``, ``"1"``, ...

    Examples:
        >>> from unitrain.models import Identity, Linear
        >>> Concatenate([Identity(), Linear(4, 3)]).output_shape((5, 4))
        (5, 7)
    """

    branches: tuple[AbstractLayer, ...]
    axis: int = -1

    def __post_init__(self) -> None:
        set_checked(self, "branches", check_layers("Concatenate", self.branches))
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise ConfigError(f"Concatenate: axis must be an int, got axis={self.axis!r}")

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return tuple((str(i), layer) for i, layer in enumerate(self.branches))

    def describe(self) -> str:
        return f"Concatenate of {len(self.branches)} branches"

    def forward(self, scope: Scope, x: Any) -> Any:
        outputs = [scope.call(name, x) for name, _ in self.children()]
        return ops.concat(outputs, axis=self.axis if self.axis < 0 else self.axis + 1)

    def _output_shape(self, shape: Shape) -> Shape:
        shapes = []
        for name, branch in self.children():
            try:
                shapes.append(branch.output_shape(shape))
            except DataError as error:
                raise DataError(f"Concatenate branch {name}: {error}") from None
        rank = len(shapes[0])
        if not -rank <= self.axis < rank:
            raise DataError(
                f"{self.describe()}: axis {self.axis} is outside the branches' outputs "
                f"{shapes}; choose an axis in [{-rank}, {rank})"
            )
        axis = self.axis % rank
        rest = {s[:axis] + s[axis + 1 :] for s in shapes}
        if len(rest) != 1 or any(len(s) != rank for s in shapes):
            raise DataError(
                f"{self.describe()}: the branches' outputs {shapes} differ on axes other than "
                f"axis {self.axis}; make them agree there"
            )
        return (*shapes[0][:axis], sum(s[axis] for s in shapes), *shapes[0][axis + 1 :])
