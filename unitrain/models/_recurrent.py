"""LSTM and GRU on ``(N, L, features)`` sequences, written once on :func:`unitrain.ops.scan`.

The gate formulas, gate orders and the GRU's reset-after form are torch's (``nn.LSTM``,
``nn.GRU``) and Keras 3's defaults; weights are in the canonical ``(in, out)`` layout with
the gates side by side in the output columns. Initial values follow torch: every weight and
bias uniform in ``±1/sqrt(hidden)``.

A layer with ``batch_size`` set is stateful (Keras' ``stateful=True``): its last hidden state
is model state, the next train-mode batch starts from it (truncated backpropagation through
time: no gradient flows into the previous batch), it is saved in checkpoints, and evaluation
reads it without moving it. Every batch must then have ``batch_size`` sequences.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, check_int, set_checked
from unitrain.models._basic import check_bool
from unitrain.models._scope import Scope

__all__ = ["GRU", "LSTM"]


class _Recurrent(AbstractLayer):
    """What LSTM and GRU share: shapes, initial values, the state and the time loop."""

    gates: ClassVar[int]
    #: The carried tensors, by state name.
    carried: ClassVar[tuple[str, ...]]
    input_size: int
    hidden_size: int
    return_sequences: bool
    batch_size: int | None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        set_checked(self, "input_size", check_int(owner, "input_size", self.input_size))
        set_checked(self, "hidden_size", check_int(owner, "hidden_size", self.hidden_size))
        check_bool(owner, "return_sequences", self.return_sequences)
        if self.batch_size is not None:
            set_checked(self, "batch_size", check_int(owner, "batch_size", self.batch_size))

    def own_param_shapes(self) -> dict[str, Shape]:
        width = self.gates * self.hidden_size
        return {
            "weight_ih": (self.input_size, width),
            "weight_hh": (self.hidden_size, width),
            **{name: (width,) for name in self._bias_names()},
        }

    def _bias_names(self) -> tuple[str, ...]:
        return ("bias",)

    def own_state_shapes(self) -> dict[str, Shape]:
        if self.batch_size is None:
            return {}
        return {name: (self.batch_size, self.hidden_size) for name in self.carried}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        bound = 1.0 / math.sqrt(self.hidden_size)
        return {
            name: rng.uniform(-bound, bound, shape)
            for name, shape in self.own_param_shapes().items()
        }

    def _init_own_state(self) -> dict[str, np.ndarray]:
        return {name: np.zeros(shape) for name, shape in self.own_state_shapes().items()}

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.input_size:
            raise self._refuse(shape, f"(length, {self.input_size})")
        return (shape[0], self.hidden_size) if self.return_sequences else (self.hidden_size,)

    def step(self, scope: Scope, carry: Any, projected: Any) -> Any:
        """The next carry from the carry and one position's ``x @ weight_ih + bias``."""
        raise NotImplementedError

    def forward(self, scope: Scope, x: Any) -> Any:
        batch, dtype = ops.shape(x)[0], ops.dtype(x)
        if self.batch_size is not None and batch != self.batch_size:
            raise ConfigError(
                f"{self.describe()} is stateful for batches of {self.batch_size} sequences, "
                f"got {batch}; batch the data by {self.batch_size} (drop the last, short batch)"
            )
        projected = ops.linear(x, scope.param("weight_ih"), scope.param(self._bias_names()[0]))
        if self.batch_size is None:
            start = tuple(ops.zeros((batch, self.hidden_size), dtype) for _ in self.carried)
        else:
            start = tuple(ops.cast(scope.state(name), dtype) for name in self.carried)

        def step(carry: Any, position: Any) -> tuple[Any, Any]:
            carry = self.step(scope, carry, position)
            return carry, carry[0]

        carry, hidden = ops.scan(step, start, ops.transpose(projected, (1, 0, 2)))
        if self.batch_size is not None and scope.training:
            for name, value in zip(self.carried, carry):
                scope.set_state(name, ops.cast(value, ops.dtype(scope.state(name))))
        return ops.transpose(hidden, (1, 0, 2)) if self.return_sequences else carry[0]


@dataclasses.dataclass(frozen=True)
class LSTM(_Recurrent, type_name="lstm"):
    """Long short-term memory (Hochreiter and Schmidhuber), torch's gate order i, f, g, o.

    ``weight_ih`` ``(input_size, 4 hidden)``, ``weight_hh`` ``(hidden, 4 hidden)`` and one
    ``bias`` ``(4 hidden)`` (torch's two biases only ever appear summed). Gives the hidden state
    of every position ``(L, hidden)``, or of the last one with ``return_sequences=False``.

    Examples:
        >>> LSTM(3, 5).output_shape((7, 3))
        (7, 5)
        >>> LSTM(3, 5, return_sequences=False).param_shapes()["weight_hh"]
        (5, 20)
    """

    gates: ClassVar[int] = 4
    carried: ClassVar[tuple[str, ...]] = ("h", "c")
    input_size: int
    hidden_size: int
    return_sequences: bool = True
    batch_size: int | None = None

    def step(self, scope: Scope, carry: Any, projected: Any) -> Any:
        h, c = carry
        i, f, g, o = ops.split(
            projected + ops.matmul(h, scope.param("weight_hh")), [self.hidden_size] * 4, -1
        )
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        return ops.sigmoid(o) * ops.tanh(c), c


@dataclasses.dataclass(frozen=True)
class GRU(_Recurrent, type_name="gru"):
    """Gated recurrent unit (Cho et al.) in torch's form, gate order r, z, n:
    ``n = tanh(x W_in + b_in + r * (h W_hn + b_hn))``, ``h' = (1 - z) * n + z * h``.

    ``weight_ih`` ``(input_size, 3 hidden)``, ``weight_hh`` ``(hidden, 3 hidden)``,
    ``bias_ih`` and ``bias_hh`` ``(3 hidden)`` (the hidden bias sits inside the reset gate's
    product, so it cannot be folded into the input bias: Keras' ``reset_after=True``).

    Examples:
        >>> GRU(3, 4).output_shape((6, 3))
        (6, 4)
    """

    gates: ClassVar[int] = 3
    carried: ClassVar[tuple[str, ...]] = ("h",)
    input_size: int
    hidden_size: int
    return_sequences: bool = True
    batch_size: int | None = None

    def _bias_names(self) -> tuple[str, ...]:
        return ("bias_ih", "bias_hh")

    def step(self, scope: Scope, carry: Any, projected: Any) -> Any:
        (h,) = carry
        recurrent = ops.linear(h, scope.param("weight_hh"), scope.param("bias_hh"))
        x_r, x_z, x_n = ops.split(projected, [self.hidden_size] * 3, -1)
        h_r, h_z, h_n = ops.split(recurrent, [self.hidden_size] * 3, -1)
        r, z = ops.sigmoid(x_r + h_r), ops.sigmoid(x_z + h_z)
        n = ops.tanh(x_n + r * h_n)
        return ((1 - z) * n + z * h,)
