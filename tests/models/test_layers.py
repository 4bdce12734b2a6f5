"""The layer language: descriptions, validation, JSON round trip, shapes, initial values."""

from __future__ import annotations

import numpy as np
import pytest

from unitrain import ConfigError, DataError, models
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.conformance._layer_cases import LAYER_CASES, layer_input

CASES = [pytest.param(layer, shape, id=name) for name, layer, shape in LAYER_CASES]


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_every_layer_round_trips_through_json(layer, shape):
    again = models.model_from_json(layer.to_json())
    assert again == layer
    assert again.param_shapes() == layer.param_shapes()


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_initial_values_have_the_declared_shapes_and_dtype(layer, shape):
    params, state = layer.init_params(seed=1, dtype=np.float32), layer.init_state(np.float32)
    assert {k: v.shape for k, v in params.items()} == layer.param_shapes()
    assert {k: v.shape for k, v in state.items()} == layer.state_shapes()
    assert all(v.dtype == np.float32 for v in [*params.values(), *state.values()])


def test_initial_distributions_follow_torch_defaults():
    conv = models.Conv2d(4, 64, 3).init_params(seed=0, dtype=np.float64)
    bound = 1 / np.sqrt(3 * 3 * 4)
    assert bound * 0.95 < np.abs(conv["weight"]).max() <= bound
    attention = models.MultiHeadAttention(16, 4).init_params(seed=0, dtype=np.float64)
    xavier = np.sqrt(6 / (16 + 48))
    assert xavier * 0.9 < np.abs(attention["query.weight"]).max() <= xavier
    assert not attention["key.bias"].any() and not attention["out.bias"].any()
    embedding = models.Embedding(100, 50).init_params(seed=0, dtype=np.float64)["weight"]
    assert abs(embedding.std() - 1) < 0.05
    norm = models.BatchNorm(3)
    assert norm.init_state(np.float64)["running_var"].tolist() == [1, 1, 1]


def test_mlp_keeps_its_parameter_names_and_values():
    """Checkpoints written before the layer language still load: same names, same numbers."""
    model = models.MLP((3, 5, 2))
    assert list(model.param_shapes()) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ]
    rng = np.random.default_rng([0, 0x4D4C50])  # the stream MLP has always drawn from
    first = rng.uniform(-1 / np.sqrt(3), 1 / np.sqrt(3), size=(3, 5)).astype(np.float32)
    assert np.array_equal(model.init_params(0)["layers.0.weight"], first)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: models.Linear(0, 3), "in_features must be a positive int"),
        (lambda: models.Conv2d(1, 2, 3, padding=-1), "padding must be a non-negative int"),
        (lambda: models.Conv2d(1, 2, (3, 3, 3)), "kernel_size must be an int or a pair"),
        (lambda: models.BatchNorm(3, momentum=0.0), "momentum must be in"),
        (lambda: models.LayerNorm(3, eps=0.0), "eps must be"),
        (lambda: models.MultiHeadAttention(10, 3), "multiple of heads"),
        (lambda: models.TransformerBlock(8, 2, dropout=1.0), "dropout must be"),
        (lambda: models.Sequential([]), "non-empty list"),
        (lambda: models.Sequential([models.ReLU(), "relu"]), r"layers\[1\]"),
        (lambda: models.model_from_dict({"type": "conv3d"}), "unknown model type"),
        (lambda: models.model_from_dict({"type": "linear", "in_features": 2}), "missing"),
    ],
)
def test_bad_descriptions_are_refused(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_shape_inference_names_the_layer_and_both_shapes():
    model = models.Sequential(
        [
            models.Conv2d(1, 4, 3, padding=1),
            models.MaxPool2d(2),
            models.Flatten(),
            models.Linear(64, 10),
        ]
    )
    assert model.output_shape((8, 8, 1)) == (10,)
    with pytest.raises(DataError, match=r"layer 3: Linear.*\(\.\.\., 64\).*got \(36,\)"):
        model.output_shape((6, 6, 1))
    with pytest.raises(DataError, match=r"layer 0: Conv2d.*got \(8, 8, 3\)"):
        model.output_shape((8, 8, 3))


def _cnn() -> models.Sequential:
    return models.Sequential(
        [
            models.Conv2d(1, 3, 3, padding=1),
            models.BatchNorm(3),
            models.ReLU(),
            models.GlobalAvgPool(),
            models.Linear(3, 2),
        ]
    )


def test_numpy_batch_norm_statistics_move_in_training_and_not_in_evaluate():
    backend = get_backend("numpy")(_cnn(), BackendOptions(dtype="float64"))
    x = np.random.default_rng(0).standard_normal((5, 4, 4, 1))
    y = np.array([0, 1, 0, 1, 1])
    before = backend.state_dict()
    assert before["model.1.running_var"].tolist() == [1, 1, 1]
    backend.evaluate((x, y))
    assert all(np.array_equal(v, backend.state_dict()[k]) for k, v in before.items())
    backend.forward((x, y))
    conv = x  # the BatchNorm input is the conv output; recompute it to check the update
    params = before
    padded = np.pad(conv, ((0, 0), (1, 1), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))
    z = np.tensordot(windows, params["model.0.weight"], axes=([4, 5, 3], [0, 1, 2]))
    z = z + params["model.0.bias"]
    unbiased = z.reshape(-1, 3).var(axis=0, ddof=1)
    after = backend.state_dict()
    np.testing.assert_allclose(after["model.1.running_var"], 0.9 + 0.1 * unbiased, rtol=1e-12)
    np.testing.assert_allclose(after["model.1.running_mean"], 0.1 * z.reshape(-1, 3).mean(0))


def test_numpy_trains_a_sequence_model_over_every_token():
    model = models.Sequential(
        [
            models.Embedding(5, 8),
            models.PositionalEmbedding(4, 8),
            models.TransformerBlock(8, 2, causal=True),
            models.LayerNorm(8),
            models.Linear(8, 5),
        ]
    )
    backend = get_backend("numpy")(model, BackendOptions(dtype="float64"))
    tokens = np.random.default_rng(0).integers(0, 5, size=(6, 4))
    batch = (tokens, (tokens + 1) % 5)  # learnable from each token alone
    first = float(backend.forward(batch))
    assert first == pytest.approx(np.log(5), rel=0.5)  # near-uniform logits at the start
    for _ in range(60):
        backend.forward(batch)
        backend.backward()
        backend.step(0.1)
    assert float(backend.evaluate(batch)["loss"]) < first / 4


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (np.array([[0, 5]]), r"token ids must lie in \[0, 5\), got ids from 0 to 5"),
        (np.array([[-1, 2]]), r"token ids must lie in \[0, 5\)"),
        (np.array([[0.0, 1.0]]), "integer token ids"),
        (np.zeros((1, 9), int), r"PositionalEmbedding.*length <= 4.*got \(9, 8\)"),
    ],
)
def test_numpy_refuses_tokens_it_cannot_read(inputs, message):
    model = models.Sequential([models.Embedding(5, 8), models.PositionalEmbedding(4, 8)])
    backend = get_backend("numpy")(model, BackendOptions())
    with pytest.raises(DataError, match=message):
        backend.evaluate((inputs, np.zeros(inputs.shape, int)))


def test_layer_input_draws_valid_tokens():
    ids = layer_input(models.Embedding(7, 2), (50, 3))
    assert ids.min() >= 0 and ids.max() < 7
