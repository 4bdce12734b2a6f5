"""pytorch/examples' word_language_model in its Transformer form, on the standard library's text.

    python examples/papers/word_language_model.py --backend torch
    unitrain train examples/papers/word_language_model.py --backend jax    # the same, as a recipe
    unitrain compare examples/papers/word_language_model.py --backends torch,jax,tensorflow

A port of ``word_language_model/model.py`` (``TransformerModel``) and ``main.py`` with the
example's own settings (``--model Transformer --emsize 200 --nhid 200 --nlayers 2 --nhead 2
--dropout 0.2 --lr 5 --clip 0.25 --bptt 35 --batch_size 20``: main.py's defaults, with the
rate and epochs its README gives the Transformer, ``--epochs 6 --model Transformer --lr 5``),
on ``pydoc_data.topics`` instead of Wikitext-2 (no download): words split on whitespace with
``<eos>`` at each line's end, as ``data.py`` does, words seen fewer than 3 times read as
``<unk>`` (Wikitext-2 ships with that done), the last tenth held out. Piece by piece:

- ``TransformerModel``: an embedding scaled by ``sqrt(ninp)``, sinusoidal positions then
  dropout (``PositionalEncoding``), ``nlayers`` of torch's ``TransformerEncoderLayer`` under
  the causal mask (``_generate_square_subsequent_mask``), a linear decoder; initial values
  from ``init_weights`` (encoder and decoder uniform in +-0.1, decoder bias zero).
- ``nn.TransformerEncoderLayer`` (post-LN, ReLU, ``dim_feedforward = nhid``) keeps a dropout
  inside its feed-forward network, between the activation and the second linear layer, which
  the built-in ``TransformerBlock`` does not have: :class:`EncoderLayer` below is that layer,
  written once in ``unitrain.ops`` as a user would write it, and runs on every backend.
- ``main.py``'s loop: plain SGD at 5, gradients clipped to a global norm of 0.25, and the
  learning rate divided by 4 after every epoch whose validation loss is not the best so far
  (``ReduceLROnPlateau(factor=0.25, patience=0, min_delta=0)``); ``batchify`` and
  ``get_batch``: the text in 20 columns, batches of 35 consecutive words from each, in order.
- The loss is the cross-entropy over every position (``log_softmax`` + ``NLLLoss`` there).

Nothing here names a framework: the backend is ``--backend`` (or ``UNITRAIN_BACKEND``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Any

import numpy as np

from unitrain import ArrayLoader, TrainerConfig, callbacks, ops, optim, schedules
from unitrain.losses import CrossEntropy
from unitrain.models import (
    AbstractLayer,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    MultiHeadAttention,
    Scope,
    SinusoidalPositionalEmbedding,
    init,
)
from unitrain.models.init import Initialized
from unitrain.recipes import Recipe

#: main.py's arguments for the Transformer model, scaled to a CPU where marked.
SETTINGS = {
    "emsize": 200,
    "nhid": 200,
    "nlayers": 2,
    "nhead": 2,
    "dropout": 0.2,
    "lr": 5.0,  # the README's for the Transformer; at main.py's 20 its first epoch diverged
    "clip": 0.25,
    "epochs": 6,  # the README's (main.py: 40)
    "batch_size": 20,
    "bptt": 35,
    "min_count": 3,  # Wikitext-2's own <unk> threshold
}


@dataclasses.dataclass(frozen=True)
class EncoderLayer(AbstractLayer, type_name="example_encoder_layer"):
    """torch's ``nn.TransformerEncoderLayer`` (post-LN, ReLU) under a causal mask.

    ``x = norm1(x + dropout(attention(x)))``, then
    ``x = norm2(x + dropout(fc2(dropout(relu(fc1(x))))))``; the attention drops attention
    probabilities with the same ``dropout``.
    """

    dim: int
    heads: int
    hidden: int
    dropout: float = 0.1

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (
            (
                "attention",
                MultiHeadAttention(self.dim, self.heads, causal=True, dropout=self.dropout),
            ),
            ("norm1", LayerNorm(self.dim)),
            ("fc1", Linear(self.dim, self.hidden)),
            ("fc2", Linear(self.hidden, self.dim)),
            ("norm2", LayerNorm(self.dim)),
        )

    def forward(self, scope: Scope, x: Any) -> Any:
        p = self.dropout
        x = scope.call("norm1", x + scope.dropout(scope.call("attention", x), p))
        inner = scope.dropout(ops.relu(scope.call("fc1", x)), p)
        return scope.call("norm2", x + scope.dropout(scope.call("fc2", inner), p))

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 2 or shape[1] != self.dim:
            raise self._refuse(shape, f"(L, {self.dim})")
        return shape


@dataclasses.dataclass(frozen=True)
class TransformerModel(AbstractLayer, type_name="example_word_transformer"):
    """``TransformerModel``: ``(N, L)`` word ids to ``(N, L, ntoken)`` logits."""

    ntoken: int
    ninp: int
    nhead: int
    nhid: int
    nlayers: int
    dropout: float = 0.5

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        layer = EncoderLayer(self.ninp, self.nhead, self.nhid, self.dropout)
        return (
            ("encoder", Embedding(self.ntoken, self.ninp)),
            ("pos_encoder", SinusoidalPositionalEmbedding(self.ninp)),
            ("pos_dropout", Dropout(self.dropout)),
            *((f"layers.{i}", layer) for i in range(self.nlayers)),
            ("decoder", Linear(self.ninp, self.ntoken)),
        )

    def forward(self, scope: Scope, src: Any) -> Any:
        x = scope.call("encoder", src) * math.sqrt(self.ninp)
        x = scope.call("pos_dropout", scope.call("pos_encoder", x))
        for i in range(self.nlayers):
            x = scope.call(f"layers.{i}", x)
        return scope.call("decoder", x)

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 1:
            raise self._refuse(shape, "(L,)")
        return (shape[0], self.ntoken)


def model(ntoken: int, settings: dict[str, Any] = SETTINGS) -> AbstractLayer:
    """The model with ``init_weights``' values for the encoder and the decoder (the encoder
    layers keep their own defaults, which are torch's for attention, linear and LayerNorm)."""
    network = TransformerModel(
        ntoken,
        settings["emsize"],
        settings["nhead"],
        settings["nhid"],
        settings["nlayers"],
        settings["dropout"],
    )
    rules = {
        "encoder.weight": init.Uniform(-0.1, 0.1),
        "decoder.weight": init.Uniform(-0.1, 0.1),
        "decoder.bias": init.Zeros(),
    }
    return Initialized(network, rules)


def corpus(settings: dict[str, Any] = SETTINGS) -> dict[str, Any]:
    """Training and held-out ``(inputs, next words)`` in ``get_batch``'s order, and the
    vocabulary's size."""
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    words = [w for line in text.splitlines() for w in [*line.split(), "<eos>"]]
    counts = Counter(words)
    vocabulary = ["<unk>", *sorted(w for w, n in counts.items() if n >= settings["min_count"])]
    index = {w: i for i, w in enumerate(vocabulary)}
    ids = np.array([index.get(w, 0) for w in words], np.int64)
    split = len(ids) * 9 // 10

    def batchify(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Columns as ``batchify`` makes them; batch ``k`` is rows ``k * bptt`` on of every
        column, as ``get_batch`` reads them (only whole windows: every batch is full)."""
        columns, bptt = settings["batch_size"], settings["bptt"]
        per_column = len(data) // columns
        grid = data[: per_column * columns].reshape(columns, per_column)  # column j: row j
        windows = (per_column - 1) // bptt
        x = np.stack([grid[:, k * bptt : (k + 1) * bptt] for k in range(windows)])
        y = np.stack([grid[:, k * bptt + 1 : (k + 1) * bptt + 1] for k in range(windows)])
        return x.reshape(-1, bptt), y.reshape(-1, bptt)  # batch k: rows k*columns on

    return {
        "train": batchify(ids[:split]),
        "val": batchify(ids[split:]),
        "ntoken": len(vocabulary),
    }


def recipe(settings: dict[str, Any] = SETTINGS) -> Recipe:
    """The whole port as a recipe: ``unitrain train`` / ``unitrain compare`` read this."""
    data = corpus(settings)
    batch = settings["batch_size"]
    return Recipe(
        model=model(data["ntoken"], settings),
        data=(ArrayLoader(*data["train"], batch_size=batch, shuffle=False), data["val"]),
        optimizer=optim.SGD(),
        schedule=schedules.Constant(settings["lr"]),
        loss=CrossEntropy(),
        callbacks=[
            callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.25, patience=0, min_delta=0.0)
        ],
        config=TrainerConfig(
            epochs=settings["epochs"],
            batch_size=batch,
            grad_clip_norm=settings["clip"],
            deterministic=True,
        ),
        name="word_language_model",
    )


def main() -> None:
    from _common import arguments, train_recipe  # beside this file, run as a script

    args = arguments(__doc__.splitlines()[0], epochs=SETTINGS["epochs"])
    train_recipe("word_language_model", args, recipe(dict(SETTINGS, epochs=args.epochs)))


if __name__ == "__main__":
    main()
