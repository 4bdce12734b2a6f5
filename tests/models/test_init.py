"""Initial values as data: the initialisers' distributions and the Initialized wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from unitrain import ConfigError, ops
from unitrain.models import (
    Conv2d,
    Embedding,
    Initialized,
    Linear,
    Pass,
    Sequential,
    TransformerBlock,
    apply,
    init,
    model_from_json,
)

RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    ("rule", "shape", "std"),
    [
        (init.Normal(0.02), (400, 300), 0.02),
        (init.GlorotNormal(), (400, 300), np.sqrt(2 / 700)),
        (init.HeNormal(), (3, 3, 40, 60), np.sqrt(2 / 360)),  # fan_in = 3 * 3 * 40
        (init.GlorotUniform(), (400, 300), np.sqrt(2 / 700)),  # uniform of that variance
        (init.HeUniform(), (400, 300), np.sqrt(2 / 400)),
        (init.Uniform(-0.5, 0.5), (300, 300), np.sqrt(1 / 12)),
    ],
)
def test_each_initialiser_draws_its_distribution(rule, shape, std):
    values = rule.draw(np.random.default_rng(1), shape)
    assert values.shape == shape
    assert abs(values.std() / std - 1) < 0.03, (values.std(), std)


def test_bounded_initialisers_stay_in_their_bounds():
    glorot = init.GlorotUniform().draw(RNG, (30, 50))
    assert np.abs(glorot).max() <= np.sqrt(6 / 80)
    truncated = init.TruncatedNormal(0.1, mean=1.0).draw(RNG, (200, 200))
    assert np.abs(truncated - 1.0).max() <= 0.2 and abs(truncated.std() - 0.088) < 0.003
    assert (init.Constant(0.3).draw(RNG, (2, 2)) == 0.3).all()
    assert not init.Zeros().draw(RNG, (3,)).any()


def test_initialized_changes_only_the_matched_parameters_and_no_name():
    model = Sequential((Embedding(10, 8), TransformerBlock(8, 2), Linear(8, 10)))
    rules = {"*.weight": init.Normal(0.02), "*.bias": init.Zeros(), "0.weight": init.Normal(1.0)}
    wrapped = Initialized(model, rules)
    plain, drawn = model.init_params(3, np.float64), wrapped.init_params(3, np.float64)
    assert wrapped.param_shapes() == model.param_shapes()
    assert abs(drawn["2.weight"].std() - 0.02) < 0.005
    assert abs(drawn["0.weight"].std() - 1.0) < 0.2  # the last matching rule wins
    assert not drawn["1.fc1.bias"].any()
    norms_only = Initialized(model, {"1.norm1.weight": init.Constant(2.0)})
    partly = norms_only.init_params(3, np.float64)
    assert (partly["1.norm1.weight"] == 2.0).all()
    for name in plain:  # every other parameter keeps the value it had without the rule
        if name != "1.norm1.weight":
            np.testing.assert_array_equal(partly[name], plain[name])


def test_an_inner_rule_wins_and_the_wrapper_computes_the_layer():
    inner = Sequential((Initialized(Linear(3, 3), {"weight": init.Constant(1.0)}), Linear(3, 2)))
    model = Initialized(inner, {"*.weight": init.Zeros()})
    params = model.init_params(0, np.float64)
    assert (params["0.weight"] == 1.0).all() and not params["1.weight"].any()
    x = RNG.standard_normal((4, 3))
    with ops.using("numpy"):
        ours, _ = apply(model, x, Pass(params, {}, training=False))
    want = (x @ params["0.weight"] + params["0.bias"]) @ params["1.weight"] + params["1.bias"]
    np.testing.assert_allclose(ours, want)


def test_rules_round_trip_through_json_and_functions_are_python_only():
    model = Initialized(Conv2d(1, 4, 3), {"weight": init.HeNormal(), "bias": init.Constant(0.1)})
    assert model_from_json(model.to_json()) == model
    own = Initialized(Linear(2, 2), {"weight": init.Function(lambda rng, shape: np.eye(2))})
    np.testing.assert_array_equal(own.init_params(0)["weight"], np.eye(2))
    with pytest.raises(ConfigError, match="cannot be written to JSON"):
        own.to_json()
    wrong = Initialized(Linear(2, 2), {"weight": init.Function(lambda rng, shape: np.eye(3))})
    with pytest.raises(ConfigError, match="gave values of shape"):
        wrong.init_params(0)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Initialized(Linear(2, 2), {"*.wieght": init.Zeros()}), "matches no parameter"),
        (lambda: Initialized(Linear(2, 2), {"weight": "zeros"}), "patterns to initialisers"),
        (lambda: init.Normal(std=0.0), "std must be a float > 0"),
        (lambda: init.Uniform(1.0, 0.0), "high must exceed low"),
        (lambda: init.Initializer.from_dict({"type": "orthogonal"}), "unknown initializer"),
    ],
)
def test_bad_rules_are_refused(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
