"""The optimizer reference, and the torch adapter measured against it.

The parity bar (1e-6 normwise relative over 100 float32 steps with an LR that changes every
step) comes from measurements of torch, optax and Keras against a float64 reference: correct
float32 implementations land at 2e-7 to 7e-7, so 1e-6 holds with margin while any real
difference of formula (LR inside the momentum buffer, eps placement) fails by orders.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math

import numpy as np
import pytest
from _backends import backends

from unitrain import ConfigError, ops, optim
from unitrain.backends.protocol import BackendOptions
from unitrain.conformance.optimizer_cases import OPTIMIZER_CASES
from unitrain.models import MLP

#: The kit's optimizer cases, by the kit's names (unitrain.conformance.optimizer_cases).
OPTIMIZERS = {name: case.optimizer for name, case in OPTIMIZER_CASES.items()}
STEPS = 100
MODEL = MLP((6, 5, 3))


def lr_at(step: int) -> float:
    """An LR that changes every step, as a warmup + schedule would."""
    return 0.01 * (1.0 + 0.5 * math.sin(step))


def gradients(seed: int, shapes: dict[str, tuple[int, ...]]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            k: rng.normal(scale=rng.uniform(0.01, 2.0), size=s).astype(np.float32)
            for k, s in shapes.items()
        }
        for _ in range(STEPS)
    ]


def reference_run(spec: optim.Optimizer, params: dict, grads: list[dict], clip=None) -> dict:
    """The float64 oracle: the same gradients, applied by the reference rule."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    state = optim.init_state(spec, params)
    for t, g in enumerate(grads):
        g = {k: v.astype(np.float64) for k, v in g.items()}
        if not np.isfinite(optim.global_norm(g)):
            continue
        if clip is not None:
            optim.clip_by_global_norm(g, clip)
        optim.apply_update(spec, params, g, state, lr_at(t))
    return params


def relative_error(actual: dict, expected: dict) -> float:
    diff = math.sqrt(sum(float(np.sum((actual[k] - expected[k]) ** 2)) for k in expected))
    norm = math.sqrt(sum(float(np.sum(expected[k] ** 2)) for k in expected))
    return diff / norm


def test_first_momentum_step_equals_gradient_step():
    params = {"w": np.ones(3)}
    state = optim.init_state(optim.SGD(momentum=0.9), params)
    optim.apply_update(optim.SGD(momentum=0.9), params, {"w": np.full(3, 2.0)}, state, 0.5)
    np.testing.assert_array_equal(params["w"], np.zeros(3))
    np.testing.assert_array_equal(state["w.momentum"], np.full(3, 2.0))


def test_adam_first_step_moves_by_lr():
    # With bias correction, the first Adam step is lr * g/|g| (up to eps) whatever |g| is.
    params = {"w": np.zeros(2)}
    state = optim.init_state(optim.Adam(), params)
    optim.apply_update(optim.Adam(eps=0.0), params, {"w": np.array([3.0, -1e-3])}, state, 0.1)
    np.testing.assert_allclose(params["w"], [-0.1, 0.1], rtol=1e-12)


def test_adamw_decay_is_decoupled_from_moments():
    params = {"w": np.full(2, 2.0)}
    state = optim.init_state(optim.AdamW(weight_decay=0.5), params)
    optim.apply_update(
        optim.AdamW(weight_decay=0.5, eps=0.0), params, {"w": np.zeros(2) + 1e-30}, state, 0.1
    )
    # u = 1 (normalised gradient), decay term 0.5 * 2 = 1: p = 2 - 0.1 * (1 + 1)
    np.testing.assert_allclose(params["w"], [1.8, 1.8], rtol=1e-12)
    assert np.all(state["w.exp_avg"] < 1e-29)


def test_rmsprop_first_step_divides_by_the_root_of_the_square_average():
    # s = (1 - alpha) g^2 from zero, so the step is lr * g / (sqrt(1 - alpha) |g| + eps).
    spec = optim.RMSprop(alpha=0.75, eps=0.5)
    params = {"w": np.zeros(2)}
    state = optim.init_state(spec, params)
    optim.apply_update(spec, params, {"w": np.array([4.0, -2.0])}, state, 0.1)
    np.testing.assert_allclose(params["w"], [-0.1 * 4 / 2.5, 0.1 * 2 / 1.5], rtol=1e-12)
    np.testing.assert_allclose(state["w.square_avg"], [4.0, 1.0], rtol=1e-12)


def test_centered_rmsprop_divides_by_the_root_of_the_variance():
    spec = optim.RMSprop(alpha=0.5, eps=0.0, centered=True)
    params = {"w": np.zeros(1)}
    state = optim.init_state(spec, params)
    optim.apply_update(spec, params, {"w": np.array([2.0])}, state, 1.0)
    # s = 2, a = 1: sqrt(s - a^2) = 1, so the step is the gradient itself.
    np.testing.assert_allclose(params["w"], [-2.0], rtol=1e-12)
    np.testing.assert_allclose(state["w.grad_avg"], [1.0], rtol=1e-12)


def test_rmsprop_momentum_keeps_the_lr_outside_the_buffer():
    spec = optim.RMSprop(alpha=0.0, eps=0.0, momentum=0.5)
    params = {"w": np.zeros(1)}
    state = optim.init_state(spec, params)
    for lr in (1.0, 0.1):  # with alpha 0 each normalised step is sign(g) = 1
        optim.apply_update(spec, params, {"w": np.array([3.0])}, state, lr)
    # b = 1, then 1.5: w = -1 * 1 - 0.1 * 1.5
    np.testing.assert_allclose(params["w"], [-1.15], rtol=1e-12)


def test_lion_moves_every_entry_by_the_lr():
    spec = optim.Lion(beta1=0.9, beta2=0.99, weight_decay=0.5)
    params = {"w": np.array([2.0, 2.0, 2.0])}
    state = optim.init_state(spec, params)
    optim.apply_update(spec, params, {"w": np.array([1e-6, -30.0, 0.0])}, state, 0.1)
    # sign of 0.1 g, plus the decoupled decay 0.5 * 2: w = 2 - 0.1 * (sign(g) + 1)
    np.testing.assert_allclose(params["w"], [1.8, 2.0, 1.9], rtol=1e-12)
    np.testing.assert_allclose(state["w.exp_avg"], [1e-8, -0.3, 0.0], rtol=1e-12)


def test_lion_takes_the_sign_of_the_beta1_interpolation():
    # The momentum says +, the gradient -: beta1 = 0.5 weighs the gradient enough to win,
    # while the beta2 = 0.99 interpolation (the momentum's own update) would stay +.
    spec = optim.Lion(beta1=0.5, beta2=0.99)
    params = {"w": np.zeros(1)}
    state = {"step": np.asarray(3, np.int64), "w.exp_avg": np.array([1.0])}
    optim.apply_update(spec, params, {"w": np.array([-3.0])}, state, 0.1)
    np.testing.assert_allclose(params["w"], [0.1], rtol=1e-12)
    np.testing.assert_allclose(state["w.exp_avg"], [0.99 - 0.03], rtol=1e-12)


def test_clip_by_global_norm_matches_torch_formula():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    grads = {"a": rng.normal(size=(4, 3)), "b": rng.normal(size=5)}
    tensors = [torch.tensor(g) for g in grads.values()]
    for t in tensors:
        t.grad = t.clone()
    norm = torch.nn.utils.clip_grad_norm_(tensors, 0.5)
    clipped, ours = optim.clip_by_global_norm(dict(grads), 0.5)
    assert ours == pytest.approx(float(norm), rel=1e-12)
    for t, g in zip(tensors, clipped.values()):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: optim.SGD(momentum=-0.1), "momentum"),
        (lambda: optim.SGD(momentum=1.0), "momentum"),
        (lambda: optim.SGD(nesterov=True), "nesterov"),
        (lambda: optim.SGD(weight_decay=float("nan")), "weight_decay"),
        (lambda: optim.Adam(beta1=1.0), "beta1"),
        (lambda: optim.Adam(beta2=-0.5), "beta2"),
        (lambda: optim.Adam(eps=-1e-8), "eps"),
        (lambda: optim.AdamW(weight_decay="0.1"), "weight_decay"),
        (lambda: optim.RMSprop(alpha=1.0), "alpha"),
        (lambda: optim.RMSprop(centered=1), "centered"),
        (lambda: optim.RMSprop(momentum=-0.5), "momentum"),
        (lambda: optim.RMSprop(eps=float("inf")), "eps"),
        (lambda: optim.Lion(beta1=1.5), "beta1"),
        (lambda: optim.Lion(beta2=None), "beta2"),
        (lambda: optim.Lion(weight_decay=-1e-3), "weight_decay"),
    ],
)
def test_bad_hyperparameters_are_refused(factory, message):
    with pytest.raises(ConfigError, match=message):
        factory()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_round_trips_through_dict(name):
    spec = OPTIMIZERS[name]
    assert optim.optimizer_from_dict(spec.to_dict()) == spec
    assert optim.optimizer_from_dict(json.loads(spec.to_json())) == spec
    with pytest.raises(ConfigError, match="unknown optimizer"):
        optim.optimizer_from_dict({"type": "no_such_optimizer"})


#: ``to_dict`` output as checkpoints and recipes stored it before optimizers had a base class.
STORED = [
    {"type": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 0.0},
    {"type": "adam", "beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.0},
    {"type": "adamw", "beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "weight_decay": 0.01},
    {
        "type": "rmsprop",
        "alpha": 0.99,
        "eps": 1e-08,
        "centered": True,
        "momentum": 0.9,
        "weight_decay": 0.0,
    },
    {"type": "lion", "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1},
]


@pytest.mark.parametrize("stored", STORED, ids=lambda d: d["type"])
def test_stored_optimizer_json_still_loads(stored):
    spec = optim.optimizer_from_dict(stored)
    assert spec.type_name == stored["type"]
    assert spec.to_dict() == stored


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "sgd", "momentun": 0.9}, "no field.*momentun.*momentum, nesterov"),
        ({"momentum": 0.9}, "unknown optimizer type None"),
        ("sgd", "expected a dict"),
        ({"type": "adam", "beta1": "0.9"}, "beta1 must be a real number"),
    ],
)
def test_bad_optimizer_dicts_are_refused(data, message):
    with pytest.raises(ConfigError, match=message):
        optim.optimizer_from_dict(data)


def test_optimizers_are_abstract_or_final():
    # AdamW shares Adam's update through the abstract base instead of subclassing Adam, so an
    # isinstance test for Adam can never catch AdamW by accident.
    assert not issubclass(optim.AdamW, optim.Adam)
    for cls in optim.optimizer_types().values():
        assert not [sub for sub in cls.__subclasses__()], f"{cls.__name__} is subclassed"
    with pytest.raises(TypeError):
        optim.AbstractOptimizer()  # type: ignore[abstract]


def test_a_type_name_is_registered_once():
    with pytest.raises(TypeError, match="already taken"):

        class Again(optim.AbstractOptimizer, type_name="sgd"):
            pass


def test_hyperparameters_are_normalised_to_floats():
    spec = optim.SGD(momentum=np.float32(0.5), weight_decay=0)
    assert spec.to_dict() == {
        "type": "sgd",
        "momentum": 0.5,
        "nesterov": False,
        "weight_decay": 0.0,
    }
    assert type(spec.momentum) is float and type(spec.weight_decay) is float


def test_state_slots_name_the_state_entries():
    params = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32)}
    for spec in OPTIMIZERS.values():
        state = optim.init_state(spec, params)
        want = {f"{p}.{slot}" for p in params for slot in spec.state_slots} | {"step"}
        assert set(state) == want
        assert all(state[f"w.{slot}"].dtype == np.float32 for slot in spec.state_slots)
        assert spec.state_suffixes == spec.state_slots


# -- the torch adapter against the reference ---------------------------------------------------


def torch_run(spec, grads, clip=None):
    torch = pytest.importorskip("torch")
    from unitrain.backends.torch import TorchBackend

    backend = TorchBackend(MODEL, BackendOptions(optimizer=spec, grad_clip_norm=clip, device="cpu"))
    for t, g in enumerate(grads):
        for name, p in backend.params.items():
            p.grad = torch.from_numpy(g[name].copy())
        backend.step(lr_at(t))
    model_state = {k[6:]: v for k, v in backend.state_dict().items() if k.startswith("model.")}
    return backend, model_state


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_adapter_matches_reference(name, seed):
    spec = OPTIMIZERS[name]
    grads = gradients(seed, MODEL.param_shapes())
    _, actual = torch_run(spec, grads)
    expected = reference_run(spec, MODEL.init_params(0), grads)
    assert relative_error(actual, expected) <= 1e-6


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_torch_adapter_clips_like_reference(name):
    grads = gradients(5, MODEL.param_shapes())
    _, actual = torch_run(OPTIMIZERS[name], grads, clip=0.3)
    expected = reference_run(OPTIMIZERS[name], MODEL.init_params(0), grads, clip=0.3)
    assert relative_error(actual, expected) <= 1e-6


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw"])
def test_torch_adapter_skips_non_finite_updates(name):
    grads = gradients(7, MODEL.param_shapes())
    grads[10]["layers.0.bias"][0] = np.nan
    grads[20]["layers.1.weight"][1, 1] = np.inf
    backend, actual = torch_run(OPTIMIZERS[name], grads)
    expected = reference_run(OPTIMIZERS[name], MODEL.init_params(0), grads)
    assert backend.skipped_steps == 2
    assert int(backend.state_dict()["optimizer.step"]) == STEPS - 2
    assert relative_error(actual, expected) <= 1e-6


# -- an optimizer written once ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Adagrad(optim.AbstractOptimizer):
    """A new optimizer, written once in ops (deliberately not registered by a type name)."""

    eps: float = 1e-10

    @property
    def state_slots(self) -> tuple[str, ...]:
        return ("sum",)

    def update(self, param, grad, slots, lr, step):
        total = slots["sum"] + grad * grad
        return param - lr * grad / (ops.sqrt(total) + self.eps), {"sum": total}


@dataclasses.dataclass(frozen=True)
class NumpyOnlyAdagrad(Adagrad):
    """The same rule as a numpy reference_update alone, the form before rules were in ops."""

    update = optim.AbstractOptimizer.update

    def reference_update(self, param, grad, slots, lr, step):
        total = slots["sum"] + grad * grad
        return param - lr * grad / (np.sqrt(total) + self.eps), {"sum": total}


def trained(backend: str, spec: optim.Optimizer, dtype: str) -> dict[str, np.ndarray]:
    """Parameters after 20 updates of the public protocol on a fixed batch."""
    pytest.importorskip(backend)
    from unitrain.backends.registry import get_backend

    options = BackendOptions(optimizer=spec, dtype=dtype, device="cpu", seed=0)
    runner = get_backend(backend)(MODEL, options)
    rng = np.random.default_rng(0)
    batch = (rng.normal(size=(8, 6)).astype(dtype), rng.integers(0, 3, 8))
    for t in range(20):
        runner.forward(batch)
        runner.backward()
        runner.step(lr_at(t))
    state = runner.state_dict()
    return {k: np.asarray(v, np.float64) for k, v in state.items() if not k.endswith(".step")}


@pytest.mark.parametrize("backend", backends("torch", "jax", "tensorflow"))
def test_an_optimizer_written_once_in_ops_runs_on_every_backend(backend):
    expected = trained("numpy", Adagrad(), "float64")
    actual = trained(backend, Adagrad(), "float32")
    assert sorted(actual) == sorted(expected)
    model = [k for k in expected if k.startswith("model.")]
    assert relative_error({k: actual[k] for k in model}, {k: expected[k] for k in model}) < 1e-5
    assert relative_error(actual, expected) < 1e-5  # the "sum" slots too


@pytest.mark.parametrize("backend", backends("torch", "jax", "tensorflow"))
def test_an_optimizer_without_an_update_in_ops_is_refused_by_name(backend):
    pytest.importorskip(backend)
    from unitrain import Trainer

    message = f"the {backend} backend cannot run NumpyOnlyAdagrad: it defines only a numpy "
    with pytest.raises(ConfigError, match=message):
        Trainer(MODEL, backend=backend, optimizer=NumpyOnlyAdagrad())


@pytest.mark.parametrize("backend", backends("torch", "jax", "tensorflow"))
def test_native_forms_are_optional_and_lion_has_none(backend):
    """Lion is written once: no adapter keeps a form of its own, and each runs its rule in ops
    (the kit's optimizer checks hold every adapter to it, with or without a native form)."""
    pytest.importorskip(backend)
    module = importlib.import_module(f"unitrain.backends.{backend}.optimizers")
    native = getattr(module, "OPTIMIZERS", {})
    assert set(native) <= set(optim.optimizer_types().values())
    assert optim.Lion not in native
    assert all(optim.written_in_ops(cls()) for cls in optim.optimizer_types().values())


@pytest.mark.parametrize("spec", [Adagrad(), NumpyOnlyAdagrad()], ids=["in_ops", "numpy_only"])
def test_the_numpy_reference_runs_any_optimizer_by_its_reference_update(spec):
    from unitrain.backends.numpy import NumpyBackend

    backend = NumpyBackend(MODEL, BackendOptions(optimizer=spec, dtype="float64"))
    start = backend.state_dict()
    grads = gradients(3, MODEL.param_shapes())[:2]
    for g in grads:
        backend.grads = {k: v.astype(np.float64) for k, v in g.items()}
        backend.step(0.1)
    state = backend.state_dict()
    for name in MODEL.param_shapes():
        total = sum(g[name].astype(np.float64) ** 2 for g in grads)
        np.testing.assert_allclose(state[f"optimizer.{name}.sum"], total, rtol=1e-12)
        assert not np.array_equal(state[f"model.{name}"], start[f"model.{name}"])


def test_every_optimizer_type_has_a_case_the_kit_and_the_tests_run():
    """A new optimizer is its file in unitrain.optim and a row of OPTIMIZER_CASES: the row is
    what the kit's optimizer and canonical-key checks and these tests iterate over."""
    covered = {type(case.optimizer) for case in OPTIMIZER_CASES.values()}
    assert covered == set(optim.optimizer_types().values())
    for name, case in OPTIMIZER_CASES.items():
        for drawn in case.examples:
            assert type(case.build(drawn)) is type(case.optimizer), name
