"""The precision policy: config validation, the loss-scaling rule, and the Trainer end to end.

The rule's reference is checked against a trajectory worked out by hand from the issue's
definition (initial 2**16, x2 after 2000 finite updates, /2 and skip on a non-finite one,
never below 1, never infinite); every backend's copy of it is checked by the conformance
kit's ``mixed_precision`` family, run here on every backend with the rest of the kit.
"""

from __future__ import annotations

import numpy as np
import pytest
from _backends import backends

from unitrain import ConfigError, Trainer, TrainerConfig, callbacks, models, optim
from unitrain.backends.precision import (
    MAX_LOSS_SCALE,
    LossScaler,
    next_loss_scale,
    reference_trajectory,
    require_precision,
)
from unitrain.backends.protocol import BackendOptions
from unitrain.backends.registry import get_backend


def test_defaults_follow_the_issue():
    config = TrainerConfig()
    assert (config.matmul_precision, config.precision) == ("highest", "32")
    assert (config.loss_scaler.initial_scale, config.loss_scaler.growth_interval) == (2.0**16, 2000)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("matmul_precision", "tf32", "matmul_precision must be one of"),
        ("precision", 16, "for 16 write '16-mixed'"),
        ("precision", "bf16", "for 'bf16' write 'bf16-mixed'"),
        ("precision", 64, "for 64 write dtype='float64' with precision '32'"),
        ("precision", True, r"precision must be one of .*got True$"),
        ("precision", "32-bit", r"precision must be one of .*got '32-bit'$"),
        ("loss_scaler", 2.0**16, "loss_scaler must be a unitrain.backends.precision.LossScaler"),
    ],
)
def test_bad_precision_settings_are_refused(field, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(**{field: value})


def test_precision_32_may_be_written_as_a_number():
    """What a TOML recipe or ``--set config.precision=32`` gives (Lightning accepts it too)."""
    assert TrainerConfig(precision=32).precision == "32"


def test_mixed_precision_needs_float32_master_weights():
    with pytest.raises(ConfigError, match="needs dtype='float32'"):
        TrainerConfig(precision="bf16-mixed", dtype="float64")


@pytest.mark.parametrize("scale", [3.0, 0.5, 2.0**128, float("inf"), True])
def test_initial_scale_must_be_a_power_of_two_in_range(scale):
    with pytest.raises(ConfigError, match="power of two"):
        LossScaler(initial_scale=scale)


def test_growth_after_2000_finite_updates_and_halving_on_overflow():
    steps = reference_trajectory(LossScaler(), [True] * 2000 + [False] + [True] * 3)
    assert {s.scale_used for s in steps[:2000]} == {2.0**16}
    assert steps[1998].scale_after == 2.0**16 and steps[1999].scale_after == 2.0**17
    assert steps[2000].scale_used == 2.0**17 and not steps[2000].applied
    assert steps[2000].scale_after == 2.0**16 and steps[2000].good_steps_after == 0
    assert [s.good_steps_after for s in steps[2001:]] == [1, 2, 3]


def test_scale_never_falls_below_one_nor_becomes_infinite():
    floor = reference_trajectory(LossScaler(initial_scale=2.0), [False] * 4)
    assert [s.scale_after for s in floor] == [1.0, 1.0, 1.0, 1.0]
    assert not any(s.applied for s in floor)
    ceiling = reference_trajectory(LossScaler(2.0**126, growth_interval=1), [True] * 4)
    assert [s.scale_after for s in ceiling] == [2.0**127, MAX_LOSS_SCALE, 2.0**127, 2.0**127]


def test_rule_keeps_float32_and_int32():
    scale, good = next_loss_scale(
        LossScaler(), np.float32(2.0**16), np.int32(5), np.bool_(True), np.where
    )
    assert (scale.dtype, good.dtype) == (np.float32, np.int32)


@pytest.mark.parametrize("name", backends())
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_trainer_mixed_precision_learns_and_resumes_exactly(name, precision, tmp_path):
    """fit in mixed precision lowers the loss; a resume from the epoch-1 checkpoint ends
    bit-identical to the uninterrupted run, the scaler's state included."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    model = models.MLP((6, 16, 2))

    def trainer(epochs: int, directory: str) -> Trainer:
        config = TrainerConfig(
            epochs=epochs,
            batch_size=16,
            device="cpu",
            precision=precision,
            checkpoint_dir=directory,
            loss_scaler=LossScaler(initial_scale=2.0**8, growth_interval=4),
        )
        return Trainer(
            model,
            backend=name,
            optimizer=optim.Adam(),
            callbacks=[callbacks.ModelCheckpoint(directory, background=False)],
            config=config,
        )

    whole = trainer(3, str(tmp_path / "whole"))
    history = whole.fit((x, y))
    assert history[-1]["loss"] < history[0]["loss"]
    trainer(1, str(tmp_path / "part")).fit((x, y))
    resumed = trainer(3, str(tmp_path / "part"))
    resumed.fit((x, y), resume="latest")
    expected, actual = whole.backend.state_dict(), resumed.backend.state_dict()
    assert sorted(actual) == sorted(expected)
    if precision == "16-mixed":
        assert "optimizer.loss_scale" in actual
        assert float(actual["optimizer.loss_scale"]) > 2.0**8  # 18 finite updates: it grew
    for key in expected:
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


@pytest.mark.parametrize("name", backends())
def test_matmul_precision_reaches_the_backend(name):
    """Every backend accepts the three names; on the CPU they all compute in float32."""
    model, spec = models.MLP((4, 8, 3)), optim.SGD()
    x = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    y = np.arange(8) % 3
    states = []
    for matmul in ("highest", "high", "medium"):
        options = BackendOptions(device="cpu", matmul_precision=matmul, optimizer=spec)
        backend = get_backend(name)(model, options)
        loss = backend.forward((x, y))
        backend.backward()
        backend.step(0.1)
        states.append((float(loss), backend.state_dict()))
    for loss, state in states[1:]:
        assert loss == states[0][0]
        for key, value in state.items():
            np.testing.assert_array_equal(value, states[0][1][key], err_msg=key)


def test_undeclared_precision_is_refused_with_the_declared_ones():
    with pytest.raises(ConfigError, match=r"trains in precision \('32', 'bf16-mixed'\) on cpu"):
        require_precision("demo", ("32", "bf16-mixed"), "16-mixed", "cpu")


@pytest.mark.parametrize("name", backends())
def test_an_edited_loss_scale_is_refused_on_load(name):
    options = BackendOptions(device="cpu", precision="16-mixed")
    backend = get_backend(name)(models.MLP((4, 8, 3)), options)
    state = backend.state_dict()
    assert state["optimizer.loss_scale"].dtype == np.float32
    assert state["optimizer.loss_scale_good_steps"].dtype == np.int64
    state["optimizer.loss_scale"] = np.array(3.0, np.float32)
    with pytest.raises(ConfigError, match="not a loss-scaler state"):
        backend.load_state_dict(state)


def test_tensorflow_refuses_to_cast_a_keras_model_behind_its_back():
    pytest.importorskip("tensorflow")
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ConfigError, match="its own dtype policy"):
        get_backend("tensorflow")(model, BackendOptions(device="cpu", precision="bf16-mixed"))
