"""The layer base class, its type-name registry, argument checks and JSON round-tripping.

A layer is a frozen dataclass that describes a computation; it holds no arrays. Its
parameters and state are named, shaped and initialised here, in numpy, and every backend
builds the computation natively from that description. Composite layers (Sequential,
Residual, TransformerBlock, MLP) name their children, and a parameter's canonical name is the
dotted path of children down to it: ``"2.weight"``, ``"1.attention.query.weight"``.
"""

from __future__ import annotations

import abc
import dataclasses
import fnmatch
import json
import math
import numbers
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from unitrain._errors import ConfigError, DataError
from unitrain._fields import TypeRegistry

if TYPE_CHECKING:
    from unitrain.models._scope import Scope

__all__ = [
    "AbstractLayer",
    "InputCheck",
    "Shape",
    "as_pair",
    "check_float",
    "check_int",
    "check_pair",
    "layer_from_dict",
    "set_checked",
]

#: The shape of one example (no batch axis), e.g. ``(8, 8, 1)`` for an 8x8 grey image.
Shape = tuple[int, ...]

_REGISTRY: TypeRegistry[AbstractLayer] = TypeRegistry("model")


class AbstractLayer(abc.ABC):
    """One piece of a portable model: a description that every backend builds natively.

    Subclasses are frozen dataclasses that name themselves in the class statement,
    ``class Linear(AbstractLayer, type_name="linear")``, which registers them for
    :func:`layer_from_dict`. A leaf implements :meth:`own_param_shapes` and
    :meth:`_init_own_params` (if it has parameters) and :meth:`_output_shape`; a composite
    implements :meth:`children`. Any layer can be trained on its own as a model.
    """

    type_name: ClassVar[str]
    #: Seeds the stream of initial weights; MLP keeps its own so old checkpoints reproduce.
    _seed_tag: ClassVar[int] = 0x554C59
    #: Whether sharded training gathers this layer's parameters (its whole subtree's) as one
    #: unit of their own: a repeated block of a network, such as TransformerBlock. See
    #: :meth:`sharding_units`.
    sharding_unit: ClassVar[bool] = False
    #: Whether this composite only runs its children, reading none of their parameters
    #: itself (Sequential, Residual), so that each child can be a unit of its own.
    only_runs_children: ClassVar[bool] = False

    def __init_subclass__(cls, *, type_name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            _REGISTRY.register(cls, type_name)

    # -- what a subclass describes -------------------------------------------------------------

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        """The named sub-layers of a composite, in the order they run; none for a leaf."""
        return ()

    def own_param_shapes(self) -> dict[str, Shape]:
        """The layer's own trainable parameters (not its children's), by local name."""
        return {}

    def own_state_shapes(self) -> dict[str, Shape]:
        """The layer's own non-trainable state (e.g. BatchNorm statistics), by local name."""
        return {}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw the own parameters in float64 from ``rng``, in :meth:`own_param_shapes` order."""
        return {}

    def _init_own_state(self) -> dict[str, np.ndarray]:
        """The initial own state in float64."""
        return {}

    def forward(self, scope: Scope, x: Any) -> Any:
        """The layer's computation, written in :mod:`unitrain.ops` (never a framework).

        ``scope`` gives the layer its own parameters (``scope.param("weight")``) and state,
        the mode (``scope.training``), dropout (``scope.dropout(x, p)``) and its children
        (``scope.call("0", x)``); see :class:`unitrain.models.Scope`. Every backend runs this
        one body, and its gradients come from the backend's own autodiff.
        """
        raise ConfigError(
            f"{type(self).__name__} has no forward: a layer computes its output in "
            "`forward(self, scope, x)`, written in unitrain.ops"
        )

    @abc.abstractmethod
    def _output_shape(self, shape: Shape) -> Shape:
        """The output shape of one example of ``shape``; DataError (via :meth:`_refuse`) if
        the shape does not fit."""

    # -- what every layer offers -----------------------------------------------------------------

    @property
    def input_kind(self) -> str:
        """``"tokens"`` when the layer reads integer ids (Embedding first), else ``"float"``."""
        kids = self.children()
        return kids[0][1].input_kind if kids else "float"

    @property
    def drops_values(self) -> bool:
        """Whether this layer itself calls ``scope.dropout`` (or draws random numbers) in
        train mode. The default reads a ``p``, ``dropout`` or ``attention_dropout`` field; a
        layer of your own that drops values under another name overrides this."""
        return any(bool(getattr(self, name, 0.0)) for name in ("p", "dropout", "attention_dropout"))

    @property
    def drops_out(self) -> bool:
        """Whether any layer of the tree drops values in train mode (needs a dropout key)."""
        return any(layer.drops_values for _, layer in self.named_layers())

    def child(self, name: str) -> AbstractLayer | None:
        """The child called ``name``, or None; looked up in a table made once per layer."""
        table = self.__dict__.get("_children_by_name")  # the table's fast path, inlined
        return (self._child_table() if table is None else table).get(name)

    def child_names(self) -> tuple[str, ...]:
        """The children's names in order, from the same table (``children()`` may build
        new layers on every call, which a forward run every step should not pay for)."""
        return tuple(self._child_table())

    def _child_table(self) -> dict[str, AbstractLayer]:
        table: dict[str, AbstractLayer] | None = self.__dict__.get("_children_by_name")
        if table is None:
            table = dict(self.children())
            object.__setattr__(self, "_children_by_name", table)  # a cache, not a field
        return table

    def named_layers(self, prefix: str = "") -> Iterator[tuple[str, AbstractLayer]]:
        """Every layer of the tree with its dotted name, parents before children."""
        yield prefix, self
        for name, child in self.children():
            yield from child.named_layers(_join(prefix, name))

    def sharding_units(self) -> tuple[str, ...]:
        """The canonical paths of the layers sharded training gathers one at a time.

        A sharded worker holds ``1/N`` of every parameter; a layer's full parameters are
        gathered just before it runs and freed after it, one *unit* at a time, so a worker's
        peak holds one unit's full parameters (and, in the backward pass, its gradients),
        not the whole model's. The units are the outermost layers below the model that are
        either a block (``sharding_unit``: TransformerBlock) or a child with parameters of a
        composite that only runs its children (``only_runs_children``: Sequential,
        Residual); a nested Sequential is looked into. Every other parameter belongs to the
        model's own unit, gathered for the whole pass: a composite of your own whose forward
        reads a child's parameter itself (a head tied to the token embedding) keeps that
        child in its unit, as a parameter is only there while its unit runs.

        >>> from unitrain.models import Embedding, LayerNorm, Linear, Sequential
        >>> from unitrain.models import TransformerBlock
        >>> blocks = [TransformerBlock(8, 2) for _ in range(2)]
        >>> Sequential([Embedding(11, 8), *blocks, LayerNorm(8), Linear(8, 11)]).sharding_units()
        ('0', '1', '2', '3', '4')
        """
        units: list[str] = []

        def visit(layer: AbstractLayer, prefix: str) -> None:
            for name, child in layer.children():
                path = _join(prefix, name)
                if not child.param_shapes():
                    continue
                if child.sharding_unit or (
                    layer.only_runs_children and not child.only_runs_children
                ):
                    units.append(path)
                else:
                    visit(child, path)

        visit(self, "")
        return tuple(dict.fromkeys(units))  # a transparent child shares its parent's path

    def param_shapes(self) -> dict[str, Shape]:
        """Canonical parameter names and shapes, in the order the layers run."""
        return {
            _join(prefix, name): shape
            for prefix, layer in self.named_layers()
            for name, shape in layer.own_param_shapes().items()
        }

    def state_shapes(self) -> dict[str, Shape]:
        """Canonical names and shapes of the model state (non-trainable tensors)."""
        return {
            _join(prefix, name): shape
            for prefix, layer in self.named_layers()
            for name, shape in layer.own_state_shapes().items()
        }

    def init_params(self, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """Initial weights drawn in numpy, identical for every backend given the seed.

        Each layer follows the distribution of PyTorch's default initialisation for its kind
        (not torch's random stream), drawn in float64 and rounded to ``dtype``.
        """
        rng = np.random.default_rng([seed, self._seed_tag])
        params: dict[str, np.ndarray] = {}
        for prefix, layer in self.named_layers():
            for name, value in layer._init_own_params(rng).items():
                params[_join(prefix, name)] = value.astype(dtype)
        from unitrain.models.init import rule_stream

        for prefix, layer in self.named_layers():  # outer rules first: inner ones win
            for pattern, rule in layer.init_rules():
                for name in fnmatch.filter(params, _join(prefix, pattern)):
                    shape = params[name].shape
                    params[name] = rule.draw(rule_stream(seed, name), shape).astype(dtype)
        return params

    def init_rules(self) -> Iterator[tuple[str, Any]]:
        """``(pattern, initializer)`` rules for the parameters below this layer (see
        :class:`unitrain.models.Initialized`); none for other layers."""
        return iter(())

    def init_state(self, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """The initial model state under canonical names, in ``dtype``."""
        return {
            _join(prefix, name): value.astype(dtype)
            for prefix, layer in self.named_layers()
            for name, value in layer._init_own_state().items()
        }

    def output_shape(self, input_shape: Shape) -> Shape:
        """The shape of one output example given the shape of one input example.

        Raises:
            DataError: the input shape does not fit; the message names the layer and both
                shapes.
        """
        return self._output_shape(_shapes(input_shape))

    def check_input(self, inputs: Any) -> None:
        """Refuse a batch the model cannot read, before any backend touches it.

        Checks the per-example shape against the first layer (:meth:`output_shape`) and,
        for token models, that ids are integers in range: frameworks disagree on an
        out-of-range id (torch and TensorFlow raise, JAX returns a NaN row, plain indexing
        clamps), so unitrain refuses it everywhere.

        Raises:
            DataError: the batch does not fit the model.
        """
        if isinstance(inputs, (tuple, dict)):  # several inputs: one shape each
            self.output_shape(_example_shapes(inputs))
            return
        shape = getattr(inputs, "shape", None)
        if shape is None or len(shape) < 1:
            raise DataError(
                f"{self.describe()}: inputs must be an array with a batch axis, got {inputs!r}"
            )
        self.output_shape(tuple(shape[1:]))
        if self.input_kind == "tokens":
            _check_token_ids(self, np.asarray(inputs))

    def describe(self) -> str:
        """A short name for messages: the class and its arguments."""
        return repr(self)

    def _refuse(self, shape: Shape, expected: str) -> DataError:
        """The DataError for an input of ``shape`` that does not fit this layer."""
        return DataError(
            f"{self.describe()} expects inputs of shape {expected} (per example), "
            f"got {shape}; reshape the data or change the layer"
        )

    @classmethod
    def field_from_plain(cls, name: str, value: Any) -> Any:
        """Field ``name`` rebuilt from its JSON form: nested dicts are layers, lists tuples."""
        return _from_plain(value)

    def to_dict(self) -> dict[str, Any]:
        """Return ``{"type": type_name, **args}`` with JSON types only; children nest."""
        out: dict[str, Any] = {"type": self.type_name}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            if field.init:
                out[field.name] = _to_plain(getattr(self, field.name))
        return out

    def to_json(self) -> str:
        """Return :meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(), allow_nan=False)


class InputCheck:
    """Refuses the batches a model cannot read, cheaply enough to run before every step.

    The shape of an example is checked once per distinct shape (shape inference walks the
    whole model); token ids are checked in every batch, since any batch may hold a bad one.

    Args:
        model: the portable model the batches are for.
    """

    def __init__(self, model: AbstractLayer) -> None:
        self.model = model
        #: Whether the model reads integer token ids (they must stay integers).
        self.tokens = model.input_kind == "tokens"
        self._checked: Any = None  # the last example shape (or shapes) that fitted

    def __call__(self, inputs: Any) -> None:
        """Raise DataError unless ``inputs`` (a batch) fits the model."""
        if isinstance(inputs, (tuple, dict)):
            shapes = _example_shapes(inputs)
            if shapes != self._checked:
                self.model.check_input(inputs)
                self._checked = shapes
        elif self.tokens or tuple(inputs.shape[1:]) != self._checked:
            self.model.check_input(inputs)
            self._checked = tuple(inputs.shape[1:])


def _shapes(shape: Any) -> Any:
    """One example's shape as a tuple of ints; several inputs' shapes (a tuple of shapes or a
    dict of them, as a model of several inputs reads them) each so."""
    if isinstance(shape, Mapping):
        return {key: _shapes(value) for key, value in shape.items()}
    if any(isinstance(n, (tuple, list, Mapping)) for n in shape):
        return tuple(_shapes(n) for n in shape)
    return tuple(int(n) for n in shape)


def _example_shapes(inputs: Any) -> Any:
    """The shape of one example of every array of a structured batch, in its structure."""
    if isinstance(inputs, Mapping):
        return {key: _example_shapes(value) for key, value in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(_example_shapes(value) for value in inputs)
    shape = getattr(inputs, "shape", None)
    if shape is None or len(shape) < 1:
        raise DataError(f"every input must be an array with a batch axis, got {inputs!r}")
    return tuple(int(n) for n in shape[1:])


def _join(prefix: str, name: str) -> str:
    if not name:  # a transparent child (Initialized) shares its parent's names
        return prefix
    return f"{prefix}.{name}" if prefix else name


def _check_token_ids(model: AbstractLayer, ids: np.ndarray) -> None:
    # A token model's first leaf is its Embedding (that is what makes input_kind "tokens").
    first_leaf = next(layer for _, layer in model.named_layers() if not layer.children())
    vocabulary = first_leaf.num_embeddings  # type: ignore[attr-defined]
    if ids.dtype.kind not in "iu":
        raise DataError(
            f"{model.describe()} reads integer token ids, got dtype {ids.dtype}; pass an int array"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= vocabulary):
        raise DataError(
            f"token ids must lie in [0, {vocabulary}), got ids from {ids.min()} to {ids.max()}; "
            "map the data into the vocabulary or enlarge the Embedding"
        )


def _to_plain(value: object) -> object:
    if isinstance(value, AbstractLayer):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_plain(item) for item in value]
    return value


def _from_plain(value: object) -> object:
    if isinstance(value, Mapping):
        return layer_from_dict(value)
    if isinstance(value, list):
        return tuple(_from_plain(item) for item in value)
    return value


def layer_from_dict(data: Mapping[str, Any]) -> AbstractLayer:
    """Rebuild a layer (or a whole model) from :meth:`AbstractLayer.to_dict` output.

    Raises:
        ConfigError: the type is unknown, a field is missing or unknown, or a value is bad.
    """
    cls, fields = _REGISTRY.lookup(data, "model_from_dict")
    return cls(**{key: cls.field_from_plain(key, value) for key, value in fields.items()})


# Argument checks. Each returns the value normalised to a plain Python type, so that to_dict
# emits JSON types and equality does not depend on how a value was spelled.


def set_checked(obj: object, name: str, value: object) -> None:
    """Store a checked value on a frozen dataclass (only ever from ``__post_init__``)."""
    object.__setattr__(obj, name, value)


def check_int(owner: str, name: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` as an int, or raise ConfigError if it is not an int >= ``minimum``."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if integral and int(value) >= minimum:  # type: ignore[call-overload]
        return int(value)  # type: ignore[call-overload]
    kind = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
    raise ConfigError(f"{owner}: {name} must be {kind}, got {name}={value!r}")


def check_pair(owner: str, name: str, value: object, *, minimum: int = 1) -> tuple[int, int]:
    """Return an int or a pair of ints as ``(height, width)``, each >= ``minimum``."""
    items = value if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ConfigError(f"{owner}: {name} must be an int or a pair of ints, got {name}={value!r}")
    first, second = (check_int(owner, name, item, minimum=minimum) for item in items)
    return first, second


def as_pair(value: tuple[int, int] | int | None) -> tuple[int, int]:
    """A checked ``int | (int, int)`` field as the pair it was normalised to."""
    assert isinstance(value, tuple), "fields are normalised to pairs in __post_init__"
    return value


def check_float(
    owner: str,
    name: str,
    value: object,
    *,
    low: float,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = True,
    rule: str,
) -> float:
    """Return ``value`` as a finite float in the range (``[low, high)`` by default)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        above = number > low if low_open else number >= low
        below = number < high if high_open else number <= high
        if math.isfinite(number) and above and below:
            return number
    raise ConfigError(f"{owner}: {name} must be {rule}, got {name}={value!r}")
