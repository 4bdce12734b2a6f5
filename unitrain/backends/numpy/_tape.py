"""Reverse-mode differentiation for the numpy reference: a graph of nodes and its sweep.

Each differentiated value is a :class:`Node` that keeps its numpy value, the nodes it was
computed from and the vector-Jacobian product of the op that made it. There is no global
tape: the graph is whatever the outputs reach, so a pullback can run any number of times and
a value nobody differentiates costs nothing (the ops return plain arrays when no input is a
node). The sweep visits each node once, after every node computed from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Node", "backpropagate"]

#: ``vjp(cotangent)`` gives one gradient per input of the op (None where none flows).
VJP = Callable[[Any], Sequence[Any]]


class Node:
    """A value on the graph: ``parents`` pairs an input's position in the op with its node."""

    __slots__ = ("parents", "value", "vjp")

    def __init__(
        self, value: Any, parents: tuple[tuple[int, Node], ...] = (), vjp: VJP | None = None
    ) -> None:
        self.value, self.parents, self.vjp = value, parents, vjp


def _reverse_topological(outputs: Sequence[Node]) -> list[Node]:
    """The nodes the outputs reach, each before every node it was computed from."""
    finished: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(node, False) for node in outputs]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            finished.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((parent, False) for _, parent in node.parents if id(parent) not in seen)
    finished.reverse()
    return finished


def backpropagate(outputs: Sequence[Any], cotangents: Sequence[Any]) -> dict[int, np.ndarray]:
    """The gradients of the leaves (nodes without a vjp) the outputs reach, by ``id``, for the
    cotangents of the outputs (outputs that are not nodes are constants and pass nothing)."""
    grads: dict[int, Any] = {}
    roots = []
    for output, cotangent in zip(outputs, cotangents):
        if isinstance(output, Node):
            roots.append(output)
            previous = grads.get(id(output))
            grads[id(output)] = cotangent if previous is None else previous + cotangent
    for node in _reverse_topological(roots):
        if node.vjp is None:
            continue
        cotangent = grads.pop(id(node), None)
        if cotangent is None:
            continue
        parts = node.vjp(cotangent)
        for position, parent in node.parents:
            part = parts[position]
            if part is None:
                continue
            want = parent.value
            if np.shape(part) != np.shape(want):  # a vjp bug, never the caller's
                raise AssertionError(
                    f"gradient of shape {np.shape(part)} for a value of shape {np.shape(want)}"
                )
            part = np.asarray(part, dtype=want.dtype)
            previous = grads.get(id(parent))
            grads[id(parent)] = part if previous is None else previous + part
    return grads
