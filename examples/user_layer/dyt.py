"""A layer from a recent paper, written once and certified on every backend.

Dynamic Tanh (DyT), from "Transformers without Normalization" (Zhu, Chen, He, LeCun and Liu,
CVPR 2025), replaces LayerNorm by ``weight * tanh(alpha * x) + bias``, with one learned
scalar ``alpha`` (starting at 0.5) and per-feature ``weight`` and ``bias``.

The layer below is all a researcher writes: its parameters, their initial values, its output
shape and its forward in ``unitrain.ops``. It trains on every backend, loads from any
backend's checkpoint, and the kit certifies it::

    unitrain conformance --backend torch --layer dyt:DyT      # from this folder
    python dyt.py --backend jax                               # train a small Transformer

``conformance_cases`` tells the kit which instances and input shapes to check.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from unitrain import ops
from unitrain.models import AbstractLayer, Scope


@dataclasses.dataclass(frozen=True)
class DyT(AbstractLayer, type_name="dyt"):
    """``weight * tanh(alpha * x) + bias`` over the last axis (features)."""

    num_features: int
    alpha: float = 0.5

    def own_param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"alpha": (1,), "weight": (self.num_features,), "bias": (self.num_features,)}

    def _init_own_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        n = self.num_features
        return {"alpha": np.full(1, self.alpha), "weight": np.ones(n), "bias": np.zeros(n)}

    def forward(self, scope: Scope, x: Any) -> Any:
        squashed = ops.tanh(scope.param("alpha") * x)
        return squashed * scope.param("weight") + scope.param("bias")

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if not shape or shape[-1] != self.num_features:
            raise self._refuse(shape, f"(..., {self.num_features})")
        return shape

    @classmethod
    def conformance_cases(cls) -> list[tuple[str, AbstractLayer, tuple[int, ...]]]:
        """What the kit checks: the layer on sequences, and in a Transformer-like block."""
        from unitrain.models import Linear, Residual, Sequential

        block = Residual((cls(8, alpha=0.8), Linear(8, 8)))
        return [("features", cls(6), (3, 4, 6)), ("block", Sequential((block, cls(8))), (2, 5, 8))]


def main() -> None:
    """Train a character-level Transformer whose norms are DyT on a text the standard
    library ships, on the backend given."""
    from pydoc_data.topics import topics

    from unitrain import Trainer, TrainerConfig, optim, schedules
    from unitrain.models import (
        Embedding,
        Linear,
        MultiHeadAttention,
        PositionalEmbedding,
        Residual,
        Sequential,
    )

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    text = "".join(topics.values())[:40_000].encode("ascii", "replace")
    ids = np.frombuffer(text, np.uint8).astype(np.int64) % 96
    length = 32
    windows = np.lib.stride_tricks.sliding_window_view(ids, length + 1)[::length]
    x, y = windows[:, :-1], windows[:, 1:]
    dim = 32
    model = Sequential(
        (
            Embedding(96, dim),
            PositionalEmbedding(length, dim),
            Residual((DyT(dim), MultiHeadAttention(dim, 4, causal=True))),
            Residual((DyT(dim), Linear(dim, dim))),
            DyT(dim),
            Linear(dim, 96),
        )
    )
    cut = len(x) * 9 // 10
    trainer = Trainer(
        model,
        backend=args.backend,
        optimizer=optim.Adam(),
        schedule=schedules.Constant(3e-3),
        config=TrainerConfig(epochs=args.epochs, batch_size=32, seed=0),
    )
    history = trainer.fit((x[:cut], y[:cut]), (x[cut:], y[cut:]))
    print(f"{args.backend}: val_loss {history[-1]['val_loss']:.4f}")


if __name__ == "__main__":
    main()
