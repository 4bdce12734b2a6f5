"""The numpy reference's hand-written backward passes, against finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

from unitrain.backends.numpy.layers import Run
from unitrain.backends.numpy.model import build
from unitrain.conformance._layer_cases import LAYER_CASES, layer_input

CASES = [pytest.param(layer, shape, id=name) for name, layer, shape in LAYER_CASES]


def _loss_and_grads(layer, x, projection, params, state):
    """``sum(layer(x) * projection)`` and its gradients (params, input) by the reference."""
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    node = build(layer)
    run = Run(params, dict(state), grads, train=True)
    out = node.forward(x, run)
    dx = node.backward(projection, run)
    return float(np.sum(out * projection)), grads, dx


@pytest.mark.parametrize(("layer", "shape"), CASES)
def test_backward_matches_finite_differences(layer, shape):
    x = layer_input(layer, shape)
    params = layer.init_params(seed=3, dtype=np.float64)
    # Perturb the initial values so that zero biases and unit norm weights are not special.
    rng = np.random.default_rng(7)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    state = layer.init_state(np.float64)
    out_shape = (shape[0], *layer.output_shape(shape[1:]))
    projection = rng.standard_normal(out_shape)
    _, grads, dx = _loss_and_grads(layer, x, projection, params, state)

    def loss_at(params_, x_):
        return _loss_and_grads(layer, x_, projection, params_, state)[0]

    # Errors are relative to the case's largest gradient entry, not each tensor's: some
    # gradients are zero in theory (a conv bias under BatchNorm, attention's key bias), and
    # their finite differences are pure rounding noise.
    scale = max(np.abs(g).max() for g in [*grads.values(), *([] if dx is None else [dx])])
    step = 1e-6
    for name, value in params.items():
        numeric = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            plus, minus = dict(params), dict(params)
            plus[name], minus[name] = value.copy(), value.copy()
            plus[name][index] += step
            minus[name][index] -= step
            numeric[index] = (loss_at(plus, x) - loss_at(minus, x)) / (2 * step)
        error = np.abs(grads[name] - numeric).max() / scale
        assert error < 1e-6, f"{name}: relative error {error:.2e}"
    if layer.input_kind == "tokens":
        assert dx is None
        return
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        numeric[index] = (loss_at(params, plus) - loss_at(params, minus)) / (2 * step)
    error = np.abs(dx - numeric).max() / scale
    assert error < 1e-6, f"input: relative error {error:.2e}"
