"""Dense layers, activations, dropout, flattening and the two ways to compose layers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError, DataError
from unitrain.models._base import (
    AbstractLayer,
    Shape,
    check_float,
    check_int,
    set_checked,
)
from unitrain.models._scope import Scope

__all__ = [
    "ACTIVATION_LAYERS",
    "GELU",
    "Dropout",
    "Flatten",
    "Linear",
    "ReLU",
    "Residual",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "activation_function",
    "chain_output_shape",
    "check_bool",
    "check_layers",
    "run_children",
    "uniform_fan_in",
]


def uniform_fan_in(rng: np.random.Generator, shape: Shape, fan_in: int) -> np.ndarray:
    """Uniform in ``±1/sqrt(fan_in)``: torch's default for Linear and Conv weights and biases.

    (torch's ``kaiming_uniform_(a=sqrt(5))`` bound ``sqrt(6 / ((1 + 5) * fan_in))`` is this.)
    """
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape)


@dataclasses.dataclass(frozen=True)
class Linear(AbstractLayer, type_name="linear"):
    """``y = x @ weight + bias`` over the last axis; weight ``(in_features, out_features)``.

    Args:
        in_features: width of the last input axis.
        out_features: width of the last output axis.
        bias: whether ``bias`` is added (``False``: ``y = x @ weight``).

    Examples:
        >>> Linear(3, 2).param_shapes()
        {'weight': (3, 2), 'bias': (2,)}
        >>> Linear(3, 2).output_shape((5, 3))
        (5, 2)
    """

    in_features: int
    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        set_checked(self, "in_features", check_int("Linear", "in_features", self.in_features))
        set_checked(self, "out_features", check_int("Linear", "out_features", self.out_features))
        check_bool("Linear", "bias", self.bias)

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {"weight": (self.in_features, self.out_features)}
        if self.bias:
            shapes["bias"] = (self.out_features,)
        return shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shapes = self.own_param_shapes()
        return {
            name: uniform_fan_in(rng, shape, self.in_features) for name, shape in shapes.items()
        }

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.linear(x, scope.param("weight"), scope.param("bias") if self.bias else None)

    def _output_shape(self, shape: Shape) -> Shape:
        if not shape or shape[-1] != self.in_features:
            raise self._refuse(shape, f"(..., {self.in_features})")
        return (*shape[:-1], self.out_features)


@dataclasses.dataclass(frozen=True)
class Flatten(AbstractLayer, type_name="flatten"):
    """Flatten each example to one axis, in channels-last order (``H, W, C`` for images)."""

    def forward(self, scope: Scope, x: Any) -> Any:
        return ops.reshape(x, (-1, math.prod(ops.shape(x)[1:])))

    def _output_shape(self, shape: Shape) -> Shape:
        return (math.prod(shape),)


@dataclasses.dataclass(frozen=True)
class Dropout(AbstractLayer, type_name="dropout"):
    """Zero each value with probability ``p`` in train mode; survivors scale by ``1/(1-p)``.

    Masks keep a value where a uniform draw in [0, 1) is below ``1 - p``, drawn from the
    portable generator keyed by ``(seed, step, micro_batch)`` and the layer's path
    (:mod:`unitrain.ops.random`): every backend drops the same values, and runs resume
    exactly. With ``random="native"`` each backend draws from its own generator instead
    (faster on some, different masks on each). Evaluation never drops.
    """

    p: float = 0.5

    def __post_init__(self) -> None:
        set_checked(
            self, "p", check_float("Dropout", "p", self.p, low=0.0, high=1.0, rule="in [0, 1)")
        )

    def forward(self, scope: Scope, x: Any) -> Any:
        return scope.dropout(x, self.p)

    def _output_shape(self, shape: Shape) -> Shape:
        return shape


class _Activation(AbstractLayer):
    """An elementwise function of :mod:`unitrain.ops`: the output has the input's shape."""

    function: ClassVar[Callable[[Any], Any]]

    def forward(self, scope: Scope, x: Any) -> Any:
        return type(self).function(x)

    def _output_shape(self, shape: Shape) -> Shape:
        return shape


@dataclasses.dataclass(frozen=True)
class ReLU(_Activation, type_name="relu"):
    """``max(x, 0)``; its gradient at 0 is 0, as in every framework."""

    function = ops.relu


@dataclasses.dataclass(frozen=True)
class GELU(_Activation, type_name="gelu"):
    """``x * Phi(x)`` in the exact erf form (torch's default, not the tanh approximation)."""

    function = ops.gelu


@dataclasses.dataclass(frozen=True)
class Tanh(_Activation, type_name="tanh"):
    """The hyperbolic tangent."""

    function = ops.tanh


@dataclasses.dataclass(frozen=True)
class Sigmoid(_Activation, type_name="sigmoid"):
    """The logistic function ``1 / (1 + exp(-x))``."""

    function = ops.sigmoid


@dataclasses.dataclass(frozen=True)
class SiLU(_Activation, type_name="silu"):
    """``x * sigmoid(x)`` (also called swish)."""

    function = ops.silu


#: The activation layers by the names MLP, TransformerBlock and GatedMLP take.
ACTIVATION_LAYERS: dict[str, type[AbstractLayer]] = {
    "relu": ReLU,
    "tanh": Tanh,
    "gelu": GELU,
    "sigmoid": Sigmoid,
    "silu": SiLU,
}


def activation_function(owner: str, name: object) -> Callable[[Any], Any]:
    """The :mod:`unitrain.ops` function of activation ``name``; ConfigError if unknown."""
    layer = ACTIVATION_LAYERS.get(name) if isinstance(name, str) else None
    if layer is None:
        raise ConfigError(
            f"{owner}: unknown activation {name!r}; choose one of {tuple(ACTIVATION_LAYERS)}"
        )
    return layer.function  # type: ignore[attr-defined]


def check_bool(owner: str, name: str, value: object) -> bool:
    """``value`` if it is a bool; ConfigError otherwise."""
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be true or false, got {name}={value!r}")
    return value


def check_layers(owner: str, layers: object) -> tuple[AbstractLayer, ...]:
    if isinstance(layers, AbstractLayer) or not isinstance(layers, Sequence) or not layers:
        raise ConfigError(f"{owner}: layers must be a non-empty list of layers, got {layers!r}")
    for index, layer in enumerate(layers):
        if not isinstance(layer, AbstractLayer):
            raise ConfigError(
                f"{owner}: layers[{index}] must be a unitrain.models layer, got {layer!r}"
            )
    return tuple(layers)


def run_children(owner: AbstractLayer, scope: Scope, x: Any) -> Any:
    """Run ``owner``'s children one after the other on ``x`` (a chain's forward)."""
    for name in owner.child_names():
        x = scope.call(name, x)
    return x


def chain_output_shape(owner: AbstractLayer, shape: Shape) -> Shape:
    """Run shape inference through ``owner``'s children in order, naming the one that fails."""
    for name, layer in owner.children():
        try:
            shape = layer.output_shape(shape)
        except DataError as error:
            raise DataError(f"{type(owner).__name__} layer {name}: {error}") from None
    return shape


@dataclasses.dataclass(frozen=True)
class Sequential(AbstractLayer, type_name="sequential"):
    """Layers applied one after the other; the child at index ``i`` is named ``"i"``.

    Examples:
        >>> model = Sequential([Linear(4, 8), ReLU(), Linear(8, 3)])
        >>> list(model.param_shapes())
        ['0.weight', '0.bias', '2.weight', '2.bias']
        >>> model.output_shape((4,))
        (3,)
    """

    layers: tuple[AbstractLayer, ...]
    only_runs_children: ClassVar[bool] = True

    def __post_init__(self) -> None:
        set_checked(self, "layers", check_layers("Sequential", self.layers))

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return tuple((str(i), layer) for i, layer in enumerate(self.layers))

    def describe(self) -> str:
        return f"Sequential of {len(self.layers)} layers"

    def forward(self, scope: Scope, x: Any) -> Any:
        return run_children(self, scope, x)

    def _output_shape(self, shape: Shape) -> Shape:
        return chain_output_shape(self, shape)


@dataclasses.dataclass(frozen=True)
class Residual(AbstractLayer, type_name="residual"):
    """``x + f(x)`` where ``f`` is the given layers in order (children named ``"0"``, ...).

    The layers must give an output of the input's shape.
    """

    layers: tuple[AbstractLayer, ...]
    only_runs_children: ClassVar[bool] = True

    def __post_init__(self) -> None:
        set_checked(self, "layers", check_layers("Residual", self.layers))

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return tuple((str(i), layer) for i, layer in enumerate(self.layers))

    @property
    def input_kind(self) -> str:
        return "float"  # the sum x + f(x) needs x to be a float tensor

    def describe(self) -> str:
        return f"Residual of {len(self.layers)} layers"

    def forward(self, scope: Scope, x: Any) -> Any:
        return x + run_children(self, scope, x)

    def _output_shape(self, shape: Shape) -> Shape:
        out = chain_output_shape(self, shape)
        if out != shape:
            raise self._refuse(shape, f"whose branch output {out} equals it")
        return shape
