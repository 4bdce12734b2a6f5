"""Portable conv nets and Transformers on every backend: hand-off, parity, refused inputs.

A checkpoint written by any backend loads into any other (all 12 ordered pairs of the four
backends), the loaded backend computes what the float64 reference computes from the same
state, and every backend refuses the same bad inputs with the same DataError.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools

import numpy as np
import pytest
from _backends import FRAMEWORKS, backends

from unitrain import DataError, models, optim
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend

CNN = models.Sequential(
    [
        models.Conv2d(1, 4, 3, padding=1),
        models.BatchNorm(4),
        models.ReLU(),
        models.MaxPool2d(2),
        models.Residual([models.Conv2d(4, 4, 3, padding=1), models.ReLU()]),
        models.GlobalAvgPool(),
        models.Linear(4, 3),
    ]
)
TRANSFORMER = models.Sequential(
    [
        models.Embedding(11, 8),
        models.PositionalEmbedding(6, 8),
        models.TransformerBlock(8, 2, mlp_ratio=2, causal=True),
        models.LayerNorm(8),
        models.Linear(8, 11),
    ]
)
MODELS = {"cnn": CNN, "transformer": TRANSFORMER}
# Momentum, not Adam: Adam divides by the gradient's own size, so parameters whose gradient
# is zero in theory (a conv bias under BatchNorm, attention's key bias) would move by
# amplified rounding noise and no two backends would agree on them.
OPTIMIZER = optim.SGD(momentum=0.9)
INSTALLED = [n for n, m in FRAMEWORKS.items() if importlib.util.find_spec(m) is not None]


def _batch(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if name == "cnn":
        return rng.standard_normal((6, 6, 6, 1)).astype(np.float32), rng.integers(0, 3, 6)
    tokens = rng.integers(0, 11, (4, 6))
    return tokens, (tokens + 1) % 11


def _options(**fields) -> BackendOptions:
    return BackendOptions(device="cpu", optimizer=OPTIMIZER, **fields)


@functools.cache
def _sent(model_name: str, backend_name: str) -> dict[str, np.ndarray]:
    """The state dict of ``backend_name`` after two updates (seeded differently per
    backend, so each hand-off carries its sender's numbers)."""
    seed = INSTALLED.index(backend_name)
    backend = get_backend(backend_name)(MODELS[model_name], _options(seed=seed))
    for step in range(2):
        backend.forward(_batch(model_name, step))
        backend.backward()
        backend.step(0.01)
    return backend.state_dict()


@functools.cache
def _fresh(backend_name: str, model_name: str):
    """One backend per model and backend, reused: every test loads its state or only makes
    it refuse inputs."""
    return get_backend(backend_name)(MODELS[model_name], _options())


PAIRS = [
    pytest.param(model, sender, receiver, id=f"{model}-{sender}-to-{receiver}")
    for model in MODELS
    for sender, receiver in itertools.permutations(INSTALLED, 2)
]


@pytest.mark.parametrize(("model_name", "sender", "receiver"), PAIRS)
def test_a_checkpoint_carries_over_between_backends(model_name, sender, receiver):
    state = _sent(model_name, sender)
    model = MODELS[model_name]
    loaded = _fresh(receiver, model_name)  # load_state_dict replaces everything it holds
    loaded.load_state_dict(state)
    for key, value in loaded.state_dict().items():  # the round trip is exact
        assert value.dtype == state[key].dtype and np.array_equal(value, state[key]), key
    reference = get_backend("numpy")(model, BackendOptions(dtype="float64", optimizer=OPTIMIZER))
    reference.load_state_dict(
        {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in state.items()}
    )
    batch = _batch(model_name, 7)
    ours, theirs = loaded.evaluate(batch), reference.evaluate(batch)
    assert float(ours["loss"]) == pytest.approx(float(theirs["loss"]), rel=1e-5)
    # The same count of hits; a float32 mean rounds the fraction.
    assert float(ours["accuracy"]) == pytest.approx(float(theirs["accuracy"]), rel=1e-7)
    for backend in (loaded, reference):  # one more update from the handed-off state
        backend.forward(batch)
        backend.backward()
        backend.step(0.01)
    after, expected = loaded.state_dict(), reference.state_dict()
    for key in model.param_shapes():
        np.testing.assert_allclose(
            after[f"model.{key}"], expected[f"model.{key}"], rtol=1e-5, atol=1e-6, err_msg=key
        )
    for key in model.state_shapes():  # BatchNorm statistics moved by that update
        np.testing.assert_allclose(after[f"model.{key}"], expected[f"model.{key}"], rtol=1e-5)


@pytest.mark.parametrize("backend_name", backends())
@pytest.mark.parametrize(
    ("model_name", "inputs", "message"),
    [
        (
            "transformer",
            np.array([[0, 1, 11]]),
            r"token ids must lie in \[0, 11\), got ids from 0 to 11",
        ),
        ("transformer", np.array([[-1, 1, 2]]), r"token ids must lie in \[0, 11\)"),
        ("transformer", np.zeros((1, 7), int), r"layer 1: PositionalEmbedding.*got \(7, 8\)"),
        (
            "cnn",
            np.zeros((2, 6, 6, 3), np.float32),
            r"layer 0: Conv2d.*\(height, width, 1\).*got \(6, 6, 3\)",
        ),
        ("cnn", np.zeros((2, 36), np.float32), r"layer 0: Conv2d.*got \(36,\)"),
    ],
)
def test_every_backend_refuses_inputs_the_model_cannot_read(
    backend_name, model_name, inputs, message
):
    backend = _fresh(backend_name, model_name)
    targets = np.zeros(inputs.shape[: 2 if model_name == "transformer" else 1], int)
    with pytest.raises(DataError, match=message):
        backend.evaluate((inputs, targets))
    with pytest.raises(DataError, match=message):
        backend.forward((inputs, targets))


@pytest.mark.parametrize("backend_name", backends())
def test_every_backend_trains_a_transformer_with_adam_like_the_reference(backend_name):
    """Adam over an embedding's sparse gradient (TensorFlow's IndexedSlices) and every other
    parameter; attention's key bias moves by Adam's rounding noise on every backend, which
    changes nothing (a softmax ignores a shift shared by a whole row), so losses agree."""
    options = {"optimizer": optim.Adam(), "device": "cpu"}
    reference = get_backend("numpy")(TRANSFORMER, BackendOptions(dtype="float64", **options))
    backend = get_backend(backend_name)(TRANSFORMER, BackendOptions(**options))
    for step in range(3):
        for each in (reference, backend):
            each.forward(_batch("transformer", step))
            each.backward()
            each.step(0.01)
    batch = _batch("transformer", 9)
    ours, theirs = backend.evaluate(batch)["loss"], reference.evaluate(batch)["loss"]
    assert float(ours) == pytest.approx(float(theirs), rel=1e-5)
