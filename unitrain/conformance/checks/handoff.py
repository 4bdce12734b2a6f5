"""handoff: a portable model's checkpoint moves to another backend and carries on alike.

For a conv net with BatchNorm and a causal Transformer, one backend trains a few updates
and writes a checkpoint to disk (parameters, BatchNorm statistics, momentum buffers, the
update counter); another backend reads it. The reader must hold exactly the checkpoint's
arrays, evaluate a held-out batch as the writer does, and over more updates on the same
batches stay with the writer. Each check runs both directions: the backend under test
writes and the peer reads, then the peer writes and the backend under test reads.

The peers come from :mod:`unitrain.backends.registry`: the ``*_numpy`` checks hand off to and from
the numpy reference, the ``*_installed`` checks to and from every other installed backend
that builds portable layers, so that the kit run on the four built-in backends covers all
twelve ordered pairs. Peers run on the CPU in the dtype under test; one that does not
declare that dtype is left out (the check says so, and skips if no peer is left).

Bars, from the table's kinds: the held-out loss at the loaded weights is an ``evaluate``
comparison, the three losses and the weights after them ``step`` comparisons. Measured over
all twelve ordered pairs of the built-in backends in float32 (CPU, torch 2.13, JAX 0.10,
TensorFlow 2.21): held-out loss at most 1.1e-7 relative (bar 1e-5), the losses 1.3e-7 and
the weights 5.2e-8 (bar 1e-6); float64 pairs 2.8e-16 at most. The seeded faults
(tests/conformance/test_conformance_faults.py) are off by far more: conv kernels with height
and width swapped 3e-3 in the held-out loss, their momentum alone so swapped 7e-4 in the losses
after the hand-off, the query and key momentum swapped 7e-4 in the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from unitrain import optim
from unitrain.backends.protocol import BackendOptions, split_state
from unitrain.backends.registry import get_backend, list_backends
from unitrain.checkpoint import load_checkpoint, save_checkpoint
from unitrain.conformance._context import CheckFailed, Context
from unitrain.conformance._probes import copy_state, model_state
from unitrain.conformance._registry import add_check
from unitrain.models import (
    AbstractLayer,
    BatchNorm,
    Conv2d,
    Embedding,
    GlobalAvgPool,
    LayerNorm,
    Linear,
    PositionalEmbedding,
    ReLU,
    Sequential,
    TransformerBlock,
)

#: Square 3x3 kernels with as many outputs as inputs in the second conv: a kernel saved in
#: another axis order keeps its shape and loads, so only its numbers can give it away.
CNN = Sequential(
    (
        Conv2d(2, 4, 3, padding=1),
        BatchNorm(4),
        ReLU(),
        Conv2d(4, 4, 3, stride=2, padding=1),
        BatchNorm(4),
        ReLU(),
        GlobalAvgPool(),
        Linear(4, 3),
    )
)
#: The query, key and value projections share one shape, so weights saved under each other's
#: names (a packed ``in_proj`` split in the wrong order) load, and only their numbers differ.
TRANSFORMER = Sequential(
    (
        Embedding(11, 8),
        PositionalEmbedding(6, 8),
        TransformerBlock(8, 2, mlp_ratio=2, causal=True),
        LayerNorm(8),
        Linear(8, 11),
    )
)
#: Momentum buffers are optimizer state that must move too. Not Adam: a conv bias before
#: BatchNorm and the attention key bias have zero gradient in theory (rounding noise in
#: practice), which Adam would turn into full-size updates that differ between backends.
OPTIMIZER = optim.SGD(momentum=0.9)
LEARNING_RATE = 0.05
#: Updates before the checkpoint and after it.
BEFORE, AFTER = 3, 3

_Batch = tuple[np.ndarray, np.ndarray]


def _cnn_batches(ctx: Context) -> list[_Batch]:
    rng = np.random.default_rng(0x4A4D)
    return [
        (ctx.host(rng.standard_normal((8, 6, 6, 2))), rng.integers(0, 3, 8))
        for _ in range(BEFORE + AFTER + 1)
    ]


def _transformer_batches(ctx: Context) -> list[_Batch]:
    rng = np.random.default_rng(0x7F0F)
    return [
        (rng.integers(0, 11, (4, 6)), rng.integers(0, 11, (4, 6)))
        for _ in range(BEFORE + AFTER + 1)
    ]


class _Party:
    """One backend of a hand-off, reset to its own initial state before it writes."""

    def __init__(self, name: str, backend: Any) -> None:
        self.name, self.backend = name, backend
        self.initial = copy_state(backend.state_dict())

    def write(self, ctx: Context, batches: list[_Batch], path: Path) -> Path:
        """Train :data:`BEFORE` updates from the initial state and write a checkpoint."""
        self.backend.load_state_dict(copy_state(self.initial))
        for batch in batches[:BEFORE]:
            ctx.update(self.backend, batch, LEARNING_RATE)
        model, optimizer = split_state(self.backend.state_dict())
        trainer = {"epoch": 0, "step": BEFORE}
        return save_checkpoint(path, model=model, optimizer=optimizer, trainer=trainer)

    def read(self, ctx: Context, path: Path, pair: str) -> None:
        """Load the checkpoint at ``path``; it must then hold exactly the saved arrays."""
        saved = load_checkpoint(path)
        state = {f"model.{k}": v for k, v in saved.model.items()}
        state.update({f"optimizer.{k}": v for k, v in saved.optimizer.items()})
        self.backend.load_state_dict(copy_state(state))
        ctx.require_identical(f"{pair}: state after loading", self.backend.state_dict(), state)

    def go_on(self, ctx: Context, batches: list[_Batch]) -> tuple[float, list[float]]:
        """The held-out loss now, then the losses of :data:`AFTER` more updates."""
        held_out = float(self.backend.evaluate(batches[-1])["loss"])
        after = batches[BEFORE : BEFORE + AFTER]
        return held_out, [ctx.update(self.backend, b, LEARNING_RATE) for b in after]


def _hand_off(ctx: Context, writer: _Party, reader: _Party, batches: list[_Batch]) -> None:
    """``writer`` trains and saves, ``reader`` loads; both go on and must agree."""
    pair = f"{writer.name} to {reader.name}"
    reader.read(ctx, writer.write(ctx, batches, ctx.path(pair.replace(" ", "_"))), pair)
    written_loss, written_losses = writer.go_on(ctx, batches)
    read_loss, read_losses = reader.go_on(ctx, batches)
    ctx.compare(f"{pair}: held-out loss after loading", read_loss, written_loss, "evaluate")
    ctx.compare(
        f"{pair}: model after {AFTER} more updates",
        model_state(reader.backend.state_dict()),
        model_state(writer.backend.state_dict()),
        "step",
    )
    ctx.compare(f"{pair}: losses of {AFTER} more updates", read_losses, written_losses, "step")


def _installed_peers(ctx: Context) -> list[tuple[str, Any]]:
    """Every other installed backend that builds portable layers in the dtype under test."""
    peers = []
    for info in list_backends():
        if not info.installed or info.name in ("numpy", ctx.backend.name):
            continue
        cls: Any = get_backend(info.name)
        declared = cls.capabilities
        if not declared.portable_layers:
            ctx.notes.append(f"{info.name} does not build portable layers: no hand-off")
        elif ctx.dtype not in declared.dtypes:
            ctx.notes.append(f"{info.name} does not declare {ctx.dtype}: no hand-off")
        else:
            peers.append((info.name, cls))
    return peers


def _numpy_peer(ctx: Context) -> list[tuple[str, Any]]:
    cls: Any = get_backend("numpy")
    if ctx.dtype not in cls.capabilities.dtypes:
        ctx.skip(f"the numpy reference does not declare {ctx.dtype}")
    return [("numpy", cls)]


def numpy_and_installed(ctx: Context) -> list[tuple[str, Any]]:
    """The numpy reference (where it declares the dtype) and every other installed backend
    that builds portable layers in it."""
    reference: Any = get_backend("numpy")
    found = [("numpy", reference)] if ctx.dtype in reference.capabilities.dtypes else []
    return [*found, *_installed_peers(ctx)]


def run_model(
    ctx: Context,
    model: AbstractLayer,
    batches: Callable[[Context], list[_Batch]],
    peers: Callable[[Context], list[tuple[str, Any]]],
    loss: str = "cross_entropy",
) -> None:
    """Hand ``model``'s checkpoint from the backend under test to each peer and back."""
    found = peers(ctx)
    if not found:
        ctx.skip(f"no other installed backend builds portable layers in {ctx.dtype}")
    data = batches(ctx)
    # Seeds 0 and 7: each reader starts from other weights than its writer's, so it can
    # agree with the writer only through the checkpoint.
    ours = _Party(ctx.backend.name, ctx.make(model, optimizer=OPTIMIZER, seed=0, loss=loss))
    failures = []
    for name, cls in found:
        options = BackendOptions(
            device="cpu",
            dtype=ctx.dtype,
            deterministic=True,
            optimizer=OPTIMIZER,
            seed=7,
            loss=loss,
        )
        theirs = _Party(name, cls(model, options))
        for writer, reader in ((ours, theirs), (theirs, ours)):
            try:
                _hand_off(ctx, writer, reader, data)
            except CheckFailed as failure:  # go on: the report names every pair that fails
                failures.append(str(failure))
    if failures:
        raise CheckFailed("; ".join(failures))


_MODELS = {
    "cnn": (CNN, _cnn_batches, "conv + BatchNorm net"),
    "transformer": (TRANSFORMER, _transformer_batches, "causal pre-LN Transformer"),
}
_PEERS = {
    "numpy": (_numpy_peer, "the numpy reference"),
    "installed": (_installed_peers, "every other installed backend"),
}
_GUARDS = {
    "cnn": (
        "conv kernels saved in the framework's own axis order (OIHW, or kh and kw swapped), "
        "BatchNorm statistics dropped or saved biased, momentum buffers not carried over"
    ),
    "transformer": (
        "attention weights packed another way (query and key swapped, in_proj order), "
        "LayerNorm or embedding tables transposed, momentum buffers not carried over"
    ),
}


def _register() -> None:
    for model_name, (model, batches, what) in _MODELS.items():
        for peer_name, (peers, whom) in _PEERS.items():

            def run(
                ctx: Context,
                model: AbstractLayer = model,
                batches: Callable[[Context], list[_Batch]] = batches,
                peers: Callable[[Context], list[tuple[str, Any]]] = peers,
            ) -> None:
                run_model(ctx, model, batches, peers)

            name = f"{model_name}_{peer_name}"
            run.__qualname__ = f"handoff_{name}"
            add_check(
                "handoff",
                name,
                run,
                requires=("portable_layers",),
                description=(
                    f"A {what}'s checkpoint moves to and from {whom}: same state, "
                    f"held-out loss and {AFTER} more updates"
                ),
                guards=_GUARDS[model_name],
            )


_register()
