"""Metrics, ``Trainer.predict``, loading weights for inference, and native weight export."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _backends import backends

from unitrain import (
    CheckpointError,
    ConfigError,
    DataError,
    Trainer,
    TrainerConfig,
    export_weights,
    models,
)
from unitrain.callbacks import ModelCheckpoint
from unitrain.metrics import Metric, Perplexity, TopKAccuracy, resolve_metrics
from unitrain.recipes import load_digits

OUTPUTS = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]])
TARGETS = np.array([1, 1, 0, 1])


def test_top_k_accuracy_counts_targets_among_the_k_highest():
    assert TopKAccuracy(1).batch(OUTPUTS, TARGETS) == (1.0, 4)
    assert TopKAccuracy(2).batch(OUTPUTS, TARGETS) == (2.0, 4)  # rows 2 and 3: ties are misses
    assert TopKAccuracy(3).batch(OUTPUTS, TARGETS) == (4.0, 4)


def test_perplexity_is_exp_of_the_mean_token_cross_entropy():
    logits = np.random.default_rng(0).normal(size=(2, 5, 7))
    tokens = np.random.default_rng(1).integers(0, 7, size=(2, 5))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = math.exp(-np.take_along_axis(log_probs, tokens[..., None], -1).mean())
    metric = Perplexity()
    assert metric.result(*metric.batch(logits, tokens)) == pytest.approx(expected, rel=1e-12)


def test_metric_specs_are_checked():
    assert [m.name for m in resolve_metrics(["mse", {"type": "top_k_accuracy", "k": 2}])] == [
        "mse",
        "top2_accuracy",
    ]
    with pytest.raises(ConfigError, match="unknown metric 'f1'"):
        resolve_metrics(["f1"])
    with pytest.raises(ConfigError, match="share a name"):
        resolve_metrics(["accuracy", TopKAccuracy(1)])
    with pytest.raises(DataError, match=r"outside 0\.\.2"):
        TopKAccuracy(1).check(OUTPUTS.shape, np.array([0, 1, 2, 3]))
    with pytest.raises(DataError, match=r"outputs \(4, 3\) and targets \(3,\)"):
        Perplexity().check((2, 2, 3), np.zeros(3, np.int64))


def _trainer(backend: str, **settings) -> Trainer:
    return Trainer(
        models.MLP((64, 16, 10)),
        backend=backend,
        config=TrainerConfig(epochs=1, batch_size=64, **settings),
        metrics=[
            "top3_accuracy",
            "perplexity",
            Metric.from_function("mean_max_logit", lambda out, y: out.max(axis=1).mean()),
        ],
    )


@pytest.mark.parametrize("backend", backends())
def test_metrics_and_predict_agree_with_the_numpy_reference(backend):
    data = load_digits()
    runs = {}
    for name in ("numpy", backend):
        trainer = _trainer(name)
        row = trainer.fit((data.x_train, data.y_train), (data.x_val, data.y_val))[-1]
        runs[name] = (row, trainer.predict(data.x_val))
    (reference, expected), (row, outputs) = runs["numpy"], runs[backend]
    assert outputs.shape == (len(data.x_val), 10) and isinstance(outputs, np.ndarray)
    np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-5)
    for key in ("val_top3_accuracy", "val_perplexity", "val_mean_max_logit"):
        assert row[key] == pytest.approx(reference[key], rel=1e-4), key
    assert row["val_perplexity"] == pytest.approx(math.exp(row["val_loss"]), rel=1e-5)


def test_load_weights_restores_a_checkpoint_for_inference(tmp_path):
    data = load_digits()
    trained = _trainer("numpy")
    trained.callbacks = type(trained.callbacks)([ModelCheckpoint(tmp_path, every_n_epochs=1)])
    trained.fit((data.x_train, data.y_train))
    fresh = _trainer("numpy")
    assert not np.allclose(fresh.predict(data.x_val), trained.predict(data.x_val))
    fresh.load_weights(tmp_path / "epoch=0001-step=000023")
    np.testing.assert_array_equal(fresh.predict(data.x_val), trained.predict(data.x_val))
    other = Trainer(models.MLP((64, 8, 10)), backend="numpy")
    with pytest.raises(CheckpointError, match="different model"):
        other.load_weights(tmp_path / "epoch=0001-step=000023")


def test_torch_export_loads_into_a_native_module_and_predicts_the_same():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):  # written as a torch user would, knowing nothing of unitrain
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(64, 16), torch.nn.Linear(16, 10)])

        def forward(self, x):
            return self.layers[1](torch.relu(self.layers[0](x)))

    data = load_digits()
    for backend in ("numpy", "torch"):
        trainer = _trainer(backend)
        trainer.fit((data.x_train, data.y_train))
        net = Net()
        net.load_state_dict(export_weights(trainer, "torch"))  # strict: every key and shape
        with torch.no_grad():
            native = net(torch.from_numpy(data.x_val)).numpy()
        np.testing.assert_allclose(native, trainer.predict(data.x_val), rtol=0, atol=1e-6)


def test_keras_export_sets_the_weights_of_a_dense_stack():
    keras = pytest.importorskip("keras")
    data = load_digits()
    trainer = _trainer("numpy")
    trainer.fit((data.x_train, data.y_train))
    net = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)]
    )
    net.set_weights(export_weights(trainer, "keras"))
    native = np.asarray(net(data.x_val[:50]))
    np.testing.assert_allclose(native, trainer.predict(data.x_val[:50]), rtol=0, atol=1e-5)


def test_export_refuses_what_it_cannot_do():
    trainer = _trainer("numpy")
    with pytest.raises(ConfigError, match="unknown framework 'onnx'"):
        export_weights(trainer, "onnx")


@pytest.mark.parametrize("backend", backends("torch", "jax", "tensorflow"))
def test_metrics_run_on_the_device_and_are_read_back_once_per_pass(backend, monkeypatch):
    data = load_digits()
    trainer = Trainer(
        models.MLP((64, 16, 10)), backend=backend, metrics=["top3_accuracy", "perplexity"]
    )

    def no_host_outputs(inputs):
        raise AssertionError("metrics must not copy the outputs to the host")

    monkeypatch.setattr(trainer.backend, "predict", no_host_outputs)
    totals = trainer.validate((data.x_val, data.y_val))
    assert 0 <= totals["val_top3_accuracy"] <= 1 and totals["val_perplexity"] > 1
