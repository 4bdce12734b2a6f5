"""The benchmark workloads and their synthetic data, the same bytes in every process.

Every method of a workload trains the same architecture on the same arrays, generated here
from a fixed seed (no downloads). Labels come from a random linear teacher, so the loss falls
and a method that does not learn shows up in the reported losses.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

__all__ = [
    "LEARNING_RATE",
    "MOMENTUM",
    "SEED",
    "WORKLOADS",
    "Workload",
    "make_data",
    "torch_inputs",
]

#: SGD with momentum 0.9 at a constant learning rate, softmax cross-entropy, for every method.
LEARNING_RATE = 0.01
MOMENTUM = 0.9
SEED = 0


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model, batch size and amount of data, with how long each timed segment runs.

    Attributes:
        name: short label used on the command line and in tables.
        kind: ``"mlp"``, ``"cnn"``, ``"lenet"`` or ``"transformer"``.
        sizes: MLP layer widths (input first); for the CNN, ``(channels..., classes)``; for
            LeNet ``(conv1, conv2, hidden1, hidden2, classes)``; for the Transformer
            ``(dim, depth, heads)`` (the vocabulary is the corpus's).
        input_shape: one example's shape, channels last (``(28, 28, 1)`` for the CNN); the
            sequence length ``(L,)`` for the Transformer.
        batch_size: examples per step.
        steps_per_epoch: full batches in one epoch (the data holds exactly that many).
        epochs_per_segment: epochs in one timed segment (a repeat) of a full run.
        quick_epochs_per_segment: the same for ``--quick``.
    """

    name: str
    kind: str
    sizes: tuple[int, ...]
    input_shape: tuple[int, ...]
    batch_size: int
    steps_per_epoch: int
    epochs_per_segment: int
    quick_epochs_per_segment: int

    @property
    def num_examples(self) -> int:
        """Examples in the training set."""
        return self.batch_size * self.steps_per_epoch

    @property
    def classes(self) -> int:
        """Number of output classes (the vocabulary for the Transformer)."""
        return len(corpus()[1]) if self.kind == "transformer" else self.sizes[-1]

    def segment_epochs(self, quick: bool) -> int:
        """Epochs per timed segment."""
        return self.quick_epochs_per_segment if quick else self.epochs_per_segment

    def describe(self) -> str:
        """A one-line description for tables."""
        if self.kind == "mlp":
            return f"MLP {'-'.join(map(str, self.sizes))}, batch {self.batch_size}"
        if self.kind == "lenet":
            c1, c2, h1, h2, classes = self.sizes
            h, w, c = self.input_shape
            return (
                f"LeNet-5 {h}x{w}x{c} conv3x3 {c1}-{c2} + tanh + avg-pool, dense {h1}-{h2}-"
                f"{classes}, batch {self.batch_size}"
            )
        if self.kind == "transformer":
            dim, depth, heads = self.sizes
            return (
                f"char LM, {depth} pre-LN blocks dim {dim} {heads} heads, vocabulary "
                f"{self.classes}, {self.input_shape[0]} tokens x batch {self.batch_size}"
            )
        h, w, c = self.input_shape
        convs = "-".join(map(str, self.sizes[:-1]))
        return (
            f"CNN {h}x{w}x{c} conv3x3 {convs} + pool, dense {self.classes}, batch {self.batch_size}"
        )


WORKLOADS: dict[str, Workload] = {
    workload.name: workload
    for workload in (
        Workload("W1", "mlp", (784, 256, 256, 10), (784,), 128, 32, 4, 2),
        Workload("W2", "mlp", (32, 64, 10), (32,), 32, 64, 16, 8),
        # conv 3x3 (1->8) relu maxpool2, conv 3x3 (8->16) relu maxpool2, dense 400->10.
        Workload("CNN", "cnn", (8, 16, 10), (28, 28, 1), 64, 16, 4, 2),
        # unitrain.models portable layers from here on (examples/papers' LeNet-5 and char LM).
        Workload("LeNet", "lenet", (6, 16, 120, 84, 10), (8, 8, 1), 64, 32, 8, 4),
        Workload("Transformer", "transformer", (64, 2, 4), (64,), 16, 16, 2, 1),
    )
}


@functools.cache
def corpus() -> tuple[np.ndarray, str]:
    """``(character ids, vocabulary)`` of ``pydoc_data.topics`` (stdlib text, no download)."""
    from pydoc_data.topics import topics

    text = "".join(topics[key] for key in sorted(topics))
    vocabulary = "".join(sorted(set(text)))
    lookup = {c: i for i, c in enumerate(vocabulary)}
    return np.array([lookup[c] for c in text], np.int64), vocabulary


def make_data(workload: Workload, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs float32, labels int64)`` for ``workload``, a pure function of ``seed``.

    Examples:
        >>> x, y = make_data(WORKLOADS["W2"])
        >>> x.shape, y.shape, x.dtype.name, y.dtype.name
        ((2048, 32), (2048,), 'float32', 'int64')
    """
    if workload.kind == "transformer":  # consecutive windows; the targets are the next ids
        length = workload.input_shape[0]
        needed, text = workload.num_examples * length + 1, corpus()[0]
        if needed > len(text):
            raise ValueError(
                f"{workload.name}: {workload.num_examples} windows of {length} tokens need "
                f"{needed:,} characters and the corpus has {len(text):,}; use fewer steps, "
                "a smaller batch or shorter windows"
            )
        ids = text[:needed]
        rows = np.arange(workload.num_examples)[:, None] * length + np.arange(length + 1)
        return ids[rows][:, :-1].copy(), ids[rows][:, 1:].copy()
    rng = np.random.default_rng([seed, workload.num_examples])
    x = rng.standard_normal((workload.num_examples, *workload.input_shape), dtype=np.float32)
    flat = x.reshape(len(x), -1)
    teacher = rng.standard_normal((flat.shape[1], workload.classes), dtype=np.float32)
    y = np.argmax(flat @ teacher, axis=1).astype(np.int64)
    return x, y


def torch_inputs(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """The workload's data laid out for native torch models (images channels-first)."""
    x, y = make_data(workload)
    if workload.kind in ("cnn", "lenet"):
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    return x, y
