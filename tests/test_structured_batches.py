"""Structured batches: several inputs and targets (tuples, dicts), sample weights, a model of
several outputs, an objective over them and the loss terms layers report."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, final

import numpy as np
import pytest

from unitrain import ConfigError, DataError, Trainer, TrainerConfig, losses, ops
from unitrain.backends.strategy import SimulatedWorkers, slice_batch, worker_shard
from unitrain.data import ArrayLoader
from unitrain.models import AbstractLayer, Linear, Scope
from unitrain.schedules import Constant

ERRORS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


@dataclasses.dataclass(frozen=True)
class TwoTower(AbstractLayer, type_name="test_two_tower"):
    """Two inputs (a dict) joined in a hidden layer, two outputs (a tuple): class logits and
    a score; reports ``penalty * mean(h**2)`` as a loss term."""

    penalty: float = 0.0

    def children(self) -> tuple[tuple[str, AbstractLayer], ...]:
        return (
            ("a", Linear(3, 4)),
            ("b", Linear(2, 4)),
            ("cls", Linear(4, 3)),
            ("reg", Linear(4, 1)),
        )

    def forward(self, scope: Scope, x: Any) -> Any:
        hidden = ops.tanh(scope.call("a", x["x"]) + scope.call("b", x["z"]))
        if self.penalty:
            scope.add_loss(self.penalty * ops.mean(hidden * hidden))
        return scope.call("cls", hidden), scope.call("reg", hidden)

    def _output_shape(self, shape: Any) -> Any:
        return (3,), (1,)


@final
@dataclasses.dataclass(frozen=True)
class LabelAndScore(losses.Objective, type_name="test_label_and_score"):
    """Cross-entropy of the logits plus the squared error of the score where ``mask`` is 1."""

    takes_labels: ClassVar[bool] = True

    def per_example(self, outputs: Any, batch: losses.BatchView) -> Any:
        logits, score = outputs
        labels = batch.targets["label"]
        diff = score[:, 0] - batch.targets["score"]
        return (
            losses.CrossEntropy().per_example(logits, labels) + diff * diff * batch.inputs["mask"]
        )


@final
@dataclasses.dataclass(frozen=True)
class ReadsMissingTarget(losses.Objective, type_name="test_reads_missing_target"):
    def per_example(self, outputs: Any, batch: losses.BatchView) -> Any:
        return outputs[1][:, 0] - batch.targets["weight"]


def _data(n: int = 12, seed: int = 0) -> tuple[dict, dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    inputs = {
        "x": rng.normal(size=(n, 3)),
        "z": rng.normal(size=(n, 2)),
        "mask": (rng.random(n) > 0.3).astype(np.float64),
    }
    targets = {"label": rng.integers(0, 3, n), "score": rng.normal(size=n)}
    return inputs, targets, rng.random(n) + 0.1


def _fit(
    backend: str,
    strategy: int,
    *,
    penalty: float,
    weights: bool,
    dtype: str = "float64",
    accumulation: int = 1,
) -> dict[str, np.ndarray]:
    inputs, targets, weight = _data()
    loader = ArrayLoader(inputs, targets, 6, seed=1, sample_weight=weight if weights else None)
    trainer = Trainer(
        TwoTower(penalty),
        backend=backend,
        loss=LabelAndScore(),
        schedule=Constant(0.1),
        strategy=strategy,
        config=TrainerConfig(epochs=2, dtype=dtype, grad_accum_steps=accumulation),
    )
    trainer.fit(loader)
    return {k: v for k, v in trainer.backend.state_dict().items() if k.startswith("model.")}


def _largest_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


# -- data ------------------------------------------------------------------------------------


def test_array_loader_shuffles_every_leaf_alike_and_resumes_by_seek():
    inputs, targets, _ = _data()
    inputs["x"][:, 0] = np.arange(12)  # each leaf carries the example's number
    targets["score"] = np.arange(12.0)
    loader = ArrayLoader(inputs, targets, 5, seed=3, sample_weight=np.arange(12.0))
    batches = list(loader.batches(epoch=2))
    assert [len(b[2]) for b in batches] == [5, 5, 2]
    for x, y, w in batches:
        assert np.array_equal(x["x"][:, 0], y["score"]) and np.array_equal(w, y["score"])
    order = np.concatenate([y["score"] for _, y, _ in batches])
    assert not np.array_equal(order, np.arange(12.0))  # shuffled
    resumed = list(loader.batches(epoch=2, start=1))
    assert all(np.array_equal(a[1]["score"], b[1]["score"]) for a, b in zip(batches[1:], resumed))


def test_slices_split_every_leaf_and_weigh_by_sample_weight():
    inputs, targets, weight = _data()
    batch = (inputs, targets, weight)
    shards = SimulatedWorkers(2).shards(batch)
    assert [len(shard[2]) for shard, _ in shards] == [6, 6]
    assert np.array_equal(shards[1][0][0]["z"], inputs["z"][6:])
    shares = [share for _, share in shards]
    assert shares == pytest.approx(
        [weight[:6].sum() / weight.sum(), weight[6:].sum() / weight.sum()]
    )
    # Without weights, the share of the examples, as for a plain batch.
    assert [w for _, w in worker_shard((inputs, targets), 3, 0)] == [pytest.approx(4 / 12)]
    assert slice_batch((inputs["x"], targets["label"]), 0, 2)[0].shape == (2, 3)


# -- losses ----------------------------------------------------------------------------------


def test_built_in_losses_take_sample_weights_as_a_weighted_mean():
    rng = np.random.default_rng(1)
    out, y, w = rng.normal(size=(5, 2)), rng.normal(size=(5, 2)), rng.random(5)
    per = losses.MSE().reference(out, y, per_example=True)
    with ops.using("numpy"):
        got = float(losses.MSE().weighted(out, y, w))
    assert got == pytest.approx(float((w * per).sum() / w.sum()), rel=1e-12)
    logits, labels = rng.normal(size=(4, 3, 5)), rng.integers(0, 5, (4, 3))
    labels[0, 1] = -1  # ignored, and class weights: the weights of the positions kept count
    loss = losses.CrossEntropy(ignore_index=-1, class_weights=(1.0, 2.0, 1.0, 0.5, 1.0))
    values = loss.reference(logits, labels, per_example=True)
    counted = np.where(labels >= 0, np.take(loss.class_weights, np.maximum(labels, 0)), 0.0)
    with ops.using("numpy"):
        got = float(loss.weighted(logits, labels, np.array([1.0, 0.0, 2.0, 3.0])))
    spread = np.array([1.0, 0.0, 2.0, 3.0])[:, None]
    assert got == pytest.approx(
        float((spread * values).sum() / (spread * counted).sum()), rel=1e-12
    )


@dataclasses.dataclass(frozen=True)
class VectorTerm(AbstractLayer, type_name="test_vector_term"):
    """Reports a loss term that is not a scalar."""

    def forward(self, scope: Scope, x: Any) -> Any:
        scope.add_loss(x[:, 0])
        return x

    def _output_shape(self, shape: Any) -> Any:
        return shape

    def describe(self) -> str:
        return "VectorTerm"


def _fit_numpy(model: AbstractLayer, loss: Any, data: Any) -> None:
    Trainer(model, backend="numpy", loss=loss).fit(data)


def _mistakes() -> dict[str, tuple[Any, type, str]]:
    """Each documented mistake: how to make it, the error and its message."""
    inputs, targets, weight = _data()
    return {
        "missing_key": (
            lambda: _fit_numpy(TwoTower(), ReadsMissingTarget(), (inputs, targets)),
            DataError,
            "the objective reads targets['weight'], but targets has only the keys "
            "['label', 'score']; add 'weight' to the data (or the model's outputs) or read "
            "one of those",
        ),
        "several_outputs": (
            lambda: _fit_numpy(TwoTower(), "mse", (inputs, targets["score"])),
            DataError,
            "MSE compares one output with one target, but the outputs are a tuple of 2; write "
            "a unitrain.losses.Objective that says how to combine them",
        ),
        "ragged_leaf": (
            lambda: _fit_numpy(
                TwoTower(), LabelAndScore(), ({**inputs, "z": inputs["z"][:11]}, targets)
            ),
            DataError,
            "train_data is ragged: inputs['z'] has 11 examples, but inputs['mask'] has 12; "
            "every array of inputs, targets and sample_weight must have the same length",
        ),
        "non_array_leaf": (
            lambda: _fit_numpy(
                TwoTower(), LabelAndScore(), (inputs, {**targets, "label": ["a"] * 12})
            ),
            DataError,
            "train_data targets['label'] holds dtype <U1, not numbers; every leaf of a batch "
            "must be an array of numbers",
        ),
        "negative_sample_weight": (
            lambda: _fit_numpy(TwoTower(), LabelAndScore(), (inputs, targets, weight - 1)),
            DataError,
            "train_data sample_weight must be one weight >= 0 per example, shape (12,), got "
            f"shape (12,) with minimum {np.min(weight - 1)}",
        ),
        "batch_of_four_parts": (
            lambda: _fit_numpy(TwoTower(), LabelAndScore(), [(inputs, targets, weight, weight)]),
            DataError,
            "a batch is (inputs, targets) or (inputs, targets, sample_weight), got tuple of 4 "
            "parts; yield one of those from the loader",
        ),
        "loss_term_not_scalar": (
            lambda: _fit_numpy(VectorTerm(), "mse", (np.ones((2, 1)), np.ones((2, 1)))),
            ConfigError,
            "VectorTerm reported a loss term of shape (2,); scope.add_loss takes a scalar: "
            "reduce the term (ops.mean, ops.sum) first",
        ),
    }


@pytest.mark.parametrize("name", list(_mistakes()))
def test_documented_error(name):
    make, error, message = _mistakes()[name]
    with pytest.raises(error) as raised:
        make()
    assert str(raised.value) == message
    if name != "negative_sample_weight":  # its minimum is the data's own
        assert message in ERRORS_PAGE.read_text(encoding="utf-8"), f"{name} is not documented"


# -- training --------------------------------------------------------------------------------


@pytest.mark.parametrize(("penalty", "weights"), [(0.05, False), (0.0, True)])
def test_two_simulated_workers_equal_one_on_a_structured_batch(penalty, weights):
    one = _fit("numpy", 1, penalty=penalty, weights=weights)
    two = _fit("numpy", 2, penalty=penalty, weights=weights)
    assert _largest_difference(one, two) < 1e-13  # float64: the order of the sums alone
    assert _largest_difference(one, _fit("numpy", 1, penalty=0.5, weights=weights)) > 1e-4


def test_accumulation_of_weighted_structured_micro_batches_equals_one_batch():
    inputs, targets, weight = _data()
    config = {"backend": "numpy", "loss": LabelAndScore(), "schedule": Constant(0.1)}
    whole = Trainer(TwoTower(), **config, config=TrainerConfig(epochs=1, dtype="float64"))
    whole.fit(ArrayLoader(inputs, targets, 12, shuffle=False, sample_weight=weight))
    halves = Trainer(
        TwoTower(), **config, config=TrainerConfig(epochs=1, grad_accum_steps=2, dtype="float64")
    )
    halves.fit(ArrayLoader(inputs, targets, 6, shuffle=False, sample_weight=weight))
    # Each micro-batch counts by its share of the sample weight, as a worker's slice does.
    assert _largest_difference(whole.backend.state_dict(), halves.backend.state_dict()) < 1e-13


def test_evaluation_reads_the_first_output_and_target_and_predict_returns_every_output():
    inputs, targets, _ = _data()
    trainer = Trainer(TwoTower(), backend="numpy", loss=LabelAndScore(), metrics=["accuracy"])
    results = trainer.test((inputs, targets))
    logits, score = trainer.predict((inputs, targets))
    assert logits.shape == (12, 3) and score.shape == (12, 1)
    expected = float(np.mean(logits.argmax(-1) == targets["label"]))
    assert results["test_accuracy"] == pytest.approx(expected)


BACKENDS = [
    "torch",
    pytest.param("jax", marks=pytest.mark.harness),
    pytest.param("tensorflow", marks=pytest.mark.harness),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_trains_two_inputs_and_two_outputs_like_the_reference(backend):
    pytest.importorskip(backend)
    reference = _fit("numpy", 1, penalty=0.05, weights=True)
    got = _fit(backend, 1, penalty=0.05, weights=True, dtype="float32")
    # float32 against the float64 reference over 4 updates: rounding of ~1e-7 per value.
    assert _largest_difference(got, reference) < 2e-5


@pytest.mark.harness
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_prefetching_loop_passes_structured_batches_on_to_the_backend(backend):
    # Device prefetch copies plain (x, y) pairs ahead; a structured batch goes on unchanged
    # and the backend converts it leaf by leaf (run here on the CPU device, as on a GPU).
    pytest.importorskip(backend)
    inputs, targets, weight = _data(4)
    plain = (inputs["x"].astype(np.float32), targets["label"])
    if backend == "jax":
        import jax

        from unitrain.backends.jax import prefetch

        staged = list(
            prefetch._ahead(
                iter([(inputs, targets, weight), plain]), jax.devices("cpu")[0], False, True
            )
        )
    else:
        from unitrain.backends.tensorflow import prefetch

        staged = list(
            prefetch._ahead(iter([(inputs, targets, weight), plain]), "/CPU:0", np.float32, True)
        )
    assert staged[0][0] is inputs and staged[0][2] is weight
    assert not isinstance(staged[1][0], np.ndarray)  # the plain batch was put on the device
    assert np.array_equal(np.asarray(staged[1][1]), targets["label"])


class _NativeLoss:
    """A framework's own loss function, as a user might pass one."""

    def __call__(self, outputs: Any, targets: Any) -> Any:
        return ((outputs - targets) ** 2).mean()

    def __repr__(self) -> str:
        return "_NativeLoss()"


def test_a_native_loss_on_a_structured_batch_is_refused_with_what_to_write():
    pytest.importorskip("torch")
    inputs, targets, _ = _data()
    trainer = Trainer(TwoTower(), backend="torch", loss=_NativeLoss(), schedule=Constant(0.1))
    with pytest.raises(ConfigError) as raised:
        trainer.fit(ArrayLoader(inputs, targets, 6, seed=1))
    message = str(raised.value)
    assert message.endswith(
        "write it as a unitrain.losses.Objective (over the outputs and the "
        "whole batch), which runs on every backend"
    )
    assert message.replace("_NativeLoss()", "<function my_loss at 0x...>") in ERRORS_PAGE.read_text(
        encoding="utf-8"
    )
