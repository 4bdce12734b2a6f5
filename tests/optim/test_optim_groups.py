"""Parameter groups: their data form, which parameter each group takes, the errors, and every
installed backend against the float64 reference on a model whose groups need layer types."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _backends import backends

from unitrain import ConfigError, optim
from unitrain.backends.protocol import BackendOptions
from unitrain.models import MLP, LayerNorm, Linear, ReLU, Sequential
from unitrain.optim import Group
from unitrain.recipes._toml import dumps, loads

#: Linear, LayerNorm, ReLU, Linear: parameters 0.*, 1.* (the norm's), 3.* (weight and bias).
MODEL = Sequential([Linear(6, 5), LayerNorm(5), ReLU(), Linear(5, 3)])
#: nanoGPT's split: no decay on biases and norm weights; a head at twice the learning rate.
NANOGPT = optim.AdamW(
    weight_decay=0.1,
    groups=[Group(("*.bias", "LayerNorm"), weight_decay=0.0), Group("3.*", lr_scale=2.0)],
)


def split(spec: optim.Optimizer, model=MODEL) -> dict[str, tuple[float, float]]:
    """Parameter -> (its weight decay, its lr_scale) after resolving ``spec`` for ``model``."""
    groups = optim.parameter_groups(optim.for_model(spec, model), model.param_shapes())
    return {n: (g.optimizer.weight_decay, g.lr_scale) for g in groups for n in g.names}


# -- data ------------------------------------------------------------------------------------


def test_groups_round_trip_through_json_and_a_recipe_table():
    assert optim.optimizer_from_dict(json.loads(NANOGPT.to_json())) == NANOGPT
    recipe = loads(
        """
        [optimizer]
        type = "adamw"
        weight_decay = 0.1
        [[optimizer.groups]]
        match = ["*.bias", "LayerNorm"]
        weight_decay = 0
        [[optimizer.groups]]
        match = "3.*"
        lr_scale = 2
        """
    )
    assert optim.optimizer_from_dict(recipe["optimizer"]) == NANOGPT
    written = loads(dumps({"optimizer": NANOGPT.to_dict()}))  # as a recipe file stores it
    assert optim.optimizer_from_dict(written["optimizer"]) == NANOGPT
    assert NANOGPT.to_dict()["groups"] == [
        {"match": ["*.bias", "LayerNorm"], "lr_scale": 1.0, "weight_decay": 0.0},
        {"match": ["3.*"], "lr_scale": 2.0},
    ]


def test_an_optimizer_without_groups_is_stored_as_before():
    stored = {"type": "adamw", "beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.01}
    assert optim.AdamW().to_dict() == stored
    assert optim.optimizer_from_dict(stored) == optim.AdamW()


def test_a_group_repr_reads_as_the_call_that_made_it():
    assert repr(Group("head.*", lr_scale=2.0, beta2=0.95)) == (
        "Group(match=('head.*',), lr_scale=2.0, beta2=0.95)"
    )


# -- which group takes which parameter -------------------------------------------------------


def test_first_matching_group_wins_and_the_rest_keep_the_base_options():
    assert split(NANOGPT) == {
        "0.weight": (0.1, 1.0),
        "0.bias": (0.0, 1.0),
        "1.weight": (0.0, 1.0),  # LayerNorm, by type
        "1.bias": (0.0, 1.0),
        "3.weight": (0.1, 2.0),
        "3.bias": (0.0, 1.0),  # taken by the first group before "3.*"
    }
    reversed_order = optim.AdamW(weight_decay=0.1, groups=list(reversed(NANOGPT.groups)))
    assert split(reversed_order)["3.bias"] == (0.1, 2.0)


def test_a_layer_type_selects_subclasses_and_resolves_to_exact_names():
    class MyNorm(LayerNorm):
        pass

    model = Sequential([Linear(4, 4), MyNorm(4)])
    spec = optim.for_model(optim.SGD(groups=[Group("LayerNorm", lr_scale=0.5)]), model)
    assert spec.groups[0].match == ("1.weight", "1.bias")
    bare = Linear(3, 2)  # a lone layer's parameters are "weight" and "bias"
    resolved = optim.for_model(optim.SGD(groups=[Group("Linear", lr_scale=0.5)]), bare)
    assert all(not entry.isidentifier() or entry.islower() for entry in resolved.groups[0].match)
    assert split(optim.SGD(groups=[Group("Linear", lr_scale=0.5)]), bare) == {
        "weight": (0.0, 0.5),
        "bias": (0.0, 0.5),
    }


def test_the_reference_applies_each_groups_options_and_learning_rate():
    # Zero gradients: AdamW's direction is 0, so each parameter only decays by lr * wd * p.
    params = {"w": np.full(2, 2.0), "b": np.full(2, 2.0), "head": np.full(2, 2.0)}
    spec = optim.AdamW(
        weight_decay=0.5, groups=[Group("b", weight_decay=0.0), Group("head", lr_scale=3.0)]
    )
    state = optim.init_state(spec, params)
    optim.apply_update(spec, params, {k: np.zeros(2) for k in params}, state, 0.1)
    np.testing.assert_allclose(params["w"], 2.0 - 0.1 * 0.5 * 2.0, rtol=1e-15)
    np.testing.assert_array_equal(params["b"], 2.0)
    np.testing.assert_allclose(params["head"], 2.0 - 0.3 * 0.5 * 2.0, rtol=1e-15)


def test_lr_scale_zero_freezes_a_group():
    params = {"frozen.weight": np.ones(3), "trained.weight": np.ones(3)}
    spec = optim.SGD(momentum=0.9, groups=[Group("frozen.*", lr_scale=0.0)])
    state = optim.init_state(spec, params)
    for _ in range(3):
        optim.apply_update(spec, params, {k: np.ones(3) for k in params}, state, 0.1)
    np.testing.assert_array_equal(params["frozen.weight"], 1.0)
    assert np.all(params["trained.weight"] < 0.5)


def test_groups_leave_the_state_layout_alone():
    from unitrain.backends.numpy import NumpyBackend

    def layout(spec):
        state = NumpyBackend(MODEL, BackendOptions(optimizer=spec)).state_dict()
        return {k: v.shape for k, v in state.items()}

    assert layout(NANOGPT) == layout(optim.AdamW(weight_decay=0.1))


# -- errors ----------------------------------------------------------------------------------


def test_a_name_pattern_that_matches_nothing_is_named_with_some_parameters():
    spec = optim.AdamW(groups=[Group("head.*", lr_scale=2.0)])
    message = r"'head\.\*' \(a glob on parameter names\) matches no parameter; the model's param"
    with pytest.raises(ConfigError, match=message):
        optim.for_model(spec, MODEL)
    with pytest.raises(ConfigError, match=r"matches no parameter; the model's parameters are 'w'"):
        optim.parameter_groups(spec, ["w", "b"])


def test_a_layer_type_the_model_lacks_lists_the_types_it_has():
    spec = optim.AdamW(groups=[Group("LayerNorn", weight_decay=0.0)])
    with pytest.raises(ConfigError, match=r"matches no parameter \(did you mean 'LayerNorm'\?\)"):
        optim.for_model(spec, MODEL)
    with pytest.raises(ConfigError, match=r"layer types are .*Linear"):
        optim.for_model(spec, MLP((2, 2)))


def test_a_layer_type_needs_a_portable_model_or_a_resolved_optimizer():
    spec = optim.AdamW(groups=[Group("LayerNorm", weight_decay=0.0)])
    with pytest.raises(ConfigError, match="native object: match its parameters by name"):
        optim.for_model(spec, object())
    with pytest.raises(ConfigError, match=r"optim\.for_model\(optimizer, model\) first"):
        optim.parameter_groups(spec, ["ln.weight"])


@pytest.mark.parametrize(
    ("group", "message"),
    [
        (Group("*", beta3=0.5), "AdamW has no hyperparameter 'beta3' for a group to set"),
        (Group("*", weight_decay=-1.0), r"weight_decay must be a finite number >= 0"),
        ({"lr_scale": 2.0}, "an optimizer group needs a 'match' entry"),
        (Group("*", groups=()), "no hyperparameter 'groups'"),
    ],
)
def test_a_bad_group_is_refused_when_the_optimizer_is_made(group, message):
    with pytest.raises(ConfigError, match=message):
        optim.AdamW(groups=[group])


def test_a_group_cannot_change_the_state_the_optimizer_keeps():
    with pytest.raises(ConfigError, match="cannot change the state the optimizer keeps"):
        optim.SGD(groups=[Group("*.bias", momentum=0.9)])
    with pytest.raises(ConfigError, match=r"lr_scale=<multiplier> instead of lr=0\.1"):
        Group("*", lr=0.1)
    with pytest.raises(ConfigError, match=r"groups must be a list of optim\.Group"):
        optim.SGD(groups=Group("*"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lr_scale must be finite and >= 0"):
        Group("*", lr_scale=math.inf)


@pytest.mark.parametrize("backend", backends())
def test_every_backend_refuses_an_unmatched_pattern_when_it_is_built(backend):
    pytest.importorskip(backend)
    from unitrain.backends.registry import get_backend

    spec = optim.AdamW(groups=[Group("head.*", lr_scale=2.0)])
    with pytest.raises(ConfigError, match=r"'head\.\*' \(a glob on parameter names\) matches no"):
        get_backend(backend)(MODEL, BackendOptions(optimizer=spec, device="cpu"))


def test_the_errors_page_shows_each_group_message():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    native = pytest.importorskip("torch").nn.Linear(2, 2)
    mistakes = [
        lambda: optim.for_model(optim.AdamW(groups=[Group("head.*", lr_scale=2.0)]), MODEL),
        lambda: optim.for_model(optim.AdamW(groups=[Group("LayerNorn")]), MODEL),
        lambda: optim.for_model(optim.AdamW(groups=[Group("LayerNorm")]), native),
        lambda: optim.AdamW(groups=[Group("*.bias", weight_decay=0.0, beta3=0.5)]),
        lambda: Group("head.*", lr=0.1),
        lambda: optim.SGD(groups=[Group("*.bias", momentum=0.9)]),
        lambda: optim.optimizer_from_dict({"type": "adamw", "groups": [{"weight_decay": 0.0}]}),
    ]
    for mistake in mistakes:
        with pytest.raises(ConfigError) as error:
            mistake()
        assert f"| {error.value} |" in page


# -- every backend against the reference -----------------------------------------------------


def trained(backend: str, spec: optim.Optimizer, dtype: str) -> dict[str, np.ndarray]:
    """Parameters and slots after 12 updates with a changing LR on a fixed batch."""
    from unitrain.backends.registry import get_backend

    options = BackendOptions(optimizer=spec, dtype=dtype, device="cpu", seed=0)
    runner = get_backend(backend)(MODEL, options)
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(8, 6)).astype(dtype), rng.integers(0, 3, 8))
    for t in range(12):
        runner.forward(batch)
        runner.backward()
        runner.step(0.01 * (1.0 + 0.5 * math.sin(t)))
    state = runner.state_dict()
    return {k: np.asarray(v, np.float64) for k, v in state.items() if not k.endswith(".step")}


def relative_error(actual: dict, expected: dict) -> float:
    diff = math.sqrt(sum(float(np.sum((actual[k] - expected[k]) ** 2)) for k in expected))
    return diff / math.sqrt(sum(float(np.sum(expected[k] ** 2)) for k in expected))


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    return trained("numpy", NANOGPT, "float64")


@pytest.mark.parametrize("backend", backends("torch", "jax", "tensorflow"))
def test_every_backend_runs_groups_chosen_by_name_and_layer_type_as_the_reference(
    backend, reference
):
    pytest.importorskip(backend)
    actual = trained(backend, NANOGPT, "float32")
    assert sorted(actual) == sorted(reference)
    assert relative_error(actual, reference) < 1e-5
    # The groups change the numbers by far more than the bar: a backend ignoring them fails.
    ungrouped = trained("numpy", optim.AdamW(weight_decay=0.1), "float64")
    assert relative_error(ungrouped, reference) > 1e-3
