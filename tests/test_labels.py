"""Labels and targets are checked against every portable model's outputs, on every backend.

A conv net (3 classes) and a Transformer (5 classes per position) are trained through the
public API. Labels outside ``[0, classes)`` (``-1`` included, which plain indexing would read
as the last class) and ``mse`` targets that do not match the outputs' shape are refused with
a DataError before any update; token ids outside the vocabulary too. A batch whose loss is
not finite triggers the ``nonfinite`` policy on every backend, also when its gradients are
finite (a NaN loss from a bad label in a later batch of a native loader, an ``mse`` loss
that overflows).
"""

from __future__ import annotations

import numpy as np
import pytest
from _backends import backends

from unitrain import DataError, NonFiniteError, Trainer, TrainerConfig, models, optim
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend

BACKENDS = backends("numpy", "torch", "jax")
CONV = models.Sequential(
    [
        models.Conv2d(1, 2, 3, padding=1),
        models.ReLU(),
        models.MaxPool2d(2),
        models.Flatten(),
        models.Linear(2 * 2 * 2, 3),
    ]
)
TRANSFORMER = models.Sequential(
    [
        models.Embedding(11, 8),
        models.PositionalEmbedding(6, 8),
        models.TransformerBlock(8, 2, mlp_ratio=2),
        models.LayerNorm(8),
        models.Linear(8, 5),
    ]
)
MODELS = {"conv": CONV, "transformer": TRANSFORMER}
#: Outputs per example of each model: 3 classes, and 5 classes at each of 6 positions.
CLASSES = {"conv": 3, "transformer": 5}
OUTPUT_SHAPES = {"conv": (3,), "transformer": (6, 5)}


def data(model: str, n: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and in-range integer labels for ``model``."""
    rng = np.random.default_rng(seed)
    if model == "conv":
        return rng.normal(size=(n, 4, 4, 1)).astype(np.float32), rng.integers(0, 3, n)
    return rng.integers(0, 11, (n, 6)), rng.integers(0, 5, (n, 6))


def trainer(backend: str, model: str, loss: str = "cross_entropy", **config) -> Trainer:
    settings = {"epochs": 1, "batch_size": 4, "device": "cpu", "log_every_n_steps": 1}
    return Trainer(
        MODELS[model],
        backend=backend,
        loss=loss,
        optimizer=optim.SGD(),
        config=TrainerConfig(**(settings | config)),
    )


def with_label(labels: np.ndarray, value: int) -> np.ndarray:
    """``labels`` with its last entry (last example, last position) set to ``value``."""
    labels = labels.copy()
    labels.reshape(-1)[-1] = value
    return labels


class Batches:
    """A native loader (re-iterable batches) whose first batch is good, so only the backend
    sees the later ones."""

    def __init__(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
        self.items = batches

    def __iter__(self):
        return iter(self.items)


# -- cross-entropy labels ---------------------------------------------------------------------


@pytest.mark.parametrize("native", [False, True], ids=["arrays", "loader"])
@pytest.mark.parametrize("bad", ["too_high", "negative"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_out_of_range_are_refused_before_any_update(backend, model, bad, native):
    x, y = data(model)
    classes = CLASSES[model]
    value = classes if bad == "too_high" else -1
    y = with_label(y, value)
    low, high = min(value, 0), max(value, int(y.max()))
    run = trainer(backend, model)
    train_data = [(x, y)] if native else (x, y)
    where = "the first batch of train_data" if native else "train_data"
    message = (
        rf"^{where} has labels in \[{low}, {high}\], but the model has {classes} outputs; "
        rf"labels must be in \[0, {classes - 1}\]$"
    )
    with pytest.raises(DataError, match=message):
        run.fit(train_data)
    assert run.state.step == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float_labels_are_refused_for_cross_entropy(backend, model):
    x, y = data(model)
    run = trainer(backend, model)
    with pytest.raises(DataError, match="targets must be integer class labels for cross-entropy"):
        run.fit((x, y.astype(np.float32)))
    assert run.state.step == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sequence_model_needs_one_label_per_position(backend):
    x, y = data("transformer")
    run = trainer(backend, "transformer")
    message = (
        r"^train_data has targets of shape \(\) per example, but the model gives outputs of "
        r"shape \(6, 5\) per example; cross-entropy needs one label per position, of shape "
        r"\(6,\)$"
    )
    with pytest.raises(DataError, match=message):
        run.fit((x, y[:, 0]))
    assert run.state.step == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_labels_in_range_train(backend, model):
    run = trainer(backend, model)
    run.fit(data(model))
    assert run.state.step == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_token_ids_out_of_range_are_refused_before_any_update(backend):
    x, y = data("transformer")
    run = trainer(backend, "transformer")
    with pytest.raises(DataError, match=r"token ids must lie in \[0, 11\), got ids from -1 to"):
        run.fit((with_label(x, -1), y))
    assert run.state.step == 0


# -- mse targets ------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mse_targets_of_another_shape_are_refused(backend, model):
    x, _ = data(model)
    targets = np.zeros((len(x), 2), np.float32)
    run = trainer(backend, model, loss="mse")
    shape = str(OUTPUT_SHAPES[model]).replace("(", r"\(").replace(")", r"\)")
    message = (
        rf"^train_data has targets of shape \(2,\) per example, but the model gives outputs "
        rf"of shape {shape} per example; mse needs targets of the outputs' shape$"
    )
    with pytest.raises(DataError, match=message):
        run.fit((x, targets))
    assert run.state.step == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mse_with_class_labels_suggests_cross_entropy(backend, model):
    x, y = data(model)
    run = trainer(backend, model, loss="mse")
    with pytest.raises(DataError, match=r"use loss='cross_entropy', or one-hot float targets"):
        run.fit((x, y))
    assert run.state.step == 0


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mse_targets_of_the_outputs_shape_train(backend, model):
    x, _ = data(model)
    targets = np.random.default_rng(1).normal(size=(len(x), *OUTPUT_SHAPES[model]))
    run = trainer(backend, model, loss="mse")
    run.fit((x, targets.astype(np.float32)))
    assert run.state.step == 2


# -- a loss that is not finite ------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_loss_from_overflowing_inputs_raises(backend):
    x, y = data("conv")
    # Finite in float64, so the data checks pass; infinite once cast to the model's float32.
    x = x.astype(np.float64)
    x[5] = 1e39
    run = trainer(backend, "conv", nonfinite="raise")
    with pytest.raises(NonFiniteError, match=r"in 1 update\(s\) up to step 2"):
        run.fit(Batches([(x[:4], y[:4]), (x[4:], y[4:])]))
    assert run.skipped_steps == 1


@pytest.mark.parametrize("value", ["too_high", "negative"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("backend", "error", "step"),
    [("numpy", DataError, 1), ("jax", NonFiniteError, 2)],
    ids=["numpy", "jax"],
)
def test_a_bad_label_in_a_later_batch_is_never_trained_on(backend, error, step, model, value):
    """numpy checks every batch; JAX checks none on the host (that would cost a sync per step)
    but makes the loss NaN, which the policy reports, where it used to wrap -1 to the last class
    and train on with a NaN loss and finite gradients."""
    pytest.importorskip(backend)
    x, y = data(model)
    bad = with_label(y[4:], CLASSES[model] if value == "too_high" else -1)
    run = trainer(backend, model, nonfinite="raise")
    with pytest.raises(error):
        run.fit(Batches([(x[:4], y[:4]), (x[4:], bad)]))
    assert run.state.step == step
    assert run.skipped_steps == (1 if error is NonFiniteError else 0)


@pytest.mark.parametrize("fused", [True, False], ids=["train_step", "forward-backward-step"])
def test_jax_skips_an_update_whose_loss_is_nan_with_finite_gradients(fused):
    pytest.importorskip("jax")
    backend = get_backend("jax")(CONV, BackendOptions(device="cpu", optimizer=optim.SGD()))
    before = backend.state_dict()
    x, y = data("conv", n=4)
    batch = (x, with_label(y, -1))
    if fused:
        loss = backend.train_step(batch, 0.1)
    else:
        loss = backend.forward(batch)
        backend.backward()
        backend.step(0.1)
    assert np.isnan(float(loss))
    assert backend.skipped_steps == 1
    after = backend.state_dict()
    for name, value in before.items():
        if name != "optimizer.step":
            np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_numpy_refuses_a_bad_label_in_any_batch():
    backend = get_backend("numpy")(CONV, BackendOptions(optimizer=optim.SGD()))
    x, y = data("conv", n=4)
    backend.forward((x, y))
    with pytest.raises(DataError, match=r"labels in \[-1, 2\], but the model has 3 outputs"):
        backend.forward((x, with_label(y, -1)))
    mse = get_backend("numpy")(CONV, BackendOptions(loss="mse", optimizer=optim.SGD()))
    with pytest.raises(DataError, match=r"targets of shape \(2,\) per example, but the model"):
        mse.forward((x, np.zeros((4, 2), np.float32)))


@pytest.mark.parametrize("backend", ["numpy", "jax", "torch", "tensorflow"])
def test_an_infinite_mse_loss_with_finite_gradients_raises(backend):
    """``(output - 1e30)**2`` overflows float32 while its gradient, ``2 * (output - 1e30) / n``,
    does not: the policy must see the loss, not only the gradients."""
    pytest.importorskip(backend)
    x, _ = data("conv")
    run = trainer(backend, "conv", loss="mse", nonfinite="raise")
    with pytest.raises(NonFiniteError, match=r"up to step 1\b"):
        run.fit((x, np.full((len(x), 3), 1e30, np.float32)))
    assert run.state.step == 1
