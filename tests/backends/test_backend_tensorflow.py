"""Tests of the TensorFlow backend against the numpy reference and against itself.

Parity bars come from the common backend brief: 1e-6 normwise relative error over 100 float32
optimizer steps against the float64 reference, 1e-4 relative on per-epoch losses against the
numpy backend, and bit-exact state for save/load and resume on CPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unitrain
from unitrain import callbacks as cb
from unitrain import models, ops, optim, schedules
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import Backend, BackendOptions, FusedStep
from unitrain.backends.state import split_state
from unitrain.checkpoint import checkpoint_name, load_checkpoint, save_checkpoint
from unitrain.conformance.optimizer_cases import OPTIMIZER_CASES
from unitrain.models import MLP
from unitrain.recipes import default_trainer, load_digits
from unitrain.training.config import TrainerConfig

tf = pytest.importorskip("tensorflow")
tf_backend = pytest.importorskip("unitrain.backends.tensorflow")
TensorFlowBackend = tf_backend.TensorFlowBackend

#: The kit's optimizer cases, by the kit's names (unitrain.conformance.optimizer_cases).
OPTIMIZERS = {name: case.optimizer for name, case in OPTIMIZER_CASES.items()}
PARITY_MODEL = MLP((16, 32, 4))
PARITY_SEEDS = (0, 1, 2, 3)
PARITY_STEPS = 100
PARITY_TOLERANCE = 1e-6
LOSS_TOLERANCE = 1e-4


def _options(optimizer: optim.Optimizer | None = None, **kwargs: Any) -> BackendOptions:
    return BackendOptions(optimizer=optimizer or optim.SGD(), device="cpu", **kwargs)


def _batch(seed: int, n: int, model: MLP = PARITY_MODEL) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, model.in_features)).astype(np.float32)
    return x, rng.integers(0, model.out_features, n)


def _assert_states_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def _three_calls(backend: Any, batch: Any, lr: float, scale: float = 1.0) -> Any:
    """``forward; backward(scale); step(lr)``; returns the loss."""
    loss = backend.forward(batch)
    backend.backward(scale)
    backend.step(lr)
    return loss


def _relative_error(state: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Normwise relative error of all parameters together."""
    diff = sum(float(np.sum((state[f"model.{k}"] - v) ** 2)) for k, v in reference.items())
    norm = sum(float(np.sum(v**2)) for v in reference.values())
    return math.sqrt(diff / norm)


# -- import, registry, protocol --------------------------------------------------------------


def test_importing_unitrain_does_not_import_tensorflow() -> None:
    code = "import sys, unitrain; sys.exit('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_registered_and_implements_the_protocol() -> None:
    assert unitrain.get_backend("tensorflow") is TensorFlowBackend
    # The adapter package ``unitrain.backends.tensorflow`` imports the framework, not itself.
    from unitrain.backends.tensorflow import backend as adapter

    assert adapter.tf is sys.modules["tensorflow"] and hasattr(adapter.tf, "function")
    backend = TensorFlowBackend(PARITY_MODEL, _options())
    assert isinstance(backend, Backend) and isinstance(backend, FusedStep)
    assert backend.device == "cpu" and backend.name == "tensorflow"
    assert backend.versions()["tensorflow"] == tf.__version__


def test_devices_and_dtypes_are_checked() -> None:
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(unitrain.ConfigError, match="no GPU"):
            TensorFlowBackend(PARITY_MODEL, BackendOptions(device="gpu"))
        assert TensorFlowBackend(PARITY_MODEL, BackendOptions(device="auto")).device == "cpu"
    with pytest.raises(unitrain.ConfigError, match="unknown device"):
        TensorFlowBackend(PARITY_MODEL, BackendOptions(device="tpu"))
    with pytest.raises(unitrain.ConfigError, match="float16"):
        TensorFlowBackend(PARITY_MODEL, _options(dtype="float16"))
    with pytest.raises(unitrain.ConfigError, match="unknown loss"):
        TensorFlowBackend(PARITY_MODEL, _options(loss="hinge"))
    with pytest.raises(unitrain.ConfigError, match="got object"):
        TensorFlowBackend(object(), _options())


# -- 1. optimizer parity with the float64 reference -------------------------------------------


def _gradients(seed: int, step: int) -> dict[str, np.ndarray]:
    """A known float32 gradient for ``step``, its scale spread over four decades."""
    rng = np.random.default_rng([seed, step, 7])
    scale = 10.0 ** rng.uniform(-4.0, 0.5)
    return {
        name: (scale * rng.normal(size=shape)).astype(np.float32)
        for name, shape in PARITY_MODEL.param_shapes().items()
    }


def _optimizer_parity(
    backend: Any, spec: optim.Optimizer, seed: int, nan_steps: tuple[int, ...] = ()
) -> float:
    """Feed the same gradients to the backend and the float64 reference; return the error."""
    params = PARITY_MODEL.init_params(seed)
    state = {f"model.{k}": v for k, v in params.items()}
    state.update({f"optimizer.{k}": v for k, v in optim.init_state(spec, params).items()})
    backend.load_state_dict(state)
    reference = {k: v.astype(np.float64) for k, v in params.items()}
    reference_state = optim.init_state(spec, reference)
    skipped_before = backend.skipped_steps
    for t in range(PARITY_STEPS):
        grads = _gradients(seed, t)
        if t in nan_steps:
            grads["layers.0.weight"][1, 2] = np.nan
        lr = 0.01 * (1.0 + 0.5 * math.sin(t))
        for buffer, name in zip(backend.grad_buffers, backend.params, strict=True):
            buffer.assign(grads[name])  # the test knows the adapter: set the buffers directly
        before = backend.state_dict() if t in nan_steps else None
        backend.step(lr)
        grads64 = {k: v.astype(np.float64) for k, v in grads.items()}
        if t in nan_steps:
            _assert_states_equal(backend.state_dict(), before)
            assert not np.any([b.numpy().any() for b in backend.grad_buffers]), "buffers zeroed"
            continue
        if backend.options.grad_clip_norm is not None:
            optim.clip_by_global_norm(grads64, backend.options.grad_clip_norm)
        optim.apply_update(spec, reference, grads64, reference_state, lr)
    final = backend.state_dict()
    assert int(final["optimizer.step"]) == PARITY_STEPS - len(nan_steps)
    assert backend.skipped_steps - skipped_before == len(nan_steps)
    return _relative_error(final, reference)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_matches_float64_reference(name: str) -> None:
    spec = OPTIMIZERS[name]
    backend = TensorFlowBackend(PARITY_MODEL, _options(spec))
    errors = [_optimizer_parity(backend, spec, seed) for seed in PARITY_SEEDS]
    print(f"{name}: max normwise relative error {max(errors):.2e}")
    assert max(errors) <= PARITY_TOLERANCE, errors
    assert backend.trace_counts["step"] == 1


@pytest.mark.parametrize("name", ["sgd_nesterov", "adam", "adamw"])
def test_optimizer_parity_with_clipping_and_a_nan_gradient(name: str) -> None:
    spec = OPTIMIZERS[name]
    # Gradient norms run from ~3e-3 to ~80, so about 40% of the steps are clipped.
    backend = TensorFlowBackend(PARITY_MODEL, _options(spec, grad_clip_norm=1.0))
    errors = [_optimizer_parity(backend, spec, seed, nan_steps=(10, 57)) for seed in (0, 1)]
    print(f"{name} clipped, NaN skipped: max normwise relative error {max(errors):.2e}")
    assert max(errors) <= PARITY_TOLERANCE, errors


def test_nonfinite_loss_skips_the_update() -> None:
    backend = TensorFlowBackend(PARITY_MODEL, _options(optim.Adam()))
    before = backend.state_dict()
    x, y = _batch(0, 8)
    x[3, 1] = np.inf
    backend.train_step((x, y), 0.1)
    _three_calls(backend, (x, y), 0.1)
    _assert_states_equal(backend.state_dict(), before)
    assert backend.skipped_steps == 2


# -- 2. cross-backend parity on the default recipe ---------------------------------------------


@pytest.fixture(scope="module")
def recipe_histories() -> dict[str, Any]:
    """The default recipe for 5 epochs on numpy and on TensorFlow."""
    histories, trace_counts = {}, {}
    for backend in ("numpy", "tensorflow"):
        trainer, train, val = default_trainer(backend=backend, epochs=5, progress=False)
        histories[backend] = trainer.fit(train, val)
        trace_counts[backend] = getattr(trainer.backend, "trace_counts", None)
    return {"histories": histories, "trace_counts": trace_counts["tensorflow"]}


def test_default_recipe_matches_numpy(recipe_histories: dict[str, Any]) -> None:
    histories = recipe_histories["histories"]
    reference, ours = histories["numpy"], histories["tensorflow"]
    assert len(ours) == len(reference) == 5
    for mine, theirs in zip(ours, reference, strict=True):
        for key in ("loss", "val_loss", "val_accuracy"):
            difference = abs(mine[key] - theirs[key]) / max(abs(theirs[key]), 1e-12)
            print(f"epoch {mine['epoch']} {key}: relative difference {difference:.1e}")
            assert difference <= LOSS_TOLERANCE, (mine["epoch"], key, mine[key], theirs[key])
        assert mine["lr"] == theirs["lr"] and mine["step"] == theirs["step"]


def test_fit_traces_each_function_once(recipe_histories: dict[str, Any]) -> None:
    # 45 batches per epoch, the last one smaller, 12 validation batches, 5 epochs, an LR that
    # changes every step: still one trace of each function.
    assert dict(recipe_histories["trace_counts"]) == {"train_step": 1, "evaluate": 1}


def test_early_stopping_stops_at_the_numpy_epoch() -> None:
    stopped = {}
    for backend in ("numpy", "tensorflow"):
        run = {"backend": backend, "epochs": 25, "patience": 2, "progress": False}
        trainer, train, val = default_trainer(**run)
        stopped[backend] = len(trainer.fit(train, val))
    assert stopped["tensorflow"] == stopped["numpy"] < 25


# -- 3. state dict ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam", "adamw"])
def test_state_dict_layout_equals_numpy(name: str) -> None:
    spec = OPTIMIZERS[name]
    ours = TensorFlowBackend(PARITY_MODEL, _options(spec)).state_dict()
    theirs = NumpyBackend(PARITY_MODEL, _options(spec)).state_dict()
    assert {k: (v.shape, v.dtype) for k, v in ours.items()} == {
        k: (v.shape, v.dtype) for k, v in theirs.items()
    }
    _assert_states_equal(ours, theirs)  # same initial weights, zero optimizer state


def test_state_loads_across_backends_and_round_trips(tmp_path: Path) -> None:
    spec = optim.Adam(weight_decay=1e-3)
    numpy_backend = NumpyBackend(PARITY_MODEL, _options(spec))
    ours = TensorFlowBackend(PARITY_MODEL, _options(spec))
    for step in range(3):
        _three_calls(numpy_backend, _batch(step, 16), 0.01)
    ours.load_state_dict(numpy_backend.state_dict())
    _assert_states_equal(ours.state_dict(), numpy_backend.state_dict())
    for step in range(3, 6):
        ours.train_step(_batch(step, 16), 0.01)
        _three_calls(numpy_backend, _batch(step, 16), 0.01)
    state = ours.state_dict()
    assert _relative_error(state, split_state(numpy_backend.state_dict())[0]) < 1e-6
    numpy_backend.load_state_dict(state)
    _assert_states_equal(numpy_backend.state_dict(), state)
    # save -> load -> save through checkpoint files is bit-identical.
    model, optimizer = split_state(state)
    path = save_checkpoint(
        tmp_path / "c", model=model, optimizer=optimizer, trainer={"step": 6, "epoch": 0}
    )
    loaded = load_checkpoint(path)
    fresh = TensorFlowBackend(PARITY_MODEL, _options(spec, seed=5))
    prefixed = {f"model.{k}": v for k, v in loaded.model.items()}
    prefixed.update({f"optimizer.{k}": v for k, v in loaded.optimizer.items()})
    fresh.load_state_dict(prefixed)
    _assert_states_equal(fresh.state_dict(), state)
    with pytest.raises(unitrain.ConfigError, match="missing keys"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "optimizer.step"})


def test_float64_backend_keeps_float64_state() -> None:
    options = _options(optim.SGD(momentum=0.5), dtype="float64")
    ours, theirs = TensorFlowBackend(PARITY_MODEL, options), NumpyBackend(PARITY_MODEL, options)
    for backend in (ours, theirs):
        _three_calls(backend, _batch(0, 16), 0.1)
    a, b = ours.state_dict(), theirs.state_dict()
    assert {k: v.dtype for k, v in a.items()} == {k: v.dtype for k, v in b.items()}
    assert _relative_error(a, split_state(b)[0]) < 1e-12


# -- 4. resume equals uninterrupted ------------------------------------------------------------


def test_resume_at_an_epoch_boundary_is_bit_exact(tmp_path: Path) -> None:
    run = {"backend": "tensorflow", "epochs": 3, "progress": False}
    full, train, val = default_trainer(out=tmp_path / "full", **run)
    full.fit(train, val)
    resumed, train, val = default_trainer(out=tmp_path / "resumed", **run)
    checkpoint = tmp_path / "full" / "checkpoints" / checkpoint_name(1, len(train))
    history = resumed.fit(train, val, resume=checkpoint)
    _assert_states_equal(resumed.backend.state_dict(), full.backend.state_dict())
    assert [h["val_loss"] for h in history] == [h["val_loss"] for h in full.history]


def _small_trainer(directory: Path, grad_accum_steps: int) -> Any:
    """Adam, dropout, clipping, warmup + cosine and a checkpoint every 3 updates."""
    cosine = schedules.CosineDecay(3e-3, decay_steps=40, min_lr=1e-4)
    return unitrain.Trainer(
        MLP((64, 32, 10), dropout=0.2),
        backend="tensorflow",
        optimizer=optim.Adam(),
        schedule=schedules.Warmup(cosine, warmup_steps=5),
        callbacks=[cb.ModelCheckpoint(directory, every_n_epochs=None, every_n_steps=3)],
        config=TrainerConfig(
            epochs=2, batch_size=64, grad_accum_steps=grad_accum_steps, grad_clip_norm=1.0
        ),
    )


@pytest.mark.parametrize("grad_accum_steps", [1, 2], ids=["fused", "three_call"])
def test_resume_mid_epoch_is_bit_exact(tmp_path: Path, grad_accum_steps: int) -> None:
    digits = load_digits()
    train = (digits.x_train[:640], digits.y_train[:640])  # 10 batches of 64 per epoch
    full = _small_trainer(tmp_path / "full", grad_accum_steps)
    full.fit(train)
    again = _small_trainer(tmp_path / "again", grad_accum_steps)
    again.fit(train)
    _assert_states_equal(again.backend.state_dict(), full.backend.state_dict())  # same seed
    # Update 3 ends batch 3 (fused) or batch 6 (two micro-batches per update) of 10.
    checkpoint = tmp_path / "full" / checkpoint_name(1, 3)  # step 3 is in epoch 1
    assert load_checkpoint(checkpoint).trainer["batch"] == 3 * grad_accum_steps
    resumed = _small_trainer(tmp_path / "resumed", grad_accum_steps)
    resumed.fit(train, resume=checkpoint)
    _assert_states_equal(resumed.backend.state_dict(), full.backend.state_dict())
    assert resumed.state.step == full.state.step


# -- 5. no retracing --------------------------------------------------------------------------


def test_changing_lr_scale_and_batch_size_does_not_retrace() -> None:
    backend = TensorFlowBackend(PARITY_MODEL, _options(optim.Adam(), grad_clip_norm=1.0))
    for t, n in enumerate([32, 32, 30, 7, 32, 1]):
        batch = _batch(t, n)
        backend.train_step(batch, 0.01 * (1.0 + 0.5 * math.sin(t)))
        backend.forward(batch)
        backend.backward(0.25 + t)
        _three_calls(backend, batch, 1e-3 / (t + 1), scale=1.0 / (t + 1))
        backend.evaluate(batch)
    expected = {"train_step": 1, "forward": 1, "accumulate": 1, "step": 1, "evaluate": 1}
    assert dict(backend.trace_counts) == expected
    # TensorFlow's own count agrees with ours.
    traced = backend.compiled.traces.polymorphic.values()
    assert sum(f.experimental_get_tracing_count() for f in traced) == 5
    # Inputs are cast to the backend's dtypes first, so float64 data or int32 labels share it.
    x, y = _batch(0, 8)
    backend.train_step((x.astype(np.float64), y.astype(np.int32)), 0.2)
    assert backend.trace_counts["train_step"] == 1


# -- 6. fused, k steps per call, device-resident data -----------------------------------------


def _fresh(spec: optim.Optimizer, dropout: float) -> Any:
    model = MLP((16, 32, 4), dropout=dropout)
    return TensorFlowBackend(model, _options(spec, grad_clip_norm=0.5, seed=3))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_fast_paths_equal_single_steps(dropout: float) -> None:
    spec, k, n = optim.AdamW(weight_decay=1e-2), 6, 12
    batches = [_batch(100 + i, n) for i in range(k)]
    lrs = [0.02 * (1.0 + 0.5 * math.sin(i)) for i in range(k)]
    single = _fresh(spec, dropout)
    single_losses = [
        single.train_step(batch, lr).numpy() for batch, lr in zip(batches, lrs, strict=True)
    ]
    expected = single.state_dict()

    three_call = _fresh(spec, dropout)
    for batch, lr in zip(batches, lrs, strict=True):
        _three_calls(three_call, batch, lr)
    _assert_states_equal(three_call.state_dict(), expected)

    stacked = _fresh(spec, dropout)
    xs, ys = np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])
    losses = stacked.train_steps((xs[:4], ys[:4]), lrs[:4])
    losses2 = stacked.train_steps((xs[4:], ys[4:]), lrs[4:])  # another k: no retrace
    np.testing.assert_array_equal(np.concatenate([losses, losses2]), single_losses)
    _assert_states_equal(stacked.state_dict(), expected)
    assert stacked.trace_counts["train_steps"] == 1

    on_device = _fresh(spec, dropout)
    on_device.set_device_data(xs.reshape(k * n, -1), ys.reshape(k * n))
    indices = np.arange(k * n).reshape(k, n)
    losses = on_device.train_steps_on_device(indices, lrs)
    np.testing.assert_array_equal(losses, single_losses)
    _assert_states_equal(on_device.state_dict(), expected)


# -- 7. gradient accumulation -----------------------------------------------------------------


def test_accumulated_micro_batches_equal_one_batch() -> None:
    spec = optim.SGD(momentum=0.9, nesterov=True, weight_decay=1e-3)
    whole, parts = (TensorFlowBackend(PARITY_MODEL, _options(spec)) for _ in range(2))
    for t in range(5):
        x, y = _batch(t, 24)
        _three_calls(whole, (x, y), 0.1)
        for start, stop in ((0, 10), (10, 18), (18, 24)):
            parts.forward((x[start:stop], y[start:stop]))
            parts.backward((stop - start) / 24)
        parts.step(0.1)
    error = _relative_error(parts.state_dict(), split_state(whole.state_dict())[0])
    print(f"accumulation vs one batch: normwise relative error {error:.1e}")
    assert error < 1e-6


# -- evaluation, losses, native models, RNG ---------------------------------------------------


def test_evaluate_is_eval_mode_and_matches_numpy() -> None:
    model = MLP((16, 32, 4), dropout=0.5)
    ours, theirs = TensorFlowBackend(model, _options()), NumpyBackend(model, _options())
    batch = _batch(0, 50)
    before = ours.state_dict()
    first, second = ours.evaluate(batch), ours.evaluate(batch)
    _assert_states_equal(ours.state_dict(), before)
    reference = theirs.evaluate(batch)
    for key in ("loss", "accuracy"):
        assert float(first[key]) == float(second[key])
        assert float(first[key]) == pytest.approx(float(reference[key]), rel=1e-6)
    # Train mode draws masks: the loss differs from eval mode's, and repeats for the same
    # (seed, step, micro_batch) after a reload.
    train_loss = float(ours.forward(batch))
    ours.load_state_dict(before)
    assert float(ours.forward(batch)) == train_loss != float(first["loss"])


def test_mse_matches_numpy() -> None:
    model = MLP((16, 8, 3), activation="gelu")
    options = _options(optim.SGD(momentum=0.9), loss="mse")
    ours, theirs = TensorFlowBackend(model, options), NumpyBackend(model, options)
    rng = np.random.default_rng(0)
    for _ in range(5):
        batch = (rng.normal(size=(20, 16)).astype(np.float32), rng.normal(size=(20, 3)))
        loss = float(ours.train_step(batch, 0.05))
        assert loss == pytest.approx(float(_three_calls(theirs, batch, 0.05)), rel=1e-5)
    assert _relative_error(ours.state_dict(), split_state(theirs.state_dict())[0]) < 1e-6
    assert "accuracy" not in ours.evaluate(batch)


def test_keras_model_trains_with_path_names() -> None:
    keras = pytest.importorskip("keras")
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )
    backend = TensorFlowBackend(model, _options(optim.SGD(momentum=0.9)))
    names = sorted(k for k in backend.state_dict() if k.startswith("model."))
    assert [n.rsplit(".", 1)[1] for n in names] == ["bias", "kernel", "bias", "kernel"]
    assert all(f"optimizer.{n[6:]}.momentum" in backend.state_dict() for n in names)
    batch = _batch(0, 32)
    losses = [float(backend.train_step(batch, 0.1)) for _ in range(10)]
    assert losses[-1] < losses[0]
    assert backend.versions()["keras"] == keras.__version__
    with pytest.raises(unitrain.ConfigError, match="must be float64"):
        TensorFlowBackend(model, _options(dtype="float64"))
    state = backend.state_dict()
    backend.train_step(batch, 0.1)
    backend.load_state_dict(state)
    _assert_states_equal(backend.state_dict(), state)


def test_tf_module_trains_with_attribute_path_names() -> None:
    class Linear(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = [tf.Module()]
            self.layers[0].w = tf.Variable(tf.zeros((16, 4)))
            self.scale = tf.Variable(2.0, trainable=False)

        def __call__(self, x: Any, training: bool = False) -> Any:
            return self.scale * tf.matmul(x, self.layers[0].w)

    backend = TensorFlowBackend(Linear(), _options(optim.Adam()))
    state = backend.state_dict()
    optimizer_keys = {"optimizer.layers.0.w.exp_avg", "optimizer.layers.0.w.exp_avg_sq"}
    assert set(state) == {"model.layers.0.w", "model.scale", "optimizer.step", *optimizer_keys}
    batch = _batch(0, 32)
    losses = [float(backend.train_step(batch, 0.05)) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_rng_state_is_json_and_restores_the_global_generator() -> None:
    backend = TensorFlowBackend(PARITY_MODEL, _options())
    state = json.loads(json.dumps(backend.rng_state()))
    first = tf.random.get_global_generator().normal([3]).numpy()
    backend.set_rng_state(state)
    np.testing.assert_array_equal(tf.random.get_global_generator().normal([3]).numpy(), first)


# -- portable models: one generic module ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Gain(models.AbstractLayer):
    """A user's layer, unknown to the adapter: a parameter, a state, a forward in ops."""

    width: int

    def own_param_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"gain": (self.width,)}

    def own_state_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"seen": (self.width,)}

    def _init_own_params(self, rng: Any) -> dict[str, np.ndarray]:
        return {"gain": np.full(self.width, 2.0)}

    def _init_own_state(self) -> dict[str, np.ndarray]:
        return {"seen": np.zeros(self.width)}

    def forward(self, scope: Any, x: Any) -> Any:
        if scope.training:
            scope.set_state("seen", scope.state("seen") + ops.sum(x, axis=0))
        return x * scope.param("gain")

    def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape


def test_a_users_layer_trains_under_canonical_names_in_one_trace() -> None:
    spec = models.Sequential([models.Linear(16, 4), _Gain(4), models.Dropout(0.5)])
    backend = TensorFlowBackend(spec, _options(optim.Adam()))
    assert list(backend.params) == list(spec.param_shapes())
    assert list(backend.variables) == [*spec.param_shapes(), *spec.state_shapes()]
    weight, bias = (backend.variables[k].numpy() for k in ("0.weight", "0.bias"))
    x = _batch(0, 8)[0]
    backend.train_step(_batch(0, 8), 0.05)
    seen = backend.variables["1.seen"].numpy()
    np.testing.assert_allclose(seen, (x @ weight + bias).sum(0), rtol=1e-5)
    assert backend.variables["1.gain"].numpy() != pytest.approx(2.0)  # trained
    for t, n in enumerate([5, 8], start=1):
        backend.train_step(_batch(t, n), 0.05)
    assert dict(backend.trace_counts) == {"train_step": 1}  # a smaller batch: no retrace


def test_a_model_that_reads_its_batch_size_traces_per_batch_size() -> None:
    # BatchNorm checks its count of values per channel in Python: under an unknown batch size
    # the trace fails, and the function is traced per batch size instead; eval mode reads no
    # count and keeps one trace.
    spec = models.Sequential([models.Linear(16, 4), models.BatchNorm(4)])
    backend = TensorFlowBackend(spec, _options())
    for n in (8, 5, 8):
        backend.train_step(_batch(n, n), 0.1)
        backend.evaluate(_batch(n, n))
    assert dict(backend.trace_counts) == {"train_step": 2, "evaluate": 1}
    with pytest.raises(unitrain.DataError, match="more than one value per channel"):
        backend.train_step(_batch(0, 1), 0.1)


def test_dropout_masks_are_stateless_draws_keyed_by_their_place_in_the_pass() -> None:
    """The k-th mask of a pass is ``stateless_uniform`` of ``fold_in(key, k)``, k from 1 (the
    MLP's from 0: it was a module of its own that numbered its hidden layers), as before the
    layers were written once, so seeded runs keep their masks."""
    key = tf.constant([3, 11], tf.int64)

    def mask(k: int, like: Any) -> Any:
        seed = tf.random.experimental.stateless_fold_in(key, k, alg="philox")
        uniform = tf.random.stateless_uniform(tf.shape(like), seed, dtype=like.dtype, alg="philox")
        return tf.cast(uniform < 0.5, like.dtype) / 0.5

    x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)))
    mlp = models.MLP((4, 8, 8, 3), dropout=0.5)
    for spec, first in ((mlp, 0), (_users_model(mlp), 1)):
        module = tf_backend.layers.PortableModule(spec, spec.init_params(0), {}, tf.float64)
        out, h = module(x, training=True, key=key), x
        weights = {k: v.numpy() for k, v in module.named_variables().items()}
        for i in range(3):
            h = h @ weights[f"layers.{i}.weight"] + weights[f"layers.{i}.bias"]
            if i < 2:
                h = tf.nn.relu(h) * mask(first + i, h)
        np.testing.assert_allclose(out.numpy(), h.numpy(), rtol=1e-12)
    with pytest.warns(DeprecationWarning, match="PortableModule"):
        old = tf_backend.model.TFMLP(PARITY_MODEL, PARITY_MODEL.init_params(0), tf.float32)
    assert list(old.named_variables()) == list(PARITY_MODEL.param_shapes())
    with pytest.warns(DeprecationWarning, match="use unitrain.backends.tensorflow.layers.Port"):
        renamed = tf_backend.layers.TFPortable
    assert renamed is tf_backend.layers.PortableModule


def _users_model(mlp: models.MLP) -> models.AbstractLayer:
    """A user's composite layer that runs ``mlp``'s layers, under their names."""

    @dataclasses.dataclass(frozen=True)
    class Net(models.AbstractLayer):
        def children(self) -> tuple[tuple[str, models.AbstractLayer], ...]:
            return mlp.children()

        def forward(self, scope: Any, x: Any) -> Any:
            for name, _ in self.children():
                x = scope.call(name, x)
            return x

        def _output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
            return mlp.output_shape(shape)

    return Net()
