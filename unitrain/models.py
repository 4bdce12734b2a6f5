"""Portable architectures: one description, one set of numpy initial weights, every backend.

A portable model describes its parameters (trained) and its state (non-trainable tensors
such as BatchNorm running statistics) by canonical names, shapes and numpy initial values:
``param_shapes()`` / ``init_params(seed, dtype)`` and ``state_shapes()`` / ``init_state(dtype)``.
A backend's ``state_dict`` holds both under ``model.<name>``. A backend that builds
:class:`MLP` natively must use the canonical parameter names and layouts below, so a
checkpoint written by one backend loads in any other:

``layers.{i}.weight``  shape ``(in_features, out_features)``; the layer computes ``x @ W + b``
``layers.{i}.bias``    shape ``(out_features,)``

The ``(in, out)`` layout is the one JAX and Keras use and the one ``x @ W`` reads naturally;
the PyTorch backend stores its weights the same way instead of transposing at every save.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from unitrain._errors import ConfigError

__all__ = ["ACTIVATIONS", "MLP", "model_from_dict"]

#: Hidden-layer activations every backend implements identically.
ACTIVATIONS = ("relu", "tanh", "gelu", "sigmoid")


@dataclasses.dataclass(frozen=True)
class MLP:
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
    kind: ClassVar[str] = "mlp"

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

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical parameter names and shapes, in layer order."""
        shapes: dict[str, tuple[int, ...]] = {}
        for i, (fan_in, fan_out) in enumerate(zip(self.sizes, self.sizes[1:])):
            shapes[f"layers.{i}.weight"] = (fan_in, fan_out)
            shapes[f"layers.{i}.bias"] = (fan_out,)
        return shapes

    def init_params(self, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """Initial weights drawn in numpy, identical for every backend given the seed.

        Weights and biases are uniform in ``±1/sqrt(fan_in)``, the distribution of
        ``torch.nn.Linear``'s default initialisation (not its random stream).
        """
        rng = np.random.default_rng([seed, 0x4D4C50])
        params: dict[str, np.ndarray] = {}
        for name, shape in self.param_shapes().items():
            bound = 1.0 / math.sqrt(shape[0] if name.endswith("weight") else self._fan_in(name))
            params[name] = rng.uniform(-bound, bound, size=shape).astype(dtype)
        return params

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Canonical names and shapes of the model state (non-trainable tensors): none here."""
        return {}

    def init_state(self, dtype: Any = np.float32) -> dict[str, np.ndarray]:
        """Initial model state under canonical names: an MLP has none."""
        return {}

    def _fan_in(self, name: str) -> int:
        return self.sizes[int(name.split(".")[1])]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description; :func:`model_from_dict` inverts it."""
        return {"type": self.kind, **dataclasses.asdict(self), "sizes": list(self.sizes)}


def model_from_dict(data: dict[str, Any]) -> MLP:
    """Rebuild a portable model from :meth:`MLP.to_dict` output."""
    fields = dict(data)
    kind = fields.pop("type", None)
    if kind != MLP.kind:
        raise ConfigError(f"unknown model type {kind!r}; known: ['mlp']")
    fields["sizes"] = tuple(fields.get("sizes", ()))
    try:
        return MLP(**fields)
    except TypeError as error:
        raise ConfigError(f"bad fields for model 'mlp': {error}") from None
