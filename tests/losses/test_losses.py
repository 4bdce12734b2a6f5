"""unitrain.losses: the registry and round trips, each loss against a value worked out by hand
in numpy, the float64 reference against every installed backend, the old strings, a user's
loss trained on every backend, and the errors of bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import final

import numpy as np
import pytest
from _backends import backends

from unitrain import ConfigError, DataError, Trainer, TrainerConfig, losses, ops, optim
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.models import MLP, Linear
from unitrain.ops import Array
from unitrain.recipes import Digits
from unitrain.recipes._recipe import Recipe, recipe_from_dict, recipe_to_toml
from unitrain.recipes._toml import loads


@final
@dataclasses.dataclass(frozen=True)
class Cauchy(losses.AbstractLoss, type_name="test_cauchy"):
    """A user's loss: ``log(1 + (d / scale)^2)`` per value, averaged per example."""

    scale: float = 1.0

    def per_example(self, outputs: Array, targets: Array) -> Array:
        d = (outputs - ops.reshape(targets, ops.shape(outputs))) / self.scale
        return losses.mean_per_example(ops.log1p(d * d))


LOGITS = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 0.5], [-1.0, 3.0, 0.0], [0.0, 1.0, 2.0]])
LABELS = np.array([0, 2, 1, -100])
VALUES = np.array([[0.5, -2.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.5, -0.5], [3.0, -1.0, 0.0]])
PROBABILITIES = np.array([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.1, 0.1, 0.8]])
UNIT = np.array([[1.0, 0.0, 0.5], [0.0, 0.0, 1.0], [0.25, 0.75, 1.0], [1.0, 1.0, 0.0]])
WEIGHTS = (0.5, 2.0, 1.0)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _hand_cross_entropy(smoothing: float, weights: tuple[float, ...] | None) -> float:
    """torch's weighted, smoothed, ignoring cross-entropy, one row at a time."""
    w = np.ones(3) if weights is None else np.asarray(weights)
    total = counted = 0.0
    for row, label in zip(_log_softmax(LOGITS), LABELS, strict=True):
        if label == -100:
            continue
        nll = -row[label] * w[label]
        smooth = -(row * w).sum() / 3
        total += (1 - smoothing) * nll + smoothing * smooth
        counted += w[label]
    return total / counted


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _huber(d: np.ndarray, delta: float) -> np.ndarray:
    return np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta))


#: (loss, targets, the value worked out here without the loss's code)
HAND = [
    (losses.CrossEntropy(ignore_index=-100), LABELS, _hand_cross_entropy(0.0, None)),
    (
        losses.CrossEntropy(label_smoothing=0.3, ignore_index=-100, class_weights=WEIGHTS),
        LABELS,
        _hand_cross_entropy(0.3, WEIGHTS),
    ),
    (losses.MSE(), VALUES, np.mean((LOGITS - VALUES) ** 2)),
    (losses.Huber(delta=1.5), VALUES, np.mean(_huber(LOGITS - VALUES, 1.5))),
    (
        losses.BinaryCrossEntropyWithLogits(),
        UNIT,
        np.mean(
            -UNIT * np.log(1 / (1 + np.exp(-LOGITS)))
            - (1 - UNIT) * np.log(1 - 1 / (1 + np.exp(-LOGITS)))
        ),
    ),
    (
        losses.KLDivergence(),
        PROBABILITIES,
        np.mean(
            [
                sum(t * (math.log(t) - q) for t, q in zip(ts, qs, strict=True) if t > 0)
                for ts, qs in zip(PROBABILITIES, _log_softmax(LOGITS), strict=True)
            ]
        ),
    ),
    (Cauchy(scale=2.0), VALUES, np.mean(np.log1p(((LOGITS - VALUES) / 2.0) ** 2))),
]


@pytest.mark.parametrize(("loss", "targets", "expected"), HAND, ids=lambda v: type(v).__name__)
def test_each_loss_equals_its_value_worked_out_by_hand(loss, targets, expected):
    assert float(loss.reference(LOGITS, targets)) == pytest.approx(expected, rel=1e-12)


def test_sequence_cross_entropy_counts_every_position_not_ignored():
    rng = np.random.default_rng(3)
    logits, labels = rng.normal(size=(2, 5, 3)), rng.integers(0, 3, size=(2, 5))
    labels[1, 2:] = -1
    loss = losses.CrossEntropy(ignore_index=-1)
    values = loss.reference(logits, labels, per_example=True)
    assert values.shape == (2, 5) and np.all(values[1, 2:] == 0)
    kept = labels != -1
    picked = -np.take_along_axis(_log_softmax(logits), np.where(kept, labels, 0)[..., None], -1)
    assert float(loss.reference(logits, labels)) == pytest.approx(picked[..., 0][kept].mean())


def test_a_label_out_of_range_makes_cross_entropy_nan():
    assert math.isnan(float(losses.CrossEntropy().reference(LOGITS, np.array([0, 1, 2, 3]))))


def test_the_registry_holds_every_loss_by_its_type_name():
    types = losses.loss_types()
    assert {
        "cross_entropy": losses.CrossEntropy,
        "binary_cross_entropy_with_logits": losses.BinaryCrossEntropyWithLogits,
        "mse": losses.MSE,
        "huber": losses.Huber,
        "kl_divergence": losses.KLDivergence,
        "test_cauchy": Cauchy,
    }.items() <= types.items()


@pytest.mark.parametrize("loss", [loss for loss, _, _ in HAND], ids=lambda v: type(v).__name__)
def test_every_loss_round_trips_through_json(loss):
    data = json.loads(loss.to_json())
    assert data["type"] == loss.type_name
    assert losses.loss_from_dict(data) == loss


def test_a_recipe_writes_a_loss_as_a_table_and_reads_it_back():
    loss = losses.CrossEntropy(label_smoothing=0.1, class_weights=(1.0,) * 10)
    recipe = Recipe(MLP((64, 10)), Digits(), loss=loss)
    text = recipe_to_toml(recipe)
    assert '[loss]\ntype = "cross_entropy"\nlabel_smoothing = 0.1' in text
    assert recipe_from_dict(loads(text)).loss == loss
    user = recipe_from_dict(loads(recipe_to_toml(Recipe(MLP((64, 10)), Digits(), loss=Cauchy()))))
    assert user.loss == Cauchy()
    named = recipe_from_dict(loads(recipe_to_toml(Recipe(MLP((64, 10)), Digits(), loss="mse"))))
    assert named.loss == "mse"


def test_the_old_strings_are_the_default_losses():
    assert losses.resolve_loss("cross_entropy") == losses.CrossEntropy()
    assert losses.resolve_loss("mse") == losses.MSE()
    native = lambda outputs, targets: outputs  # noqa: E731
    assert losses.resolve_loss(native) is native


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"type": "hinge"},
            # Losses registered by other tests (or the kit's user loss) follow in the list.
            "unknown loss type 'hinge'; known types: binary_cross_entropy_with_logits, ",
        ),
        ({"type": "huber", "beta": 1.0}, "loss type 'huber' has no field(s) beta"),
        ({"type": "huber", "delta": 0}, "Huber: delta must be a finite number > 0"),
        (
            {"type": "cross_entropy", "label_smoothing": 2},
            "CrossEntropy: label_smoothing must be in [0, 1], got label_smoothing=2",
        ),
        ({"type": "cross_entropy", "class_weights": []}, "class_weights must be a non-empty"),
        ({"type": "cross_entropy", "ignore_index": 1.5}, "ignore_index must be an int"),
    ],
)
def test_a_bad_loss_in_a_recipe_is_refused_by_name(bad, message):
    data = loads(recipe_to_toml(Recipe(MLP((64, 10)), Digits())))
    with pytest.raises(ConfigError) as caught:
        recipe_from_dict({**data, "loss": bad})
    assert message in str(caught.value)
    _documented(message)


def _identity(name: str, loss: losses.AbstractLoss, dtype: str = "float32"):
    backend = get_backend(name)(
        Linear(3, 3), BackendOptions(loss=loss, device="cpu", dtype=dtype, optimizer=optim.SGD())
    )
    state = backend.state_dict()
    state["model.weight"] = np.eye(3, dtype=state["model.weight"].dtype)
    state["model.bias"] = np.zeros(3, state["model.bias"].dtype)
    backend.load_state_dict(state)
    return backend


ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def _documented(message: str) -> None:
    """The message is in docs/errors.md's catalogue, as it is raised."""
    assert message in ERRORS_PAGE.read_text(encoding="utf-8"), message


def test_class_weights_of_the_wrong_length_are_a_clear_error():
    loss = losses.CrossEntropy(class_weights=(1.0, 2.0))
    with pytest.raises(ConfigError, match="class_weights has 2 entries, but the outputs have 3"):
        loss.reference(LOGITS, np.array([0, 1, 2, 0]))
    with pytest.raises(ConfigError) as caught:  # the same on a backend, before any update
        _identity("numpy", loss).forward((LOGITS, np.array([0, 1, 2, 0])))
    _documented(str(caught.value))


def test_float_targets_with_an_ignore_index_are_a_clear_error():
    backend = _identity("numpy", losses.CrossEntropy(ignore_index=-100))
    with pytest.raises(DataError, match=r"integer class labels .*ignore_index=-100") as caught:
        backend.evaluate((LOGITS, np.array([0.0, 1.0, 2.0, -100.0])))
    _documented(str(caught.value))


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (np.array([0, 1, 2, 3] * 2), r"labels in \[0, 3\], but the model has 3 outputs"),
        (np.linspace(0.0, 1.0, 8), "must be integer class labels"),
    ],
)
def test_the_trainer_checks_targets_against_a_loss_object_before_training(targets, message):
    """A loss given as an object is checked up front as its string form is: torch would
    otherwise cast float labels to ints, and JAX turn an out-of-range label into a NaN."""
    trainer = Trainer(
        MLP((4, 3)),
        backend="numpy",
        loss=losses.CrossEntropy(label_smoothing=0.1),
        config=TrainerConfig(epochs=1, batch_size=4),
    )
    x = np.random.default_rng(0).normal(size=(8, 4))
    with pytest.raises(DataError, match=message):
        trainer.fit((x, targets))
    assert trainer.state.step == 0


def test_the_numpy_backend_refuses_a_native_callable():
    with pytest.raises(ConfigError, match=r"computes losses written in unitrain\.ops") as caught:
        get_backend("numpy")(MLP((3, 3)), BackendOptions(loss=lambda o, t: o))
    _documented(str(caught.value).partition("<function")[0])


@pytest.mark.parametrize("name", backends("torch", "jax", "tensorflow"))
def test_every_backend_computes_every_loss_as_the_reference_does(name):
    """The evaluated loss of known logits and the weights after one update through it."""
    logits = LOGITS.astype(np.float32)
    for index, (loss, targets, _) in enumerate(HAND):
        targets = targets if targets.dtype.kind == "i" else targets.astype(np.float32)
        backend = _identity(name, loss)
        expected = float(loss.reference(logits, targets))
        got = float(backend.evaluate((logits, targets))["loss"])
        assert got == pytest.approx(expected, rel=2e-6), loss
        if index % 2 == 0:  # the kit's gradient checks cover the rest: a short test
            continue
        reference = _identity("numpy", loss, "float64")
        for trained in (backend, reference):
            trained.forward((logits, targets))
            trained.backward()
            trained.step(0.5)
        ours, theirs = backend.state_dict(), reference.state_dict()
        for key in ("model.weight", "model.bias"):
            np.testing.assert_allclose(
                ours[key], theirs[key], rtol=1e-5, atol=1e-6, err_msg=str(loss)
            )


@pytest.mark.parametrize("name", backends())
def test_a_users_loss_trains_on_every_backend_as_on_the_reference(name):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = (x @ rng.normal(size=(4, 2))).astype(np.float32)
    config = TrainerConfig(epochs=3, batch_size=16, device="cpu", log_every_n_steps=1)
    history = Trainer(
        MLP((4, 8, 2)), backend=name, loss=Cauchy(), optimizer=optim.Adam(), config=config
    ).fit((x, y))
    reference = Trainer(
        MLP((4, 8, 2)), backend="numpy", loss=Cauchy(), optimizer=optim.Adam(), config=config
    ).fit((x, y))
    got, want = [row["loss"] for row in history], [row["loss"] for row in reference]
    assert got[-1] < got[0]
    np.testing.assert_allclose(got, want, rtol=1e-4)
