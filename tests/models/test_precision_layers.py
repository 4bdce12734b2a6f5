"""Mixed precision on portable layer models (conv net, Transformer) on every backend.

The kit's ``mixed_precision`` family runs on the MLP; these tests hold the other layers to
the same contract: float32 master state (model state included) under the usual names, one
update's gradients within a bar of the float64 reference and visibly not float32, and
evaluation and prediction that run.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from _backends import backends
from test_portable_models import MODELS, _batch

from unitrain import optim
from unitrain.backends.numpy.precision import rounding
from unitrain.backends.precision import LossScaler
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend
from unitrain.models import BatchNorm, LayerNorm, Sequential

#: Normwise relative error bars of one update's gradients against the float64 reference,
#: and the floor a compute in float32 would fall under. Measured on CPU (Nov 2026) over the
#: four backends and both models, normalisation layers reducing in float32: bf16 2.8e-3 to
#: 1.1e-2, fp16 2.1e-4 to 5.8e-4 (float32 below 1e-6); the bars are about 3.5x the worst, the
#: floors 7x under the least. (When TensorFlow's BatchNorm reduced in float16, its CNN
#: measured 1.1e-2 in fp16, and JAX's 5.4e-4.)
BARS = {"bf16-mixed": (4e-2, 4e-4), "16-mixed": (2e-3, 3e-5)}


def _options(**fields) -> BackendOptions:
    return BackendOptions(device="cpu", optimizer=optim.SGD(), **fields)


def _gradients(backend, model_name: str) -> np.ndarray:
    """Minus one SGD update at lr 1: the gradients of the first batch, parameters only."""
    before = backend.state_dict()
    backend.forward(_batch(model_name, 0))
    backend.backward()
    backend.step(1.0)
    after = backend.state_dict()
    params = [k for k in before if k.startswith("model.") and "running_" not in k]
    return np.concatenate([np.ravel(before[k] - after[k]) for k in params])


@functools.cache
def _reference(model_name: str) -> np.ndarray:
    backend = get_backend("numpy")(MODELS[model_name], _options(dtype="float64"))
    return _gradients(backend, model_name)


def _declared(name: str, precision: str) -> bool:
    return get_backend(name).capabilities.supports_precision(precision, "cpu")


@pytest.mark.parametrize("name", backends())
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("precision", sorted(BARS))
def test_mixed_precision_trains_portable_layers(name, model_name, precision):
    if not _declared(name, precision):
        # torch builds without CPU float16 autocast do not declare it; the kit checks that
        # such a backend refuses the precision instead (test_precision).
        pytest.skip(f"{name} does not declare {precision} on this CPU")
    model = MODELS[model_name]
    # The default first scale (2**16) overflows float16 on these models, so the first update
    # would be skipped, as it should; 2**8 keeps the scaled gradients in range.
    scaler = LossScaler(initial_scale=2.0**8)
    mixed = get_backend(name)(model, _options(precision=precision, loss_scaler=scaler))
    plain = get_backend(name)(model, _options())
    wrong = {
        k: (str(v.dtype), str(plain.state_dict()[k].dtype))
        for k, v in mixed.state_dict().items()
        if k in plain.state_dict() and v.dtype != plain.state_dict()[k].dtype
    }
    assert not wrong, f"state arrays changed dtype: {wrong}"
    actual, expected = _gradients(mixed, model_name), _reference(model_name)
    error = np.linalg.norm(actual - expected) / np.linalg.norm(expected)
    bar, floor = BARS[precision]
    assert floor < error < bar, f"{precision} gradients {error:.3g} from float64"
    state = mixed.state_dict()
    assert all(np.isfinite(v).all() for k, v in state.items() if k.startswith("model."))
    x, y = _batch(model_name, 1)
    assert np.isfinite(float(mixed.evaluate((x, y))["loss"]))
    outputs = mixed.predict(x)
    assert outputs.dtype == np.float32 and np.isfinite(outputs).all()


@pytest.mark.parametrize("name", backends("torch", "jax", "tensorflow"))  # against numpy's
@pytest.mark.parametrize("layer", ["batch_norm", "layer_norm"])
@pytest.mark.parametrize("precision", sorted(BARS))
def test_normalisation_takes_its_statistics_in_float32(name, layer, precision):
    """Under mixed precision a BatchNorm or LayerNorm reduces in float32 and rounds only its
    output, as autocast, Keras and Flax do and the numpy reference computes each layer. On
    inputs of mean 100 and spread 1, statistics taken in bfloat16/float16 are off by a good
    part of the spread: the loss then moves 2.4x to 120x further from float64 than the
    reference's (measured on JAX and TensorFlow before they reduced in float32)."""
    if not _declared(name, precision):
        pytest.skip(f"{name} does not declare {precision} on this CPU")
    rng = np.random.default_rng(0)
    x = (100.0 + rng.standard_normal((64, 4))).astype(np.float32)
    x = rounding("bfloat16")(rounding("float16")(x))  # on both grids: the same on every backend
    y = rng.integers(0, 4, 64)
    axis = 0 if layer == "batch_norm" else 1  # BatchNorm over the batch, LayerNorm a row
    centered = x.astype(np.float64) - x.astype(np.float64).mean(axis, keepdims=True)
    z = centered / np.sqrt((centered**2).mean(axis, keepdims=True) + 1e-5)
    log_probs = z - np.log(np.exp(z).sum(1, keepdims=True))
    expected = -log_probs[np.arange(len(y)), y].mean()  # the loss in float64
    model = Sequential([BatchNorm(4) if layer == "batch_norm" else LayerNorm(4)])

    def loss_error(backend_name: str) -> float:
        backend = get_backend(backend_name)(model, _options(precision=precision))
        return abs(float(backend.forward((x, y))) - expected) / expected

    assert loss_error(name) <= 1.5 * loss_error("numpy") + 1e-6
