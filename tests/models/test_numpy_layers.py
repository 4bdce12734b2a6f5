"""The numpy reference's gradients against finite differences in float64.

The reference differentiates the core's forward (every layer written once in
:mod:`unitrain.ops`) with its ops' own vector-Jacobian products. Each :data:`LAYER_CASES` case
is checked through ``ops.vjp`` (what ``tests/models/_layer_parity.py`` holds every framework
to), and whole models through the backend itself, so that how :class:`NumpyBackend` tracks
parameters, sweeps the graph and fills its buffers is checked too.
"""

from __future__ import annotations

import numpy as np
import pytest
from _layer_parity import reference

from unitrain import ops
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.numpy import ops as numpy_ops
from unitrain.backends.protocol import BackendOptions
from unitrain.conformance._layer_cases import LAYER_CASES, layer_input
from unitrain.models import Embedding, Linear, Pass, PositionalEmbedding, Sequential, apply

CASES = [pytest.param(layer, shape, id=name) for name, layer, shape in LAYER_CASES]
STEP = 1e-6


def numeric_gradient(loss_at, value: np.ndarray) -> np.ndarray:
    """Central differences of ``loss_at(moved copy of value)`` element by element."""
    numeric = np.zeros_like(value)
    for index in np.ndindex(value.shape):
        plus, minus = value.copy(), value.copy()
        plus[index] += STEP
        minus[index] -= STEP
        numeric[index] = (loss_at(plus) - loss_at(minus)) / (2 * STEP)
    return numeric


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_layer_gradients_match_finite_differences(layer, shape):
    x = layer_input(layer, shape)
    params = layer.init_params(seed=3, dtype=np.float64)
    # Perturb the initial values so that zero biases and unit norm weights are not special.
    rng = np.random.default_rng(7)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    state = layer.init_state(np.float64)
    projection = rng.standard_normal((shape[0], *layer.output_shape(shape[1:])))
    _, dx, grads, _ = reference(layer, x, params, state, projection)

    def loss_at(params_, x_):
        with ops.using(numpy_ops):  # the module: a name is looked up each call
            out, _ = apply(layer, x_, Pass(params_, state, training=True))
        return float(np.sum(np.asarray(out) * projection))

    # Errors are relative to the case's largest gradient entry, not each tensor's: some
    # gradients are zero in theory (a conv bias under BatchNorm, attention's key bias), and
    # their finite differences are pure rounding noise.
    scale = max(np.abs(g).max() for g in [*grads.values(), *([] if dx is None else [dx])])
    for name, value in params.items():

        def moved_loss(moved, name=name):
            return loss_at({**params, name: moved}, x)

        numeric = numeric_gradient(moved_loss, value)
        error = np.abs(grads[name] - numeric).max() / scale
        assert error < 1e-6, f"{name}: relative error {error:.2e}"
    if layer.input_kind == "tokens":
        assert dx is None
        return
    numeric = numeric_gradient(lambda moved: loss_at(params, moved), x)
    error = np.abs(dx - numeric).max() / scale
    assert error < 1e-6, f"input: relative error {error:.2e}"


_CASE = {name: (layer, shape) for name, layer, shape in LAYER_CASES}
_TOKENS = Sequential((Embedding(7, 4), PositionalEmbedding(5, 4), Linear(4, 3)))


@pytest.mark.parametrize(
    ("model", "shape", "loss"),
    [
        pytest.param(*_CASE["cnn"], "mse", id="cnn-mse"),
        pytest.param(*_CASE["transformer_block"], "mse", id="transformer_block-mse"),
        pytest.param(_TOKENS, (2, 5), "cross_entropy", id="tokens-cross_entropy"),
    ],
)
def test_backend_gradients_match_finite_differences(model, shape, loss):
    """forward/backward of the backend in float64 against differences of its own loss."""
    backend = NumpyBackend(model, BackendOptions(dtype="float64", loss=loss, seed=2))
    x = layer_input(model, shape)
    out_shape = (shape[0], *model.output_shape(shape[1:]))
    rng = np.random.default_rng(5)
    y = rng.standard_normal(out_shape) if loss == "mse" else rng.integers(0, 3, out_shape[:-1])
    backend.forward((x, y))
    backend.backward(0.5)  # the buffers get scale times the gradient
    grads = {k: g / 0.5 for k, g in backend.grads.items()}
    params = dict(backend.params)

    def loss_at(name, moved):
        backend.params = {**params, name: moved}
        return float(backend.forward((x, y)))

    scale = max(np.abs(g).max() for g in grads.values())
    for name, value in params.items():
        numeric = numeric_gradient(lambda moved, name=name: loss_at(name, moved), value)
        error = np.abs(grads[name] - numeric).max() / scale
        assert error < 1e-6, f"{name}: relative error {error:.2e}"
