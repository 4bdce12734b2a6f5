"""Attention and the composite layers in numpy, and :func:`build`, which turns a whole
portable model into a tree of nodes (see :mod:`.layers` for the leaves)."""

from __future__ import annotations

from typing import Any

import numpy as np

from unitrain import ConfigError
from unitrain.backends.numpy.layers import LEAVES, Node, Run
from unitrain.models import (
    GELU,
    MLP,
    AbstractLayer,
    Dropout,
    MultiHeadAttention,
    Residual,
    Sequential,
    TransformerBlock,
)

__all__ = ["build"]


class _AttentionNode(Node):
    spec: MultiHeadAttention

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        n, length, dim = x.shape
        heads, head_dim = self.spec.heads, self.spec.head_dim

        def project(part: str) -> np.ndarray:  # (N, L, E) -> (N, H, L, Dh)
            y = x @ run.params[self.name(f"{part}.weight")] + run.params[self.name(f"{part}.bias")]
            return y.reshape(n, length, heads, head_dim).transpose(0, 2, 1, 3)

        q, k, v = project("query"), project("key"), project("value")
        scores = (q @ k.transpose(0, 1, 3, 2)) * x.dtype.type(1 / np.sqrt(head_dim))
        if self.spec.causal:
            allowed = np.tril(np.ones((length, length), bool))
            scores = np.where(allowed, scores, -np.inf)
        scores = scores - scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        mixed = (weights @ v).transpose(0, 2, 1, 3).reshape(n, length, dim)
        self.x, self.q, self.k, self.v, self.weights, self.mixed = x, q, k, v, weights, mixed
        return mixed @ run.params[self.name("out.weight")] + run.params[self.name("out.bias")]

    def backward(self, dy: np.ndarray, run: Run) -> np.ndarray:
        n, length, dim = dy.shape
        heads, head_dim = self.spec.heads, self.spec.head_dim
        flat = dy.reshape(-1, dim)
        run.grads[self.name("out.weight")] += self.mixed.reshape(-1, dim).T @ flat
        run.grads[self.name("out.bias")] += flat.sum(axis=0)
        d_mixed = (dy @ run.params[self.name("out.weight")].T).reshape(n, length, heads, head_dim)
        d_mixed = d_mixed.transpose(0, 2, 1, 3)
        d_weights = d_mixed @ self.v.transpose(0, 1, 3, 2)
        dv = self.weights.transpose(0, 1, 3, 2) @ d_mixed
        # softmax backward, then the 1/sqrt(Dh) scale; masked entries have weight 0.
        d_scores = self.weights * (d_weights - (d_weights * self.weights).sum(-1, keepdims=True))
        d_scores *= dy.dtype.type(1 / np.sqrt(head_dim))
        dq = d_scores @ self.k
        dk = d_scores.transpose(0, 1, 3, 2) @ self.q
        dx = np.zeros_like(self.x)
        x_flat = self.x.reshape(-1, dim)
        for part, grad in (("query", dq), ("key", dk), ("value", dv)):
            grad = grad.transpose(0, 2, 1, 3).reshape(-1, dim)
            run.grads[self.name(f"{part}.weight")] += x_flat.T @ grad
            run.grads[self.name(f"{part}.bias")] += grad.sum(axis=0)
            dx += (grad @ run.params[self.name(f"{part}.weight")].T).reshape(dx.shape)
        return dx


class _ChainNode(Node):
    """Children one after the other (Sequential, MLP and parts of a Transformer block)."""

    def __init__(self, nodes: list[Node]) -> None:
        super().__init__(None, "")
        self.nodes = nodes

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        # Under mixed precision each layer's output is rounded to the compute dtype, as a
        # low-precision kernel writes it; ``run.low`` is the identity otherwise.
        for node in self.nodes:
            x = run.low(node.forward(x, run))
        return x

    def backward(self, dy: np.ndarray, run: Run) -> Any:
        # ...and so is each gradient flowing back between layers.
        for node in reversed(self.nodes):
            dy = run.low(node.backward(dy, run))
        return dy


class _ResidualNode(_ChainNode):
    """``x + f(x)``: the gradient flows through the branch and around it."""

    def forward(self, x: np.ndarray, run: Run) -> np.ndarray:
        return x + super().forward(x, run)

    def backward(self, dy: np.ndarray, run: Run) -> Any:
        return dy + super().backward(dy, run)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _children(spec: AbstractLayer, prefix: str) -> list[Node]:
    return [build(child, _join(prefix, name)) for name, child in spec.children()]


def _block(spec: TransformerBlock, prefix: str) -> Node:
    """The pre-LN block as two residual chains over its named children."""
    node = dict(zip((name for name, _ in spec.children()), _children(spec, prefix)))
    attend = [node["norm1"], node["attention"], build(Dropout(spec.dropout), prefix)]
    mix = [node["norm2"], node["fc1"], build(GELU(), prefix), node["fc2"]]
    mix.append(build(Dropout(spec.dropout), prefix))
    return _ChainNode([_ResidualNode(attend), _ResidualNode(mix)])


def _chain(spec: AbstractLayer, prefix: str) -> Node:
    return _ChainNode(_children(spec, prefix))


def _residual(spec: AbstractLayer, prefix: str) -> Node:
    return _ResidualNode(_children(spec, prefix))


#: How each layer type that is not a plain leaf is built.
_BUILDERS: dict[type, Any] = {
    MultiHeadAttention: _AttentionNode,
    Sequential: _chain,
    MLP: _chain,
    Residual: _residual,
    TransformerBlock: _block,
    **LEAVES,
}


def build(spec: AbstractLayer, prefix: str = "") -> Node:
    """The numpy computation of ``spec``, its parameters named under ``prefix``."""
    builder = _BUILDERS.get(type(spec))
    if builder is None:
        raise ConfigError(f"the numpy backend has no implementation of {type(spec).__name__}")
    node: Node = builder(spec, prefix)
    return node
