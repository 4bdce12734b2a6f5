"""Sequence layers on ``(N, L)`` token ids and ``(N, L, D)`` features: embeddings, attention.

A sequence model takes integer tokens ``(N, L)`` and gives logits ``(N, L, V)``; the
cross-entropy of such a model averages over every token of the batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._basic import Linear
from unitrain.models._norm import LayerNorm
from unitrain.models._scope import Scope

__all__ = ["Embedding", "MultiHeadAttention", "PositionalEmbedding", "TransformerBlock"]


@dataclasses.dataclass(frozen=True)
class Embedding(AbstractLayer, type_name="embedding"):
    """Look up a learned vector per token id: ``(L,)`` ints -> ``(L, dim)``.

    ``weight`` ``(num_embeddings, dim)`` starts standard normal, as torch's. An id outside
    ``[0, num_embeddings)`` is a DataError on every backend (:meth:`check_input`).
    """

    num_embeddings: int
    dim: int

    def __post_init__(self) -> None:
        owner = "Embedding"
        set_checked(self, "num_embeddings", check_int(owner, "num_embeddings", self.num_embeddings))
        set_checked(self, "dim", check_int(owner, "dim", self.dim))

    @property
    def input_kind(self) -> str:
        return "tokens"

    def own_param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.num_embeddings, self.dim)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"weight": rng.standard_normal((self.num_embeddings, self.dim))}

    def forward(self, scope: Scope, x: Any) -> Any:
        # Ids are range-checked on the host before they get here (check_input).
        return ops.take(scope.param("weight"), x, axis=0)

    def _output_shape(self, shape: Shape) -> Shape:
        return (*shape, self.dim)


@dataclasses.dataclass(frozen=True)
class PositionalEmbedding(AbstractLayer, type_name="positional_embedding"):
    """Add a learned vector per position: ``x[:, t] + weight[t]`` on ``(L, dim)`` inputs.

    ``weight`` ``(max_len, dim)`` starts standard normal, like a token embedding (torch has
    no built-in learned position table; GPT-2 style code uses an ``nn.Embedding``).
    """

    max_len: int
    dim: int

    def __post_init__(self) -> None:
        set_checked(self, "max_len", check_int("PositionalEmbedding", "max_len", self.max_len))
        set_checked(self, "dim", check_int("PositionalEmbedding", "dim", self.dim))

    def own_param_shapes(self) -> dict[str, Shape]:
        return {"weight": (self.max_len, self.dim)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"weight": rng.standard_normal((self.max_len, self.dim))}

    def forward(self, scope: Scope, x: Any) -> Any:
        return x + scope.param("weight")[: ops.shape(x)[1]]

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim or shape[0] > self.max_len:
            raise self._refuse(shape, f"(length <= {self.max_len}, {self.dim})")
        return shape


@dataclasses.dataclass(frozen=True)
class MultiHeadAttention(AbstractLayer, type_name="multi_head_attention"):
    """Self-attention over ``(L, dim)``: ``heads`` heads of ``dim // heads`` features.

    ``q, k, v = x @ W + b`` for ``query``, ``key``, ``value``; per head
    ``softmax(q k^T / sqrt(dim // heads)) v`` (position ``i`` sees only ``j <= i`` when
    ``causal``); the heads are concatenated and projected by ``out``. Weights are
    ``(dim, dim)`` in ``(in, out)`` order with head ``h`` in output columns
    ``h*Dh:(h+1)*Dh``. Initial values follow ``torch.nn.MultiheadAttention``: query, key and
    value weights Xavier-uniform over torch's packed ``(3 dim, dim)`` matrix, ``out.weight``
    uniform in ``±1/sqrt(dim)``, every bias zero.
    """

    dim: int
    heads: int
    causal: bool = False

    def __post_init__(self) -> None:
        set_checked(self, "dim", check_int("MultiHeadAttention", "dim", self.dim))
        set_checked(self, "heads", check_int("MultiHeadAttention", "heads", self.heads))
        if self.dim % self.heads:
            raise ConfigError(
                f"MultiHeadAttention: dim must be a multiple of heads, got dim={self.dim}, "
                f"heads={self.heads}"
            )
        if not isinstance(self.causal, bool):
            raise ConfigError(f"MultiHeadAttention: causal must be a bool, got {self.causal!r}")

    @property
    def head_dim(self) -> int:
        """Features per head."""
        return self.dim // self.heads

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {}
        for part in ("query", "key", "value", "out"):
            shapes[f"{part}.weight"] = (self.dim, self.dim)
            shapes[f"{part}.bias"] = (self.dim,)
        return shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        xavier = math.sqrt(6.0 / (self.dim + 3 * self.dim))
        params: dict[str, np.ndarray] = {}
        for part in ("query", "key", "value", "out"):
            bound = 1.0 / math.sqrt(self.dim) if part == "out" else xavier
            params[f"{part}.weight"] = rng.uniform(-bound, bound, (self.dim, self.dim))
            params[f"{part}.bias"] = np.zeros(self.dim)
        return params

    def forward(self, scope: Scope, x: Any) -> Any:
        length, heads = ops.shape(x)[1], self.heads

        def project(part: str) -> Any:  # (N, L, E) -> (N, H, L, Dh)
            y = ops.linear(x, scope.param(f"{part}.weight"), scope.param(f"{part}.bias"))
            return ops.transpose(ops.reshape(y, (-1, length, heads, self.head_dim)), (0, 2, 1, 3))

        mixed = ops.scaled_dot_product_attention(
            project("query"), project("key"), project("value"), causal=self.causal
        )
        mixed = ops.reshape(ops.transpose(mixed, (0, 2, 1, 3)), (-1, length, self.dim))
        return ops.linear(mixed, scope.param("out.weight"), scope.param("out.bias"))

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(length, {self.dim})")
        return shape


@dataclasses.dataclass(frozen=True)
class TransformerBlock(AbstractLayer, type_name="transformer_block"):
    """A pre-LN Transformer block on ``(L, dim)``.

    ``x = x + dropout(attention(norm1(x)))``, then
    ``x = x + dropout(fc2(gelu(fc1(norm2(x)))))`` with ``fc1`` ``dim -> mlp_ratio * dim``.
    Children: ``norm1``, ``attention``, ``norm2``, ``fc1``, ``fc2``.
    """

    dim: int
    heads: int
    mlp_ratio: int = 4
    dropout: float = 0.0
    causal: bool = False

    def __post_init__(self) -> None:
        owner = "TransformerBlock"
        set_checked(self, "mlp_ratio", check_int(owner, "mlp_ratio", self.mlp_ratio))
        rule = "in [0, 1)"
        set_checked(
            self,
            "dropout",
            check_float(owner, "dropout", self.dropout, low=0.0, high=1.0, rule=rule),
        )
        MultiHeadAttention(self.dim, self.heads, self.causal)  # checks dim, heads, causal

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        hidden = self.mlp_ratio * self.dim
        return (
            ("norm1", LayerNorm(self.dim)),
            ("attention", MultiHeadAttention(self.dim, self.heads, self.causal)),
            ("norm2", LayerNorm(self.dim)),
            ("fc1", Linear(self.dim, hidden)),
            ("fc2", Linear(hidden, self.dim)),
        )

    @property
    def input_kind(self) -> str:
        return "float"

    def forward(self, scope: Scope, x: Any) -> Any:
        attended = scope.call("attention", scope.call("norm1", x))
        x = x + scope.dropout(attended, self.dropout)
        hidden = ops.gelu(scope.call("fc1", scope.call("norm2", x)))
        return x + scope.dropout(scope.call("fc2", hidden), self.dropout)

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(length, {self.dim})")
        return shape
