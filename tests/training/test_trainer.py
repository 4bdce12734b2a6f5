"""The Trainer's loop: accuracy, accumulation, clipping, non-finite policies, evaluation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _backends import backend_param
from _faulty_backends import MultiStepNumpy

from unitrain import (
    ArrayLoader,
    ConfigError,
    DataError,
    NonFiniteError,
    Trainer,
    TrainerConfig,
    callbacks,
    models,
    optim,
    schedules,
)
from unitrain.backends.numpy import NumpyBackend
from unitrain.backends.protocol import BackendOptions
from unitrain.recipes import default_trainer, load_digits

BACKENDS = ["numpy", "torch"]


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def small_data(n=64, features=4, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = (np.abs(x[:, 0] * 2).astype(np.int64)) % classes
    return x, y


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_default_recipe_reaches_95_percent_in_10_epochs(backend):
    trainer, train, val = default_trainer(backend=backend, epochs=10, progress=False)
    history = trainer.fit(train, val)
    assert max(row["val_accuracy"] for row in history) >= 0.95
    assert history[-1]["loss"] < history[0]["loss"] / 5
    assert len(history) <= 10


def test_history_rows_and_validate_test(digits):
    trainer = Trainer(models.MLP((64, 16, 10)), backend="numpy", config=TrainerConfig(epochs=2))
    history = trainer.fit((digits.x_train, digits.y_train), (digits.x_val, digits.y_val))
    assert [row["epoch"] for row in history] == [1, 2]
    assert history[-1]["step"] == 2 * math.ceil(len(digits.x_train) / 32)
    assert set(history[0]) >= {"loss", "val_loss", "val_accuracy", "lr", "seconds", "step"}
    metrics = trainer.validate((digits.x_val, digits.y_val))
    assert metrics["val_loss"] == pytest.approx(history[-1]["val_loss"], rel=1e-12)
    assert set(trainer.test((digits.x_val, digits.y_val))) == {"test_loss", "test_accuracy"}


def test_evaluation_is_example_weighted():
    """A last, smaller batch counts by its size, so batch size does not change the mean."""
    x, y = small_data(n=50)
    means = []
    for batch_size in (7, 50):
        trainer = Trainer(
            models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(batch_size=batch_size)
        )
        means.append(trainer.validate((x, y))["val_loss"])
    assert means[0] == pytest.approx(means[1], rel=1e-6)


def test_validation_and_test_metrics_are_means_over_examples_not_batches():
    """Batches of 4, 4 and 2: the metrics are those of the 10 examples evaluated at once."""
    x, y = small_data(n=10)
    config = TrainerConfig(batch_size=4, dtype="float64", device="cpu")
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=config)
    whole = {k: float(v) for k, v in trainer.backend.evaluate((x, y)).items()}
    batches = [trainer.backend.evaluate((x[i : i + 4], y[i : i + 4])) for i in (0, 4, 8)]
    # The oracle distinguishes: a mean of batch means is off by far more than rounding.
    assert abs(np.mean([float(b["loss"]) for b in batches]) - whole["loss"]) > 1e-4
    validated, tested = trainer.validate((x, y)), trainer.test((x, y))
    for metrics, prefix in ((validated, "val_"), (tested, "test_")):
        assert metrics[f"{prefix}loss"] == pytest.approx(whole["loss"], rel=1e-12)
        assert metrics[f"{prefix}accuracy"] == pytest.approx(whole["accuracy"], rel=1e-12)


@pytest.mark.parametrize("accum", [3, 2])
def test_the_epoch_loss_weights_micro_batches_by_size(accum):
    """At learning rate 0 every forward sees the initial weights, so the epoch's loss must be
    the loss of all 20 examples at once: micro-batches of 8, 8 and 4 (one update, or two
    with the short group alone) each count by their size."""
    x, y = small_data(n=20)
    config = TrainerConfig(
        epochs=1, batch_size=8, grad_accum_steps=accum, dtype="float64", device="cpu"
    )
    trainer = Trainer(
        models.MLP((4, 8, 3)), backend="numpy", schedule=schedules.Constant(0.0), config=config
    )
    expected = float(trainer.backend.evaluate((x, y))["loss"])
    history = trainer.fit(ArrayLoader(x, y, 8, shuffle=False))
    assert trainer.state.step == (1 if accum == 3 else 2)
    assert history[0]["loss"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_accumulation_equals_one_large_batch(backend):
    """k micro-batches of n, weighted by size, give the update of one batch of k*n."""
    x, y = small_data(n=48)
    results = []
    for accum, batch in ((1, 48), (3, 16), (4, 12)):
        config = TrainerConfig(
            epochs=1, batch_size=batch, grad_accum_steps=accum, dtype="float64", device="cpu"
        )
        trainer = Trainer(
            models.MLP((4, 8, 3)),
            backend=backend,
            optimizer=optim.Adam(),
            schedule=schedules.Constant(0.01),
            config=config,
        )
        trainer.fit(__import__("unitrain").ArrayLoader(x, y, batch, shuffle=False))
        assert trainer.state.step == 1
        results.append(trainer.backend.state_dict())
    for other in results[1:]:
        for key in results[0]:
            np.testing.assert_allclose(other[key], results[0][key], rtol=1e-12, atol=1e-15)


def test_uneven_accumulation_weights_micro_batches_by_size():
    """50 examples, batch 16, accumulate 4: one update from batches of 16, 16, 16 and 2."""
    x, y = small_data(n=50)
    states = []
    for batch, accum in ((50, 1), (16, 4)):
        config = TrainerConfig(epochs=1, batch_size=batch, grad_accum_steps=accum, dtype="float64")
        trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=config)
        from unitrain import ArrayLoader

        trainer.fit(ArrayLoader(x, y, batch, shuffle=False))
        states.append(trainer.backend.state_dict())
    for key in states[0]:
        np.testing.assert_allclose(states[1][key], states[0][key], rtol=1e-12, atol=1e-15)


def test_clipping_limits_the_update_norm():
    x, y = small_data()
    x = x * 1000  # huge gradients
    before = NumpyBackend(models.MLP((4, 8, 3))).state_dict()
    config = TrainerConfig(epochs=1, batch_size=64, grad_clip_norm=0.5)
    trainer = Trainer(
        models.MLP((4, 8, 3)), backend="numpy", schedule=schedules.Constant(1.0), config=config
    )
    trainer.fit((x, y))
    after = trainer.backend.state_dict()
    moved = math.sqrt(
        sum(np.sum((after[k] - before[k]) ** 2) for k in before if k.startswith("model."))
    )
    assert moved == pytest.approx(0.5, rel=1e-5)  # plain SGD, lr 1: the step is the clipped grad


class NaNAt:
    """Makes the inputs of one batch NaN, by position in the epoch."""

    def __init__(self, x, y, batch_size, bad_batches):
        self.x, self.y, self.batch_size, self.bad = x, y, batch_size, set(bad_batches)
        self.exact_resume = True

    def __len__(self):
        return len(self.x) // self.batch_size

    def batches(self, epoch, start=0):
        for i in range(start, len(self)):
            xb = self.x[i * self.batch_size : (i + 1) * self.batch_size].copy()
            if (epoch, i) in self.bad:
                xb[0, 0] = np.nan
            yield xb, self.y[i * self.batch_size : (i + 1) * self.batch_size]


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_nonfinite_skip_batch_leaves_weights_of_the_bad_step_untouched(backend):
    x, y = small_data(n=64)
    clean = NaNAt(x, y, 16, bad_batches=[])
    poisoned = NaNAt(x, y, 16, bad_batches=[(0, 2)])
    config = TrainerConfig(epochs=1, nonfinite="skip_batch", log_every_n_steps=1, device="cpu")

    def run(data, stop_after):
        trainer = Trainer(models.MLP((4, 8, 3)), backend=backend, config=config)
        trainer.fit(NaNAt(data.x[: stop_after * 16], data.y[: stop_after * 16], 16, data.bad))
        return trainer

    reference = run(clean, 2)  # the two good steps before the bad one
    skipped = run(poisoned, 3)  # the same two, then the bad one, skipped
    assert skipped.skipped_steps == 1
    assert skipped.history[-1]["skipped_steps"] == 1
    for key, value in reference.backend.state_dict().items():
        if key != "optimizer.step":
            np.testing.assert_array_equal(skipped.backend.state_dict()[key], value)
    full = run(poisoned, 4)
    assert all(np.isfinite(v).all() for v in full.backend.state_dict().values())


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_nonfinite_raise_names_the_step_and_keeps_weights_finite(backend):
    x, y = small_data(n=64)
    config = TrainerConfig(epochs=1, nonfinite="raise", log_every_n_steps=1, device="cpu")
    trainer = Trainer(models.MLP((4, 8, 3)), backend=backend, config=config)
    with pytest.raises(NonFiniteError, match="up to step 2"):
        trainer.fit(NaNAt(x, y, 16, bad_batches=[(0, 1)]))
    assert all(np.isfinite(v).all() for v in trainer.backend.state_dict().values())


def test_nonfinite_stop_ends_training_with_a_warning():
    x, y = small_data(n=64)
    config = TrainerConfig(epochs=3, nonfinite="stop", log_every_n_steps=1)
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=config)
    with pytest.warns(UserWarning, match="stopping: non-finite"):
        history = trainer.fit(NaNAt(x, y, 16, bad_batches=[(1, 0)]))
    assert len(history) == 2 and trainer.state.stop_training
    assert trainer.state.step == 5


def test_lr_factor_and_schedule_drive_the_update():
    x, y = small_data()
    schedule = schedules.LinearDecay(0.2, 0.0, 4)
    trainer = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        schedule=schedule,
        config=TrainerConfig(epochs=2, batch_size=32, log_every_n_steps=1),
    )
    seen = []
    trainer.callbacks.hooks["on_batch_end"].append(lambda t, b, logs: seen.append(logs["lr"]))
    trainer.fit((x, y))
    assert seen == [schedule(s) for s in range(4)]


def test_a_native_iterable_trains_like_an_array_loader():
    x, y = small_data(n=64)
    from unitrain import ArrayLoader

    loader = ArrayLoader(x, y, 16, shuffle=False)
    results = []
    for data in (loader, list(loader.batches(0))):
        trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(epochs=2))
        trainer.fit(data)
        results.append(trainer.backend.state_dict())
    for key in results[0]:
        np.testing.assert_array_equal(results[0][key], results[1][key])


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        ((np.zeros((0, 4), np.float32), np.zeros(0, np.int64)), DataError, "empty"),
        ((np.zeros((5, 4), np.float32), np.zeros(4, np.int64)), DataError, "ragged"),
        ((np.zeros((5, 3), np.float32), np.zeros(5, np.int64)), DataError, "expects 4 features"),
        ((np.full((5, 4), np.nan, np.float32), np.zeros(5, np.int64)), DataError, "NaN"),
        ((np.zeros((5, 4), np.float32), np.full(5, 3, np.int64)), DataError, r"labels in \[3, 3\]"),
        (
            (np.zeros((5, 4), np.float32), np.zeros(5, np.float32)),
            DataError,
            "integer class labels",
        ),
        ("not data", DataError, "cannot train on str"),
        (iter([]), DataError, "one-shot iterator"),
    ],
)
def test_bad_data_fails_before_training(data, error, message):
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy")
    with pytest.raises(error, match=message):
        trainer.fit(data)
    assert trainer.state.step == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 2.5}, "epochs"),
        ({"grad_accum_steps": -1}, "grad_accum_steps"),
        ({"grad_clip_norm": -1.0}, "grad_clip_norm"),
        ({"grad_clip_norm": float("nan")}, "grad_clip_norm"),
        ({"device": "tpu"}, "device"),
        ({"nonfinite": "ignore"}, "nonfinite"),
        ({"seed": -3}, "seed"),
        ({"batch_size": True}, "batch_size"),
    ],
)
def test_bad_config_is_refused_with_the_field_name(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(**kwargs)


def test_schedule_must_be_a_schedule_object():
    with pytest.raises(ConfigError, match=r"schedules\.Constant"):
        Trainer(models.MLP((4, 8, 3)), backend="numpy", schedule=0.1)


def test_trainer_accepts_a_built_backend_instance():
    backend = NumpyBackend(models.MLP((4, 8, 3)), BackendOptions(seed=3))
    trainer = Trainer(models.MLP((4, 8, 3)), backend=backend)
    assert trainer.backend is backend


@pytest.mark.parametrize("backend", [backend_param(b) for b in BACKENDS])
def test_same_seed_twice_is_bit_identical_and_seeds_differ(backend):
    x, y = small_data()
    states = []
    for seed in (0, 0, 1):
        config = TrainerConfig(epochs=2, batch_size=16, seed=seed, device="cpu")
        trainer = Trainer(
            models.MLP((4, 8, 3), dropout=0.3),
            backend=backend,
            optimizer=optim.AdamW(),
            schedule=schedules.Constant(1e-2),
            config=config,
        )
        trainer.fit((x, y))
        states.append(trainer.backend.state_dict())
    assert all(np.array_equal(states[0][k], states[1][k]) for k in states[0])
    assert not all(np.array_equal(states[0][k], states[2][k]) for k in states[0])


def test_mse_regression_trains():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)
    trainer = Trainer(
        models.MLP((3, 16, 1), activation="tanh"),
        backend="numpy",
        loss="mse",
        optimizer=optim.Adam(),
        schedule=schedules.Constant(0.01),
        config=TrainerConfig(epochs=20),
    )
    history = trainer.fit((x, y), (x, y))
    assert history[-1]["val_loss"] < 0.05 * history[0]["val_loss"]
    assert "val_accuracy" not in history[-1]


@pytest.mark.parametrize("backend", [backend_param(b) for b in ("jax", "tensorflow", "torch")])
def test_multi_step_calls_and_device_data_equal_single_steps(backend, digits, tmp_path):
    """steps_per_call=k and data_on_device change the speed, not the numbers."""
    x, y = digits.x_train[:330], digits.y_train[:330]  # 10 full batches + one of 10 per epoch
    results = {}
    for k, on_device in ((1, False), (4, False), (4, True), (1, True)):
        config = TrainerConfig(
            epochs=2, device="cpu", steps_per_call=k, data_on_device=on_device, log_every_n_steps=3
        )
        trainer = Trainer(
            models.MLP((64, 16, 10)),
            backend=backend,
            optimizer=optim.Adam(),
            schedule=schedules.LinearDecay(1e-2, 1e-3, 22),
            config=config,
        )
        history = trainer.fit(ArrayLoader(x, y, 32, seed=1))
        assert trainer.state.step == 22
        results[k, on_device] = trainer.backend.state_dict(), [row["loss"] for row in history]
    state, losses = results[1, False]
    for other, other_losses in results.values():
        for key in state:
            np.testing.assert_allclose(other[key], state[key], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(other_losses, losses, rtol=1e-6)


@pytest.mark.parametrize("backend", [backend_param(b) for b in ("jax", "tensorflow", "torch")])
def test_multi_step_run_resumes_bit_exactly(backend, digits, tmp_path):
    from unitrain import callbacks

    x, y = digits.x_train[:330], digits.y_train[:330]

    def run(directory, stop_at=None):
        class Stop:
            def on_batch_end(self, trainer, batch, logs):
                if stop_at is not None and trainer.state.step >= stop_at:
                    raise KeyboardInterrupt

        config = TrainerConfig(
            epochs=3, device="cpu", steps_per_call=4, checkpoint_dir=str(directory)
        )
        hooks = [callbacks.ModelCheckpoint(every_n_steps=6, every_n_epochs=None), Stop()]
        trainer = Trainer(
            models.MLP((64, 16, 10)),
            backend=backend,
            optimizer=optim.Adam(),
            schedule=schedules.Constant(1e-3),
            callbacks=hooks,
            config=config,
        )
        return trainer

    full = run(tmp_path / "full")
    full.fit(ArrayLoader(x, y, 32, seed=1))
    stopped = run(tmp_path / "cut", stop_at=17)
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(ArrayLoader(x, y, 32, seed=1))
    resumed = run(tmp_path / "cut")
    resumed.fit(ArrayLoader(x, y, 32, seed=1), resume="latest")
    for key, value in full.backend.state_dict().items():
        assert np.array_equal(resumed.backend.state_dict()[key], value), key
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in full.history]


def test_steps_per_call_without_backend_support_warns():
    with pytest.warns(UserWarning, match="no multi-step call"):
        Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(steps_per_call=4))
    with pytest.raises(ConfigError, match="steps_per_call"):
        TrainerConfig(steps_per_call=2, grad_accum_steps=2)
    trainer = Trainer(
        models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(epochs=1, data_on_device=True)
    )
    with pytest.warns(UserWarning, match="cannot keep data on the device"):
        trainer.fit(small_data())
    assert trainer.state.step == 2


class _NoBatches:
    """A re-iterable that yields nothing."""

    def __iter__(self):
        return iter(())


@pytest.mark.parametrize("method, label", [("validate", "val_data"), ("test", "test_data")])
def test_evaluation_errors_name_the_data_they_are_about(method, label):
    x, y = small_data(n=5)
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(batch_size=4))
    evaluate = getattr(trainer, method)
    with pytest.raises(DataError, match=f"^{label} is empty"):
        evaluate((x[:0], y[:0]))
    with pytest.raises(DataError, match=f"^{label} has labels in \\[7, 7\\]"):
        evaluate((x, np.full(5, 7)))
    with pytest.raises(DataError, match=f"^{label} yielded no batches"):
        evaluate(_NoBatches())


def test_evaluating_a_shuffled_loader_reads_its_first_epoch():
    """A loader passed as it is keeps its shuffle; evaluation reads its epoch-0 order and
    returns the example-weighted mean of the backend's batch losses, in that order."""
    x, y = small_data(n=30)
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", config=TrainerConfig(dtype="float64"))
    loader = ArrayLoader(x, y, 8, seed=3)
    total = sum(trainer.backend.evaluate(b)["loss"] * len(b[0]) for b in loader.batches(0))
    assert trainer.validate(loader)["val_loss"] == total / 30
    assert trainer.test(loader)["test_loss"] == total / 30


class _RunsDry:
    """A loader whose batch is there when the Trainer checks it, and gone when it is read."""

    def __init__(self, batch):
        self.batch, self.passes = batch, 0

    def __iter__(self):
        self.passes += 1
        return iter([self.batch] if self.passes == 1 else [])


@pytest.mark.parametrize("workers", [1, 2])  # one pass, or each worker's share summed
@pytest.mark.parametrize("method, label", [("validate", "val_data"), ("test", "test_data")])
def test_a_loader_that_runs_dry_after_its_check_is_named_in_the_error(method, label, workers):
    trainer = Trainer(models.MLP((4, 8, 3)), backend="numpy", strategy=workers)
    with pytest.raises(DataError, match=f"^{label} yielded no batches"):
        getattr(trainer, method)(_RunsDry(small_data(n=4)))


class _PredictOnlyNumpy:
    """The reference without ``outputs``: metrics go through ``predict`` on the host, as with
    a third-party backend that offers only the required methods and ``predict``."""

    def __init__(self, model, options):
        self._inner = NumpyBackend(model, options)

    def __getattr__(self, name):
        if name in ("outputs", "array_ops"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_metrics_through_predict_equal_metrics_on_the_device():
    x, y = small_data(n=30)
    results = []
    for backend in (NumpyBackend, _PredictOnlyNumpy):
        trainer = Trainer(
            models.MLP((4, 8, 3)),
            backend=backend,
            metrics=["top2_accuracy", "perplexity"],
            config=TrainerConfig(batch_size=8, dtype="float64"),
        )
        results.append(trainer.validate((x, y)))
    device, host = results
    assert {"val_top2_accuracy", "val_perplexity"} <= set(device) == set(host)
    for key in device:
        assert host[key] == pytest.approx(device[key], rel=1e-12), key


def test_steps_per_call_leftovers_train_one_fused_update_each():
    """Five batches with steps_per_call=2: two stacked calls, then the fifth batch alone
    through train_step, with its own LR and size. The run equals the plain one."""
    x, y = small_data(n=36)  # batches of 8, 8, 8, 8 and 4
    runs = []
    for backend, steps in ((NumpyBackend, 1), (MultiStepNumpy, 2)):
        monitor = callbacks.LRMonitor("step")
        trainer = Trainer(
            models.MLP((4, 8, 3)),
            backend=backend,
            schedule=schedules.LinearDecay(0.1, 0.01, 5),
            callbacks=[monitor],
            config=TrainerConfig(epochs=1, batch_size=8, steps_per_call=steps, dtype="float64"),
        )
        history = trainer.fit(ArrayLoader(x, y, 8, shuffle=False))
        runs.append((trainer.backend.state_dict(), history[0]["loss"], monitor.values))
    (plain, plain_loss, plain_lrs), (multi, multi_loss, multi_lrs) = runs
    # Batch hooks fire once per call, after its last update: updates 2, 4, then 5 alone.
    assert len(plain_lrs) == 5 and multi_lrs == [plain_lrs[1], plain_lrs[3], plain_lrs[4]]
    assert multi_loss == pytest.approx(plain_loss, rel=1e-12)
    for key in plain:
        np.testing.assert_allclose(multi[key], plain[key], rtol=1e-12, atol=1e-15)


class _CallRecorder(callbacks.Callback):
    """Records what the batch hooks are given: (trainer, batch index) and the logged LR."""

    def __init__(self) -> None:
        self.begins: list[tuple[object, int]] = []
        self.lrs: list[float] = []

    def on_batch_begin(self, trainer, batch):
        self.begins.append((trainer, batch))

    def on_batch_end(self, trainer, batch, logs):
        self.lrs.append(logs["lr"])


def test_multi_step_calls_train_a_chunk_of_mixed_sizes_one_batch_at_a_time():
    """A native loader whose batch sizes vary mid-epoch: a chunk of steps_per_call batches
    that cannot be stacked goes one update per batch, and the chunks after it are stacked
    again. Every batch trains once, at its own LR; a call's hooks see the batch index where
    it starts and the LR of its last update. The run equals the plain one."""
    x, y = small_data(n=44)
    edges = np.cumsum([0, 8, 4, 8, 8, 8, 8])  # a mixed chunk, then a full one of 8s
    batches = [(x[a:b], y[a:b]) for a, b in itertools.pairwise(edges)]
    runs = []
    for backend, steps in ((NumpyBackend, 1), (MultiStepNumpy, 3)):
        recorder = _CallRecorder()
        trainer = Trainer(
            models.MLP((4, 8, 3)),
            backend=backend,
            schedule=schedules.LinearDecay(0.1, 0.01, 6),
            callbacks=[recorder],
            config=TrainerConfig(epochs=1, steps_per_call=steps, dtype="float64"),
        )
        trainer.fit(batches)
        assert trainer.state.step == 6
        assert all(seen is trainer for seen, _ in recorder.begins)
        runs.append((trainer.backend.state_dict(), recorder))
    (plain, plain_calls), (multi, multi_calls) = runs
    assert [batch for _, batch in plain_calls.begins] == [0, 1, 2, 3, 4, 5]
    assert [batch for _, batch in multi_calls.begins] == [0, 1, 2, 3]
    assert multi_calls.lrs == [plain_calls.lrs[i] for i in (0, 1, 2, 5)]
    for key in plain:
        np.testing.assert_allclose(multi[key], plain[key], rtol=1e-12, atol=1e-15)


def test_a_reduced_learning_rate_applies_to_accumulated_updates():
    """ReduceLROnPlateau's factor multiplies the schedule in the accumulation path too (and
    the LR reaches the batch logs): 'loss' in mode 'max' never improves after the first
    epoch, so the third epoch runs at half the LR."""
    x, y = small_data(n=32)
    monitor = callbacks.LRMonitor("step")
    trainer = Trainer(
        models.MLP((4, 8, 3)),
        backend="numpy",
        schedule=schedules.Constant(0.1),
        callbacks=[
            callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, mode="max"),
            monitor,
        ],
        config=TrainerConfig(epochs=3, batch_size=8, grad_accum_steps=2),
    )
    trainer.fit((x, y))
    assert [lr for _, lr in monitor.values] == pytest.approx([0.1] * 4 + [0.05] * 2)
