"""The portable MLP description: canonical names, layouts and initial weights."""

from __future__ import annotations

import numpy as np
import pytest
from _backends import backends

from unitrain import ConfigError, models
from unitrain.backends.protocol import BackendOptions


def test_initial_weights_are_a_function_of_the_seed():
    model = models.MLP((5, 7, 2))
    a, b, c = model.init_params(0), model.init_params(0), model.init_params(1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["layers.0.weight"], c["layers.0.weight"])
    bound = 1 / np.sqrt(5)
    assert np.abs(a["layers.0.weight"]).max() <= bound and np.abs(a["layers.0.bias"]).max() <= bound


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": (5,)}, "sizes"),
        ({"sizes": (5, 0, 2)}, "positive"),
        ({"sizes": (5, 2.0)}, "sizes"),
        ({"sizes": (5, 2), "activation": "swish"}, "activation"),
        ({"sizes": (5, 2), "dropout": 1.0}, "dropout"),
        ({"sizes": (5, 2), "dropout": -0.1}, "dropout"),
    ],
)
def test_bad_descriptions_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        models.MLP(**kwargs)


def test_round_trip_through_dict():
    model = models.MLP((3, 4, 2), activation="gelu", dropout=0.1)
    assert models.model_from_dict(model.to_dict()) == model
    with pytest.raises(ConfigError, match="unknown model type"):
        models.model_from_dict({"type": "cnn"})


@pytest.mark.parametrize("backend", backends())
@pytest.mark.parametrize("activation", models.ACTIVATIONS)
def test_every_backend_computes_the_same_function(backend, activation):
    """Same description and seed: same outputs (eval mode) on every backend, up to float32."""
    from unitrain.backends.registry import get_backend

    model = models.MLP((6, 9, 4), activation=activation, dropout=0.5)
    x = np.random.default_rng(1).normal(size=(11, 6)).astype(np.float32)
    y = np.arange(11) % 4
    reference = get_backend("numpy")(model, BackendOptions(dtype="float64")).evaluate((x, y))
    other = get_backend(backend)(model, BackendOptions(device="cpu")).evaluate((x, y))
    assert float(other["loss"]) == pytest.approx(float(reference["loss"]), rel=2e-6)
    assert float(other["accuracy"]) == pytest.approx(float(reference["accuracy"]), rel=1e-6)
