"""Initial values as data: initialisers, and :class:`Initialized`, which applies them.

Every layer draws its parameters from torch's default distribution for its kind. A recipe that
wants others (GPT-2's normal(0.02) weights, zero biases, Glorot kernels as Keras draws them)
wraps the model, or any part of it, in :class:`Initialized` with rules that match parameter
names::

    from unitrain.models import Initialized, init

    Initialized(model, {"*.weight": init.Normal(0.02), "*.bias": init.Zeros()})

The wrapper adds nothing to the computation or to the names (it is a transparent child), so a
checkpoint is the same with or without it. Values are drawn in numpy, identical for every
backend: a rule's parameter gets its own stream, seeded by the model's seed and the
parameter's name, so the other parameters keep the values they had without the rule.
"""

from __future__ import annotations

import abc
import dataclasses
import fnmatch
import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from unitrain._errors import ConfigError
from unitrain._fields import TypeRegistry
from unitrain.models._base import AbstractLayer, Shape, check_float, set_checked
from unitrain.models._scope import Scope

__all__ = [
    "Constant",
    "Function",
    "GlorotNormal",
    "GlorotUniform",
    "HeNormal",
    "HeUniform",
    "Initialized",
    "Initializer",
    "Normal",
    "TruncatedNormal",
    "Uniform",
    "Zeros",
    "fans",
]

_INITIALIZERS: TypeRegistry[Initializer] = TypeRegistry("initializer")


def fans(shape: Shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a parameter in the canonical layouts: ``(in, out)`` for a
    dense weight, ``(*window, in, out)`` for a kernel (times the window's size), the length
    for a vector."""
    if len(shape) < 2:
        size = shape[0] if shape else 1
        return size, size
    window = math.prod(shape[:-2])
    return shape[-2] * window, shape[-1] * window


class Initializer(abc.ABC):
    """How one parameter's initial values are drawn; a frozen dataclass with a type name."""

    type_name: ClassVar[str]

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            _INITIALIZERS.register(cls, type_name)

    @abc.abstractmethod
    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        """Values of ``shape`` in float64, drawn from ``rng``."""

    def to_dict(self) -> dict[str, Any]:
        """``{"type": type_name, **fields}``."""
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        return {"type": self.type_name, **{f.name: getattr(self, f.name) for f in fields}}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Initializer:
        """Rebuild an initialiser from :meth:`to_dict` output."""
        cls, fields = _INITIALIZERS.lookup(data, "Initializer.from_dict")
        return cls(**fields)


def _positive(owner: str, name: str, value: object) -> float:
    return check_float(owner, name, value, low=0.0, low_open=True, rule="a float > 0")


def _finite(owner: str, name: str, value: object) -> float:
    return check_float(owner, name, value, low=-math.inf, low_open=True, rule="a finite float")


@dataclasses.dataclass(frozen=True)
class Zeros(Initializer, type_name="zeros"):
    """All zeros."""

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        return np.zeros(shape)


@dataclasses.dataclass(frozen=True)
class Constant(Initializer, type_name="constant"):
    """Every value ``value``."""

    value: float

    def __post_init__(self) -> None:
        set_checked(self, "value", _finite("Constant", "value", self.value))

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        return np.full(shape, self.value)


@dataclasses.dataclass(frozen=True)
class Normal(Initializer, type_name="normal"):
    """Normal with standard deviation ``std`` around ``mean`` (GPT-2: ``Normal(0.02)``)."""

    std: float = 1.0
    mean: float = 0.0

    def __post_init__(self) -> None:
        set_checked(self, "std", _positive("Normal", "std", self.std))
        set_checked(self, "mean", _finite("Normal", "mean", self.mean))

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        return self.mean + self.std * rng.standard_normal(shape)


@dataclasses.dataclass(frozen=True)
class TruncatedNormal(Initializer, type_name="truncated_normal"):
    """Normal with ``std`` around ``mean``, values beyond ``bound`` standard deviations
    drawn again (Keras' rule, 2 deviations; torch's ``trunc_normal_`` cuts at absolute
    values instead)."""

    std: float = 1.0
    mean: float = 0.0
    bound: float = 2.0

    def __post_init__(self) -> None:
        set_checked(self, "std", _positive("TruncatedNormal", "std", self.std))
        set_checked(self, "mean", _finite("TruncatedNormal", "mean", self.mean))
        set_checked(self, "bound", _positive("TruncatedNormal", "bound", self.bound))

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        values = rng.standard_normal(shape)
        outside = np.abs(values) > self.bound
        while outside.any():
            values[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(values) > self.bound
        return self.mean + self.std * values


@dataclasses.dataclass(frozen=True)
class Uniform(Initializer, type_name="uniform"):
    """Uniform in ``[low, high)``."""

    low: float = -0.05
    high: float = 0.05

    def __post_init__(self) -> None:
        set_checked(self, "low", _finite("Uniform", "low", self.low))
        set_checked(self, "high", _finite("Uniform", "high", self.high))
        if self.high <= self.low:
            raise ConfigError(f"Uniform: high must exceed low, got [{self.low}, {self.high})")

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        return rng.uniform(self.low, self.high, shape)


class _VarianceScaling(Initializer):
    """Variance ``scale / n``, ``n`` the parameter's fan by ``mode``, drawn uniform (in
    ``±sqrt(3 * variance)``) or normal (untruncated, as torch's)."""

    mode: ClassVar[str]
    scale: ClassVar[float]
    uniform: ClassVar[bool]

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        fan_in, fan_out = fans(shape)
        n = {"fan_in": fan_in, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        variance = self.scale / n
        if self.uniform:
            bound = math.sqrt(3 * variance)
            return rng.uniform(-bound, bound, shape)
        return math.sqrt(variance) * rng.standard_normal(shape)


@dataclasses.dataclass(frozen=True)
class GlorotUniform(_VarianceScaling, type_name="glorot_uniform"):
    """Uniform in ``±sqrt(6 / (fan_in + fan_out))`` (Glorot and Bengio; Keras' default)."""

    mode, scale, uniform = "fan_avg", 1.0, True


@dataclasses.dataclass(frozen=True)
class GlorotNormal(_VarianceScaling, type_name="glorot_normal"):
    """Normal with variance ``2 / (fan_in + fan_out)``."""

    mode, scale, uniform = "fan_avg", 1.0, False


@dataclasses.dataclass(frozen=True)
class HeUniform(_VarianceScaling, type_name="he_uniform"):
    """Uniform in ``±sqrt(6 / fan_in)`` (He et al., for ReLU networks)."""

    mode, scale, uniform = "fan_in", 2.0, True


@dataclasses.dataclass(frozen=True)
class HeNormal(_VarianceScaling, type_name="he_normal"):
    """Normal with variance ``2 / fan_in`` (torch's ``kaiming_normal_``)."""

    mode, scale, uniform = "fan_in", 2.0, False


@dataclasses.dataclass(frozen=True)
class Function(Initializer):
    """A function ``fn(rng, shape) -> values`` of your own, drawing from the numpy generator
    it is given (so every backend gets the same values). Python only: a function cannot be
    written to JSON or a recipe (which would run code when read)."""

    fn: Callable[[np.random.Generator, Shape], Any]

    type_name: ClassVar[str] = "function"

    def draw(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        values = np.asarray(self.fn(rng, shape), dtype=np.float64)
        if values.shape != tuple(shape):
            raise ConfigError(
                f"initialiser {self.fn!r} gave values of shape {values.shape} for a parameter "
                f"of shape {tuple(shape)}"
            )
        return values

    def to_dict(self) -> dict[str, Any]:
        raise ConfigError(
            f"Function initialiser {self.fn!r} cannot be written to JSON or a recipe; use a "
            "built-in initialiser there (Normal, Uniform, GlorotUniform, ...)"
        )


def _check_rules(rules: object) -> tuple[tuple[str, Initializer], ...]:
    pairs: Any = rules.items() if isinstance(rules, Mapping) else rules
    checked = []
    try:
        for pattern, rule in pairs:
            if isinstance(rule, Mapping):
                rule = Initializer.from_dict(rule)
            if not isinstance(pattern, str) or not isinstance(rule, Initializer):
                raise TypeError
            checked.append((pattern, rule))
    except (TypeError, ValueError):
        raise ConfigError(
            "Initialized: rules must map parameter-name patterns to initialisers, e.g. "
            f"{{'*.weight': Normal(0.02)}}, got {rules!r}"
        ) from None
    return tuple(checked)


@dataclasses.dataclass(frozen=True)
class Initialized(AbstractLayer, type_name="initialized"):
    """``layer`` with the initial values of the parameters that ``rules`` match drawn by
    their initialisers; the computation and the parameter names are ``layer``'s.

    Patterns are ``fnmatch`` patterns over names relative to ``layer`` (``"*.weight"``,
    ``"0.bias"``, ``"*"``); where several match, the last one given wins, and a rule of an
    inner ``Initialized`` wins over an outer one. A pattern that matches no parameter is an
    error (a typo would otherwise be silent).

    Examples:
        >>> from unitrain.models import Linear, Sequential
        >>> model = Initialized(Sequential([Linear(2, 3)]), {"*.bias": Constant(0.5)})
        >>> model.init_params(seed=0)["0.bias"]
        array([0.5, 0.5, 0.5], dtype=float32)
    """

    layer: AbstractLayer
    rules: Any

    def __post_init__(self) -> None:
        if not isinstance(self.layer, AbstractLayer):
            raise ConfigError(f"Initialized: layer must be a layer, got {self.layer!r}")
        set_checked(self, "rules", _check_rules(self.rules))
        names = list(self.layer.param_shapes())
        for pattern, _ in self.rules:
            if not fnmatch.filter(names, pattern):
                raise ConfigError(
                    f"Initialized: pattern {pattern!r} matches no parameter of "
                    f"{self.layer.describe()}; its parameters: {names}"
                )

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (("", self.layer),)  # transparent: the layer's names are the wrapper's

    @property
    def input_kind(self) -> str:
        return self.layer.input_kind

    def describe(self) -> str:
        return self.layer.describe()

    def init_rules(self) -> Iterator[tuple[str, Initializer]]:
        return iter(self.rules)

    def forward(self, scope: Scope, x: Any) -> Any:
        return scope.call("", x)

    def _output_shape(self, shape: Shape) -> Shape:
        return self.layer.output_shape(shape)

    def to_dict(self) -> dict[str, Any]:
        rules = {pattern: rule.to_dict() for pattern, rule in self.rules}
        return {"type": self.type_name, "layer": self.layer.to_dict(), "rules": rules}

    @classmethod
    def field_from_plain(cls, name: str, value: Any) -> Any:
        return value if name == "rules" else super().field_from_plain(name, value)


def rule_stream(seed: int, name: str) -> np.random.Generator:
    """The generator of parameter ``name`` under a rule: its own, so that a rule changes no
    other parameter's values."""
    return np.random.default_rng([seed, 0x494E4954, zlib.crc32(name.encode())])
