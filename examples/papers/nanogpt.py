"""nanoGPT's GPT and training loop, followed line by line, on the standard library's own text.

    python examples/papers/nanogpt.py --backend torch
    unitrain train examples/papers/nanogpt.py --backend jax     # the same, as a recipe
    unitrain compare examples/papers/nanogpt.py --backends torch,jax,tensorflow

A port of karpathy/nanoGPT's ``model.py`` and ``train.py`` with the settings of its
``config/train_shakespeare_char.py``, scaled to a CPU: the character corpus is
``pydoc_data.topics`` (no download) instead of Shakespeare, and the model is smaller (2 layers
of 128 features instead of 6 of 384, windows of 64 characters instead of 256). What is kept,
piece by piece:

- ``GPT``: token and learned position embeddings, dropout on their sum, pre-LN blocks with
  causal self-attention (dropout on the attention probabilities and on both residual
  branches) and a GELU MLP of width 4 * n_embd, a final LayerNorm, and the output head tied to
  the token embedding (``lm_head.weight = wte.weight``: ``logits = x @ wte.T``). ``bias=False``
  as ``train.py`` sets it: no biases in the linear layers or the LayerNorms.
- ``_init_weights``: every linear and embedding weight from normal(0, 0.02), the two residual
  projections (``c_proj``) from normal(0, 0.02 / sqrt(2 * n_layer)), LayerNorm weights one.
- ``configure_optimizers``: AdamW with weight decay 0.1 on the matrices and embeddings and
  none on the LayerNorm weights, betas (0.9, 0.99).
- ``get_lr``: linear warmup to 1e-3 over 100 iterations (``lr * (it + 1) / (warmup + 1)``),
  then a cosine to 1e-4 at ``lr_decay_iters``; gradients clipped to a global norm of 1.0.
- ``get_batch``: every iteration reads ``batch_size`` windows at uniformly random offsets of
  the training text (drawn here once, from a seeded generator, so every backend trains on the
  same windows); the loss is the cross-entropy over every position.
- ``estimate_loss`` every ``eval_interval`` iterations over ``eval_iters`` batches of
  held-out windows at random offsets. The windows are drawn once and kept, where nanoGPT
  draws new ones each time, so that evaluations compare like with like; the last tenth of the
  text is held out, as nanoGPT's ``prepare.py`` does.

Nothing here names a framework: the backend is ``--backend`` (or ``UNITRAIN_BACKEND``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from unitrain import ArrayLoader, TrainerConfig, ops, optim, schedules
from unitrain.losses import CrossEntropy
from unitrain.models import (
    AbstractLayer,
    Dropout,
    Embedding,
    LayerNorm,
    PositionalEmbedding,
    Scope,
    TransformerBlock,
    init,
)
from unitrain.models.init import Initialized
from unitrain.recipes import Recipe

#: ``config/train_shakespeare_char.py``, scaled to a CPU where marked.
CONFIG = {
    "n_layer": 2,  # 6
    "n_head": 4,  # 6
    "n_embd": 128,  # 384
    "block_size": 64,  # 256
    "batch_size": 32,  # 64
    "dropout": 0.2,
    "bias": False,
    "learning_rate": 1e-3,
    "max_iters": 1000,  # 5000
    "lr_decay_iters": 1000,  # 5000: equal to max_iters, as there
    "min_lr": 1e-4,
    "beta2": 0.99,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "warmup_iters": 100,
    "eval_interval": 100,  # 250
    "eval_iters": 20,  # 200
}


@dataclasses.dataclass(frozen=True)
class GPT(AbstractLayer, type_name="example_nanogpt"):
    """nanoGPT's ``GPT`` module: reads ``(N, L)`` character ids, gives ``(N, L, V)`` logits.

    The output head has no weight of its own: it is the token embedding, transposed.
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        block = TransformerBlock(
            self.n_embd,
            self.n_head,
            dropout=self.dropout,
            causal=True,
            attention_dropout=self.dropout,
            bias=self.bias,
            norm_bias=self.bias,
        )
        return (
            ("wte", Embedding(self.vocab_size, self.n_embd)),
            ("wpe", PositionalEmbedding(self.block_size, self.n_embd)),
            ("drop", Dropout(self.dropout)),
            *((f"h{i}", block) for i in range(self.n_layer)),
            ("ln_f", LayerNorm(self.n_embd, bias=self.bias)),
        )

    def forward(self, scope: Scope, idx: Any) -> Any:
        x = scope.call("drop", scope.call("wpe", scope.call("wte", idx)))
        for i in range(self.n_layer):
            x = scope.call(f"h{i}", x)
        x = scope.call("ln_f", x)
        tied = scope.child("wte").param("weight")  # (vocab_size, n_embd)
        return ops.matmul(x, ops.transpose(ops.cast(tied, ops.dtype(x)), (1, 0)))

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 1 or shape[0] > self.block_size:
            raise self._refuse(shape, f"(L,) with L <= {self.block_size}")
        return (shape[0], self.vocab_size)


def model(vocab_size: int, settings: dict[str, Any] = CONFIG) -> AbstractLayer:
    """The GPT with nanoGPT's initial values (``_init_weights``)."""
    gpt = GPT(
        vocab_size,
        settings["block_size"],
        settings["n_layer"],
        settings["n_head"],
        settings["n_embd"],
        settings["dropout"],
        settings["bias"],
    )
    residual = init.Normal(0.02 / math.sqrt(2 * settings["n_layer"]))
    return Initialized(
        gpt,
        {
            "*.weight": init.Normal(0.02),
            "*.attention.out.weight": residual,  # attn.c_proj
            "*.fc2.weight": residual,  # mlp.c_proj
            "*norm*.weight": init.Constant(1.0),
            "ln_f.weight": init.Constant(1.0),
        },
    )


def corpus(settings: dict[str, Any] = CONFIG, seed: int = 1337) -> dict[str, Any]:
    """Every iteration's training windows and the held-out windows, with their targets.

    ``x_train[i * batch_size:(i + 1) * batch_size]`` is iteration ``i``'s batch; targets are
    the windows shifted by one character.
    """
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    vocabulary = sorted(set(text))
    ids = np.array([vocabulary.index(c) for c in text], np.int64)
    split = len(ids) * 9 // 10
    train, val = ids[:split], ids[split:]
    rng = np.random.default_rng(seed)
    block, batch = settings["block_size"], settings["batch_size"]

    def windows(data: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        starts = rng.integers(0, len(data) - block, size=count)
        rows = starts[:, None] + np.arange(block + 1)
        return data[rows[:, :-1]], data[rows[:, 1:]]

    x_train, y_train = windows(train, settings["max_iters"] * batch)
    x_val, y_val = windows(val, settings["eval_iters"] * batch)
    return {"train": (x_train, y_train), "val": (x_val, y_val), "vocab_size": len(vocabulary)}


def recipe(settings: dict[str, Any] = CONFIG) -> Recipe:
    """The whole port as a recipe: ``unitrain train`` / ``unitrain compare`` read this.

    ``settings`` are nanoGPT's (:data:`CONFIG` by default); ``--set config.KEY=VALUE`` on the
    command line changes the Trainer's config after it is built (``config.max_steps=200``).
    """
    data = corpus(settings)
    warmup = settings["warmup_iters"]
    cosine = schedules.CosineDecay(
        settings["learning_rate"], settings["lr_decay_iters"] - warmup, settings["min_lr"]
    )
    # get_lr's warmup, lr * (it + 1) / (warmup + 1), is a ramp that starts at lr / (warmup + 1).
    schedule = schedules.Warmup(cosine, warmup, start_lr=settings["learning_rate"] / (warmup + 1))
    no_decay = "LayerNorm" if not settings["bias"] else ("LayerNorm", "*.bias")
    optimizer = optim.AdamW(
        beta1=0.9,
        beta2=settings["beta2"],
        weight_decay=settings["weight_decay"],
        groups=(optim.Group(no_decay, weight_decay=0.0),),
    )
    batch = settings["batch_size"]
    # One pass over the drawn windows is the whole run (max_iters iterations); the Trainer
    # validates every eval_interval updates, as train.py calls estimate_loss.
    train = ArrayLoader(*data["train"], batch_size=batch, shuffle=False)
    return Recipe(
        model=model(data["vocab_size"], settings),
        data=(train, data["val"]),
        optimizer=optimizer,
        schedule=schedule,
        loss=CrossEntropy(),
        config=TrainerConfig(
            epochs=1,
            batch_size=batch,
            grad_clip_norm=settings["grad_clip"],
            val_every_n_steps=settings["eval_interval"],
            log_every_n_steps=settings["eval_interval"],
            deterministic=True,
        ),
        name="nanogpt",
    )


def main() -> None:
    from _common import arguments, train_recipe  # beside this file, run as a script

    args = arguments(__doc__.splitlines()[0], epochs=1)
    train_recipe("nanogpt", args, recipe())


if __name__ == "__main__":
    main()
