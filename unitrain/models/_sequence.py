"""Sequence layers on ``(N, L)`` token ids and ``(N, L, D)`` features: embeddings, attention.

A sequence model takes integer tokens ``(N, L)`` and gives logits ``(N, L, V)``; the
cross-entropy of such a model averages over every token of the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import numpy as np

from unitrain import ops
from unitrain._errors import ConfigError
from unitrain.models._base import AbstractLayer, Shape, check_float, check_int, set_checked
from unitrain.models._basic import Linear, activation_function, check_bool
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

    Args:
        dim: features of the input and output.
        heads: number of heads; divides ``dim``.
        causal: position ``i`` attends only to positions ``j <= i``.
        dropout: probability of dropping an attention weight in train mode (after the
            softmax, as torch's ``dropout_p`` and Keras' ``dropout`` do).
        bias: whether the four projections have biases.
        rotary: rotate queries and keys by their position (RoPE, Su et al. 2021) in the
            half-split form of GPT-NeoX and LLaMA, base 10000; needs an even head size.
    """

    dim: int
    heads: int
    causal: bool = False
    dropout: float = 0.0
    bias: bool = True
    rotary: bool = False

    def __post_init__(self) -> None:
        owner = "MultiHeadAttention"
        set_checked(self, "dim", check_int(owner, "dim", self.dim))
        set_checked(self, "heads", check_int(owner, "heads", self.heads))
        if self.dim % self.heads:
            raise ConfigError(
                f"{owner}: dim must be a multiple of heads, got dim={self.dim}, heads={self.heads}"
            )
        for flag in ("causal", "bias", "rotary"):
            check_bool(owner, flag, getattr(self, flag))
        rate = check_float(owner, "dropout", self.dropout, low=0.0, high=1.0, rule="in [0, 1)")
        set_checked(self, "dropout", rate)
        if self.rotary and self.head_dim % 2:
            raise ConfigError(
                f"{owner}: rotary positions need an even head size, got dim // heads = "
                f"{self.head_dim}; change dim or heads"
            )

    @property
    def head_dim(self) -> int:
        """Features per head."""
        return self.dim // self.heads

    def own_param_shapes(self) -> dict[str, Shape]:
        shapes: dict[str, Shape] = {}
        for part in ("query", "key", "value", "out"):
            shapes[f"{part}.weight"] = (self.dim, self.dim)
            if self.bias:
                shapes[f"{part}.bias"] = (self.dim,)
        return shapes

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        xavier = math.sqrt(6.0 / (self.dim + 3 * self.dim))
        params: dict[str, np.ndarray] = {}
        for part in ("query", "key", "value", "out"):
            bound = 1.0 / math.sqrt(self.dim) if part == "out" else xavier
            params[f"{part}.weight"] = rng.uniform(-bound, bound, (self.dim, self.dim))
            if self.bias:
                params[f"{part}.bias"] = np.zeros(self.dim)
        return params

    def forward(self, scope: Scope, x: Any) -> Any:
        length, heads = ops.shape(x)[1], self.heads

        def project(part: str) -> Any:
            bias = scope.param(f"{part}.bias") if self.bias else None
            return ops.linear(x, scope.param(f"{part}.weight"), bias)

        def split(y: Any) -> Any:  # (N, L, E) -> (N, H, L, Dh)
            return ops.transpose(ops.reshape(y, (-1, length, heads, self.head_dim)), (0, 2, 1, 3))

        q, k, v = split(project("query")), split(project("key")), split(project("value"))
        if self.rotary:
            q, k = rotate(q), rotate(k)
        if scope.training and self.dropout:
            mixed = _attend_with_dropout(scope, q, k, v, self.causal, self.dropout)
        else:
            mixed = ops.scaled_dot_product_attention(q, k, v, causal=self.causal)
        mixed = ops.reshape(ops.transpose(mixed, (0, 2, 1, 3)), (-1, length, self.dim))
        out_bias = scope.param("out.bias") if self.bias else None
        return ops.linear(mixed, scope.param("out.weight"), out_bias)

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(length, {self.dim})")
        return shape


def rotate(x: Any, base: float = 10000.0) -> Any:
    """Rotary position embedding of ``x`` ``(..., L, D)``: feature ``i`` and ``i + D/2`` of
    position ``t`` rotated by the angle ``t * base ** (-2i / D)`` (the half-split form)."""
    *_, length, size = ops.shape(x)
    half, dtype = size // 2, ops.dtype(x)
    cos, sin = (ops.asarray(table, dtype) for table in _rotary_tables(length, size, base))
    first, second = x[..., :half], x[..., half:]
    return x * cos + ops.concat([-second, first], axis=-1) * sin


@functools.lru_cache(maxsize=64)
def _rotary_tables(length: int, size: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """The float64 cosines and sines of :func:`rotate`, made once per shape (a forward runs
    every step; the tables only change with the sequence length)."""
    half = size // 2
    angles = np.arange(length)[:, None] * base ** (-np.arange(half) * 2.0 / size)[None, :]
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles), np.sin(angles)


def _attend_with_dropout(scope: Scope, q: Any, k: Any, v: Any, causal: bool, rate: float) -> Any:
    """Attention with dropout on its weights, written out (the fused op has no dropout)."""
    length, size = ops.shape(q)[-2], ops.shape(q)[-1]
    scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) / ops.asarray(
        math.sqrt(size), ops.dtype(q)
    )
    if causal:
        allowed = ops.asarray(np.tril(np.ones((length, length), bool)), "bool")
        scores = ops.where(allowed, scores, ops.full(ops.shape(scores), -np.inf, ops.dtype(q)))
    weights = scope.dropout(ops.softmax(scores, axis=-1), rate)
    return ops.matmul(weights, v)


@dataclasses.dataclass(frozen=True)
class TransformerBlock(AbstractLayer, type_name="transformer_block"):
    """A Transformer block on ``(L, dim)``: attention, then a feed-forward network.

    Pre-LN (``norm="pre"``, GPT-2's): ``x = x + dropout(attention(norm1(x)))``, then
    ``x = x + dropout(fc2(act(fc1(norm2(x)))))``. Post-LN (``norm="post"``, the original
    Transformer's and BERT's): ``x = norm1(x + dropout(attention(x)))``, then
    ``x = norm2(x + dropout(fc2(act(fc1(x)))))``. ``fc1`` maps ``dim`` to ``hidden``
    (``mlp_ratio * dim`` unless given). Children: ``norm1``, ``attention``, ``norm2``,
    ``fc1``, ``fc2``.

    Args:
        dim: features.
        heads: attention heads.
        mlp_ratio: the feed-forward width as a multiple of ``dim`` (``mlp_ratio * dim`` must
            be a whole number); ignored when ``hidden`` is given.
        dropout: on the attention's and the feed-forward network's outputs.
        causal: each position sees only the positions before it and itself.
        norm: ``"pre"`` or ``"post"``.
        activation: the feed-forward activation, one of ``ACTIVATIONS`` (exact-erf GELU).
        attention_dropout: on the attention weights.
        hidden: the feed-forward width.
        bias: whether the projections and the feed-forward layers have biases.
        norm_bias: whether the two LayerNorms have biases (GPT-2 style models written with
            ``bias=False`` leave them out too: give both).
    """

    dim: int
    heads: int
    mlp_ratio: float = 4
    dropout: float = 0.0
    causal: bool = False
    norm: str = "pre"
    activation: str = "gelu"
    attention_dropout: float = 0.0
    hidden: int | None = None
    bias: bool = True
    norm_bias: bool = True
    sharding_unit: ClassVar[bool] = True  # sharded training gathers one block at a time

    def __post_init__(self) -> None:
        owner = "TransformerBlock"
        ratio = check_float(owner, "mlp_ratio", self.mlp_ratio, low=0.0, low_open=True, rule="> 0")
        if self.hidden is None and not float(ratio * self.dim).is_integer():
            raise ConfigError(
                f"{owner}: mlp_ratio * dim must be a whole number of features, got "
                f"{self.mlp_ratio} * {self.dim}; change mlp_ratio or give hidden"
            )
        if self.hidden is not None:
            set_checked(self, "hidden", check_int(owner, "hidden", self.hidden))
        rule = "in [0, 1)"
        set_checked(
            self,
            "dropout",
            check_float(owner, "dropout", self.dropout, low=0.0, high=1.0, rule=rule),
        )
        if self.norm not in ("pre", "post"):
            raise ConfigError(f"{owner}: norm must be 'pre' or 'post', got norm={self.norm!r}")
        activation_function(owner, self.activation)
        self.children()  # the attention checks dim, heads, causal, attention_dropout, bias;
        # the norms check norm_bias

    @property
    def width(self) -> int:
        """The feed-forward network's hidden width."""
        return self.hidden if self.hidden is not None else int(self.mlp_ratio * self.dim)

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        attention = MultiHeadAttention(
            self.dim, self.heads, self.causal, self.attention_dropout, self.bias
        )
        return (
            ("norm1", LayerNorm(self.dim, bias=self.norm_bias)),
            ("attention", attention),
            ("norm2", LayerNorm(self.dim, bias=self.norm_bias)),
            ("fc1", Linear(self.dim, self.width, self.bias)),
            ("fc2", Linear(self.width, self.dim, self.bias)),
        )

    @property
    def input_kind(self) -> str:
        return "float"

    def forward(self, scope: Scope, x: Any) -> Any:
        act = activation_function("TransformerBlock", self.activation)

        def feed_forward(h: Any) -> Any:
            return scope.call("fc2", act(scope.call("fc1", h)))

        if self.norm == "post":
            x = scope.call("norm1", x + scope.dropout(scope.call("attention", x), self.dropout))
            return scope.call("norm2", x + scope.dropout(feed_forward(x), self.dropout))
        attended = scope.call("attention", scope.call("norm1", x))
        x = x + scope.dropout(attended, self.dropout)
        return x + scope.dropout(feed_forward(scope.call("norm2", x)), self.dropout)

    def _output_shape(self, shape: Shape) -> Shape:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(length, {self.dim})")
        return shape
