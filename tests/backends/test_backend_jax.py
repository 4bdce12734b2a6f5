"""Tests of the JAX backend against the float64 reference and the numpy backend.

Optimizer parity feeds one known gradient sequence to the backend (through its gradient
buffers) and to :func:`unitrain.optim.apply_update` on float64 copies; the other checks train
the default recipe, resume from checkpoints, and count traces to prove that a changing
learning rate never recompiles.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

from unitrain import (  # noqa: E402
    Backend,
    BackendOptions,
    ConfigError,
    FusedStep,
    Trainer,
    TrainerConfig,
    callbacks,
    optim,
    schedules,
)
from unitrain.backends.jax import JaxBackend, JaxModel  # noqa: E402
from unitrain.backends.numpy import NumpyBackend  # noqa: E402
from unitrain.backends.state import split_state  # noqa: E402
from unitrain.conformance.optimizer_cases import OPTIMIZER_CASES  # noqa: E402
from unitrain.models import MLP  # noqa: E402
from unitrain.recipes import default_trainer, load_digits  # noqa: E402

SMALL = MLP((8, 16, 4))
#: The kit's optimizer cases, by the kit's names (unitrain.conformance.optimizer_cases).
OPTIMIZERS = {name: case.optimizer for name, case in OPTIMIZER_CASES.items()}
PARITY_SEEDS = (0, 1, 2, 3)
PARITY_STEPS = 100
HAS_GPU = any(d.platform != "cpu" for d in jax.devices())


def options(**kwargs):
    return BackendOptions(**{"device": "cpu", **kwargs})


def batch(seed=0, n=32, model=SMALL):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, model.in_features)).astype(np.float32)
    return x, rng.integers(0, model.out_features, n)


def lr_at(t):
    """A learning rate that changes every step."""
    return 0.01 * (1 + 0.5 * math.sin(t))


def same(a, b):
    """Bit-identical state dicts: same keys, dtypes and values."""
    keys_equal = list(a) == list(b)
    return keys_equal and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def relative_error(params, reference):
    diff = math.sqrt(sum(float(np.sum((params[k] - reference[k]) ** 2)) for k in reference))
    return diff / math.sqrt(sum(float(np.sum(reference[k] ** 2)) for k in reference))


def parity_error(spec, clip, seed, nonfinite_steps=()):
    """Max normwise relative error of 100 steps of JaxBackend.step vs the float64 reference."""
    backend = JaxBackend(SMALL, options(optimizer=spec, grad_clip_norm=clip))
    rng = np.random.default_rng([seed, 99])
    shapes = SMALL.param_shapes()
    params = {k: (0.5 * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
    state = {f"model.{k}": v for k, v in params.items()}
    state.update({f"optimizer.{k}": v for k, v in optim.init_state(spec, params).items()})
    backend.load_state_dict(state)
    ref = {k: v.astype(np.float64) for k, v in params.items()}
    ref_state = optim.init_state(spec, ref)
    worst = 0.0
    for t in range(PARITY_STEPS):
        scale = 10 ** rng.uniform(-3, 0)  # spans clipped and unclipped steps
        grads = {k: (scale * rng.normal(size=s)).astype(np.float32) for k, s in shapes.items()}
        if t in nonfinite_steps:
            grads["layers.0.bias"][3] = np.nan if t % 2 else np.inf
        backend._grads = {k: jnp.asarray(v) for k, v in grads.items()}
        backend.step(lr_at(t))
        g64 = {k: v.astype(np.float64) for k, v in grads.items()}
        if math.isfinite(optim.global_norm(g64)):
            if clip is not None:
                optim.clip_by_global_norm(g64, clip)
            optim.apply_update(spec, ref, g64, ref_state, lr_at(t))
        got = split_state(backend.state_dict())[0]
        worst = max(worst, relative_error(got, ref))
    assert backend.skipped_steps == len(nonfinite_steps)
    assert int(backend.state_dict()["optimizer.step"]) == int(ref_state["step"])
    return worst


# -- 1. optimizer parity -----------------------------------------------------------------------


@pytest.mark.parametrize("clip", [None, 1.0], ids=["noclip", "clip"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_float64_reference(name, clip):
    errors = [parity_error(OPTIMIZERS[name], clip, seed) for seed in PARITY_SEEDS]
    assert max(errors) <= 1e-6, errors


@pytest.mark.parametrize("name", ["sgd_nesterov", "adam", "adamw"])
def test_nonfinite_gradients_are_skipped_in_parity_run(name):
    assert parity_error(OPTIMIZERS[name], 1.0, 0, nonfinite_steps=(30, 61)) <= 1e-6


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_gradient_leaves_state_untouched(bad):
    backend = JaxBackend(SMALL, options(optimizer=optim.Adam()))
    backend.train_step(batch(), 0.01)
    before = backend.state_dict()
    backend.forward(batch(1))
    backend.backward()
    backend._grads["layers.1.weight"] = backend._grads["layers.1.weight"].at[0, 0].set(bad)
    backend.step(0.01)
    assert same(backend.state_dict(), before)
    assert backend.skipped_steps == 1 and backend._grads is None
    backend.train_step(batch(2), 0.01)  # training goes on
    assert int(backend.state_dict()["optimizer.step"]) == 2


@pytest.mark.parametrize("sizes", [(8, 16, 4), (300, 256, 4)], ids=["one-reduction", "per-tensor"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_finite_check_catches_one_bad_element_at_any_model_size(sizes, bad):
    # The two forms of the check (see jax/optimizers.py._all_finite): 196 and 78,084 elements.
    model = MLP(sizes)
    backend = JaxBackend(model, options(optimizer=optim.SGD(momentum=0.9)))
    backend.train_step(batch(model=model), 0.01)
    before = backend.state_dict()
    backend.forward(batch(1, model=model))
    backend.backward()
    grads = backend._grads["layers.0.weight"]
    backend._grads["layers.0.weight"] = grads.at[grads.shape[0] - 1, 3].set(bad)
    backend.step(0.01)
    assert same(backend.state_dict(), before) and backend.skipped_steps == 1
    backend.forward(batch(2, model=model))
    backend.backward()
    backend.step(0.01)  # finite again: applied
    assert int(backend.state_dict()["optimizer.step"]) == 2


def test_losses_stay_readable_across_log_pages():
    # Each train_step loss is a slot of a device page; a full page is sealed and replaced.
    backend = JaxBackend(SMALL, options())
    reference = JaxBackend(SMALL, options())
    refs, expected = [], []
    for t in range(600):  # more than two pages of 256
        refs.append(backend.train_step(batch(t % 7), 0.01))
        expected.append(np.float32(reference.forward(batch(t % 7))))
        reference.backward()
        reference.step(0.01)
    values = backend.to_host(refs)
    assert np.array_equal(np.asarray(values, np.float32), np.asarray(expected))
    assert float(refs[3]) == expected[3] and np.asarray(refs[-1]) == expected[-1]
    mixed = backend.to_host([refs[0], backend.forward(batch()), refs[-1]])
    assert mixed[0] == expected[0] and mixed[2] == expected[-1]


def test_fused_step_skips_a_nonfinite_batch():
    backend = JaxBackend(SMALL, options(optimizer=optim.Adam()))
    before = backend.state_dict()
    x, y = batch()
    x[0, 0] = np.nan
    assert math.isnan(float(backend.train_step((x, y), 0.01)))
    assert same(backend.state_dict(), before) and backend.skipped_steps == 1


# -- 2. the default recipe against numpy --------------------------------------------------------


def fit_recipe(backend, **kwargs):
    trainer, train, val = default_trainer(backend=backend, device="cpu", progress=False, **kwargs)
    return trainer.fit(train, val)


def test_default_recipe_matches_numpy_every_epoch():
    ours, reference = fit_recipe("jax", epochs=5), fit_recipe("numpy", epochs=5)
    assert len(ours) == len(reference) == 5
    for mine, theirs in zip(ours, reference, strict=True):
        for key in ("loss", "val_loss", "val_accuracy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4), (mine["epoch"], key)


def test_early_stopping_stops_at_the_numpy_epoch():
    ours = fit_recipe("jax", epochs=15, patience=2)
    reference = fit_recipe("numpy", epochs=15, patience=2)
    assert len(reference) < 15  # it did stop early
    assert len(ours) == len(reference)


# -- 3. state dict -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam", "adamw"])
def test_state_dict_layout_equals_numpy(name):
    opts = options(optimizer=OPTIMIZERS[name])
    ours, theirs = JaxBackend(SMALL, opts).state_dict(), NumpyBackend(SMALL, opts).state_dict()
    layout = lambda state: [(k, v.shape, v.dtype) for k, v in state.items()]  # noqa: E731
    assert layout(ours) == layout(theirs)


def train_a_little(backend, steps=3):
    for t in range(steps):
        backend.forward(batch(t))
        backend.backward()
        backend.step(lr_at(t))
    return backend.state_dict()


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_state_crosses_to_and_from_numpy(name):
    opts = options(optimizer=OPTIMIZERS[name])
    from_numpy = train_a_little(NumpyBackend(SMALL, opts))
    jax_backend = JaxBackend(SMALL, opts)
    jax_backend.load_state_dict(from_numpy)
    assert same(jax_backend.state_dict(), from_numpy)
    from_jax = train_a_little(jax_backend)
    numpy_backend = NumpyBackend(SMALL, opts)
    numpy_backend.load_state_dict(from_jax)
    assert same(numpy_backend.state_dict(), from_jax)


def test_save_load_save_is_bit_identical():
    opts = options(optimizer=optim.Adam())
    first = train_a_little(JaxBackend(SMALL, opts))
    other = JaxBackend(SMALL, opts)
    other.load_state_dict(first)
    assert same(other.state_dict(), first)
    original = JaxBackend(SMALL, opts)  # the loaded state trains on exactly like the original
    original.load_state_dict(first)
    assert same(train_a_little(original), train_a_little(other))


# -- 4. resume equals uninterrupted ------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    split = load_digits()
    return split.x_train[:256], split.y_train[:256], split.x_val[:64], split.y_val[:64]


def resume_trainer(checkpoint_dir, epochs=3, **checkpoint):
    schedule = schedules.Warmup(schedules.CosineDecay(0.2, 16, 1e-3), warmup_steps=8)
    hooks = [callbacks.ModelCheckpoint(checkpoint_dir, **checkpoint)] if checkpoint else []
    config = TrainerConfig(epochs=epochs, batch_size=32, seed=3, device="cpu", log_every_n_steps=3)
    return Trainer(
        MLP((64, 32, 10), dropout=0.2),
        backend="jax",
        optimizer=optim.AdamW(),
        schedule=schedule,
        callbacks=hooks,
        config=config,
    )


@pytest.fixture(scope="module")
def uninterrupted(digits):
    trainer = resume_trainer(None)
    history = trainer.fit(digits[:2], digits[2:])
    return trainer.backend.state_dict(), history


CHECKPOINTS = {  # how the first run saves -> the checkpoint the second run resumes from
    "epoch-boundary": ({"every_n_epochs": 1}, "epoch=0001-step=000008"),
    "mid-epoch": ({"every_n_steps": 5}, "epoch=0002-step=000010"),
}


@pytest.mark.parametrize("where", list(CHECKPOINTS))
def test_resume_equals_uninterrupted(digits, tmp_path, uninterrupted, where):
    checkpoint, name = CHECKPOINTS[where]
    first = resume_trainer(tmp_path, **checkpoint)
    first.fit(digits[:2], digits[2:])
    resumed = resume_trainer(tmp_path)
    history = resumed.fit(digits[:2], digits[2:], resume=tmp_path / name)
    expected, expected_history = uninterrupted
    assert same(resumed.backend.state_dict(), expected)
    assert [h["loss"] for h in history] == [h["loss"] for h in expected_history]


def test_same_seed_twice_is_bit_identical(digits, uninterrupted):
    trainer = resume_trainer(None)
    trainer.fit(digits[:2], digits[2:])
    assert same(trainer.backend.state_dict(), uninterrupted[0])


# -- 5. no retrace when the learning rate changes ----------------------------------------------


def test_changing_lr_and_step_never_retraces():
    # A configuration no other test compiles (beta1), so the counts start at zero; dropout, so
    # the traced step feeds the key.
    opts = options(optimizer=optim.Adam(beta1=0.8), seed=4242, grad_clip_norm=1.0)
    backend = JaxBackend(MLP((8, 16, 4), dropout=0.3), opts)
    for t in range(6):
        backend.forward(batch(t))
        backend.backward(0.5)
        backend.forward(batch(t + 1))
        backend.backward(0.5)
        backend.step(lr_at(t))
        backend.train_step(batch(t), lr_at(t) * 3)
    backend.train_steps(stacked(3), [0.1, 0.2, 0.3])
    backend.train_steps(stacked(3, seed=5), [0.3, 0.2, 0.1])
    traced = ("forward", "backward", "accumulate", "step", "train_step", "train_steps")
    assert dict(backend.trace_counts) == dict.fromkeys(traced, 1)
    assert backend._fn.step._cache_size() == backend._fn.train_step._cache_size() == 1


# -- 6. fused and multi-step paths ---------------------------------------------------------------


def stacked(k, seed=0):
    xs, ys = zip(*(batch(seed + i) for i in range(k)), strict=True)
    return np.stack(xs), np.stack(ys)


DROPOUT = MLP((8, 16, 4), dropout=0.25)


def test_fused_step_equals_three_calls():
    opts = options(optimizer=optim.AdamW(), grad_clip_norm=0.5)
    fused, three = JaxBackend(DROPOUT, opts), JaxBackend(DROPOUT, opts)
    for t in range(5):
        loss_fused = fused.train_step(batch(t), lr_at(t))
        loss_three = three.forward(batch(t))
        three.backward()
        three.step(lr_at(t))
        assert float(loss_fused) == pytest.approx(float(loss_three), rel=1e-6)
    assert relative_error(fused.state_dict(), three.state_dict()) <= 1e-6


def test_train_steps_equals_single_steps():
    opts = options(optimizer=optim.AdamW())
    many, single = JaxBackend(DROPOUT, opts), JaxBackend(DROPOUT, opts)
    xs, ys = stacked(4)
    lrs = [lr_at(t) for t in range(4)]
    expected = [float(single.train_step((xs[i], ys[i]), lrs[i])) for i in range(4)]
    np.testing.assert_allclose(many.train_steps((xs, ys), lrs), expected, rtol=1e-6)
    assert relative_error(many.state_dict(), single.state_dict()) <= 1e-6


def test_train_steps_on_device_gathers_on_device():
    opts = options(optimizer=optim.AdamW())
    indexed, stacked_backend = JaxBackend(DROPOUT, opts), JaxBackend(DROPOUT, opts)
    x, y = batch(0, n=100)
    indices = np.random.default_rng(1).permutation(96).reshape(3, 32)
    indexed.set_device_data(x, y)
    expected = stacked_backend.train_steps((x[indices], y[indices]), [0.1, 0.05, 0.02])
    np.testing.assert_array_equal(
        indexed.train_steps_on_device(indices, [0.1, 0.05, 0.02]), expected
    )
    assert same(indexed.state_dict(), stacked_backend.state_dict())


# -- 7. gradient accumulation --------------------------------------------------------------------


def test_accumulated_micro_batches_equal_one_batch():
    opts = options(optimizer=optim.Adam())
    accumulated, whole = JaxBackend(SMALL, opts), JaxBackend(SMALL, opts)
    x, y = batch(0, n=32)
    bounds = (0, 10, 22, 32)  # micro-batches of 10, 12 and 10
    losses = []
    for lo, hi in itertools.pairwise(bounds):
        losses.append(accumulated.forward((x[lo:hi], y[lo:hi])) * (hi - lo))
        accumulated.backward((hi - lo) / 32)
    accumulated.step(0.01)
    loss = whole.forward((x, y))
    whole.backward()
    whole.step(0.01)
    assert float(sum(losses)) / 32 == pytest.approx(float(loss), rel=1e-6)
    assert accumulated.trace_counts["accumulate"] >= 1
    assert relative_error(accumulated.state_dict(), whole.state_dict()) <= 1e-6


def test_trainer_accumulation_matches_numpy(digits):
    histories = []
    for backend in ("jax", "numpy"):
        config = TrainerConfig(epochs=2, batch_size=16, grad_accum_steps=2, seed=1, device="cpu")
        trainer = Trainer(
            MLP((64, 32, 10)),
            backend=backend,
            optimizer=optim.SGD(momentum=0.9),
            schedule=schedules.Constant(0.05),
            config=config,
        )
        histories.append(trainer.fit(digits[:2], digits[2:]))
    for ours, theirs in zip(*histories, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert ours["val_loss"] == pytest.approx(theirs["val_loss"], rel=1e-5)


# -- the rest of the contract -----------------------------------------------------------------


def test_evaluate_is_eval_mode_and_changes_nothing():
    opts = options(optimizer=optim.AdamW())
    ours, reference = JaxBackend(DROPOUT, opts), NumpyBackend(DROPOUT, opts)
    before = ours.state_dict()
    first, second = ours.evaluate(batch(3)), ours.evaluate(batch(3))
    assert float(first["loss"]) == float(second["loss"])
    expected = reference.evaluate(batch(3))
    assert float(first["loss"]) == pytest.approx(float(expected["loss"]), rel=1e-6)
    assert float(first["accuracy"]) == pytest.approx(float(expected["accuracy"]))
    assert same(ours.state_dict(), before)


def test_dropout_masks_come_from_seed_step_and_micro_batch():
    backend = JaxBackend(DROPOUT, options(seed=5, optimizer=optim.AdamW()))
    losses = [float(backend.forward(batch())) for _ in range(2)]  # micro-batch 0, then 1
    assert losses[0] != losses[1]
    again = JaxBackend(DROPOUT, options(seed=5, optimizer=optim.AdamW()))
    assert float(again.forward(batch())) == losses[0]
    backend.backward()
    backend.step(0.0)  # step 1, micro-batch 0: a new mask although the weights are the same
    assert float(backend.forward(batch())) not in losses


def keyed_dropout(x, rng, k, p):
    """The mask the backend always drew for its ``k``-th dropout of a pass, applied to ``x``."""
    draw = jax.random.uniform(jax.random.fold_in(rng, k), x.shape, x.dtype)
    return x * (draw < 1 - p).astype(x.dtype) / (1 - p)


def test_dropout_masks_are_keyed_as_they_always_were():
    # Under random="native" (PortableModule's default, BackendOptions.random="native"), seeded
    # runs and the paper results reproduce only if every mask is the one drawn before the
    # layers ran through the core's forward: a bare MLP keyed by its hidden layer index from
    # 0, every other model by the dropout's place in the run from 1.
    from unitrain.backends.jax.layers import PortableModule
    from unitrain.models import Dropout, Linear, ReLU, Sequential

    rng, x = jax.random.key(3), jnp.asarray(batch(1)[0])
    mlp = MLP((8, 16, 16, 4), dropout=0.3)
    params = {k: jnp.asarray(v) for k, v in mlp.init_params(0).items()}

    def dense(h, i):
        return h @ params[f"layers.{i}.weight"] + params[f"layers.{i}.bias"]

    h = keyed_dropout(jax.nn.relu(dense(x, 0)), rng, 0, 0.3)
    h = keyed_dropout(jax.nn.relu(dense(h, 1)), rng, 1, 0.3)
    out, _ = PortableModule(mlp)(params, {}, x, train=True, rng=rng)
    np.testing.assert_allclose(out, dense(h, 2), rtol=1e-6, atol=1e-6)

    chain = Sequential([Linear(8, 16), Dropout(0.5), ReLU(), Dropout(0.25)])
    weights = {k: jnp.asarray(v) for k, v in chain.init_params(0).items()}
    h = keyed_dropout(x @ weights["0.weight"] + weights["0.bias"], rng, 1, 0.5)
    out, _ = PortableModule(chain)(weights, {}, x, train=True, rng=rng)
    np.testing.assert_allclose(out, keyed_dropout(jax.nn.relu(h), rng, 2, 0.25), rtol=1e-6)


def test_mlp_apply_is_a_deprecated_alias_of_the_generic_apply():
    from unitrain.backends.jax.layers import PortableModule
    from unitrain.backends.jax.model import mlp_apply

    model = MLP((8, 16, 4), dropout=0.5)
    params = {k: jnp.asarray(v) for k, v in model.init_params(0).items()}
    x, rng = jnp.asarray(batch(0)[0]), jax.random.key(1)
    with pytest.warns(DeprecationWarning, match="PortableModule"):
        apply = mlp_apply(model)
    expected, _ = PortableModule(model)(params, {}, x, train=True, rng=rng)
    assert np.array_equal(apply(params, x, train=True, rng=rng), expected)
    evaluated, _ = PortableModule(model)(params, {}, x, train=False, rng=None)
    assert np.array_equal(apply(params, x, train=True, rng=None), evaluated)  # no key: no drop


def test_layers_apply_is_the_deprecated_name_of_portable_module():
    from unitrain.backends.jax import layers

    with pytest.warns(DeprecationWarning, match="use unitrain.backends.jax.layers.PortableModule"):
        old = layers.layers_apply
    assert old is layers.PortableModule
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        layers.missing  # noqa: B018


def test_a_layer_the_backend_never_heard_of_trains_like_the_reference():
    import dataclasses

    from unitrain import ops
    from unitrain.models import AbstractLayer, Linear, Sequential

    @dataclasses.dataclass(frozen=True)
    class Scale(AbstractLayer, type_name="test_jax_scale"):
        """``x * exp(log_scale)`` with a moving count of calls as its state."""

        features: int

        def own_param_shapes(self):
            return {"log_scale": (self.features,)}

        def own_state_shapes(self):
            return {"calls": (1,)}

        def _init_own_params(self, rng):
            return {"log_scale": rng.normal(size=self.features) * 0.1}

        def _init_own_state(self):
            return {"calls": np.zeros(1)}

        def forward(self, scope, x):
            if scope.training:
                scope.set_state("calls", scope.state("calls") + 1)
            return x * ops.exp(scope.param("log_scale"))

        def _output_shape(self, shape):
            return shape

    model = Sequential([Linear(8, 16), Scale(16), Linear(16, 4)])
    opts = options(optimizer=optim.Adam())
    ours, reference = JaxBackend(model, opts), NumpyBackend(model, opts)
    for t in range(3):
        for backend in (ours, reference):
            backend.forward(batch(t))
            backend.backward()
            backend.step(0.01)
    got, expected = ours.state_dict(), reference.state_dict()
    assert list(got) == list(expected)
    assert got["model.1.calls"][0] == 3
    assert relative_error(got, expected) <= 1e-6


def test_mse_matches_numpy():
    model = MLP((8, 16, 3), activation="gelu")
    x, _ = batch(0)
    y = np.random.default_rng(2).normal(size=(32, 3)).astype(np.float32)
    opts = options(loss="mse", optimizer=optim.Adam())
    ours, reference = JaxBackend(model, opts), NumpyBackend(model, opts)
    for t in range(5):
        for backend in (ours, reference):
            backend.forward((x, y))
            backend.backward()
            backend.step(lr_at(t))
    assert relative_error(ours.state_dict(), reference.state_dict()) <= 1e-6


def native_apply(params, x, *, train, rng):
    hidden = jax.nn.relu(x @ params["layers.0.weight"] + params["layers.0.bias"])
    return hidden @ params["layers.1.weight"] + params["layers.1.bias"]


@pytest.mark.parametrize(
    "wrap", [JaxModel, lambda apply, params: (apply, params)], ids=["JaxModel", "tuple"]
)
def test_native_model_trains_like_the_portable_mlp(wrap):
    opts = options(optimizer=optim.SGD(momentum=0.9))
    native = JaxBackend(wrap(native_apply, SMALL.init_params(0)), opts)
    portable = JaxBackend(SMALL, opts)
    assert not native.portable and portable.portable
    for backend in (native, portable):
        for t in range(3):
            backend.train_step(batch(t), 0.1)
    assert same(native.state_dict(), portable.state_dict())


def test_nested_native_params_get_dotted_names():
    params = {"dense": {"w": np.ones((8, 4), np.float32), "b": np.zeros(4, np.float32)}}
    apply = lambda p, x, *, train, rng: x @ p["dense"]["w"] + p["dense"]["b"]  # noqa: E731
    backend = JaxBackend(JaxModel(apply, params), options(optimizer=optim.Adam()))
    backend.train_step(batch(), 0.1)
    state = backend.state_dict()
    assert {"model.dense.w", "optimizer.dense.w.exp_avg", "optimizer.step"} <= set(state)
    backend.load_state_dict(state)
    assert np.array_equal(backend.state_dict()["model.dense.w"], state["model.dense.w"])


def test_protocol_capabilities_and_metadata():
    backend = JaxBackend(SMALL, options())
    assert isinstance(backend, Backend) and isinstance(backend, FusedStep)
    assert isinstance(JaxBackend, FusedStep) and "gpu" in JaxBackend.capabilities.devices
    assert backend.device == "cpu" and backend.name == "jax"
    assert json.loads(json.dumps(backend.rng_state())) == {}
    assert set(backend.versions()) == {"jax", "jaxlib", "optax"}
    assert not jax.config.jax_enable_x64  # float32 by construction, nothing switched globally


BAD_OPTIONS = {"dtype": "float64", "device": "tpu", "loss": "hinge"}


@pytest.mark.parametrize("field", list(BAD_OPTIONS))
def test_bad_options_are_refused(field):
    with pytest.raises(ConfigError, match=f"float32 only|unknown {field}"):
        JaxBackend(SMALL, options(**{field: BAD_OPTIONS[field]}))


def test_other_models_states_and_misuse_are_refused():
    with pytest.raises(ConfigError, match="MLP"):
        JaxBackend("not a model", options())
    backend = JaxBackend(SMALL, options(optimizer=optim.Adam()))
    with pytest.raises(ConfigError, match="forward"):
        backend.backward()
    with pytest.raises(ConfigError, match="missing keys"):
        backend.load_state_dict(JaxBackend(SMALL, options()).state_dict())
    with pytest.raises(ConfigError, match="set_device_data"):
        backend.train_steps_on_device(np.zeros((1, 4)), [0.1])
    backend.forward(batch())
    backend.backward()
    with pytest.raises(ConfigError, match="pending"):
        backend.train_steps(stacked(2), [0.1, 0.1])


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_gpu_requested_without_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="no GPU"):
        JaxBackend(SMALL, options(device="gpu"))


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_deterministic_runs_are_bit_identical_and_match_cpu():
    opts = options(device="gpu", deterministic=True, optimizer=optim.Adam())
    runs = [train_a_little(JaxBackend(DROPOUT, opts), steps=20) for _ in range(2)]
    assert same(runs[0], runs[1])
    cpu_opts = options(deterministic=True, optimizer=optim.Adam())
    assert relative_error(runs[0], train_a_little(JaxBackend(DROPOUT, cpu_opts), 20)) <= 1e-5


def test_importing_unitrain_does_not_import_jax():
    code = "import sys, unitrain; print(sorted({'jax', 'optax'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
