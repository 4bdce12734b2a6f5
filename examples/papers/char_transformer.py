"""A character-level Transformer language model on the standard library's own text.

    python examples/papers/char_transformer.py --backend torch

The corpus is ``pydoc_data.topics`` (the text of Python's help topics, about 465,000
characters, in every Python installation: no download). Its last tenth is held out. The model
is a small decoder: learned token and position embeddings, pre-LN Transformer blocks with
causal self-attention (Vaswani et al. 2017, with the normalisation moved in front as later
work does), a final LayerNorm and a linear read-out; it reads ``(N, L)`` character ids and
gives ``(N, L, V)`` logits, and the loss is the cross-entropy averaged over every character.
Adam with the paper's betas (0.9, 0.98) and epsilon 1e-9 follows the paper's inverse square
root schedule with linear warmup.
"""

from __future__ import annotations

import numpy as np
from _common import arguments, run

from unitrain import optim, schedules
from unitrain.models import (
    Embedding,
    LayerNorm,
    Linear,
    PositionalEmbedding,
    Sequential,
    TransformerBlock,
)


def corpus(length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Train and held-out ``(inputs, next characters)`` of ``length`` ids, and the vocabulary
    size. Sequences are consecutive, non-overlapping windows of the text."""
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    vocabulary = sorted(set(text))
    ids = np.array([vocabulary.index(c) for c in text], np.int64)
    split = len(ids) * 9 // 10

    def windows(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count = (len(part) - 1) // length
        starts = np.arange(count) * length
        rows = starts[:, None] + np.arange(length + 1)
        chunk = part[rows]
        return chunk[:, :-1], chunk[:, 1:]

    (x_train, y_train), (x_val, y_val) = windows(ids[:split]), windows(ids[split:])
    return x_train, y_train, x_val, y_val, len(vocabulary)


def model(vocabulary: int, length: int, dim: int, depth: int, heads: int) -> Sequential:
    """The decoder: embeddings, ``depth`` causal pre-LN blocks, LayerNorm, read-out."""
    blocks = [TransformerBlock(dim, heads, causal=True) for _ in range(depth)]
    return Sequential(
        [
            Embedding(vocabulary, dim),
            PositionalEmbedding(length, dim),
            *blocks,
            LayerNorm(dim),
            Linear(dim, vocabulary),
        ]
    )


def main() -> None:
    args = arguments(
        __doc__.splitlines()[0], epochs=6, length=128, dim=128, depth=2, heads=4, batch=32
    )
    x_train, y_train, x_val, y_val, vocabulary = corpus(args.length)
    network = model(vocabulary, args.length, args.dim, args.depth, args.heads)
    steps_per_epoch = -(-len(x_train) // args.batch)
    schedule = schedules.InverseSqrt(base_lr=2e-3, warmup_steps=steps_per_epoch // 2)
    optimizer = optim.Adam(beta1=0.9, beta2=0.98, eps=1e-9)
    data = (x_train, y_train, x_val, y_val)
    run(
        "char_transformer",
        args,
        network,
        data,
        optimizer=optimizer,
        schedule=schedule,
        batch_size=args.batch,
    )


if __name__ == "__main__":
    main()
